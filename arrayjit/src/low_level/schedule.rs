//! The CPU schedule: loop order, tiling and register blocking of contractions.
//!
//! Lowering puts reductions innermost with a scalar accumulator (`c[i,j] = Σ_k ...`), which is
//! right for the interpreter and for GPUs (one thread per cell, no races) but leaves a CPU with a
//! strided, unvectorizable inner loop. For a nest of the form
//!
//! ```text
//! for .. i par { for j par { t := init; for k { t := t ⊕ e(i, j, k) }; c[.., i, j] := t } }
//! ```
//!
//! with a reorderable `⊕` (sum, product, max, min; `fma` counts as a sum) and `j` indexing the
//! last (contiguous) axis of `c`, this pass rewrites the nest in place (`c` itself accumulates):
//!
//! ```text
//! c := init                                            (a separate parallel nest)
//! for ic par {                  rows i = MC*ic + MR*i0 + r        (split across threads)
//!   for j0 { for k0 {           tiles of NC columns and KC reduction steps (cache blocking)
//!     for i0 { for k1 {         k = KC*k0 + KU*k1 + q
//!       t_rq := <parts of e not depending on j>      (hoisted, e.g. a[i_r, k_q])
//!       for j1 { c[i_r, j] := c[i_r, j] ⊕ e_r0 ⊕ ... ⊕ e_r(KU-1)   for r < MR }   (vectorized)
//! }}}}}
//! ```
//!
//! The innermost loop is contiguous in `c` (and in `b` for a matmul), so GCC vectorizes it; MR
//! rows × KU reduction steps per iteration keep the FMA units busier than the load/store ports.
//! Tile sizes divide the extents exactly (no remainder loops); the pass leaves alone what it
//! does not recognize.

use super::{Expr, IdxVar, Index, LocalId, Program, Stmt, Var};
use crate::ops::{BinOp, Prec, TernOp};

/// Rows per register block (at most).
pub const MR: usize = 4;
/// Reduction steps per register block (at most).
pub const KU: usize = 4;
/// Reduction tile (at most).
pub const KC: usize = 256;
/// Column tile (at most).
pub const NC: usize = 512;
/// Rows per parallel chunk (at most).
pub const MC: usize = 64;

/// Applies the schedule to every recognized top-level nest.
pub fn schedule_cpu(prog: &mut Program) {
    let body = std::mem::take(&mut prog.body);
    let mut out = Vec::with_capacity(body.len());
    for s in body {
        match Contraction::recognize(prog, &s) {
            Some(c) => out.extend(c.rewrite(prog)),
            None => out.push(s),
        }
    }
    prog.body = out;
}

/// How the accumulator is updated: `t := op(t, e)` or `t := fma(x, y, t)`.
#[derive(Clone, Debug)]
enum Update {
    Op(BinOp, Expr),
    Fma(Expr, Expr),
}

struct Contraction {
    /// Lhs loops, outermost first: (var, extent, parallel).
    lhs_loops: Vec<(Var, usize, bool)>,
    red: (Var, usize),
    init: Option<f64>,
    node: super::NodeId,
    idx: Vec<Index>,
    update: Update,
    prec: Prec,
}

fn largest_divisor(n: usize, at_most: usize, multiple_of: usize) -> usize {
    (1..=at_most.min(n)).rev().find(|d| n % d == 0 && d % multiple_of == 0).unwrap_or(n)
}

fn uses_local(e: &Expr) -> bool {
    let mut found = false;
    e.visit(&mut |e| found |= matches!(e, Expr::Local(_)));
    found
}

impl Contraction {
    fn recognize(prog: &Program, s: &Stmt) -> Option<Contraction> {
        let mut lhs_loops = Vec::new();
        let mut cur = s;
        loop {
            match cur {
                Stmt::For { var, extent, parallel: true, body } => {
                    lhs_loops.push((*var, *extent, true));
                    match body.as_slice() {
                        [inner @ Stmt::For { parallel: true, .. }] => cur = inner,
                        [_, _, _] => return Self::from_block(prog, lhs_loops, body),
                        _ => return None,
                    }
                }
                _ => return None,
            }
        }
    }

    fn from_block(
        prog: &Program,
        lhs_loops: Vec<(Var, usize, bool)>,
        body: &[Stmt],
    ) -> Option<Contraction> {
        let [
            Stmt::SetLocal { local: t, value: init },
            Stmt::For { var: kv, extent: kx, parallel: false, body: red_body },
            Stmt::Set { node, idx, value: Expr::Local(t2) },
        ] = body
        else {
            return None;
        };
        let [Stmt::SetLocal { local: t3, value: upd }] = red_body.as_slice() else { return None };
        if t != t2 || t != t3 {
            return None;
        }
        let node_info = prog.nodes.get(node)?;
        let prec = node_info.prec;
        if !matches!(prec, Prec::F32 | Prec::F64) || prog.locals[t.0 as usize] != prec {
            return None;
        }
        let is_t = |e: &Expr| matches!(e, Expr::Local(l) if l == t);
        let update = match upd {
            Expr::Binop(op, a, b) if op.is_reorderable() && is_t(a) => {
                Update::Op(*op, (**b).clone())
            }
            Expr::Binop(op, a, b) if op.is_reorderable() && is_t(b) => {
                Update::Op(*op, (**a).clone())
            }
            Expr::Ternop(TernOp::Fma, x, y, c) if is_t(c) => {
                Update::Fma((**x).clone(), (**y).clone())
            }
            _ => return None,
        };
        let contributions: Vec<&Expr> = match &update {
            Update::Op(_, e) => vec![e],
            Update::Fma(x, y) => vec![x, y],
        };
        if contributions.iter().any(|e| uses_local(e) || e.reads(*node)) {
            return None;
        }
        let neutral = match &update {
            Update::Op(op, _) => op.neutral(),
            Update::Fma(..) => Some(0.0),
        };
        let init = match init {
            Expr::Const(c) if Some(*c) == neutral => Some(*c),
            Expr::Get(n, i) if n == node && i == idx => None,
            _ => return None,
        };
        let &(j, n, _) = lhs_loops.last()?;
        if idx.last()?.as_var() != Some(j) || n < 16 || *kx < 4 {
            return None;
        }
        if !idx.iter().all(|i| i.as_var().is_some() || i.terms.is_empty()) {
            return None;
        }
        Some(Contraction {
            lhs_loops,
            red: (*kv, *kx),
            init,
            node: *node,
            idx: idx.clone(),
            update,
            prec,
        })
    }

    fn rewrite(self, prog: &mut Program) -> Vec<Stmt> {
        let mut out = Vec::new();
        if let Some(c) = self.init {
            let mut s = Stmt::Set { node: self.node, idx: self.idx.clone(), value: Expr::Const(c) };
            for &(v, e, _) in self.lhs_loops.iter().rev() {
                s = Stmt::For { var: v, extent: e, parallel: true, body: vec![s] };
            }
            out.push(s);
        }
        let (kv, kx) = self.red;
        let &(jv, nx, _) = self.lhs_loops.last().unwrap_or(&(kv, 1, true));
        let has_i = self.lhs_loops.len() >= 2;
        let (iv, mx) = if has_i {
            let l = self.lhs_loops[self.lhs_loops.len() - 2];
            (Some(l.0), l.1)
        } else {
            (None, 1)
        };
        let mr = [MR, 2, 1].into_iter().find(|m| mx % m == 0).unwrap_or(1);
        let ku = [KU, 2, 1].into_iter().find(|u| kx % u == 0).unwrap_or(1);
        let kc = if kx > KC { largest_divisor(kx, KC, ku) } else { kx };
        let nc = if nx > NC { largest_divisor(nx, NC, 16) } else { nx };
        let mc = if has_i { largest_divisor(mx, MC.max(mr), mr) } else { 1 };
        let [ic, j0, k0, i0, k1, j1] = [(); 6].map(|_| prog.fresh_var());
        let lin = |terms: Vec<(i64, Var)>, off: i64| {
            Index::new(terms.into_iter().map(|(c, v)| (c, IdxVar::Loop(v))).collect(), off)
        };
        let j_idx = lin(vec![(nc as i64, j0), (1, j1)], 0);
        let k_at = |q: usize| lin(vec![(kc as i64, k0), (ku as i64, k1)], q as i64);
        let i_at = |r: usize| lin(vec![(mc as i64, ic), (mr as i64, i0)], r as i64);

        let mut hoisted: Vec<(Expr, LocalId)> = Vec::new();
        let mut rows = Vec::new();
        for r in 0..mr {
            let subst_ij = |e: &Expr, q: usize| {
                e.clone().subst(&|v| {
                    if v == jv {
                        Some(j_idx.clone())
                    } else if v == kv {
                        Some(k_at(q))
                    } else if Some(v) == iv {
                        Some(i_at(r))
                    } else {
                        None
                    }
                })
            };
            let cell: Vec<Index> = self
                .idx
                .iter()
                .map(|i| match i.as_var() {
                    Some(v) if v == jv => j_idx.clone(),
                    Some(v) if Some(v) == iv => i_at(r),
                    _ => i.clone(),
                })
                .collect();
            let mut acc = Expr::Get(self.node, cell.clone());
            for q in 0..ku {
                acc = match &self.update {
                    Update::Op(op, e) => {
                        let e = hoist(prog, subst_ij(e, q), j1, self.prec, &mut hoisted);
                        Expr::bin(*op, acc, e)
                    }
                    Update::Fma(x, y) => {
                        let x = hoist(prog, subst_ij(x, q), j1, self.prec, &mut hoisted);
                        let y = hoist(prog, subst_ij(y, q), j1, self.prec, &mut hoisted);
                        Expr::Ternop(TernOp::Fma, Box::new(x), Box::new(y), Box::new(acc))
                    }
                };
            }
            rows.push(Stmt::Set { node: self.node, idx: cell, value: acc });
        }
        let mut k1_body: Vec<Stmt> =
            hoisted.into_iter().map(|(e, l)| Stmt::SetLocal { local: l, value: e }).collect();
        k1_body.push(Stmt::For { var: j1, extent: nc, parallel: true, body: rows });
        let mut nest = Stmt::For { var: k1, extent: kc / ku, parallel: false, body: k1_body };
        if has_i {
            nest = Stmt::For { var: i0, extent: mc / mr, parallel: false, body: vec![nest] };
        }
        nest = Stmt::For { var: k0, extent: kx / kc, parallel: false, body: vec![nest] };
        nest = Stmt::For { var: j0, extent: nx / nc, parallel: !has_i, body: vec![nest] };
        if has_i {
            nest = Stmt::For { var: ic, extent: mx / mc, parallel: true, body: vec![nest] };
        }
        let outer = self.lhs_loops.len().saturating_sub(if has_i { 2 } else { 1 });
        for &(v, e, par) in self.lhs_loops[..outer].iter().rev() {
            nest = Stmt::For { var: v, extent: e, parallel: par, body: vec![nest] };
        }
        out.push(nest);
        out
    }
}

fn uses_var(e: &Expr, v: Var) -> bool {
    e.indices().iter().any(|i| i.uses(v))
}

/// Replaces the maximal subexpressions of `e` that do not depend on `j` by locals computed
/// before the `j` loop.
fn hoist(
    prog: &mut Program,
    e: Expr,
    j: Var,
    prec: Prec,
    hoisted: &mut Vec<(Expr, LocalId)>,
) -> Expr {
    if !uses_var(&e, j) {
        if matches!(e, Expr::Const(_)) {
            return e;
        }
        if let Some((_, l)) = hoisted.iter().find(|(h, _)| *h == e) {
            return Expr::Local(*l);
        }
        let l = prog.fresh_local(prec);
        hoisted.push((e, l));
        return Expr::Local(l);
    }
    match e {
        Expr::Unop(op, a) => Expr::Unop(op, Box::new(hoist(prog, *a, j, prec, hoisted))),
        Expr::Binop(op, a, b) => {
            let a = hoist(prog, *a, j, prec, hoisted);
            Expr::bin(op, a, hoist(prog, *b, j, prec, hoisted))
        }
        Expr::Ternop(op, a, b, c) => {
            let a = hoist(prog, *a, j, prec, hoisted);
            let b = hoist(prog, *b, j, prec, hoisted);
            Expr::Ternop(op, Box::new(a), Box::new(b), Box::new(hoist(prog, *c, j, prec, hoisted)))
        }
        e => e,
    }
}

//! Common-subexpression elimination within a statement.
//!
//! Virtualization inlines a definition at every read, so `y = x * x` with a cheap `x = a + b`
//! becomes `mul(add(a, b), add(a, b))`. This pass computes each repeated subexpression once
//! into a fresh scalar local placed just before the statement (`t3 := add(a, b)`;
//! `y := mul(t3, t3)`), largest first, until no subexpression repeats.

use std::hash::{Hash, Hasher};

use rustc_hash::{FxHashMap, FxHasher};

use super::{Expr, LocalId, Program, Stmt};
use crate::ops::Prec;

/// Eliminates repeated subexpressions in every statement.
pub fn run(prog: &mut Program) {
    let body = std::mem::take(&mut prog.body);
    prog.body = cse_block(prog, body);
}

fn cse_block(prog: &mut Program, body: Vec<Stmt>) -> Vec<Stmt> {
    let mut out = Vec::with_capacity(body.len());
    for s in body {
        match s {
            Stmt::For { var, extent, parallel, body } => {
                let body = cse_block(prog, body);
                out.push(Stmt::For { var, extent, parallel, body });
            }
            Stmt::If { guards, body } => {
                let body = cse_block(prog, body);
                out.push(Stmt::If { guards, body });
            }
            Stmt::Set { node, idx, value } => {
                let prec = prog.nodes.get(&node).map_or(Prec::F64, |n| n.prec.compute());
                let value = extract(prog, value, prec, &mut out);
                out.push(Stmt::Set { node, idx, value });
            }
            Stmt::SetLocal { local, value } => {
                let prec = prog.locals[local.0 as usize].compute();
                let value = extract(prog, value, prec, &mut out);
                out.push(Stmt::SetLocal { local, value });
            }
            s => out.push(s),
        }
    }
    out
}

fn extract(prog: &mut Program, mut value: Expr, prec: Prec, out: &mut Vec<Stmt>) -> Expr {
    while let Some(rep) = largest_repeated(&value) {
        let t = prog.fresh_local(prec);
        value = replace(value, &rep, t);
        out.push(Stmt::SetLocal { local: t, value: rep });
    }
    value
}

fn worth_sharing(e: &Expr) -> bool {
    matches!(e, Expr::Get(..) | Expr::Unop(..) | Expr::Binop(..) | Expr::Ternop(..))
        || matches!(e, Expr::Uniform { .. })
}

/// The repeated subexpression worth sharing with the largest cost; among equals, the one that
/// occurs first (parents first). Subexpressions are compared through a structural hash computed
/// bottom-up in one walk, so a statement of `k` nodes costs `O(k)` plus the equality checks of
/// actual repeats, not `O(k²)` pairwise comparisons.
fn largest_repeated(value: &Expr) -> Option<Expr> {
    let mut nodes: Vec<(&Expr, u64, u32)> = Vec::new();
    summarize(value, &mut nodes);
    let mut first: FxHashMap<u64, Vec<usize>> = FxHashMap::default();
    let mut best: Option<(usize, u32)> = None;
    for (i, &(e, h, cost)) in nodes.iter().enumerate() {
        if !worth_sharing(e) {
            continue;
        }
        let seen = first.entry(h).or_default();
        match seen.iter().copied().find(|&j| nodes[j].0 == e) {
            Some(j) => {
                if best.is_none_or(|(bj, bc)| cost > bc || (cost == bc && j < bj)) {
                    best = Some((j, cost));
                }
            }
            None => seen.push(i),
        }
    }
    best.map(|(j, _)| nodes[j].0.clone())
}

/// Lists every subexpression parents first with its structural hash and its cost
/// ([`Expr::cost`]); returns the expression's own hash and cost.
fn summarize<'a>(e: &'a Expr, out: &mut Vec<(&'a Expr, u64, u32)>) -> (u64, u32) {
    let slot = out.len();
    out.push((e, 0, 0));
    let mut h = FxHasher::default();
    std::mem::discriminant(e).hash(&mut h);
    let cost = match e {
        Expr::Const(c) => {
            c.to_bits().hash(&mut h);
            0
        }
        Expr::Local(l) => {
            l.hash(&mut h);
            0
        }
        Expr::Get(n, idx) => {
            (n, idx).hash(&mut h);
            1
        }
        Expr::IndexValue(i) => {
            i.hash(&mut h);
            1
        }
        Expr::Uniform { seed, offset } => {
            (seed, offset).hash(&mut h);
            8
        }
        Expr::Unop(op, a) => {
            op.hash(&mut h);
            let (ha, ca) = summarize(a, out);
            ha.hash(&mut h);
            op.facts().cost + ca
        }
        Expr::Binop(op, a, b) => {
            op.hash(&mut h);
            let (ha, ca) = summarize(a, out);
            let (hb, cb) = summarize(b, out);
            (ha, hb).hash(&mut h);
            op.facts().cost + ca + cb
        }
        Expr::Ternop(op, a, b, c) => {
            op.hash(&mut h);
            let (ha, ca) = summarize(a, out);
            let (hb, cb) = summarize(b, out);
            let (hc, cc) = summarize(c, out);
            (ha, hb, hc).hash(&mut h);
            op.facts().cost + ca + cb + cc
        }
    };
    let hash = h.finish();
    out[slot].1 = hash;
    out[slot].2 = cost;
    (hash, cost)
}

fn replace(value: Expr, target: &Expr, t: LocalId) -> Expr {
    if value == *target {
        return Expr::Local(t);
    }
    match value {
        Expr::Unop(op, a) => Expr::Unop(op, Box::new(replace(*a, target, t))),
        Expr::Binop(op, a, b) => Expr::bin(op, replace(*a, target, t), replace(*b, target, t)),
        Expr::Ternop(op, a, b, c) => Expr::Ternop(
            op,
            Box::new(replace(*a, target, t)),
            Box::new(replace(*b, target, t)),
            Box::new(replace(*c, target, t)),
        ),
        e => e,
    }
}

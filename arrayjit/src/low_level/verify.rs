//! The verifier: invariants every pass must preserve, checked between passes in debug builds.
//!
//! - every loop variable used in an index is bound by an enclosing loop, and no loop rebinds a
//!   variable of an enclosing loop;
//! - every runtime symbol (in an index or a loop limit) is registered in the program's slot
//!   list;
//! - every tensor access names a node of the program that is not virtual, with one index per
//!   axis;
//! - every local exists and is assigned somewhere before (in program order) it is read;
//! - every matrix-product call ([`super::Gemm`]) is in f32 or f64 on operands of its
//!   precision, and every cell it can address lies inside its tensor.

use rustc_hash::FxHashSet;

use super::{Expr, IdxVar, Index, LocalId, Program, Stmt, Var};
use crate::error::Error;
use crate::ops::Prec;
use crate::tnode::NodeId;

/// Checks the invariants; `pass` names the pass that just ran, for the error message.
pub fn verify(prog: &Program, pass: &'static str) -> Result<(), Error> {
    let mut v =
        Verifier { prog, bound: Vec::new(), extents: Vec::new(), assigned: FxHashSet::default() };
    v.block(&prog.body).map_err(|reason| Error::Verify { pass, reason })
}

struct Verifier<'a> {
    prog: &'a Program,
    bound: Vec<Var>,
    /// The extent of each bound loop.
    extents: Vec<usize>,
    assigned: FxHashSet<LocalId>,
}

impl Verifier<'_> {
    fn block(&mut self, body: &[Stmt]) -> Result<(), String> {
        body.iter().try_for_each(|s| self.stmt(s))
    }

    fn stmt(&mut self, s: &Stmt) -> Result<(), String> {
        match s {
            Stmt::Comment(_) => Ok(()),
            Stmt::For { var, extent, limit, body, .. } => {
                if self.bound.contains(var) {
                    return Err(format!("loop variable {var} rebound inside its own loop"));
                }
                if let Some(l) = limit {
                    if !self.prog.runtime_symbols.contains(&l.size) {
                        return Err(format!("loop limit {} not registered", l.size));
                    }
                    if l.per == 0 {
                        return Err(format!("loop limit {l} has no rows per iteration"));
                    }
                }
                self.bound.push(*var);
                self.extents.push(*extent);
                let r = self.block(body);
                self.bound.pop();
                self.extents.pop();
                r
            }
            Stmt::If { guards, body } => {
                guards.iter().try_for_each(|g| self.index(&g.index))?;
                self.block(body)
            }
            Stmt::Set { node, idx, value } => {
                self.expr(value)?;
                self.access(*node, idx)
            }
            Stmt::SetLocal { local, value } => {
                self.expr(value)?;
                if local.0 as usize >= self.prog.locals.len() {
                    return Err(format!("local {local} not declared"));
                }
                self.assigned.insert(*local);
                Ok(())
            }
            Stmt::Gemm(g) => self.gemm(g),
        }
    }

    fn gemm(&self, g: &super::Gemm) -> Result<(), String> {
        if !matches!(g.prec, Prec::F32 | Prec::F64) {
            return Err(format!("gemm in {}", g.prec.name()));
        }
        for axis in [&g.m, &g.n, &g.k] {
            if let Some((s, _)) = axis.limit
                && !self.prog.runtime_symbols.contains(&s)
            {
                return Err(format!("gemm limit {s} not registered"));
            }
        }
        g.indices().iter().try_for_each(|i| self.index(i))?;
        let extent = |v: Var| self.bound.iter().position(|b| *b == v).map(|k| self.extents[k]);
        let (m, n, k) = (g.m.extent as i64, g.n.extent as i64, g.k.extent as i64);
        for (o, rows, cols) in [(&g.c, m, n), (&g.a, m, k), (&g.b, k, n)] {
            let Some(node) = self.prog.nodes.get(&o.node) else {
                return Err(format!("gemm on unknown node {}", o.node));
            };
            if self.prog.virtual_nodes.contains(&o.node) {
                return Err(format!("gemm on virtualized node {}", o.node));
            }
            let want = if g.bf16_pairs && o.node != g.c.node { Prec::Bf16 } else { g.prec };
            if g.bf16_pairs && g.prec != Prec::F32 {
                return Err(format!("bf16 pairs into {}", g.prec.name()));
            }
            if node.prec != want {
                return Err(format!(
                    "gemm {} on {} node {}",
                    g.prec.name(),
                    node.prec.name(),
                    o.node
                ));
            }
            // Offsets with runtime symbols are checked when running.
            let Some((lo, hi)) = o.offset.range(&extent) else { continue };
            let span = |step: i64, len: i64| (step * (len - 1)).min(0)..=(step * (len - 1)).max(0);
            let (r, c) = (span(o.rows, rows.max(1)), span(o.cols, cols.max(1)));
            let (first, last) = (lo + r.start() + c.start(), hi + r.end() + c.end());
            if rows * cols > 0 && (first < 0 || last >= node.num_elements() as i64) {
                return Err(format!(
                    "gemm reaches cells {first}..={last} of {} ({} cells)",
                    o.node,
                    node.num_elements()
                ));
            }
        }
        Ok(())
    }

    fn index(&self, i: &Index) -> Result<(), String> {
        for (_, x) in &i.terms {
            match x {
                IdxVar::Loop(v) if !self.bound.contains(v) => {
                    return Err(format!("loop variable {v} used outside its loop in `{i}`"));
                }
                IdxVar::Sym(s) if !self.prog.runtime_symbols.contains(s) => {
                    return Err(format!("runtime symbol {s} not registered"));
                }
                _ => {}
            }
        }
        Ok(())
    }

    fn access(&self, node: NodeId, idx: &[Index]) -> Result<(), String> {
        let Some(n) = self.prog.nodes.get(&node) else {
            return Err(format!("access to unknown node {node}"));
        };
        if self.prog.virtual_nodes.contains(&node) {
            return Err(format!("access to virtualized node {node}"));
        }
        if n.dims.len() != idx.len() {
            return Err(format!("{node} has {} axes, accessed with {}", n.dims.len(), idx.len()));
        }
        idx.iter().try_for_each(|i| self.index(i))
    }

    fn expr(&self, e: &Expr) -> Result<(), String> {
        let mut res = Ok(());
        e.visit(&mut |e| {
            if res.is_err() {
                return;
            }
            res = match e {
                Expr::Get(n, idx) => self.access(*n, idx),
                Expr::IndexValue(i) | Expr::Uniform { offset: i, .. } => self.index(i),
                Expr::Local(l) if !self.assigned.contains(l) => {
                    Err(format!("local {l} read before any assignment"))
                }
                _ => Ok(()),
            };
        });
        res
    }
}

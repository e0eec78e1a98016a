//! The verifier: invariants every pass must preserve, checked between passes in debug builds.
//!
//! - every loop variable used in an index is bound by an enclosing loop, and no loop rebinds a
//!   variable of an enclosing loop;
//! - every runtime symbol (in an index or a loop limit) is registered in the program's slot
//!   list;
//! - every tensor access names a node of the program that is not virtual, with one index per
//!   axis;
//! - every local exists and is assigned somewhere before (in program order) it is read.

use rustc_hash::FxHashSet;

use super::{Expr, IdxVar, Index, LocalId, Program, Stmt, Var};
use crate::error::Error;
use crate::tnode::NodeId;

/// Checks the invariants; `pass` names the pass that just ran, for the error message.
pub fn verify(prog: &Program, pass: &'static str) -> Result<(), Error> {
    let mut v = Verifier { prog, bound: Vec::new(), assigned: FxHashSet::default() };
    v.block(&prog.body).map_err(|reason| Error::Verify { pass, reason })
}

struct Verifier<'a> {
    prog: &'a Program,
    bound: Vec<Var>,
    assigned: FxHashSet<LocalId>,
}

impl Verifier<'_> {
    fn block(&mut self, body: &[Stmt]) -> Result<(), String> {
        body.iter().try_for_each(|s| self.stmt(s))
    }

    fn stmt(&mut self, s: &Stmt) -> Result<(), String> {
        match s {
            Stmt::Comment(_) => Ok(()),
            Stmt::For { var, limit, body, .. } => {
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
                let r = self.block(body);
                self.bound.pop();
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
        }
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

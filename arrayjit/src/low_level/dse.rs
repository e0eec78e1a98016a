//! Dead-store elimination.
//!
//! A store is dead when nothing can observe it: a write to an intermediate node (memory mode
//! `Virtual` or `Local`) that the routine never reads, or a write to a scalar local that is
//! never read. Removing one can make others dead (a local only used to compute a dead store),
//! so the pass repeats until nothing changes. Removed nodes need no buffer and are reported
//! virtual.

use rustc_hash::FxHashSet;

use super::trace::trace;
use super::virtualize::remove_def;
use super::{Expr, LocalId, Program, Stmt, prune_empty};

/// Removes dead stores; returns the nodes whose writes were all removed.
pub fn remove_dead_stores(prog: &mut Program) -> Vec<super::NodeId> {
    let mut removed_nodes = Vec::new();
    loop {
        let uses = trace(prog);
        let mut dead: Vec<_> = uses
            .iter()
            .filter(|(n, u)| {
                u.write_sites > 0
                    && u.read_sites == 0
                    && prog.nodes.get(n).is_some_and(|node| !node.memory.is_persistent())
            })
            .map(|(n, _)| *n)
            .collect();
        dead.sort();
        let mut read_locals = FxHashSet::default();
        for s in &prog.body {
            s.visit_exprs(&mut |e| {
                e.visit(&mut |e| {
                    if let Expr::Local(l) = e {
                        read_locals.insert(*l);
                    }
                })
            });
        }
        let before = count_stmts(&prog.body);
        let mut body = std::mem::take(&mut prog.body);
        for n in &dead {
            body = remove_def(body, *n);
            prog.virtual_nodes.push(*n);
            removed_nodes.push(*n);
        }
        body = remove_unread_locals(body, &read_locals);
        prog.body = prune_empty(body);
        if count_stmts(&prog.body) == before && dead.is_empty() {
            return removed_nodes;
        }
    }
}

fn count_stmts(body: &[Stmt]) -> usize {
    let mut n = 0;
    body.iter().for_each(|s| s.visit(&mut |_| n += 1));
    n
}

fn remove_unread_locals(body: Vec<Stmt>, read: &FxHashSet<LocalId>) -> Vec<Stmt> {
    body.into_iter()
        .filter_map(|s| match s {
            Stmt::SetLocal { local, .. } if !read.contains(&local) => None,
            s => Some(s.map_body(|body| remove_unread_locals(body, read))),
        })
        .collect()
}

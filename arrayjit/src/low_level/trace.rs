//! Visit counting: how often, where and in which order every tensor is read and written.
//!
//! Virtualization and dead-store elimination need to know, per node, how many statements write
//! it, how many read it, whether each read site touches every cell at most once (so inlining
//! does not multiply work), and the program-order positions of the first and last accesses.

use rustc_hash::FxHashMap;

use super::{Expr, IdxVar, Index, Program, Stmt, Var};
use crate::tnode::NodeId;

/// The accesses of one node in a program.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct NodeUse {
    /// Statements writing the node.
    pub write_sites: usize,
    /// Read occurrences (one per `Get` in the program text).
    pub read_sites: usize,
    /// Whether every read site, over its enclosing loops, reads each cell at most once.
    pub reads_once_per_cell: bool,
    /// Program-order positions of the writing statements.
    pub write_positions: Vec<usize>,
    /// Program-order positions of the reading statements.
    pub read_positions: Vec<usize>,
}

/// Counts the accesses of every node.
pub fn trace(prog: &Program) -> FxHashMap<NodeId, NodeUse> {
    let mut uses: FxHashMap<NodeId, NodeUse> = FxHashMap::default();
    let mut pos = 0;
    let mut loops = Vec::new();
    for s in &prog.body {
        walk(s, &mut loops, &mut pos, &mut uses);
    }
    uses
}

/// Whether an access at `idx` inside `loops` touches each cell at most once: every enclosing
/// loop variable of extent > 1 alone indexes some axis.
pub fn once_per_cell(idx: &[Index], loops: &[(Var, usize)]) -> bool {
    loops.iter().all(|&(v, d)| d <= 1 || idx.iter().any(|i| i.terms == [(1, IdxVar::Loop(v))]))
}

fn walk(
    s: &Stmt,
    loops: &mut Vec<(Var, usize)>,
    pos: &mut usize,
    uses: &mut FxHashMap<NodeId, NodeUse>,
) {
    match s {
        Stmt::Comment(_) => {}
        Stmt::For { var, extent, body, .. } => {
            loops.push((*var, *extent));
            body.iter().for_each(|s| walk(s, loops, pos, uses));
            loops.pop();
        }
        Stmt::If { body, .. } => body.iter().for_each(|s| walk(s, loops, pos, uses)),
        Stmt::Set { node, value, .. } => {
            *pos += 1;
            record_reads(value, loops, *pos, uses);
            let u = uses.entry(*node).or_insert_with(fresh_use);
            u.write_sites += 1;
            u.write_positions.push(*pos);
        }
        Stmt::SetLocal { value, .. } => {
            *pos += 1;
            record_reads(value, loops, *pos, uses);
        }
        // A product reads its operands (and the result, when accumulating) many times per
        // cell, and writes the result.
        Stmt::Gemm(g) => {
            let read = g.accumulate.then_some(g.c.node);
            record_call(uses, pos, [g.a.node, g.b.node].into_iter().chain(read), [g.c.node]);
        }
        // A map reads its inputs (and the result, when a reduction accumulates) and writes
        // the result; a reduction reads its inputs many times per cell.
        Stmt::Map(m) => {
            let read = m.accumulate.then_some(m.out.node);
            record_call(uses, pos, m.inputs.iter().map(|o| o.node).chain(read), [m.out.node]);
        }
        // An attention call reads its inputs many times and writes its results; each result
        // also counts as read, so that no pass removes the call for one unread result (an
        // inference routine never reads the log-sum-exp).
        Stmt::Call(c) => record_call(uses, pos, c.nodes().into_iter(), c.written()),
    }
}

/// A kernel call at the next position: reads (not once per cell), then its writes.
fn record_call(
    uses: &mut FxHashMap<NodeId, NodeUse>,
    pos: &mut usize,
    reads: impl Iterator<Item = NodeId>,
    written: impl IntoIterator<Item = NodeId>,
) {
    *pos += 1;
    for n in reads {
        let u = uses.entry(n).or_insert_with(fresh_use);
        u.read_sites += 1;
        u.read_positions.push(*pos);
        u.reads_once_per_cell = false;
    }
    for w in written {
        let u = uses.entry(w).or_insert_with(fresh_use);
        u.write_sites += 1;
        u.write_positions.push(*pos);
    }
}

fn fresh_use() -> NodeUse {
    NodeUse { reads_once_per_cell: true, ..NodeUse::default() }
}

fn record_reads(
    value: &Expr,
    loops: &[(Var, usize)],
    pos: usize,
    uses: &mut FxHashMap<NodeId, NodeUse>,
) {
    value.visit(&mut |e| {
        if let Expr::Get(n, idx) = e {
            let u = uses.entry(*n).or_insert_with(fresh_use);
            u.read_sites += 1;
            u.read_positions.push(pos);
            u.reads_once_per_cell &= once_per_cell(idx, loops);
        }
    });
}

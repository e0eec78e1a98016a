//! Memory planning: a routine's intermediates share one arena, each holding its bytes only
//! while it is live.
//!
//! An intermediate the optimizer could not inline (read many times, or too costly to
//! recompute) needs memory, but only from the statement that first writes it to the last one
//! that reads it. Giving each its own buffer for the life of the context made a routine's
//! memory the sum of all its intermediates: a training step keeps every forward activation
//! *and* every backward temporary at once, and a document of many large intermediates fails a
//! memory limit that its live data fits in easily.
//!
//! The plan works on top-level statements, because that is the grain every backend keeps:
//! statements run in order (the interpreter walks them, CUDA launches kernels on one stream,
//! gccjit's steps are runs of consecutive statements and a parallel step is one statement, and
//! the CPU schedule rewrites each statement in place). An intermediate's lifetime is the span
//! from the first to the last statement touching it, both included, so one whose lifetime
//! ends in the statement where another's begins never shares its bytes. Offsets come from a
//! greedy interval colouring: largest first, each at the lowest 64-byte-aligned offset that is
//! free for its whole lifetime. The arena's size is the routine's peak, which is what the
//! memory estimate counts ([`super::estimate`]).
//!
//! A statement that only fills an intermediate with a constant (backpropagation zeroes every
//! gradient up front) is first moved down to the next statement touching it, so that the
//! intermediate is not live, doing nothing, for most of the routine.
//!
//! When an intermediate's lifetime begins, its bytes hold whatever an earlier one left there,
//! where a fresh buffer held zeros. Most first statements overwrite every cell before reading
//! any (a loop nest over the whole tensor, or the neutral fill of a reduction); an intermediate
//! whose first statement cannot be shown to do that gets an explicit zero fill just before
//! it, so every run computes what it computed with its own zeroed buffer.

use rustc_hash::{FxHashMap, FxHashSet};

use super::{Arena, ArenaSlot, Expr, Program, Stmt, Var, nodes_of};
use crate::tnode::{NodeId, TensorNode};

/// Alignment of every buffer and of every arena slot: a cache line, and the alignment of
/// AVX-512 vectors.
pub const ALIGN: usize = 64;

/// Plans the arena of `prog`'s intermediates: the materialized nodes that need not outlive the
/// routine (memory mode below `OnDevice`) and have no buffer yet (`has_buffer` is false). A
/// node that already has a buffer keeps it. Inserts the zero fills described above.
pub fn plan_arena(prog: &mut Program, has_buffer: impl Fn(NodeId) -> bool) {
    let candidates: FxHashSet<NodeId> = prog
        .materialized_nodes()
        .into_iter()
        .filter(|n| {
            prog.nodes.get(n).is_some_and(|node| {
                !node.memory.is_persistent() && node.num_elements() > 0 && !has_buffer(*n)
            }) && prog.scratch_of(*n).is_none()
        })
        .collect();
    if candidates.is_empty() {
        prog.arena = Arena::default();
        return;
    }
    sink_fills(&mut prog.body, &candidates);
    // Zero fills for the intermediates whose first statement might read an unwritten cell.
    let live = lifetimes(&prog.body, &candidates);
    let mut fills: FxHashMap<usize, Vec<NodeId>> = FxHashMap::default();
    for (&n, &(first, _)) in &live {
        if !overwrites_before_reading(&prog.body[first], &prog.nodes[&n]) {
            fills.entry(first).or_default().push(n);
        }
    }
    let live = if fills.is_empty() {
        live
    } else {
        let body = std::mem::take(&mut prog.body);
        let mut out = Vec::with_capacity(body.len() + fills.len());
        for (i, s) in body.into_iter().enumerate() {
            if let Some(nodes) = fills.get_mut(&i) {
                nodes.sort();
                for n in nodes.iter() {
                    let node = prog.nodes[n].clone();
                    out.push(prog.fill_const(&node, 0.0));
                }
            }
            out.push(s);
        }
        prog.body = out;
        lifetimes(&prog.body, &candidates)
    };
    prog.arena = colour(&live, |n| bytes_of(&prog.nodes[&n]));
}

/// Moves each top-level statement that only fills a candidate with constants down to just
/// before the next statement touching that candidate, so that its lifetime starts where it is
/// used. Backpropagation zeroes every gradient first and accumulates into each much later;
/// without this, every intermediate's gradient would be live for the whole backward pass.
/// Moving a statement past statements that do not touch its node changes nothing they compute.
fn sink_fills(body: &mut Vec<Stmt>, candidates: &FxHashSet<NodeId>) {
    let mut pending: FxHashMap<NodeId, Vec<Stmt>> = FxHashMap::default();
    let mut out = Vec::with_capacity(body.len());
    for s in std::mem::take(body) {
        let touched = nodes_of(std::slice::from_ref(&s));
        for n in &touched {
            if let Some(fills) = pending.remove(n) {
                out.extend(fills);
            }
        }
        match constant_fill_of(&s).filter(|n| candidates.contains(n)) {
            Some(n) => pending.entry(n).or_default().push(s),
            None => out.push(s),
        }
    }
    // Fills nothing reads afterwards stay, last, in their original order.
    let mut rest: Vec<(NodeId, Vec<Stmt>)> = pending.into_iter().collect();
    rest.sort_by_key(|(n, _)| *n);
    out.extend(rest.into_iter().flat_map(|(_, s)| s));
    *body = out;
}

/// The node a statement fills with constants, when that is all it does (no reads, no other
/// stores, no locals).
fn constant_fill_of(s: &Stmt) -> Option<NodeId> {
    let mut node = None;
    let mut pure = true;
    s.visit(&mut |s| match s {
        Stmt::Set { node: n, value: Expr::Const(_), .. } => {
            pure &= node.is_none_or(|m| m == *n);
            node = Some(*n);
        }
        Stmt::Set { .. } | Stmt::SetLocal { .. } => pure = false,
        _ => {}
    });
    node.filter(|_| pure)
}

/// The first and last top-level statement touching each candidate.
fn lifetimes(body: &[Stmt], candidates: &FxHashSet<NodeId>) -> FxHashMap<NodeId, (usize, usize)> {
    let mut live: FxHashMap<NodeId, (usize, usize)> = FxHashMap::default();
    for (i, s) in body.iter().enumerate() {
        for n in nodes_of(std::slice::from_ref(s)) {
            if candidates.contains(&n) {
                live.entry(n).and_modify(|r| r.1 = i).or_insert((i, i));
            }
        }
    }
    live
}

/// Bytes a node occupies in the arena: its size rounded up to the alignment.
fn bytes_of(node: &TensorNode) -> usize {
    (node.num_elements() * node.prec.size_in_bytes()).div_ceil(ALIGN) * ALIGN
}

/// Greedy interval colouring: largest first (then earliest, then by node), each at the lowest
/// aligned offset not used by a placed node whose lifetime overlaps its own.
fn colour(live: &FxHashMap<NodeId, (usize, usize)>, bytes: impl Fn(NodeId) -> usize) -> Arena {
    let mut order: Vec<(NodeId, (usize, usize), usize)> =
        live.iter().map(|(&n, &r)| (n, r, bytes(n))).collect();
    order.sort_by(|a, b| b.2.cmp(&a.2).then(a.1.0.cmp(&b.1.0)).then(a.0.cmp(&b.0)));
    let mut placed: Vec<ArenaSlot> = Vec::with_capacity(order.len());
    let mut sizes: FxHashMap<NodeId, usize> = FxHashMap::default();
    let mut top = 0usize;
    let mut busy: Vec<(usize, usize)> = Vec::new();
    for (node, (first, last), size) in order {
        busy.clear();
        busy.extend(
            placed
                .iter()
                .filter(|p| p.live.0 <= last && first <= p.live.1)
                .map(|p| (p.offset, p.offset + sizes[&p.node])),
        );
        busy.sort_unstable();
        let mut offset = 0;
        for &(start, end) in &busy {
            if start >= offset + size {
                break;
            }
            offset = offset.max(end);
        }
        top = top.max(offset + size);
        sizes.insert(node, size);
        placed.push(ArenaSlot { node, offset, live: (first, last) });
    }
    placed.sort_by_key(|s| s.node);
    Arena { bytes: top, slots: placed }
}

/// Whether `s`, run with arbitrary contents in `node`, writes every cell of it before reading
/// any: one store to it, under loops only (no guard), whose index runs each axis through a
/// distinct enclosing loop of the axis' extent (or is 0 on an axis of size 1), and no read of
/// the node anywhere in the statement.
fn overwrites_before_reading(s: &Stmt, node: &TensorNode) -> bool {
    struct Walk<'a> {
        node: &'a TensorNode,
        loops: Vec<(Var, usize)>,
        stores: usize,
        covering: bool,
        reads: bool,
    }
    impl Walk<'_> {
        fn stmt(&mut self, s: &Stmt, guarded: bool) {
            match s {
                Stmt::For { var, extent, body, .. } => {
                    self.loops.push((*var, *extent));
                    body.iter().for_each(|b| self.stmt(b, guarded));
                    self.loops.pop();
                }
                Stmt::If { body, .. } => body.iter().for_each(|b| self.stmt(b, true)),
                Stmt::Set { node, idx, value } => {
                    self.expr(value);
                    if *node == self.node.id {
                        self.stores += 1;
                        self.covering = !guarded && self.covers(idx);
                    }
                }
                Stmt::SetLocal { value, .. } => self.expr(value),
                // Counted as a read of every operand: it is not known to write every cell.
                Stmt::Gemm(g) => self.reads |= g.operands().iter().any(|o| o.node == self.node.id),
                Stmt::Map(m) => self.reads |= m.operands().any(|o| o.node == self.node.id),
                Stmt::Call(c) => self.reads |= c.nodes().contains(&self.node.id),
                Stmt::Comment(_) => {}
            }
        }

        fn expr(&mut self, e: &Expr) {
            e.visit(&mut |e| {
                if let Expr::Get(n, _) = e {
                    self.reads |= *n == self.node.id;
                }
            });
        }

        fn covers(&self, idx: &[super::Index]) -> bool {
            if idx.len() != self.node.dims.len() {
                return false;
            }
            let mut used: Vec<Var> = Vec::with_capacity(idx.len());
            idx.iter().zip(&self.node.dims).all(|(i, &d)| {
                if d == 1 && i.terms.is_empty() && i.offset == 0 {
                    return true;
                }
                let Some(v) = i.as_var() else { return false };
                let fits = self.loops.iter().any(|&(l, e)| l == v && e == d);
                let fresh = !used.contains(&v);
                used.push(v);
                fits && fresh
            })
        }
    }
    let mut w = Walk { node, loops: Vec::new(), stores: 0, covering: false, reads: false };
    w.stmt(s, false);
    w.stores == 1 && w.covering && !w.reads
}

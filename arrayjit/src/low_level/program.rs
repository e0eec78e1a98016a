//! A routine in the low-level IR (its statements, locals, nodes, runtime symbols and memory
//! plan) and the methods that passes use to extend it.

use rustc_hash::FxHashMap;

use super::{Expr, Index, LocalId, Stmt, Var, nodes_of};
use crate::indexing::Symbol;
use crate::ops::Prec;
use crate::tnode::{NodeId, TensorNode};

/// A routine in the low-level IR, with everything a backend needs to know about it.
#[derive(Clone, Debug)]
pub struct Program {
    /// The routine's name.
    pub name: String,
    /// The statements.
    pub body: Vec<Stmt>,
    /// The precision of each local, indexed by [`LocalId`].
    pub locals: Vec<Prec>,
    /// The next fresh loop variable number.
    pub next_var: u32,
    /// The nodes the routine refers to.
    pub nodes: FxHashMap<NodeId, TensorNode>,
    /// The nodes the optimizer removed (no buffer needed for this routine).
    pub virtual_nodes: Vec<NodeId>,
    /// Runtime symbols, in slot order (the order bindings are passed to backends).
    pub runtime_symbols: Vec<Symbol>,
    /// Range checks for indices that depend on runtime symbols, checked when running.
    pub runtime_checks: Vec<RuntimeCheck>,
    /// Buffers introduced by the CPU schedule ([`schedule`](super::schedule)): not tensors of
    /// the context, owned by the compiled routine. Empty before scheduling.
    pub scratch: Vec<Scratch>,
    /// Where the materialized intermediates live: one arena per routine, shared by
    /// intermediates whose lifetimes do not overlap ([`memory`](super::memory)). Empty until
    /// planned.
    pub arena: Arena,
}

/// The memory plan of a routine's intermediates: each occupies `bytes` of one arena from its
/// offset, only between its first and last top-level statement.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Arena {
    /// The arena's size: the peak of the intermediates' memory over the routine.
    pub bytes: usize,
    /// One slot per intermediate, sorted by node.
    pub slots: Vec<ArenaSlot>,
}

/// Where one intermediate lives in its routine's arena.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub struct ArenaSlot {
    /// The node.
    pub node: NodeId,
    /// Its byte offset in the arena (a multiple of 64).
    pub offset: usize,
    /// Its lifetime: the first and the last top-level statement touching it.
    pub live: (usize, usize),
}

impl Arena {
    /// The byte offset of a node in the arena, if it lives there.
    pub fn offset_of(&self, node: NodeId) -> Option<usize> {
        let k = self.slots.binary_search_by_key(&node, |s| s.node).ok()?;
        Some(self.slots[k].offset)
    }
}

/// A buffer the CPU schedule introduced: a packed copy of an operand, or partial sums.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Scratch {
    /// The node (in [`Program::nodes`]).
    pub node: NodeId,
    /// Each thread needs its own copy, and its values do not outlive one call of the step that
    /// uses it: a small array on the stack of the generated function. Otherwise one buffer of
    /// the routine, shared by its steps and threads.
    pub per_thread: bool,
}

/// A bounds condition that depends on runtime symbols: for every value of the loop
/// variables, `lo + Σ c·sym >= 0` and `hi + Σ c·sym < bound`.
#[derive(Clone, Debug, PartialEq)]
pub struct RuntimeCheck {
    /// The indexed node.
    pub node: NodeId,
    /// The axis.
    pub axis: usize,
    /// The symbol terms.
    pub sym_terms: Vec<(i64, Symbol)>,
    /// The smallest value of the loop-variable part plus the offset.
    pub lo: i64,
    /// The largest value of the loop-variable part plus the offset.
    pub hi: i64,
    /// The axis' size.
    pub bound: usize,
}

impl Program {
    /// The precision an expression storing to a `target` tensor is computed in: the target's
    /// compute precision ([`Prec::compute`]: `f32` for `f16`, `bf16` and `f32`), or `f64` when
    /// the expression reads an `f64` tensor or local. A rule of the IR that every backend
    /// follows, so that they all round at the same places.
    pub fn compute_prec(&self, e: &Expr, target: Prec) -> Prec {
        let mut p = target.compute();
        e.visit(&mut |e| match e {
            Expr::Get(n, _) if self.nodes.get(n).is_some_and(|n| n.prec == Prec::F64) => {
                p = Prec::F64;
            }
            Expr::Local(l) if self.locals.get(l.0 as usize) == Some(&Prec::F64) => p = Prec::F64,
            _ => {}
        });
        p
    }

    /// A fresh loop variable.
    pub fn fresh_var(&mut self) -> Var {
        let v = Var(self.next_var);
        self.next_var += 1;
        v
    }

    /// A fresh local of precision `prec`.
    pub fn fresh_local(&mut self, prec: Prec) -> LocalId {
        self.locals.push(prec);
        LocalId(self.locals.len() as u32 - 1)
    }

    /// The nodes that need a buffer: those the routine reads or writes after optimization.
    pub fn materialized_nodes(&self) -> Vec<NodeId> {
        nodes_of(&self.body)
    }

    /// Whether `n` is a scratch buffer of the schedule, and which kind.
    pub fn scratch_of(&self, n: NodeId) -> Option<Scratch> {
        self.scratch.iter().find(|s| s.node == n).copied()
    }

    /// A fresh node id: one above every node the program knows.
    pub fn fresh_node_id(&self) -> NodeId {
        NodeId(self.nodes.keys().map(|n| n.0 + 1).max().unwrap_or(0))
    }

    /// Loops over every cell of `dims`, with the body built from the index of each axis: a
    /// loop variable, or the constant 0 for an axis of size 1 (which gets no loop: a tensor of
    /// a hundred thousand size-1 axes is one cell, not a nest of a hundred thousand loops).
    pub fn fill_loops(&mut self, dims: &[usize], body: impl FnOnce(&[Index]) -> Stmt) -> Stmt {
        let vars: Vec<Option<Var>> =
            dims.iter().map(|&d| (d != 1).then(|| self.fresh_var())).collect();
        let idx: Vec<Index> =
            vars.iter().map(|v| v.map_or_else(|| Index::fixed(0), Index::var)).collect();
        let mut stmt = body(&idx);
        for (v, &d) in vars.iter().zip(dims).rev() {
            if let Some(v) = v {
                stmt =
                    Stmt::For { var: *v, extent: d, limit: None, parallel: true, body: vec![stmt] };
            }
        }
        stmt
    }

    /// Sets every cell of `node` to `value`.
    pub fn fill_const(&mut self, node: &TensorNode, value: f64) -> Stmt {
        self.fill_loops(&node.dims, |idx| Stmt::Set {
            node: node.id,
            idx: idx.to_vec(),
            value: Expr::Const(value),
        })
    }

    /// The slot of a runtime symbol.
    pub fn symbol_slot(&self, s: Symbol) -> Option<usize> {
        self.runtime_symbols.iter().position(|x| *x == s)
    }
}

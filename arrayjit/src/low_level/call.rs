//! Kernel calls in loop nests: operations no nest of this IR can say well, called as one
//! statement.
//!
//! Two operations lower to a [`Call`] instead of nests: the fused attention ([`AttentionCall`],
//! which keeps the scores out of memory) and the table lookup ([`GatherCall`], whose index is
//! read from a tensor, while the IR's indices are affine in loop variables). Lowering puts all
//! calls of one assignment in one top-level statement (parallel loops around them). The native
//! backend calls a kernel per call, through its run table; every other backend (and native code
//! where the kernel does not apply: bounds checks, a routine run once, other precisions) gets
//! ordinary nests computing the same values from [`expand_calls`], run before the memory plan.
//!
//! Every pass sees a call through the same methods: the nodes it reads and writes, the work it
//! does, its pointers and descriptor words (the kernel's arguments), and its printed form.

use std::fmt;

use super::{AttentionCall, GatherCall, Index, Program, Stmt};
use crate::tnode::NodeId;

/// A kernel call (see the module documentation).
#[derive(Clone, Debug, PartialEq)]
pub enum Call {
    /// One (batch, head) pair of a fused attention.
    Attention(AttentionCall),
    /// One part of a table lookup or of its gradient.
    Gather(GatherCall),
}

/// The kernels a call can be to, named for the run table and listings.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub enum Kernel {
    /// [`crate::kernels::attention::rc_attention_f32`].
    AttentionF32,
    /// [`crate::kernels::gather::rc_gather_f32`].
    GatherF32,
}

impl Kernel {
    /// The entry point's name.
    pub fn name(self) -> &'static str {
        match self {
            Kernel::AttentionF32 => "rc_attention_f32",
            Kernel::GatherF32 => "rc_gather_f32",
        }
    }
}

impl Call {
    /// Every node the call reads or writes, sorted.
    pub fn nodes(&self) -> Vec<NodeId> {
        match self {
            Call::Attention(a) => a.nodes(),
            Call::Gather(g) => g.nodes(),
        }
    }

    /// The nodes the call writes.
    pub fn written(&self) -> Vec<NodeId> {
        match self {
            Call::Attention(a) => a.asgn.written(),
            Call::Gather(g) => vec![g.asgn.written()],
        }
    }

    /// The call with every node renamed by `f`.
    pub fn map_nodes(&self, f: impl FnMut(NodeId) -> NodeId) -> Call {
        match self {
            Call::Attention(a) => Call::Attention(a.map_nodes(f)),
            Call::Gather(g) => Call::Gather(g.map_nodes(f)),
        }
    }

    /// The call with its index (the attention's pair, the lookup's part) rewritten by `f`.
    pub fn map_index(&self, f: impl FnOnce(&Index) -> Index) -> Call {
        match self {
            Call::Attention(a) => Call::Attention(AttentionCall { pair: f(&a.pair), ..a.clone() }),
            Call::Gather(g) => Call::Gather(GatherCall { start: f(&g.start), ..g.clone() }),
        }
    }

    /// The call's own index (the attention's pair, the lookup's part), affine in the enclosing
    /// loops.
    pub fn index(&self) -> &Index {
        match self {
            Call::Attention(a) => &a.pair,
            Call::Gather(g) => &g.start,
        }
    }

    /// The arithmetic of one call in multiply-adds (cells copied, for a lookup).
    pub fn steps(&self) -> usize {
        match self {
            Call::Attention(a) => a.steps(),
            Call::Gather(g) => g.steps(),
        }
    }

    /// The kernel called.
    pub fn kernel(&self) -> Kernel {
        match self {
            Call::Attention(_) => Kernel::AttentionF32,
            Call::Gather(_) => Kernel::GatherF32,
        }
    }

    /// The tensors the kernel takes, in its order, `None` where it takes a null pointer.
    pub fn pointers(&self) -> Vec<Option<NodeId>> {
        match self {
            Call::Attention(a) => a.pointers().to_vec(),
            Call::Gather(g) => g.pointers().map(Some).to_vec(),
        }
    }

    /// The descriptor words, affine in the enclosing loops and the runtime symbols.
    pub fn descriptor(&self) -> Vec<Index> {
        match self {
            Call::Attention(a) => a.descriptor().to_vec(),
            Call::Gather(g) => g.descriptor().to_vec(),
        }
    }
}

impl fmt::Display for Call {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Call::Attention(a) => write!(f, "{a}"),
            Call::Gather(g) => write!(f, "{g}"),
        }
    }
}

/// Replaces every top-level statement holding calls that `native` refuses by the ordinary nests
/// of its operation (adding the tensors those need to the program); whether it replaced any.
pub fn expand_calls(prog: &mut Program, native: impl Fn(&Program, &Call) -> bool) -> bool {
    let mut expanded = false;
    let body = std::mem::take(&mut prog.body);
    let mut out = Vec::with_capacity(body.len());
    for s in body {
        let mut calls = Vec::new();
        s.visit(&mut |s| {
            if let Stmt::Call(c) = s {
                calls.push((**c).clone());
            }
        });
        // Lowering puts all calls of one assignment under one statement.
        match calls.first() {
            Some(call) if !native(prog, call) => {
                expanded = true;
                match call {
                    Call::Attention(a) => out.extend(super::attention::expand(prog, a)),
                    Call::Gather(g) => out.extend(super::gather::expand(prog, g)),
                }
            }
            _ => out.push(s),
        }
    }
    prog.body = out;
    expanded
}

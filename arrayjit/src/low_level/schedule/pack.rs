//! Packing: copies of operands laid out for the column loop of [`super::axpy`].
//!
//! The in-place kernel vectorizes its column loop `j`, so every operand that depends on `j`
//! must be contiguous along it. In `c[i,j] = Σ_k a[i,k]·b[j,k]` (a dense layer with weights
//! stored `[out, in]`, attention scores `q·kᵀ`) and in a convolution whose kernel is stored
//! `[out channel, kh, kw, in channel]`, the operand indexed by `j` has its reduction axis
//! innermost instead. Such an operand is copied, before the contraction, into a scratch buffer
//! whose axes are the loop variables it depends on with `j` last:
//!
//! ```text
//! for .. par { for j0 { for u0 { for j1 { for u1 {            (16 × 16 blocks)
//!   b.packed[.., u, j] := b[.., j, u]                          (j = 16*j0 + j1, u = 16*u0 + u1)
//! }}}}}
//! ```
//!
//! where `u` is the variable the original is contiguous along: reads are contiguous within a
//! block row, writes within a block column, and a 16 × 16 block of either fits in L1. The copy
//! costs one pass over the operand, so it is made only when at least [`PACK_MIN_REUSE`] rows of
//! `c` share it, when the copy is not much larger than the operand (no Toeplitz expansion of a
//! convolution's input), and when every index stays inside its axis without a guard.

use super::{Loop, Nest, PACK_MIN_REUSE, Update, flat_stride, largest_divisor, lin, reads, wrap};
use crate::low_level::{Expr, IdxVar, Index, Program, Scratch, Stmt, Var};
use crate::ops::Prec;
use crate::tnode::{MemoryMode, NodeId, TensorNode};

/// Block edge of the transposing copy.
const BLOCK: usize = 16;

/// Whether some read of the nest's contributions is neither invariant nor contiguous along `j`.
pub(super) fn needed(prog: &Program, nest: &Nest, j: Var) -> bool {
    nest.update
        .contributions()
        .iter()
        .any(|e| reads(e).iter().any(|(n, idx)| !matches!(flat_stride(prog, *n, idx, j), 0 | 1)))
}

/// Replaces, in `update`, every read whose stride along `j` is neither 0 (hoisted out of the
/// column loop) nor 1 (contiguous) by a read of a packed copy; returns the nests that fill the
/// copies (empty when nothing needs packing), or `None` when a read cannot be packed.
pub(super) fn pack_operands(
    prog: &mut Program,
    nest: &Nest,
    j: Var,
    update: &mut Update,
) -> Option<Vec<Stmt>> {
    let mut todo: Vec<(NodeId, Vec<Index>)> = Vec::new();
    for e in update.contributions() {
        for r in reads(e) {
            let s = flat_stride(prog, r.0, &r.1, j);
            if s != 0 && s != 1 && !todo.contains(&r) {
                todo.push(r);
            }
        }
    }
    let mut out = Vec::new();
    for (node, idx) in todo {
        let (packed, fill) = pack_one(prog, nest, j, node, &idx)?;
        out.push(fill);
        let pidx: Vec<Index> = packed.1.iter().map(|v| Index::var(*v)).collect();
        for e in update.contributions_mut() {
            *e = std::mem::replace(e, Expr::Const(0.0)).rewrite(&mut |x| match x {
                Expr::Get(n, i) if n == node && i == idx => Expr::Get(packed.0, pidx.clone()),
                x => x,
            });
        }
    }
    Some(out)
}

/// The loop variables an index list depends on, in the nest's loop order; `None` when it
/// mentions a variable that is not a loop of the nest.
fn vars_of(nest: &Nest, idx: &[Index]) -> Option<Vec<Var>> {
    for i in idx {
        for (_, x) in &i.terms {
            if let IdxVar::Loop(v) = x {
                nest.extent(*v)?;
            }
        }
    }
    Some(
        nest.lhs
            .iter()
            .chain(&nest.red)
            .map(|l| l.var)
            .filter(|v| idx.iter().any(|i| i.uses(*v)))
            .collect(),
    )
}

/// Whether every index stays inside its axis for all values of the loop variables (symbol
/// terms are range-checked when the routine runs, for all loop values, so they are ignored).
fn in_bounds(prog: &Program, nest: &Nest, node: NodeId, idx: &[Index]) -> bool {
    let dims = &prog.nodes[&node].dims;
    idx.iter().zip(dims).all(|(i, &d)| {
        let (mut lo, mut hi) = (i.offset, i.offset);
        for &(c, x) in &i.terms {
            let IdxVar::Loop(v) = x else { continue };
            let Some(e) = nest.extent(v) else { return false };
            let top = c * (e as i64 - 1);
            if top > 0 {
                hi += top;
            } else {
                lo += top;
            }
        }
        i.terms.iter().any(|(_, x)| matches!(x, IdxVar::Sym(_))) || (lo >= 0 && hi < d as i64)
    })
}

/// Packs one read: the scratch node with its index variables, and the nest filling it.
fn pack_one(
    prog: &mut Program,
    nest: &Nest,
    j: Var,
    node: NodeId,
    idx: &[Index],
) -> Option<((NodeId, Vec<Var>), Stmt)> {
    let vars = vars_of(nest, idx)?;
    if !in_bounds(prog, nest, node, idx) {
        return None;
    }
    let ext = |v: Var| nest.extent(v).unwrap_or(1);
    let reuse: usize =
        nest.lhs.iter().filter(|l| !vars.contains(&l.var)).map(|l| l.extent).product();
    let size: usize = vars.iter().map(|v| ext(*v)).product();
    let orig = &prog.nodes[&node];
    if reuse < PACK_MIN_REUSE || size > 2 * orig.num_elements() + 1024 {
        return None;
    }
    let mut order: Vec<Var> = vars.iter().copied().filter(|v| *v != j).collect();
    order.push(j);
    let prec = match orig.prec {
        Prec::F16 | Prec::Bf16 => Prec::F32,
        p => p,
    };
    let id = prog.fresh_node_id();
    let dims: Vec<usize> = order.iter().map(|v| ext(*v)).collect();
    let label = format!("{}.packed", orig.label);
    prog.nodes.insert(id, TensorNode::new(id, &label, &dims, prec, MemoryMode::Local));
    prog.scratch.push(Scratch { node: id, per_thread: false });

    // The variable the original is contiguous along, if any: blocked together with `j`.
    let u = vars.iter().copied().find(|v| *v != j && flat_stride(prog, node, idx, *v) == 1);
    let fill = match u {
        Some(u) => {
            let (bj, bu) = (largest_divisor(ext(j), BLOCK, 1), largest_divisor(ext(u), BLOCK, 1));
            let [j0, u0, j1, u1] = [(); 4].map(|_| prog.fresh_var());
            let sub = |v: Var| {
                if v == j {
                    Some(lin(&[(bj, j0), (1, j1)], 0))
                } else if v == u {
                    Some(lin(&[(bu, u0), (1, u1)], 0))
                } else {
                    None
                }
            };
            let dst: Vec<Index> = order.iter().map(|v| Index::var(*v).subst(&sub)).collect();
            let src: Vec<Index> = idx.iter().map(|i| i.subst(&sub)).collect();
            let set = Stmt::Set { node: id, idx: dst, value: Expr::Get(node, src) };
            let mut loops: Vec<Loop> = order
                .iter()
                .filter(|v| **v != j && **v != u)
                .map(|v| Loop { var: *v, extent: ext(*v), limit: None, parallel: false })
                .collect();
            loops.extend([
                Loop { var: j0, extent: ext(j) / bj, limit: None, parallel: false },
                Loop { var: u0, extent: ext(u) / bu, limit: None, parallel: false },
                Loop { var: j1, extent: bj, limit: None, parallel: false },
                Loop { var: u1, extent: bu, limit: None, parallel: false },
            ]);
            loops[0].parallel = true;
            wrap(&loops, vec![set])
        }
        None => {
            let dst: Vec<Index> = order.iter().map(|v| Index::var(*v)).collect();
            let set = Stmt::Set { node: id, idx: dst, value: Expr::Get(node, idx.to_vec()) };
            let mut loops: Vec<Loop> = order
                .iter()
                .map(|v| Loop { var: *v, extent: ext(*v), limit: None, parallel: false })
                .collect();
            loops[0].parallel = true;
            wrap(&loops, vec![set])
        }
    };
    Some(((id, order), fill.into_iter().next()?))
}

//! The lane kernel: reductions vectorized along a contiguous reduction axis.
//!
//! When the innermost reduction loop `k` (in no guard, at least one vector long) is contiguous
//! in every operand that depends on it — an output layer with 10 classes, a matrix-vector
//! product, a row sum, and `A·Bᵀ` products whose reduction is long (see [`use_for_transposed`])
//! — each cell's reduction is split into `L` lanes (16 for f32, 8 for f64) of partial results
//! in a per-thread array `s`, combined at the end. Up to [`MR`] × [`NR`] cells (rows `i`,
//! columns `j`: lhs loops that each alone index an axis of `c`, in no guard) are computed
//! together, so an operand read for one row serves every column and vice versa:
//!
//! ```text
//! for <lhs loops, i and j by blocks> { [if <cell guards>] {
//!   for l in 0..L { s[r, q, l] := neutral }                         for every r < MR, q < NR
//!   for <reduction loops but k> { [if <point guards>] {
//!     for k0 in 0..K/L { for l in 0..L { s[r, q, l] := s[r, q, l] ⊕ e(i_r, j_q, k = L*k0 + l) } }
//!     for l in 0..K%L { s[r, q, l] := s[r, q, l] ⊕ e(i_r, j_q, k = L*(K/L) + l) }   (remainder)
//!   } }
//!   t := init; for l in 0..L { t := t ⊕ s[r, q, l] }; c[i_r, j_q] := t
//! } }
//! ```
//!
//! The lane loop is contiguous in `s` and in the operands, so GCC vectorizes it into one
//! vector operation per cell and step without being allowed to reassociate floating-point
//! arithmetic itself; `s` lives on the stack of the generated function, which GCC knows no
//! operand aliases, so its MR × NR vectors stay in registers across the `k0` loop. The
//! summation order differs from the sequential one (by lanes, like every vectorized BLAS),
//! within the rounding the conformance suite allows.

use super::{Loop, MIN_LANES_WORK, Nest, flat_stride, lin, reads, sole_axis, uses_var, wrap};
use crate::low_level::{Expr, Index, Limit, Program, Scratch, Stmt, Var};
use crate::ops::{BinOp, Prec};
use crate::tnode::{MemoryMode, NodeId, TensorNode};

/// Rows per block (at most).
pub const MR: usize = 4;
/// Columns per block (at most).
pub const NR: usize = 4;
/// The shortest reduction for which the lane kernel beats packing an operand of an `A·Bᵀ`
/// product for the in-place kernel: combining the lanes costs about as much as 16 vector
/// steps per cell, copying the operand about 1 cycle per element.
pub const TRANSPOSED_MIN_K: usize = 512;

fn lanes(prec: Prec) -> usize {
    if prec == Prec::F64 { 8 } else { 16 }
}

/// The reduction loop the lanes run along, if the nest has one: the innermost reduction loop,
/// in no guard, at least one vector long, contiguous in every read that depends on it.
fn lane_loop(prog: &Program, nest: &Nest) -> Option<Loop> {
    let k = *nest.red.last()?;
    if k.extent < lanes(nest.prec) || nest.guarded(k.var) || nest.work() < MIN_LANES_WORK {
        return None;
    }
    let mut contiguous = false;
    for e in nest.update.contributions() {
        if !uses_var(e, k.var) {
            continue;
        }
        let mut ok = true;
        e.visit(&mut |x| match x {
            Expr::IndexValue(i) | Expr::Uniform { offset: i, .. } if i.uses(k.var) => ok = false,
            _ => {}
        });
        for (n, idx) in reads(e) {
            match flat_stride(prog, n, &idx, k.var) {
                0 => {}
                1 => contiguous = true,
                _ => ok = false,
            }
        }
        if !ok {
            return None;
        }
    }
    (contiguous && nest.update.combine_op().neutral().is_some()).then_some(k)
}

/// Whether an `A·Bᵀ`-like nest (whose in-place kernel needs a packed operand) should use the
/// lane kernel instead: its reduction is long enough.
pub(super) fn use_for_transposed(prog: &Program, nest: &Nest) -> bool {
    lane_loop(prog, nest).is_some_and(|k| k.extent >= TRANSPOSED_MIN_K)
}

/// A blocking loop: an lhs loop alone indexing an axis of `c`, in no guard; its block size.
fn blocked(nest: &Nest, l: &Loop, most: usize) -> Option<usize> {
    if nest.guarded(l.var) || !sole_axis(nest, l.var) {
        return None;
    }
    [most, 2].into_iter().find(|b| *b <= most && l.extent.is_multiple_of(*b))
}

/// The rewritten statements, or `None` when no reduction loop qualifies.
pub(super) fn rewrite(prog: &mut Program, nest: &Nest) -> Option<Vec<Stmt>> {
    let k = lane_loop(prog, nest)?;
    let lanes = lanes(nest.prec);
    let op = nest.update.combine_op();
    let neutral = op.neutral()?;
    let block_vars = block_loops(prog, nest);
    let cells: usize = block_vars.iter().map(|(_, _, b)| b).product();
    let positions = block_positions(&block_vars);
    let id = prog.fresh_node_id();
    let label = format!("{}.lanes", prog.nodes[&nest.node].label);
    let dims = [cells, lanes];
    prog.nodes.insert(id, TensorNode::new(id, &label, &dims, nest.prec, MemoryMode::Local));
    prog.scratch.push(Scratch { node: id, per_thread: true });
    let [l0, k0, l1, l2] = [(); 4].map(|_| prog.fresh_var());
    let ls = LaneSums { nest, id, lanes, positions: &positions };
    let red_body = ls.accumulate(k, [k0, l1, l2]);
    let others: Vec<Loop> = nest.red[..nest.red.len() - 1].to_vec();
    let mut cell = vec![Stmt::For {
        limit: None,
        var: l0,
        extent: lanes,
        parallel: true,
        body: (0..cells)
            .map(|c| Stmt::Set { node: id, idx: slot(c, l0), value: Expr::Const(neutral) })
            .collect(),
    }];
    cell.extend(wrap(&others, red_body));
    cell.extend(ls.fold(prog, op));
    if !nest.cell_guards.is_empty() {
        cell = vec![Stmt::If { guards: nest.cell_guards.clone(), body: cell }];
    }
    let loops: Vec<Loop> = nest
        .lhs
        .iter()
        .map(|l| match block_vars.iter().find(|(v, _, _)| *v == l.var) {
            Some(&(_, outer, b)) => Loop {
                var: outer,
                extent: l.extent / b,
                limit: l.limit.map(|m| Limit { size: m.size, per: m.per * b }),
                ..*l
            },
            None => *l,
        })
        .collect();
    Some(wrap(&loops, cell))
}

/// The blocked lhs loops — columns: the innermost blockable lhs loop; rows: the next one out —
/// each with a fresh variable for its blocks and its block size.
fn block_loops(prog: &mut Program, nest: &Nest) -> Vec<(Var, Var, usize)> {
    let mut blocks: Vec<(Loop, usize)> = Vec::new();
    for l in nest.lhs.iter().rev() {
        let most = if blocks.is_empty() { NR } else { MR };
        if let Some(b) = blocked(nest, l, most) {
            blocks.push((*l, b));
            if blocks.len() == 2 {
                break;
            }
        }
    }
    blocks.iter().map(|(l, b)| (l.var, prog.fresh_var(), *b)).collect()
}

/// Every cell of a block, in the order of its slot in the lane buffer: the substitution of
/// the blocked loops.
fn block_positions(block_vars: &[(Var, Var, usize)]) -> Vec<Vec<(Var, Index)>> {
    let mut positions: Vec<Vec<(Var, Index)>> = vec![Vec::new()];
    for &(v, outer, b) in block_vars {
        positions = positions
            .into_iter()
            .flat_map(|p| {
                (0..b).map(move |r| {
                    let mut p = p.clone();
                    p.push((v, lin(&[(b, outer)], r)));
                    p
                })
            })
            .collect();
    }
    positions
}

/// The cell `c`, lane `l` of the lane buffer.
fn slot(c: usize, l: Var) -> Vec<Index> {
    vec![Index::fixed(c as i64), Index::var(l)]
}

/// The partial sums of one block of cells: `lanes` of them per cell, in buffer `id`.
struct LaneSums<'a> {
    nest: &'a Nest,
    id: NodeId,
    lanes: usize,
    positions: &'a [Vec<(Var, Index)>],
}

impl LaneSums<'_> {
    /// The reduction over `k` into the lanes: full groups of `lanes` steps (loop `k0`, lanes
    /// `l1`), then the remainder (lanes `l2`), under the point guards.
    fn accumulate(&self, k: Loop, [k0, l1, l2]: [Var; 3]) -> Vec<Stmt> {
        let (nest, id, lanes) = (self.nest, self.id, self.lanes);
        let sub = |p: &[(Var, Index)], v: Var, at: &Index| {
            if v == k.var {
                return Some(at.clone());
            }
            p.iter().find(|(x, _)| *x == v).map(|(_, i)| i.clone())
        };
        let steps = |l: Var, at: Index| -> Vec<Stmt> {
            self.positions
                .iter()
                .enumerate()
                .map(|(c, p)| {
                    let upd = nest.update.subst(&|v| sub(p, v, &at));
                    let value = upd.apply(Expr::Get(id, slot(c, l)), &|e| e.clone());
                    Stmt::Set { node: id, idx: slot(c, l), value }
                })
                .collect()
        };
        let (full, rem) = (k.extent / lanes, k.extent % lanes);
        let mut red_body = vec![Stmt::For {
            limit: None,
            var: k0,
            extent: full,
            parallel: false,
            body: vec![Stmt::For {
                limit: None,
                var: l1,
                extent: lanes,
                parallel: true,
                body: steps(l1, lin(&[(lanes, k0), (1, l1)], 0)),
            }],
        }];
        if rem > 0 {
            red_body.push(Stmt::For {
                limit: None,
                var: l2,
                extent: rem,
                parallel: true,
                body: steps(l2, lin(&[(1, l2)], lanes * full)),
            });
        }
        if !nest.point_guards.is_empty() {
            red_body = vec![Stmt::If { guards: nest.point_guards.clone(), body: red_body }];
        }
        red_body
    }

    /// Each cell's lanes folded in order with `op` onto its start (the neutral element or
    /// its old value) and stored.
    fn fold(&self, prog: &mut Program, op: BinOp) -> Vec<Stmt> {
        let (nest, id, lanes) = (self.nest, self.id, self.lanes);
        let mut out = Vec::new();
        for (c, p) in self.positions.iter().enumerate() {
            let idx: Vec<Index> = nest
                .idx
                .iter()
                .map(|x| x.subst(&|v| p.iter().find(|(y, _)| *y == v).map(|(_, i)| i.clone())))
                .collect();
            let t = prog.fresh_local(nest.prec);
            let start = match nest.init {
                Some(c) => Expr::Const(c),
                None => Expr::Get(nest.node, idx.clone()),
            };
            let l3 = prog.fresh_var();
            out.push(Stmt::SetLocal { local: t, value: start });
            out.push(Stmt::For {
                limit: None,
                var: l3,
                extent: lanes,
                parallel: false,
                body: vec![Stmt::SetLocal {
                    local: t,
                    value: Expr::bin(op, Expr::Local(t), Expr::Get(id, slot(c, l3))),
                }],
            });
            out.push(Stmt::Set { node: nest.node, idx, value: Expr::Local(t) });
        }
        out
    }
}

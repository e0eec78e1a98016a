//! Long sums in f64, given back to the kernels.
//!
//! Lowering makes a long sum of one tensor's values accumulate in an f64 local (each term
//! computed into a local of the result's compute precision first; docs/lowering.md, "Accurate
//! sums"). No kernel takes that form: they accumulate in the result itself, in its precision.
//! When every term is a plain read of a tensor — a column sum, a bias gradient `Σ_b G[b, j]` —
//! the term is the same value in f32 and in f64, so the nest can accumulate into an f64 copy of
//! its result instead, with the term read directly in f64:
//!
//! ```text
//! for <cells> {                               c.f64 := c                  (only if t starts at c)
//!   t := 0 | c[idx]           (f64)           for <cells> {
//!   for <red> {                        →        t := 0 | c.f64[idx]       (f64)
//!     t1 := x[..]             (f32)             for <red> { t := add(t, x[..]) }
//!     t := add(t, t1)         (f64)             c.f64[idx] := t
//!   }                                         }
//!   c[idx] := t                               c := c.f64                  (rounded once)
//! }
//! ```
//!
//! That is an ordinary f64 reduction, which the in-place and map kernels take; each cell keeps
//! its terms in order and is rounded once, so the bits are the lowered nest's (and the
//! interpreter's). The lane kernel, which would sum in another order, is not used for it.

use super::{Cell, covers_every_cell, interleave, wrap};
use crate::low_level::{Expr, LocalId, Program, Scratch, Stmt};
use crate::ops::{BinOp, Prec};
use crate::tnode::{MemoryMode, NodeId, TensorNode};

/// The nest accumulating into an f64 copy of its result, with the statements to run before it
/// (copying the result in, when the sum adds onto it) and after it (copying it back), or
/// `None` when `s` is not a widened sum of plain reads that writes every cell of its result.
pub(super) fn in_f64(prog: &mut Program, s: &Stmt) -> Option<(Vec<Stmt>, Stmt, Vec<Stmt>)> {
    let (cells, block) = interleave::loops_of(s);
    if cells.is_empty() {
        return None;
    }
    let Cell { local: t, start, red, node, idx } = Cell::of(block)?;
    let c = prog.nodes.get(node)?.clone();
    if prog.locals[t.0 as usize] != Prec::F64 || c.prec == Prec::F64 {
        return None;
    }
    let onto = match start {
        Expr::Const(0.0) => false,
        Expr::Get(n, i) if n == node && i == idx => true,
        _ => return None,
    };
    if !covers_every_cell(idx, &cells, &c.dims) {
        return None;
    }
    let red = direct_terms(prog, red, t)?;
    let id = prog.fresh_node_id();
    let label = format!("{}.f64", c.label);
    prog.nodes.insert(id, TensorNode::new(id, &label, &c.dims, Prec::F64, MemoryMode::Local));
    prog.scratch.push(Scratch { node: id, per_thread: false });
    let copy = |prog: &mut Program, from: NodeId, to: NodeId| {
        prog.fill_loops(&c.dims, |i| Stmt::Set {
            node: to,
            idx: i.to_vec(),
            value: Expr::Get(from, i.to_vec()),
        })
    };
    let before = if onto { vec![copy(prog, c.id, id)] } else { vec![] };
    let after = vec![copy(prog, id, c.id)];
    let start = if onto { Expr::Get(id, idx.to_vec()) } else { Expr::Const(0.0) };
    let body = vec![
        Stmt::SetLocal { local: t, value: start },
        red,
        Stmt::Set { node: id, idx: idx.to_vec(), value: Expr::Local(t) },
    ];
    let nest = wrap(&cells, body).pop()?;
    Some((before, nest, after))
}

/// The reduction loops with `u := x[..]; t := add(t, u)` replaced by `t := add(t, x[..])`,
/// when that is the whole body (under loops and guards) and `x` is a tensor of the compute
/// precision f32 (its values are the same in f64).
fn direct_terms(prog: &Program, red: &Stmt, t: LocalId) -> Option<Stmt> {
    match red {
        Stmt::For { body, .. } => Some(red.with_body(vec![direct_terms_of(prog, body, t)?])),
        _ => None,
    }
}

fn direct_terms_of(prog: &Program, body: &[Stmt], t: LocalId) -> Option<Stmt> {
    match body {
        [inner @ Stmt::For { .. }] => direct_terms(prog, inner, t),
        [guard @ Stmt::If { body, .. }] => {
            Some(guard.with_body(vec![direct_terms_of(prog, body, t)?]))
        }
        [
            Stmt::SetLocal { local: u, value: term @ Expr::Get(n, _) },
            Stmt::SetLocal { local: t2, value: Expr::Binop(BinOp::Add, a, b) },
        ] if *t2 == t
            && matches!(**a, Expr::Local(l) if l == t)
            && matches!(**b, Expr::Local(l) if l == *u)
            && prog.locals[u.0 as usize] == Prec::F32
            && prog.nodes.get(n).is_some_and(|x| x.prec.is_float() && x.prec != Prec::F64) =>
        {
            let sum = Expr::bin(BinOp::Add, Expr::Local(t), term.clone());
            Some(Stmt::SetLocal { local: t, value: sum })
        }
        _ => None,
    }
}

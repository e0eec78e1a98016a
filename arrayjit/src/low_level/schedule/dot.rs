//! The lane kernel: reductions vectorized along a contiguous reduction axis.
//!
//! When no column loop is wide enough for [`super::axpy`] — an output layer with 10 classes,
//! a matrix-vector product, a row sum — but the innermost reduction loop `k` (in no guard, at
//! least one vector long) is contiguous in every operand that depends on it, each cell's
//! reduction is split into `L` lanes (16 for f32, 8 for f64) of partial results in a per-thread
//! array `s`, combined at the end:
//!
//! ```text
//! for <lhs loops> { [if <cell guards>] {
//!   for l in 0..L { s[l] := neutral }
//!   for <reduction loops but k> { [if <point guards>] {
//!     for k0 in 0..K/L { for l in 0..L { s[l] := s[l] ⊕ e(k = L*k0 + l) } }
//!     for l in 0..K%L { s[l] := s[l] ⊕ e(k = L*(K/L) + l) }          (remainder)
//!   } }
//!   t := init; for l in 0..L { t := t ⊕ s[l] }; c[idx] := t
//! } }
//! ```
//!
//! The lane loop is contiguous in `s` and in the operands, so GCC vectorizes it into one
//! vector operation per step without being allowed to reassociate floating-point arithmetic
//! itself; `s` lives on the stack of the generated function, which GCC knows no operand aliases,
//! so it stays in a register across the `k0` loop. The summation order differs from the
//! sequential one (by lanes, like every vectorized BLAS), within the rounding the conformance
//! suite allows.

use super::{Loop, Nest, flat_stride, lin, reads, uses_var, wrap};
use crate::low_level::{Expr, Index, Program, Scratch, Stmt};
use crate::ops::Prec;
use crate::tnode::{MemoryMode, TensorNode};

/// The rewritten statements, or `None` when no reduction loop qualifies.
pub(super) fn rewrite(prog: &mut Program, nest: &Nest) -> Option<Vec<Stmt>> {
    let lanes: usize = if nest.prec == Prec::F64 { 8 } else { 16 };
    let contribs = nest.update.contributions();
    let k = *nest.red.last()?;
    if k.extent < lanes || nest.guarded(k.var) || nest.work() < super::MIN_LANES_WORK {
        return None;
    }
    let mut any = false;
    for e in &contribs {
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
                1 => any = true,
                _ => ok = false,
            }
        }
        if !ok {
            return None;
        }
    }
    let op = nest.update.combine_op();
    let neutral = op.neutral()?;
    if !any {
        return None;
    }

    let id = prog.fresh_node_id();
    let label = format!("{}.lanes", prog.nodes[&nest.node].label);
    prog.nodes.insert(id, TensorNode::new(id, &label, &[lanes], nest.prec, MemoryMode::Local));
    prog.scratch.push(Scratch { node: id, per_thread: true });
    let [l0, k0, l1, l2, l3] = [(); 5].map(|_| prog.fresh_var());
    let lane = |l| vec![Index::var(l)];
    let step = |l, at: Index| {
        let upd = nest.update.subst(&|v| (v == k.var).then(|| at.clone()));
        let value = upd.apply(Expr::Get(id, lane(l)), &|e| e.clone());
        Stmt::Set { node: id, idx: lane(l), value }
    };
    let (full, rem) = (k.extent / lanes, k.extent % lanes);
    let mut red_body = vec![Stmt::For {
        var: k0,
        extent: full,
        parallel: false,
        body: vec![Stmt::For {
            var: l1,
            extent: lanes,
            parallel: true,
            body: vec![step(l1, lin(&[(lanes, k0), (1, l1)], 0))],
        }],
    }];
    if rem > 0 {
        red_body.push(Stmt::For {
            var: l2,
            extent: rem,
            parallel: true,
            body: vec![step(l2, lin(&[(1, l2)], lanes * full))],
        });
    }
    if !nest.point_guards.is_empty() {
        red_body = vec![Stmt::If { guards: nest.point_guards.clone(), body: red_body }];
    }
    let others: Vec<Loop> = nest.red[..nest.red.len() - 1].to_vec();
    let t = prog.fresh_local(nest.prec);
    let start = match nest.init {
        Some(c) => Expr::Const(c),
        None => Expr::Get(nest.node, nest.idx.clone()),
    };
    let mut cell = vec![Stmt::For {
        var: l0,
        extent: lanes,
        parallel: true,
        body: vec![Stmt::Set { node: id, idx: lane(l0), value: Expr::Const(neutral) }],
    }];
    cell.extend(wrap(&others, red_body));
    cell.push(Stmt::SetLocal { local: t, value: start });
    cell.push(Stmt::For {
        var: l3,
        extent: lanes,
        parallel: false,
        body: vec![Stmt::SetLocal {
            local: t,
            value: Expr::bin(op, Expr::Local(t), Expr::Get(id, lane(l3))),
        }],
    });
    cell.push(Stmt::Set { node: nest.node, idx: nest.idx.clone(), value: Expr::Local(t) });
    if !nest.cell_guards.is_empty() {
        cell = vec![Stmt::If { guards: nest.cell_guards.clone(), body: cell }];
    }
    Some(wrap(&nest.lhs, cell))
}

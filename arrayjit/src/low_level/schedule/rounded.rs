//! bf16 products written by the kernel: the pairwise product rounds each cell of a bf16 result
//! when it stores it, instead of working in an f32 copy that a second pass rounds into the
//! result.
//!
//! A nest whose result is bf16 accumulates in f32 and rounds once per cell (`in_f32` in this
//! module's parent gives the kernels an f32 copy of the result to work in, filled from the
//! result before when the reduction adds onto it, copied back rounded after). For the bf16 pair
//! kernel ([`crate::kernels::bf16`]) the copy is not needed: its sums are in f32 registers until
//! it stores them, so it can round there ([`crate::kernels::GEMM_BF16_RESULT`]) and read bf16
//! cells when it accumulates. The same bits — every cell's f32 sum rounded once — without the
//! copy's pass, its f32 buffer (twice the result's bytes, written by the kernel and read back),
//! and the fill before. In a small transformer's bf16 step these copies were 4% of the time.
//!
//! Only when every write of the copy is such a call, each cell written by one call (every loop
//! around a call moves its result, or is its block of rows), and nothing else touches the copy.

use crate::low_level::{Program, Stmt, Var};
use crate::ops::Prec;
use crate::tnode::NodeId;

/// When the statements `stmts` computing the f32 copy `copy` of the bf16 `result` are all calls
/// of the bf16 pair kernel that may write `result` themselves (see the module documentation):
/// rewrites them to, forgets the copy, and returns `true` (the copy's fill before and its copy
/// back after must then be dropped). Otherwise changes nothing.
pub(crate) fn round_in_kernel(
    prog: &mut Program,
    stmts: &mut [Stmt],
    copy: NodeId,
    result: NodeId,
) -> bool {
    if prog.nodes.get(&result).is_none_or(|n| n.prec != Prec::Bf16) {
        return false;
    }
    let mut calls = 0;
    if !stmts.iter().all(|s| allowed(s, copy, &mut Vec::new(), &mut calls)) || calls == 0 {
        return false;
    }
    for s in stmts.iter_mut() {
        retarget(s, copy, result);
    }
    prog.nodes.remove(&copy);
    prog.scratch.retain(|s| s.node != copy);
    true
}

/// Whether `s` touches `copy` only as the result of pair-kernel calls that write each cell
/// once; counts those calls. `around` holds the loops enclosing `s`.
fn allowed(s: &Stmt, copy: NodeId, around: &mut Vec<Var>, calls: &mut usize) -> bool {
    match s {
        Stmt::Comment(_) => true,
        Stmt::For { var, body, .. } => {
            around.push(*var);
            let ok = body.iter().all(|s| allowed(s, copy, around, calls));
            around.pop();
            ok
        }
        Stmt::If { body, .. } => body.iter().all(|s| allowed(s, copy, around, calls)),
        Stmt::Gemm(g) => {
            if g.a.node == copy || g.b.node == copy {
                return false;
            }
            if g.c.node != copy {
                return true;
            }
            // A loop around the call that does not move its result would write its cells
            // again (a reduction split across calls): rounding each call's partial sum would
            // round twice.
            let moves = |v: &Var| g.c.offset.uses(*v) || g.rows.is_some_and(|(r, _)| r == *v);
            *calls += 1;
            g.bf16_pairs && g.prec == Prec::F32 && g.epilogue.is_none() && around.iter().all(moves)
        }
        Stmt::Map(m) => m.operands().all(|o| o.node != copy),
        Stmt::Call(c) => !c.nodes().contains(&copy),
        Stmt::Set { node, value, .. } => *node != copy && !value.reads(copy),
        Stmt::SetLocal { value, .. } => !value.reads(copy),
    }
}

/// Makes the pair-kernel calls writing `copy` write `result` in bf16.
fn retarget(s: &mut Stmt, copy: NodeId, result: NodeId) {
    match s {
        Stmt::For { body, .. } | Stmt::If { body, .. } => {
            body.iter_mut().for_each(|s| retarget(s, copy, result))
        }
        Stmt::Gemm(g) if g.c.node == copy => {
            g.c.node = result;
            g.prec = Prec::Bf16;
        }
        _ => {}
    }
}

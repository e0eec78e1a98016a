//! Accumulations onto zeros: a pointwise nest that adds onto a tensor zeroed earlier reads `+0`
//! instead of the tensor, and the fill goes.
//!
//! Backpropagation zeroes each gradient and then accumulates every contribution into it:
//! `g := 0`, later `g := g + c` (or `g := fma(a, b, g)`), later more. The first accumulation
//! then reads zeros the fill just wrote, and the fill itself is a pass over `g`: in a small
//! transformer's step, 60 fills and as many first accumulations of activation-sized gradients.
//! When nothing between the fill and the nest touches `g`, and the nest writes every cell of
//! `g` once as a sum onto it (`g + c`, `c + g`, `fma(a, b, g)`: GCC keeps `x + 0`, where it
//! would fold `x - 0` or `1 * x` and so keep a signalling NaN signalling), the nest's read of
//! `g` becomes the constant `+0` — the value it would have read, so every bit is the same (`x + 0` is computed,
//! not dropped: it turns `-0` into `+0` as the read zeros did) — and the fill becomes a comment.
//! When the nest covers a dynamic number of rows (one loop with a limit), the fill stays for
//! the rows past it, guarded, as for a sum onto zeros ([`super::zeroed_before`]).

use super::{Loop, past_the_limit, zero_fill_before};
use crate::low_level::{Expr, Index, Program, Stmt};
use crate::tnode::NodeId;

/// `s` with its read of the tensor it accumulates onto replaced by `+0` when a fill among
/// `out` allows it (see the module documentation); the fill in `out` is then dropped or kept
/// only past the nest's dynamic limit. Otherwise `s` unchanged.
pub(crate) fn fold(prog: &Program, out: &mut [Stmt], s: Stmt) -> Stmt {
    let Some((loops, node, idx)) = pointwise_update(&s) else { return s };
    let Some((i, past)) = zero_fill_before(prog, out, node, &idx, &loops) else { return s };
    out[i] = match past {
        None => Stmt::Comment("zero fill: the next accumulation reads +0 instead".into()),
        Some(p) => past_the_limit(&out[i], p),
    };
    super::reads_as_const(s, node, 0.0)
}

/// The loops around a single store `node[idx] := value` whose value
/// is a sum onto the cell (`node[idx] + e`, `e + node[idx]` or `fma(a, b, node[idx])`) and reads
/// `node` nowhere else; `None` for anything else.
fn pointwise_update(s: &Stmt) -> Option<(Vec<Loop>, NodeId, Vec<Index>)> {
    let mut loops = Vec::new();
    let mut cur = s;
    loop {
        match cur {
            Stmt::For { var, extent, limit, parallel, body } if body.len() == 1 => {
                loops.push(Loop { var: *var, extent: *extent, limit: *limit, parallel: *parallel });
                cur = &body[0];
            }
            Stmt::Set { node, idx, value } => {
                let (mut own, mut other) = (0, 0);
                value.visit(&mut |e| match e {
                    Expr::Get(n, i) if n == node && i == idx => own += 1,
                    Expr::Get(n, _) if n == node => other += 1,
                    // A local could hold a value of the tensor read elsewhere.
                    Expr::Local(_) => other += 1,
                    _ => {}
                });
                // Only a sum onto the cell: `g + e`, `e + g`, `fma(a, b, g)`. GCC keeps
                // `x + 0` (it turns `-0` into `+0`), but folds `x - 0` or `1 * x` to `x`, which
                // would leave a signalling NaN signalling where the read zeros quieted it.
                let own_cell = |e: &Expr| matches!(e, Expr::Get(n, i) if n == node && i == idx);
                let sum = match value {
                    Expr::Binop(crate::ops::BinOp::Add, a, b) => own_cell(a) || own_cell(b),
                    Expr::Ternop(crate::ops::TernOp::Fma, _, _, c) => own_cell(c),
                    _ => false,
                };
                return (sum && own == 1 && other == 0).then(|| (loops, *node, idx.clone()));
            }
            _ => return None,
        }
    }
}

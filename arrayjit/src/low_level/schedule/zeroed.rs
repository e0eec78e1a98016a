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
//!
//! The fold runs for every backend before virtualization ([`fold_zero_fills`], called by
//! [`crate::low_level::optimize`]), with the fill anywhere earlier (backpropagation zeroes
//! every gradient up front): a gradient that had a fill and one contribution is then defined
//! by one pointwise statement, which virtualization can inline into its reader. In a causal
//! attention's backward pass the gradients of the exponential, the shift, the mask and the
//! scale, each a pass over the whole score tensor, collapse into one nest that way. There,
//! simplification then drops the `0 +` as it drops every `x + 0` ([`crate::low_level::simplify`]
//! keeps no sign of zero), so the gradient of a `-0` contribution is `-0`, as PyTorch's is (it
//! assigns a gradient's first contribution); every backend runs the same program and gives
//! the same bits. Only tensors of the program's widest precision are folded there: inlining a
//! half-precision gradient would skip its rounding (a gradient that underflows in f16 must
//! still underflow). The CPU schedule folds again, after simplification, what its own rewrites
//! expose, and there the `+ 0` stays.

use rustc_hash::FxHashMap;

use crate::ops::Prec;

use super::{Loop, PastLimit, past_the_limit, store_covers, zero_fill_before, zero_fill_of};
use crate::low_level::{Expr, Index, Program, Stmt};
use crate::tnode::NodeId;

/// Folds every top-level accumulation onto a fill made earlier, however far back, when no
/// statement in between touches the tensor (see the module documentation). Backpropagation
/// zeroes every gradient up front, long before its first contribution.
pub fn fold_zero_fills(prog: &mut Program) {
    // Inlining a tensor skips its rounding to its own precision: only tensors as wide as the
    // widest of the program are folded here, where virtualization may inline them next.
    let floats = prog.nodes.values().map(|n| n.prec).filter(|p| *p != Prec::U32);
    let Some(widest) = floats.max() else { return };
    let body = std::mem::take(&mut prog.body);
    let mut out: Vec<Stmt> = Vec::with_capacity(body.len());
    // Per tensor, its last zero fill in `out`, when nothing has touched the tensor since.
    let mut filled: FxHashMap<NodeId, usize> = FxHashMap::default();
    for s in body {
        let s = match pointwise_update(&s) {
            Some((loops, node, idx)) if prog.nodes[&node].prec == widest => {
                let past = store_covers(prog, node, &idx, &loops);
                match (filled.get(&node), past) {
                    (Some(&i), Some(past)) => onto_fill(&mut out, i, past, s, node),
                    _ => s,
                }
            }
            _ => s,
        };
        for n in crate::low_level::nodes_of(std::slice::from_ref(&s)) {
            filled.remove(&n);
        }
        if let Some(n) = zero_fill_of(prog, &s) {
            filled.insert(n, out.len());
        }
        out.push(s);
    }
    out.retain(|s| !matches!(s, Stmt::Comment(c) if c == FOLDED));
    prog.body = out;
}

/// The comment a folded fill leaves in the CPU schedule's output.
const FOLDED: &str = "zero fill: the next accumulation reads +0 instead";

/// `s` reading `+0` instead of `node`, whose fill `out[i]` becomes a comment, or stays for the
/// cells past `s`'s dynamic limit.
fn onto_fill(out: &mut [Stmt], i: usize, past: Option<PastLimit>, s: Stmt, node: NodeId) -> Stmt {
    out[i] = match past {
        None => Stmt::Comment(FOLDED.into()),
        Some(p) => past_the_limit(&out[i], p),
    };
    super::reads_as_const(s, node, 0.0)
}

/// `s` with its read of the tensor it accumulates onto replaced by `+0` when a fill among
/// `out` allows it (see the module documentation); the fill in `out` is then dropped or kept
/// only past the nest's dynamic limit. Otherwise `s` unchanged.
pub(crate) fn fold(prog: &Program, out: &mut [Stmt], s: Stmt) -> Stmt {
    let Some((loops, node, idx)) = pointwise_update(&s) else { return s };
    let Some((i, past)) = zero_fill_before(prog, out, node, &idx, &loops) else { return s };
    onto_fill(out, i, past, s, node)
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

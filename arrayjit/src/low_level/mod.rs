//! The low-level IR: loop nests over scalar statements, what every backend consumes.
//!
//! Lowering ([`crate::lower`]) turns assignments into this form; the passes listed in
//! [`optimize::optimize`] rewrite it; backends render it (C, CUDA C), build it (libgccjit) or
//! interpret it. It is deliberately small:
//!
//! - loops `for v in 0..extent` (marked parallel when distinct iterations write distinct cells
//!   and read nothing another iteration writes),
//! - guards `if 0 <= index < bound` (padded convolutions),
//! - stores to a tensor cell `n[idx] = expr` or to a scalar local `t = expr`,
//! - expressions over tensor reads, locals, constants, index values and the operation table.
//!
//! Indices are affine in loop variables ([`Var`], printed `v3`) and runtime symbols
//! ([`Symbol`](crate::indexing::Symbol), printed `i3`), so bounds analysis, substitution
//! during virtualization and tiling stay exact. The printer is stable and is the snapshot
//! format of lowered code.
//!
//! The IR's parts live in files of their own: [`Index`] arithmetic (`index.rs`), expressions
//! (`expr.rs`), statements and their traversals (`stmt.rs`), the product call (`gemm.rs`),
//! [`Program`] (`program.rs`) and the printer (`print.rs`); this file keeps the analyses over
//! statement lists.

pub mod attention;
pub mod call;
pub mod cse;
pub mod dse;
pub mod estimate;
mod expr;
pub mod gather;
mod gemm;
mod index;
pub mod map;
pub mod memory;
pub mod optimize;
mod print;
mod program;
pub mod schedule;
pub mod simplify;
mod stmt;
pub mod trace;
pub mod verify;
pub mod virtualize;

use rustc_hash::FxHashMap;

use crate::ops::{BinOp, TernOp, UnOp};
use crate::tnode::NodeId;

pub use attention::AttentionCall;
pub use call::{Call, Kernel, expand_calls};
pub use expr::{Expr, fmt_indices};
pub use gather::GatherCall;
pub use gemm::{Epilogue, Gemm, GemmAxis, GemmOperand};
pub use index::{IdxVar, Index, LocalId, Var};
pub use map::{Map, MapAxis, MapOperand};
pub use print::print_stmt;
pub use program::{Arena, ArenaSlot, Program, RuntimeCheck, Scratch};
pub use stmt::{Guard, Limit, Stmt};

/// Every node the statements read or write, sorted, each once.
pub fn nodes_of(body: &[Stmt]) -> Vec<NodeId> {
    let mut out = Vec::new();
    for s in body {
        s.visit(&mut |s| match s {
            Stmt::Set { node, .. } => out.push(*node),
            Stmt::Gemm(g) => out.extend(g.operands().map(|o| o.node)),
            Stmt::Map(m) => out.extend(m.operands().map(|o| o.node)),
            Stmt::Call(c) => out.extend(c.nodes()),
            _ => {}
        });
        s.visit_exprs(&mut |e| {
            e.visit(&mut |e| {
                if let Expr::Get(n, _) = e {
                    out.push(*n);
                }
            })
        });
    }
    out.sort();
    out.dedup();
    out
}

/// Removes loops and guards whose bodies became empty (after passes delete statements).
pub fn prune_empty(body: Vec<Stmt>) -> Vec<Stmt> {
    let has_work = |body: &[Stmt]| body.iter().any(|s| !matches!(s, Stmt::Comment(_)));
    body.into_iter()
        .filter_map(|s| {
            let s = s.map_body(prune_empty);
            let empty = match &s {
                Stmt::For { extent, body, .. } => *extent == 0 || !has_work(body),
                Stmt::If { body, .. } => !has_work(body),
                _ => false,
            };
            (!empty).then_some(s)
        })
        .collect()
}

/// Where the top-level statements may be cut into separate functions: `cuts[i]` says whether
/// a step may end just before statement `i` (`cuts[len]` is the end). Locals live in one
/// function, so a cut is allowed only where no local assigned before it is read at or after
/// it — a local's live range can span many statements (a scalar loaded once and used by
/// several later nests), not only the next one. One pass over the statements.
pub fn cut_points(body: &[Stmt]) -> Vec<bool> {
    let mut last_use: FxHashMap<LocalId, usize> = FxHashMap::default();
    let mut assigned: Vec<Vec<LocalId>> = Vec::with_capacity(body.len());
    for (i, s) in body.iter().enumerate() {
        let mut set = Vec::new();
        s.visit(&mut |s| {
            if let Stmt::SetLocal { local, .. } = s {
                set.push(*local);
                last_use.entry(*local).or_insert(i);
            }
        });
        s.visit_exprs(&mut |e| {
            e.visit(&mut |e| {
                if let Expr::Local(l) = e {
                    last_use.insert(*l, i);
                }
            })
        });
        assigned.push(set);
    }
    // The last statement reading a local assigned so far; a cut before `i` is allowed when
    // every such statement comes before `i`.
    let mut live_until: Option<usize> = None;
    let mut cuts = Vec::with_capacity(body.len() + 1);
    for (i, set) in assigned.iter().enumerate() {
        cuts.push(live_until.is_none_or(|last| last < i));
        for l in set {
            let last = last_use.get(l).copied().unwrap_or(i);
            live_until = Some(live_until.map_or(last, |u| u.max(last)));
        }
    }
    cuts.push(true);
    cuts
}

/// Floating-point operations of one run of a program, as `rocannl bench` reports them: every
/// arithmetic operation executed (`+ - * /`, `pow`, `max`, `min` and the unary functions: 1;
/// `fma`: 2), times the iterations of its enclosing loops. Comparisons, selections, loads and
/// stores are not counted.
pub fn flops(prog: &Program) -> u64 {
    fn expr_flops(e: &Expr) -> u64 {
        let mut n = 0;
        e.visit(&mut |e| {
            n += match e {
                Expr::Unop(UnOp::Identity | UnOp::Not, _) => 0,
                Expr::Unop(..) => 1,
                Expr::Binop(BinOp::Lt | BinOp::Le | BinOp::Gt | BinOp::Eq | BinOp::Ne, ..) => 0,
                Expr::Binop(BinOp::Second, ..) => 0,
                Expr::Binop(..) => 1,
                Expr::Ternop(TernOp::Fma, ..) => 2,
                _ => 0,
            }
        });
        n
    }
    fn go(s: &Stmt, mult: u64) -> u64 {
        match s {
            Stmt::For { extent, body, .. } => {
                body.iter().map(|b| go(b, mult.saturating_mul(*extent as u64))).sum()
            }
            Stmt::If { body, .. } => body.iter().map(|b| go(b, mult)).sum(),
            Stmt::Set { value, .. } | Stmt::SetLocal { value, .. } => {
                mult.saturating_mul(expr_flops(value))
            }
            // Per call: its rows (a block's share of them) × columns × reduction, two each.
            Stmt::Gemm(g) => {
                let cells = (g.rows_per_call() * g.n.extent) as u64;
                let epilogue = g.epilogue.as_ref().map_or(0, |e| {
                    e.body.iter().map(|b| go(b, mult.saturating_mul(cells))).sum::<u64>()
                });
                mult.saturating_mul(2 * cells.saturating_mul(g.k.extent as u64))
                    .saturating_add(epilogue)
            }
            Stmt::Map(m) => {
                mult.saturating_mul(m.points_total() as u64).saturating_mul(m.flops_per_point())
            }
            Stmt::Call(c) => mult.saturating_mul(2 * c.steps() as u64),
            Stmt::Comment(_) => 0,
        }
    }
    prog.body.iter().map(|s| go(s, 1)).sum()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn set_local(l: u32, value: Expr) -> Stmt {
        Stmt::SetLocal { local: LocalId(l), value }
    }

    fn store(n: u32, value: Expr) -> Stmt {
        Stmt::Set { node: NodeId(n), idx: vec![], value }
    }

    #[test]
    fn cuts_avoid_every_live_range_of_a_local() {
        // t0 is assigned first and read three statements later: no cut inside that range, even
        // though the statements between do not read it.
        let body = vec![
            set_local(0, Expr::Const(1.0)),
            store(1, Expr::Const(2.0)),
            store(2, Expr::Const(3.0)),
            store(3, Expr::Local(LocalId(0))),
            store(4, Expr::Const(4.0)),
            Stmt::For {
                var: Var(0),
                extent: 4,
                limit: None,
                parallel: false,
                body: vec![set_local(1, Expr::Const(0.0)), store(5, Expr::Local(LocalId(1)))],
            },
            store(6, Expr::Const(5.0)),
        ];
        let cuts = cut_points(&body);
        assert_eq!(cuts, vec![true, false, false, false, true, true, true, true]);
    }
}

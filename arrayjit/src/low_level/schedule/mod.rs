//! The CPU schedule: loop order, packing, tiling and register blocking of contractions.
//!
//! Lowering puts reductions innermost with a scalar accumulator (`c[i,j] = Σ_k ...`), which is
//! right for the interpreter and for GPUs (one thread per cell, no races) but leaves a CPU with a
//! strided, unvectorizable inner loop. This pass (gccjit only) recognizes every nest of the form
//!
//! ```text
//! for <lhs loops> { [if cell guards] {
//!   t := init                                   (the reduction's neutral element, or c[idx])
//!   for <reduction loops> { [if point guards] { t := t ⊕ e } }
//!   c[idx] := t
//! } }
//! ```
//!
//! with a reorderable `⊕` (sum, product, max, min; `fma` counts as a sum) — matmuls in every
//! operand layout, batched products, attention scores, padded and strided convolutions and their
//! gradients, bias gradients, row reductions — and rewrites it into one of three kernels:
//!
//! - `gemm`: a product of two operands with rows, columns and a reduction becomes calls of the
//!   shape-generic matrix product ([`crate::kernels`]), compiled with the crate: GCC compiles
//!   only the loops around the call;
//! - `axpy`: `c` accumulates in place with a column loop `j` innermost that is contiguous in
//!   `c`; rows × reduction steps are register-blocked, guards are hoisted out of the column
//!   loop, and operands that are not contiguous along `j` (the `B` of `A·Bᵀ`, a convolution's
//!   kernel) are first copied into a packed buffer by `pack`;
//! - `dot`: when no column loop is wide enough (a 10-class output layer), the innermost
//!   reduction loop, contiguous in its operands, is split into lanes of partial sums kept in a
//!   small per-thread array, so it vectorizes without reassociating the compiler's floats.
//!
//! Nests neither kernel fits are left as lowered, except that a short reduction over many cells
//! computes 8 of its cells side by side, each in its own order (`interleave`), and a pointwise
//! transposition runs in cache-sized tiles (`transpose`, also applied to the product's operand
//! buffers). `Nest` is the
//! recognized form both kernels start from. A long sum of plain reads that lowering made
//! accumulate in an f64 local is first given an f64 copy of its result to accumulate in
//! (`widened`), so that the kernels take it in its order.

mod axpy;
mod dot;
mod epilogue;
mod gemm;
mod interleave;
mod map;
mod pack;
mod rounded;
mod transpose;
mod widened;
mod zeroed;

pub use gemm::{MIN_GEMM_STEPS, MIN_PAIR_DEPTH};
pub use zeroed::fold_zero_fills;

use super::{Expr, Guard, Index, Limit, LocalId, Program, Stmt, Var};
use crate::ops::{BinOp, Prec, TernOp};
use crate::tnode::{MemoryMode, NodeId, TensorNode, row_major_strides};

/// Rows per register block (at most).
pub const MR: usize = 4;
/// Reduction steps per register block (at most).
pub const KU: usize = 4;
/// Reduction tile (at most).
pub const KC: usize = 256;
/// Column tile (at most).
pub const NC: usize = 512;
/// Rows per parallel chunk (at most).
pub const MC: usize = 64;
/// The narrowest column loop `axpy` vectorizes (one AVX-512 vector of f32).
pub const MIN_COLUMNS: usize = 16;
/// Rows that must share a packed operand for the copy to pay off.
pub const PACK_MIN_REUSE: usize = 8;
/// Points (cells × reduction steps) below which a nest is left as lowered: it runs in a few
/// microseconds either way, and the kernels' unrolled code costs GCC more time to compile than
/// it saves.
pub const MIN_WORK: usize = 512;
/// Points below which the lane kernel is not used: its partial sums cost GCC's vectorizer much
/// more compile time than an in-place kernel, for a gain only long reductions show.
pub const MIN_LANES_WORK: usize = 4096;

/// Settings of the CPU schedule.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub struct CpuSchedule {
    /// Threads the routine's parallel loops are split across (products are cut into that many
    /// blocks of rows when nothing else can be split).
    pub threads: usize,
    /// Products become calls of the shape-generic kernel (off: every nest is generated code,
    /// e.g. so that bounds-check mode checks every access).
    pub kernel_calls: bool,
    /// Products of two bf16 tensors into f32 use the host's bf16 dot products (the pairwise
    /// product of [`crate::kernels::bf16`]) instead of f32 copies of the factors.
    pub bf16_pairs: bool,
    /// Which pointwise maps and (non-product) reductions become calls of the map kernel.
    pub map_calls: MapCalls,
    /// Pointwise nests that read a product's result cell by cell run inside the product's call,
    /// on each strip of the result as it becomes final ([`crate::low_level::Epilogue`]). Off by
    /// default: measured, it gained no run time and cost compile time (docs/benchmarks.md).
    pub epilogues: bool,
}

/// Which nests call the map kernel ([`crate::kernels::map`]) instead of being generated. A call
/// gives the interpreter's bits (each cell's operations in the nest's order) and costs GCC
/// nothing to compile. Reductions run about as fast as code generated for their shapes, so
/// they call it by default; pointwise maps run much slower (GCC fuses and vectorizes them in
/// registers, the kernel instruction by instruction), so they do not
/// (`docs/benchmarks.md`, "The map kernel").
#[derive(Copy, Clone, Debug, Default, PartialEq, Eq, Hash)]
pub enum MapCalls {
    /// Every nest is generated (or calls the product kernel).
    Off,
    /// Reductions other than products (row maxima and sums, means, bias gradients) of at least
    /// `MIN_MAP_POINTS` cells × points: below that, a call's fixed cost outweighs the nest.
    #[default]
    Reductions,
    /// Every reduction and pointwise map the kernel takes, whatever its size.
    All,
}

impl Default for CpuSchedule {
    fn default() -> Self {
        CpuSchedule {
            threads: 2,
            kernel_calls: true,
            bf16_pairs: false,
            map_calls: MapCalls::default(),
            epilogues: false,
        }
    }
}

/// Applies the schedule to every recognized top-level nest.
pub fn schedule_cpu(prog: &mut Program, opts: &CpuSchedule) {
    let body = std::mem::take(&mut prog.body);
    let mut out = Vec::with_capacity(body.len());
    for s in body {
        // A long sum of plain reads accumulating in an f64 local: into an f64 copy of its
        // result, which the kernels take (`widened`); the lane kernel would change its order.
        let (s, after) = match widened::in_f64(prog, &s) {
            Some((before, s, after)) => {
                out.extend(before);
                (s, after)
            }
            None => (s, vec![]),
        };
        let keep_order = !after.is_empty();
        schedule_one(prog, opts, &mut out, s, keep_order);
        out.extend(after);
    }
    prog.body = out;
}

/// Schedules one top-level statement, appending what it becomes to `out`; `keep_order` rules
/// out the lane kernel.
fn schedule_one(
    prog: &mut Program,
    opts: &CpuSchedule,
    out: &mut Vec<Stmt>,
    s: Stmt,
    keep_order: bool,
) {
    let recognized = Nest::recognize(prog, &s);
    // An accumulation onto a tensor zeroed just before reads +0 instead, and the fill goes.
    let s = if recognized.is_none() { zeroed::fold(prog, out, s) } else { s };
    // A pointwise nest on a product's result: inside the product's call.
    if recognized.is_none()
        && opts.kernel_calls
        && opts.epilogues
        && epilogue::attach(prog, out, &s)
    {
        return;
    }
    // Reductions other than products (and, with `MapCalls::All`, pointwise maps): calls of
    // the map kernel, whatever their size (a small nest of constant trip counts costs GCC as
    // much to compile as a large one).
    if opts.kernel_calls && opts.map_calls != MapCalls::Off {
        let all = opts.map_calls == MapCalls::All;
        let min = if all { 1 } else { map::MIN_MAP_POINTS };
        let call = match &recognized {
            Some(nest) => map::reduction(prog, nest, opts.threads, min),
            None if all => map::pointwise(prog, &s, opts.threads, min),
            None => None,
        };
        if let Some(stmts) = call {
            out.extend(stmts);
            return;
        }
    }
    let Some(nest) = recognized.filter(|n| n.work() >= MIN_WORK) else {
        out.extend(as_generated(prog, s));
        return;
    };
    // A sum onto a tensor zeroed just before (a gradient, an arena intermediate) starts
    // from 0 instead: the fill's pass and the kernel's reads of the zeros go.
    let zeroed = zeroed_before(prog, out, &nest);
    let nest = if zeroed.is_some() { Nest { init: Some(0.0), ..nest } } else { nest };
    let zeroed = zeroed.map(|(i, past)| (i, past.map(|p| past_the_limit(&out[i], p))));
    let result = nest.node;
    let Some((nest, mut before, mut after)) = in_f32(prog, nest) else {
        out.extend(as_generated(prog, s));
        return;
    };
    let call = if opts.kernel_calls { gemm::rewrite(prog, &nest, opts, out) } else { None };
    let rewritten = call
        .or_else(|| axpy::rewrite(prog, &nest))
        .or_else(|| if keep_order { None } else { dot::rewrite(prog, &nest) });
    match rewritten {
        Some(mut stmts) => {
            // A bf16 result the pair kernel can round itself needs no f32 copy.
            if nest.node != result && rounded::round_in_kernel(prog, &mut stmts, nest.node, result)
            {
                before.clear();
                after.clear();
            }
            match zeroed {
                Some((i, None)) => {
                    out[i] = Stmt::Comment("zero fill: the next reduction starts from 0".into())
                }
                Some((i, Some(rest))) => out[i] = rest,
                None => {}
            }
            out.extend(before);
            out.extend(stmts.into_iter().map(drop_unit_loops));
            out.extend(after);
        }
        None => out.extend(as_generated(prog, s)),
    }
}

/// A nest no kernel takes, as generated code: a short reduction over many cells with its cells
/// interleaved ([`interleave`]), a pointwise transposition in tiles ([`transpose`]), anything
/// else as it is.
fn as_generated(prog: &mut Program, s: Stmt) -> Vec<Stmt> {
    interleave::rewrite(prog, &s).or_else(|| transpose::tile(prog, &s)).unwrap_or_else(|| vec![s])
}

/// A nest whose result is stored in half precision (bf16, f16) accumulates in f32, as lowered
/// (the scalar accumulator is f32, and the result is rounded once when stored). The kernels
/// accumulate in the result itself, so such a nest is given an f32 copy of the result to work
/// in — filled from the result first when the reduction adds onto its old values — and the
/// result is written from it, rounded once, afterwards. Only for nests that write every cell of
/// the result once (one loop per axis, over its whole extent, no cell guards): the copy back
/// then writes nothing the nest would not have. Returns the nest, the statements to run
/// before its kernel and those to run after; `None` for a half-precision nest it cannot take.
fn in_f32(prog: &mut Program, nest: Nest) -> Option<(Nest, Vec<Stmt>, Vec<Stmt>)> {
    if matches!(nest.prec, Prec::F32 | Prec::F64) {
        return Some((nest, vec![], vec![]));
    }
    let c = prog.nodes.get(&nest.node)?.clone();
    if !writes_every_cell(&nest, &c.dims) {
        return None;
    }
    let id = prog.fresh_node_id();
    let label = format!("{}.f32", c.label);
    prog.nodes.insert(id, TensorNode::new(id, &label, &c.dims, Prec::F32, MemoryMode::Local));
    prog.scratch.push(super::Scratch { node: id, per_thread: false });
    let copy = |prog: &mut Program, from: NodeId, to: NodeId| {
        prog.fill_loops(&c.dims, |idx| Stmt::Set {
            node: to,
            idx: idx.to_vec(),
            value: Expr::Get(from, idx.to_vec()),
        })
    };
    let before = if nest.init.is_none() { vec![copy(prog, c.id, id)] } else { vec![] };
    let after = vec![copy(prog, id, c.id)];
    Some((Nest { node: id, prec: Prec::F32, ..nest }, before, after))
}

/// Whether the nest writes every cell of its result (of `dims`) once: one loop per axis over
/// its whole extent (an axis of one cell may be fixed at 0), no cell guards.
fn writes_every_cell(nest: &Nest, dims: &[usize]) -> bool {
    nest.cell_guards.is_empty() && covers_every_cell(&nest.idx, &nest.lhs, dims)
}

/// Whether a store at `idx` inside `loops` reaches every cell of a tensor of `dims` once: each
/// loop indexes exactly one axis over its whole extent, every axis is a loop or (of one cell) 0.
fn covers_every_cell(idx: &[Index], loops: &[Loop], dims: &[usize]) -> bool {
    idx.len() == dims.len()
        && idx.iter().zip(dims).all(|(i, &d)| {
            d == 1 && i.terms.is_empty() && i.offset == 0
                || i.as_var().is_some_and(|v| loops.iter().any(|l| l.var == v && l.extent == d))
        })
        && loops.iter().all(|l| idx.iter().filter(|i| i.as_var() == Some(l.var)).count() == 1)
}

/// Top-level statements looked through, back from a sum, for the fill that zeroed its result.
const MAX_FILL_DISTANCE: usize = 256;

/// The part of a fill the sum does not cover: its axis, and the dynamic size past which that
/// axis' cells are left to the fill.
#[derive(Copy, Clone, Debug)]
struct PastLimit {
    axis: usize,
    size: crate::indexing::Symbol,
    extent: usize,
}

/// The position in `out` of a fill of the nest's result with `+0` that nothing after it
/// touches, when the nest is a sum onto that result covering every cell once (up to one
/// axis' dynamic size of whole rows, `PastLimit`: the fill keeps the cells past it) and reading
/// the result nowhere else: starting each cell from `+0` then gives the same bits.
fn zeroed_before(prog: &Program, out: &[Stmt], nest: &Nest) -> Option<(usize, Option<PastLimit>)> {
    if nest.init.is_some() || nest.update.combine_op() != BinOp::Add {
        return None;
    }
    if !nest.cell_guards.is_empty() {
        return None;
    }
    let reads_result = nest.update.contributions().iter().any(|e| e.reads(nest.node));
    if reads_result {
        return None;
    }
    zero_fill_before(prog, out, nest.node, &nest.idx, &nest.lhs)
}

/// For a store into `node` at `idx` inside `loops` that reaches every cell once (up to one
/// loop's dynamic size of whole rows): the position in `out` of a fill of `node` with `+0` that
/// nothing after it touches (looked for up to [`MAX_FILL_DISTANCE`] statements back), and the
/// part of the fill the store leaves to it (the rows past the size).
fn zero_fill_before(
    prog: &Program,
    out: &[Stmt],
    node: NodeId,
    idx: &[Index],
    loops: &[Loop],
) -> Option<(usize, Option<PastLimit>)> {
    let past = store_covers(prog, node, idx, loops)?;
    let start = out.len().saturating_sub(MAX_FILL_DISTANCE);
    for i in (start..out.len()).rev() {
        if zero_fill_of(prog, &out[i]) == Some(node) {
            return Some((i, past));
        }
        if super::nodes_of(std::slice::from_ref(&out[i])).contains(&node) {
            return None;
        }
    }
    None
}

/// Whether a store into `node` at `idx` inside `loops` reaches every cell once, up to one
/// loop's dynamic size of whole rows: `Some(None)` for every cell, `Some(Some(p))` when the
/// cells past `p` are left out, `None` otherwise.
fn store_covers(
    prog: &Program,
    node: NodeId,
    idx: &[Index],
    loops: &[Loop],
) -> Option<Option<PastLimit>> {
    let dims = &prog.nodes.get(&node)?.dims;
    if !covers_every_cell(idx, loops, dims) {
        return None;
    }
    let limited: Vec<&Loop> = loops.iter().filter(|l| l.limit.is_some()).collect();
    match limited.as_slice() {
        [] => Some(None),
        [l] if l.limit.is_some_and(|lim| lim.per == 1) => {
            let axis = idx.iter().position(|i| i.as_var() == Some(l.var))?;
            Some(Some(PastLimit { axis, size: l.limit?.size, extent: l.extent }))
        }
        _ => None,
    }
}

/// The fill restricted to the cells past the limit: guarded by `size <= v` for the variable
/// `v` of the limited axis (the sum writes the cells below), right inside `v`'s loop, so the
/// rows below the limit cost one test each.
fn past_the_limit(fill: &Stmt, p: PastLimit) -> Stmt {
    // The fill is a chain of loops around one store.
    let mut cur = fill;
    while let Stmt::For { body, .. } = cur {
        match body.as_slice() {
            [b] => cur = b,
            _ => return fill.clone(),
        }
    }
    // (An axis of one cell has no loop: the whole fill stays, which is as correct.)
    let Stmt::Set { idx, .. } = cur else { return fill.clone() };
    let Some(v) = idx[p.axis].as_var() else { return fill.clone() };
    let index = Index::new(vec![(1, super::IdxVar::Loop(v)), (-1, super::IdxVar::Sym(p.size))], 0);
    let guard = Guard { index, bound: p.extent };
    fn wrap(s: &Stmt, v: Var, guard: &Guard) -> Stmt {
        match s {
            Stmt::For { var, body, .. } => s.with_body(if *var == v {
                vec![Stmt::If { guards: vec![guard.clone()], body: body.clone() }]
            } else {
                body.iter().map(|b| wrap(b, v, guard)).collect()
            }),
            other => other.clone(),
        }
    }
    wrap(fill, v, &guard)
}

/// The tensor `s` sets wholly to `+0`, if that is all it does: one store of the constant under
/// loops only, each loop indexing exactly one axis over its whole extent (an axis of one cell
/// may be 0).
pub(crate) fn zero_fill_of(prog: &Program, s: &Stmt) -> Option<NodeId> {
    let mut loops: Vec<(Var, usize)> = Vec::new();
    let mut cur = s;
    loop {
        match cur {
            Stmt::For { var, extent, limit: None, body, .. } if body.len() == 1 => {
                loops.push((*var, *extent));
                cur = &body[0];
            }
            Stmt::Set { node, idx, value: Expr::Const(c) } => {
                let dims = &prog.nodes.get(node)?.dims;
                let cells = c.to_bits() == 0
                    && idx.len() == dims.len()
                    && idx.iter().zip(dims).all(|(i, &d)| {
                        d == 1 && i.terms.is_empty() && i.offset == 0
                            || i.as_var().is_some_and(|v| loops.contains(&(v, d)))
                    });
                // Each loop indexes exactly one axis (a repeated variable is a diagonal).
                let once = loops
                    .iter()
                    .all(|(v, _)| idx.iter().filter(|i| i.as_var() == Some(*v)).count() == 1);
                return (cells && once).then_some(*node);
            }
            _ => return None,
        }
    }
}

/// How the accumulator is updated: `t := op(t, e)` or `t := fma(x, y, t)`.
#[derive(Clone, Debug, PartialEq)]
pub(crate) enum Update {
    Op(BinOp, Expr),
    Fma(Expr, Expr),
}

impl Update {
    /// The expressions the update combines into the accumulator.
    fn contributions(&self) -> Vec<&Expr> {
        match self {
            Update::Op(_, e) => vec![e],
            Update::Fma(x, y) => vec![x, y],
        }
    }

    fn contributions_mut(&mut self) -> Vec<&mut Expr> {
        match self {
            Update::Op(_, e) => vec![e],
            Update::Fma(x, y) => vec![x, y],
        }
    }

    /// The operator that combines partial results.
    fn combine_op(&self) -> BinOp {
        match self {
            Update::Op(op, _) => *op,
            Update::Fma(..) => BinOp::Add,
        }
    }

    /// `acc ⊕ contribution`, with `subst` applied to the contribution.
    fn apply(&self, acc: Expr, subst: &impl Fn(&Expr) -> Expr) -> Expr {
        match self {
            Update::Op(op, e) => Expr::bin(*op, acc, subst(e)),
            Update::Fma(x, y) => {
                Expr::Ternop(TernOp::Fma, Box::new(subst(x)), Box::new(subst(y)), Box::new(acc))
            }
        }
    }

    /// Replaces loop variables in the contributions.
    fn subst(&self, f: &impl Fn(Var) -> Option<Index>) -> Update {
        match self {
            Update::Op(op, e) => Update::Op(*op, e.clone().subst(f)),
            Update::Fma(x, y) => Update::Fma(x.clone().subst(f), y.clone().subst(f)),
        }
    }
}

/// One loop of a recognized nest.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Loop {
    pub var: Var,
    pub extent: usize,
    /// Kept on the loop that still runs over the same rows (or blocks of them).
    pub limit: Option<Limit>,
    pub parallel: bool,
}

/// A recognized reduction nest (see the module documentation).
#[derive(Clone, Debug)]
pub(crate) struct Nest {
    /// Loops around the accumulator, outermost first.
    pub lhs: Vec<Loop>,
    /// Reduction loops, outermost first.
    pub red: Vec<Loop>,
    /// Guards on the cell (lhs variables only).
    pub cell_guards: Vec<Guard>,
    /// Guards on each point of the reduction.
    pub point_guards: Vec<Guard>,
    /// The accumulated tensor and its cell.
    pub node: NodeId,
    pub idx: Vec<Index>,
    pub update: Update,
    /// `Some(neutral)`: the cell starts from the neutral element (the lowering proved each cell
    /// is reached once); `None`: the reduction accumulates onto the cell's value.
    pub init: Option<f64>,
    /// The precision of `c` and of the accumulator (f32 or f64).
    pub prec: Prec,
}

fn uses_local(e: &Expr) -> bool {
    let mut found = false;
    e.visit(&mut |e| found |= matches!(e, Expr::Local(_)));
    found
}

impl Nest {
    /// Recognizes the nest form of the module documentation in one top-level statement.
    pub(crate) fn recognize(prog: &Program, s: &Stmt) -> Option<Nest> {
        let mut lhs = Vec::new();
        let mut cell_guards = Vec::new();
        let mut cur = std::slice::from_ref(s);
        let block = loop {
            match cur {
                [Stmt::For { var, extent, limit, parallel, body }] => {
                    lhs.push(Loop {
                        var: *var,
                        extent: *extent,
                        limit: *limit,
                        parallel: *parallel,
                    });
                    cur = body;
                }
                [Stmt::If { guards, body }] if !lhs.is_empty() => {
                    cell_guards.extend(guards.iter().cloned());
                    cur = body;
                }
                [_, _, _] if !lhs.is_empty() => break cur,
                _ => return None,
            }
        };
        let Cell { local: t, start, red: red_stmt, node, idx } = Cell::of(block)?;
        let mut red = Vec::new();
        let mut point_guards = Vec::new();
        let mut cur = std::slice::from_ref(red_stmt);
        let upd = loop {
            match cur {
                [Stmt::For { var, extent, limit, parallel: false, body }] => {
                    red.push(Loop { var: *var, extent: *extent, limit: *limit, parallel: false });
                    cur = body;
                }
                [Stmt::If { guards, body }] => {
                    point_guards.extend(guards.iter().cloned());
                    cur = body;
                }
                [Stmt::SetLocal { local: t3, value }] if *t3 == t => break value,
                _ => return None,
            }
        };
        let prec = prog.nodes.get(node)?.prec;
        // A half-precision result accumulates in an f32 local; [`in_f32`] gives its kernel an
        // f32 copy to work in.
        let local = prog.locals[t.0 as usize];
        if local != prec.compute() {
            return None;
        }
        let is_t = |e: &Expr| matches!(e, Expr::Local(l) if *l == t);
        let update = match upd {
            Expr::Binop(op, a, b) if op.is_reorderable() && is_t(a) => {
                Update::Op(*op, (**b).clone())
            }
            Expr::Binop(op, a, b) if op.is_reorderable() && is_t(b) => {
                Update::Op(*op, (**a).clone())
            }
            Expr::Ternop(TernOp::Fma, x, y, c) if is_t(c) => {
                Update::Fma((**x).clone(), (**y).clone())
            }
            _ => return None,
        };
        if update.contributions().iter().any(|e| uses_local(e) || e.reads(*node)) {
            return None;
        }
        let neutral = update.combine_op().neutral();
        let init = match start {
            Expr::Const(c) if Some(*c) == neutral => Some(*c),
            Expr::Get(n, i) if n == node && i == idx => None,
            _ => return None,
        };
        let lhs_vars: Vec<Var> = lhs.iter().map(|l| l.var).collect();
        if cell_guards.iter().any(|g| g.index.terms.iter().any(|(_, x)| !is_lhs(x, &lhs_vars))) {
            return None;
        }
        Some(Nest {
            lhs,
            red,
            cell_guards,
            point_guards,
            node: *node,
            idx: idx.to_vec(),
            update,
            init,
            prec,
        })
    }

    /// The number of points: cells × reduction steps.
    pub(crate) fn work(&self) -> usize {
        self.lhs.iter().chain(&self.red).map(|l| l.extent).product()
    }

    /// The extent of a loop variable of the nest.
    pub(crate) fn extent(&self, v: Var) -> Option<usize> {
        self.lhs.iter().chain(&self.red).find(|l| l.var == v).map(|l| l.extent)
    }

    /// Whether some guard mentions `v`.
    pub(crate) fn guarded(&self, v: Var) -> bool {
        self.cell_guards.iter().chain(&self.point_guards).any(|g| g.index.uses(v))
    }

    /// All guards, cell guards first.
    pub(crate) fn guards(&self) -> Vec<Guard> {
        self.cell_guards.iter().chain(&self.point_guards).cloned().collect()
    }

    /// The fill `c[idx] := neutral` over the lhs loops (under the cell guards), when the cells
    /// start from the neutral element.
    pub(crate) fn fill(&self) -> Option<Stmt> {
        let c = self.init?;
        let mut s = Stmt::Set { node: self.node, idx: self.idx.clone(), value: Expr::Const(c) };
        if !self.cell_guards.is_empty() {
            s = Stmt::If { guards: self.cell_guards.clone(), body: vec![s] };
        }
        for l in self.lhs.iter().rev() {
            s = Stmt::For {
                var: l.var,
                extent: l.extent,
                limit: l.limit,
                parallel: l.parallel,
                body: vec![s],
            };
        }
        Some(s)
    }
}

fn is_lhs(x: &super::IdxVar, lhs: &[Var]) -> bool {
    match x {
        super::IdxVar::Loop(v) => lhs.contains(v),
        super::IdxVar::Sym(_) => true,
    }
}

/// Whether `v` alone indexes one axis of the nest's cell and appears in no other.
pub(crate) fn sole_axis(nest: &Nest, v: Var) -> bool {
    nest.idx.iter().filter(|x| x.uses(v)).count() == 1
        && nest.idx.iter().any(|x| x.as_var() == Some(v))
}

/// The step in the flat (row-major) offset of `node[idx]` when `v` grows by one.
pub(crate) fn flat_stride(prog: &Program, node: NodeId, idx: &[Index], v: Var) -> i64 {
    let strides = row_major_strides(&prog.nodes[&node].dims);
    idx.iter().zip(strides).map(|(i, s)| i.coeff(v) * s as i64).sum()
}

/// Every tensor read in `e`.
pub(crate) fn reads(e: &Expr) -> Vec<(NodeId, Vec<Index>)> {
    let mut out = Vec::new();
    e.visit(&mut |e| {
        if let Expr::Get(n, idx) = e {
            out.push((*n, idx.clone()));
        }
    });
    out
}

/// Whether `e` depends on loop variable `v` (through any index).
pub(crate) fn uses_var(e: &Expr, v: Var) -> bool {
    e.indices().iter().any(|i| i.uses(v))
}

/// The largest divisor of `n` that is at most `at_most` and a multiple of `multiple_of`
/// (`n` itself when there is none).
pub(crate) fn largest_divisor(n: usize, at_most: usize, multiple_of: usize) -> usize {
    (1..=at_most.min(n)).rev().find(|d| n.is_multiple_of(*d) && d % multiple_of == 0).unwrap_or(n)
}

/// `Σ coeff·var + offset` over loop variables.
pub(crate) fn lin(terms: &[(usize, Var)], off: usize) -> Index {
    Index::new(terms.iter().map(|&(c, v)| (c as i64, super::IdxVar::Loop(v))).collect(), off as i64)
}

/// The three statements of one cell of a reduction nest, inside its cell loops:
/// `t := start; <reduction loops>; c[idx] := t`.
pub(crate) struct Cell<'a> {
    /// The accumulator `t`.
    pub local: LocalId,
    /// Its initial value (the neutral element, or the cell's old value).
    pub start: &'a Expr,
    /// The (outermost) reduction loop.
    pub red: &'a Stmt,
    /// The result `c`.
    pub node: &'a NodeId,
    /// The cell's index in `c`.
    pub idx: &'a [Index],
}

impl<'a> Cell<'a> {
    /// The cell, when `block` is one (the accumulator stored is the one initialized).
    pub(crate) fn of(block: &'a [Stmt]) -> Option<Cell<'a>> {
        let [
            Stmt::SetLocal { local, value: start },
            red @ Stmt::For { .. },
            Stmt::Set { node, idx, value: Expr::Local(stored) },
        ] = block
        else {
            return None;
        };
        (local == stored).then_some(Cell { local: *local, start, red, node, idx })
    }
}

/// Wraps `body` in loops, the first of `loops` outermost.
pub(crate) fn wrap(loops: &[Loop], body: Vec<Stmt>) -> Vec<Stmt> {
    let mut body = body;
    for l in loops.iter().rev() {
        body = vec![Stmt::For {
            var: l.var,
            extent: l.extent,
            limit: l.limit,
            parallel: l.parallel,
            body,
        }];
    }
    body
}

/// Removes the loops of one iteration below the outermost one (tiles and blocks that cover a
/// whole small extent), their variable replaced by 0: shorter code to read, and to compile.
fn drop_unit_loops(s: Stmt) -> Stmt {
    match s {
        s @ Stmt::For { .. } => s.map_body(|body| body.into_iter().flat_map(inner).collect()),
        s => s,
    }
}

fn inner(s: Stmt) -> Vec<Stmt> {
    match s {
        Stmt::For { var, extent: 1, body, .. } => body
            .into_iter()
            .map(|b| subst_stmt(b, &|v| (v == var).then(|| Index::fixed(0))))
            .flat_map(inner)
            .collect(),
        s @ (Stmt::For { .. } | Stmt::If { .. }) => {
            vec![s.map_body(|body| body.into_iter().flat_map(inner).collect())]
        }
        s => vec![s],
    }
}

/// `s` with every read of `node` replaced by the constant `c` (the value the cells hold).
pub(crate) fn reads_as_const(s: Stmt, node: NodeId, c: f64) -> Stmt {
    map_stmt(s, &|i| i.clone(), &|v| {
        v.rewrite(&mut |e| match e {
            Expr::Get(m, _) if m == node => Expr::Const(c),
            e => e,
        })
    })
}

/// Replaces loop variables in every index of a statement.
pub(crate) fn subst_stmt(s: Stmt, f: &impl Fn(Var) -> Option<Index>) -> Stmt {
    map_stmt(s, &|i| i.subst(f), &|v| v.subst(f))
}

/// `s` with `index` applied to every index of its guards and stores and `value` to every stored
/// value, its loops and conditions kept.
fn map_stmt(s: Stmt, index: &impl Fn(&Index) -> Index, value: &impl Fn(Expr) -> Expr) -> Stmt {
    let body = |b: Vec<Stmt>| b.into_iter().map(|b| map_stmt(b, index, value)).collect();
    match s {
        s @ Stmt::For { .. } => s.map_body(body),
        Stmt::If { guards, body: b } => Stmt::If {
            guards: guards
                .iter()
                .map(|g| Guard { index: index(&g.index), bound: g.bound })
                .collect(),
            body: body(b),
        },
        Stmt::Set { node, idx, value: v } => {
            Stmt::Set { node, idx: idx.iter().map(index).collect(), value: value(v) }
        }
        Stmt::SetLocal { local, value: v } => Stmt::SetLocal { local, value: value(v) },
        s => s,
    }
}

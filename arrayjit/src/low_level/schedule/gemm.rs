//! Contractions as calls of the shape-generic matrix product ([`crate::kernels`]).
//!
//! A recognized nest whose update is a product of two operands (`t := fma(x, y, t)` or
//! `t := t + x·y`) is a batch of matrix products: each cell loop is a row of the result when
//! only `x` depends on it (`m`), a column when only `y` does (`n`), and a batch otherwise; the
//! reduction loops are the product's `k`. Loops of one role that walk memory as one loop would
//! (in every tensor they index) are merged, so `[batch, sequence, features] · W` is one product
//! of `batch·sequence` rows. What remains becomes loops around the call.
//!
//! An operand that is not a plain read of a tensor in the nest's precision (an inlined
//! activation such as `relu(h + b)`, a half-precision tensor) is first computed into a buffer
//! of its own over the loops it depends on: the same value, rounded to the same precision, as
//! the nest would compute at each step. The call then gives the nest's exact bits.
//!
//! When no batch loop can be split across threads, the rows are cut into one block per thread
//! (a parallel loop around the call). Nests with guards, other reductions, or too little work
//! are left to the other kernels.

use super::{Loop, Nest, Update};
use crate::indexing::Symbol;
use crate::low_level::{
    Expr, Gemm, GemmAxis, GemmOperand, Guard, IdxVar, Index, Limit, Program, Scratch, Stmt, Var,
};
use crate::ops::{BinOp, Prec, TernOp};
use crate::tnode::{MemoryMode, NodeId, TensorNode, row_major_strides};

/// Multiply-adds below which a nest is left to the generated kernels: the call's fixed cost
/// (packing, a few microseconds) would outweigh what it saves.
pub const MIN_GEMM_STEPS: usize = 32 * 1024;

/// Reduction steps below which a product is left to the generated kernels, unless its calls are
/// wide ([`MIN_WIDE_CELLS`]): the kernel packs `B` per call, paid back over the reduction; with
/// fewer steps the in-place kernel, which packs at most one operand, is as fast or faster on
/// small products (a 64 × 64 × 64 product: 2.4–2.7 µs generated, 3.1 µs called).
pub const MIN_GEMM_DEPTH: usize = 128;

/// A product of at least this many result cells (`m × n` per iteration of its batch loops,
/// before its rows are split across threads; a dynamic size counts at its maximum) is called
/// from a reduction of [`MIN_WIDE_DEPTH`] steps. In a quiet phase of a 2-vCPU Zen 5: attention
/// scores (128 × 128 cells per head, 64 steps) 0.33–0.34 ms called against 0.38–0.41 ms
/// generated, the gpt document's training step 1.87–1.88 against 2.03–2.06 ms; char_gpt's f32
/// step 1.07–1.13× faster (slow-phase figures in docs/lowering.md).
pub const MIN_WIDE_CELLS: usize = 16 * 1024;

/// The reduction from which a wide product is called.
pub const MIN_WIDE_DEPTH: usize = 64;

/// Reduction steps below which a product of two bf16 tensors is left to the generated
/// kernels. The bf16 kernel reads row-major `A` in place (its pairs are already adjacent) and
/// packs only `B`, so it pays off at shallower reductions than the f32 kernel (only with such
/// an `A`, contiguous along an even reduction; other layouts need `MIN_GEMM_DEPTH`): in char_gpt's
/// bf16 step the products of depth 64 (projections, the MLP's first layer, their input
/// gradients) ran the step 1.18–1.24× faster called than generated, those of depth 16
/// (attention, per head) 0.97–0.98× (docs/models.md, "Mixed precision").
pub const MIN_PAIR_DEPTH: usize = 64;

/// Whether a product of `cells` result cells and a reduction of `depth` steps is worth a call
/// of the kernel; `pairs_in_place`: a bf16 product whose `A` the kernel reads in place (`None`:
/// not a bf16 product).
fn deep_enough(depth: usize, cells: usize, pairs_in_place: Option<bool>) -> bool {
    match pairs_in_place {
        Some(true) => depth >= MIN_PAIR_DEPTH,
        Some(false) => depth >= MIN_GEMM_DEPTH,
        None => depth >= MIN_GEMM_DEPTH || (depth >= MIN_WIDE_DEPTH && cells >= MIN_WIDE_CELLS),
    }
}

/// Rewrites a recognized nest into calls of the matrix product, or `None` (the program is then
/// unchanged).
/// `prior` holds the statements scheduled so far: an operand's buffer may be filled by the
/// epilogue of a product among them ([`super::epilogue`]).
pub(crate) fn rewrite(
    prog: &mut Program,
    nest: &Nest,
    opts: &super::CpuSchedule,
    prior: &mut [Stmt],
) -> Option<Vec<Stmt>> {
    let (nodes, scratch, next_var) = (prog.nodes.len(), prog.scratch.len(), prog.next_var);
    let out = calls(prog, nest, opts, prior);
    if out.is_none() {
        // Forget the operand buffers made for it.
        for s in prog.scratch.drain(scratch..) {
            prog.nodes.remove(&s.node);
        }
        debug_assert_eq!(prog.nodes.len(), nodes);
        prog.next_var = next_var;
    }
    out
}

/// The calls for a recognized nest: its factors, the loops of the product's rows (`m`),
/// columns (`n`) and reduction (`k`) merged into strided axes, the call, how it is split
/// across threads, and the fills of its operand buffers.
fn calls(
    prog: &mut Program,
    nest: &Nest,
    opts: &super::CpuSchedule,
    prior: &mut [Stmt],
) -> Option<Vec<Stmt>> {
    let (x, y, fused) = factors(prog, nest)?;
    let (m_loops, n_loops) = cell_roles(nest, x, y)?;
    let loops: Vec<Loop> = nest.lhs.iter().chain(&nest.red).copied().collect();
    if loops.iter().map(|l| l.extent).product::<usize>() < MIN_GEMM_STEPS {
        return None;
    }
    // Two bf16 tensors into f32: the host's bf16 dot products read them as they are.
    let is_bf16 = |e: &Expr| matches!(e, Expr::Get(n, _) if prog.nodes.get(n).is_some_and(|t| t.prec == Prec::Bf16));
    let bf16_pairs = opts.bf16_pairs && nest.prec == Prec::F32 && is_bf16(x) && is_bf16(y);
    // Operands as strided tensors, computed into buffers where they are expressions.
    let (xo, xf) = operand(prog, x, &loops, nest.prec, bf16_pairs);
    let (yo, yf) = operand(prog, y, &loops, nest.prec, bf16_pairs);
    let c = Strided { node: nest.node, idx: nest.idx.clone() };
    let (m, m_rest) = merge(prog, &m_loops, &[&c, &xo])?;
    let (n, n_rest) = merge(prog, &n_loops, &[&c, &yo])?;
    let (k, k_rest) = merge(prog, &nest.red, &[&xo, &yo])?;
    if !k_rest.is_empty() {
        return None;
    }
    // Cell loops outside the product, in the nest's order.
    let in_product = |v: Var| m.vars.contains(&v) || n.vars.contains(&v);
    let mut batch: Vec<Loop> = nest.lhs.iter().filter(|l| !in_product(l.var)).copied().collect();
    debug_assert!(
        batch.len()
            == m_rest.len() + n_rest.len() + (nest.lhs.len() - m_loops.len() - n_loops.len())
    );
    // Kernel orientation: its column loop should be contiguous in the result.
    let (mut m, mut n, mut a, mut b, mut af, mut bf) = (m, n, xo, yo, xf, yf);
    if c.step(prog, &n).abs() != 1 && c.step(prog, &m).abs() == 1 {
        std::mem::swap(&mut m, &mut n);
        std::mem::swap(&mut a, &mut b);
        std::mem::swap(&mut af, &mut bf);
    }
    // The bf16 kernel's shallow products are worth a call only when it reads `A` in place
    // (rows contiguous along an even reduction); packing `A` too, it needs the f32 depth.
    let in_place = a.step(prog, &k) == 1 && k.axis.extent.is_multiple_of(2);
    let pairs = bf16_pairs.then_some(in_place);
    if !deep_enough(k.axis.extent, m.axis.extent * n.axis.extent, pairs) {
        return None;
    }
    let kernel_vars: Vec<Var> = m.vars.iter().chain(&n.vars).chain(&k.vars).copied().collect();
    let gop = |s: &Strided, rows: &Merged, cols: &Merged| GemmOperand {
        node: s.node,
        offset: s.offset(prog, &kernel_vars),
        rows: s.step(prog, rows),
        cols: s.step(prog, cols),
    };
    let mut call = Gemm {
        c: gop(&c, &m, &n),
        a: gop(&a, &m, &k),
        b: gop(&b, &k, &n),
        m: m.axis,
        n: n.axis,
        k: k.axis,
        rows: None,
        accumulate: nest.init.is_none(),
        fused,
        prec: nest.prec,
        bf16_pairs,
        epilogue: None,
    };
    let blocks = split_rows_across_threads(prog, &mut call, &mut batch, opts.threads);
    let fills = OperandFills { a: af, b: bf };
    let at = Placement { batch: &batch, blocks, m: &m, k: &k };
    Some(place_call(prog, opts, prior, fills, call, &at))
}

/// The two factors of the nest's product update and whether it is fused; `None` for guarded
/// nests, other precisions, no reduction, a dynamic select that is not the reduction loop's
/// own limit, factors computed in another precision, or a cell loop sharing an axis.
fn factors<'n>(prog: &Program, nest: &'n Nest) -> Option<(&'n Expr, &'n Expr, bool)> {
    if !nest.cell_guards.is_empty() || !nest.point_guards.is_empty() {
        return None;
    }
    if !matches!(nest.prec, Prec::F32 | Prec::F64) || nest.red.is_empty() {
        return None;
    }
    let (x, y, fused, select) = product(&nest.update)?;
    // A dynamic reduction's select must be the reduction loop's own limit (the loop stops
    // there, so the steps it drops are never run).
    if let Some((v, s)) = select {
        let l = nest.red.iter().find(|l| l.var == v)?;
        if l.limit.map(|l| (l.size, l.per)) != Some((s, 1)) {
            return None;
        }
    }
    if prog.compute_prec(x, nest.prec) != nest.prec || prog.compute_prec(y, nest.prec) != nest.prec
    {
        return None;
    }
    // Every cell loop indexes one axis of the result alone: distinct iterations, distinct cells.
    if nest.lhs.iter().any(|l| !super::sole_axis(nest, l.var)) {
        return None;
    }
    Some((x, y, fused))
}

/// The cell loops of the product's rows (used by `x` only) and of its columns (used by `y`
/// only); `None` when either is empty.
fn cell_roles(nest: &Nest, x: &Expr, y: &Expr) -> Option<(Vec<Loop>, Vec<Loop>)> {
    let uses = |e: &Expr, v: Var| e.indices().iter().any(|i| i.uses(v));
    let role = |want_x: bool| -> Vec<Loop> {
        nest.lhs
            .iter()
            .filter(|l| uses(x, l.var) == want_x && uses(y, l.var) != want_x)
            .copied()
            .collect()
    };
    let (m_loops, n_loops) = (role(true), role(false));
    if m_loops.is_empty() || n_loops.is_empty() {
        return None;
    }
    Some((m_loops, n_loops))
}

/// Threads: across the outermost batch loop when it is parallel with an iteration per
/// thread, else across blocks of rows — the parallel loop around the batch loops returned,
/// the call taking its block of rows and the batch loops made sequential.
fn split_rows_across_threads(
    prog: &mut Program,
    call: &mut Gemm,
    batch: &mut [Loop],
    threads: usize,
) -> Option<Loop> {
    let batch_parallel = batch.first().is_some_and(|l| l.parallel && l.extent >= threads.max(2));
    if batch_parallel || threads <= 1 {
        return None;
    }
    let m = call.m;
    let unit = m.limit.map_or(16, |(_, per)| lcm(16, per));
    let per = m.extent.div_ceil(threads).next_multiple_of(unit);
    if per >= m.extent {
        return None;
    }
    let v = prog.fresh_var();
    call.rows = Some((v, per));
    let limit = m.limit.map(|(size, rows_per_unit)| Limit { size, per: per / rows_per_unit });
    batch.iter_mut().for_each(|l| l.parallel = false);
    Some(Loop { var: v, extent: m.extent.div_ceil(per), limit, parallel: true })
}

/// The buffers of the call's operands that must be filled (expressions, packed copies).
struct OperandFills {
    a: Option<Fill>,
    b: Option<Fill>,
}

/// Where a call runs: its batch loops, the parallel loop over blocks of rows (if any), and
/// the merged row and reduction axes.
#[derive(Clone, Copy)]
struct Placement<'p> {
    batch: &'p [Loop],
    blocks: Option<Loop>,
    m: &'p Merged,
    k: &'p Merged,
}

/// The call in its batch loops and block of rows, with its operand buffers filled: by the
/// epilogue of the product whose result they read, when an earlier call can take them (the
/// buffer is written while that result is in cache); else `B`'s (every block reads all of it)
/// before the product, and `A`'s inside each block of rows, for the block's rows only, when
/// its only row loop is the product's (one step instead of two, and the rows are in cache
/// when the product reads them).
fn place_call(
    prog: &mut Program,
    opts: &super::CpuSchedule,
    prior: &mut [Stmt],
    fills: OperandFills,
    call: Gemm,
    at: &Placement<'_>,
) -> Vec<Stmt> {
    let Placement { batch, blocks, m, k } = *at;
    let mut outside = |prog: &mut Program, f: Option<Fill>| -> Option<Fill> {
        let f = f?;
        let fill = if opts.epilogues { f.stmts(prog, None) } else { vec![] };
        match fill.as_slice() {
            [s] if super::epilogue::attach(prog, prior, s) => None,
            _ => Some(f),
        }
    };
    let (bf, af) = (outside(prog, fills.b), outside(prog, fills.a));
    let mut out: Vec<Stmt> = bf.iter().flat_map(|f| f.whole(prog)).collect();
    let mut body = vec![];
    match (&af, blocks) {
        (Some(f), Some(bl)) if f.rows_only(m, k) => {
            let (v, per) = call.rows.unwrap_or((bl.var, m.axis.extent));
            body.extend(f.stmts(prog, Some((v, per, m.vars[0], m.axis.extent))));
        }
        (Some(f), _) => out.extend(f.whole(prog)),
        (None, _) => {}
    }
    body.extend(super::wrap(batch, vec![Stmt::Gemm(Box::new(call))]));
    out.extend(match blocks {
        Some(b) => super::wrap(&[b], body),
        None => body,
    });
    out
}

/// The two factors of a product update, whether it is fused, and a dynamic reduction's select
/// `where(v < size, x·y, 0)` (its variable and symbol).
type Product<'a> = (&'a Expr, &'a Expr, bool, Option<(Var, Symbol)>);

fn product(u: &Update) -> Option<Product<'_>> {
    match u {
        Update::Fma(x, y) => Some((x, y, true, None)),
        Update::Op(BinOp::Add, e) => {
            let (e, select) = match e {
                Expr::Ternop(TernOp::Where, cond, e, zero) if **zero == Expr::Const(0.0) => {
                    let Expr::Binop(BinOp::Lt, v, s) = &**cond else { return None };
                    let (Expr::IndexValue(v), Expr::IndexValue(s)) = (&**v, &**s) else {
                        return None;
                    };
                    let v = v.as_var()?;
                    let s = match (s.terms.as_slice(), s.offset) {
                        ([(1, IdxVar::Sym(s))], 0) => *s,
                        _ => return None,
                    };
                    (&**e, Some((v, s)))
                }
                e => (e, None),
            };
            match e {
                Expr::Binop(BinOp::Mul, x, y) => Some((x, y, false, select)),
                _ => None,
            }
        }
        _ => None,
    }
}

/// A tensor read with an affine index.
#[derive(Clone, Debug)]
struct Strided {
    node: NodeId,
    idx: Vec<Index>,
}

impl Strided {
    /// The flat step when the merged loop moves by one.
    fn step(&self, prog: &Program, g: &Merged) -> i64 {
        g.vars.last().map_or(0, |v| coeff(prog, self.node, &self.idx, *v))
    }

    /// The flat offset with the kernel's loops at 0: affine in the batch loops and symbols.
    fn offset(&self, prog: &Program, kernel: &[Var]) -> Index {
        let strides = row_major_strides(&prog.nodes[&self.node].dims);
        let mut terms = Vec::new();
        let mut offset = 0;
        for (i, s) in self.idx.iter().zip(strides) {
            for &(c, x) in &i.terms {
                if !matches!(x, IdxVar::Loop(v) if kernel.contains(&v)) {
                    terms.push((c * s as i64, x));
                }
            }
            offset += i.offset * s as i64;
        }
        Index::new(terms, offset)
    }
}

/// The flat step of `node[idx]` when `v` grows by one.
fn coeff(prog: &Program, node: NodeId, idx: &[Index], v: Var) -> i64 {
    super::flat_stride(prog, node, idx, v)
}

/// An operand as a strided tensor: the read itself (a plain read in `prec`, or any plain read
/// with `as_read`), or a buffer the expression is to be computed into first (its [`Fill`]).
fn operand(
    prog: &mut Program,
    e: &Expr,
    loops: &[Loop],
    prec: Prec,
    as_read: bool,
) -> (Strided, Option<Fill>) {
    if let Expr::Get(n, idx) = e
        && (as_read || prog.nodes.get(n).is_some_and(|t| t.prec == prec))
    {
        return (Strided { node: *n, idx: idx.clone() }, None);
    }
    // Only loop variables of the nest (and symbols) may index the expression.
    let mut used: Vec<Loop> =
        loops.iter().filter(|l| e.indices().iter().any(|i| i.uses(l.var))).copied().collect();
    if let Some((n, idx)) = layout_source(e, &used) {
        // The buffer is laid out as the tensor the expression reads is (a half-precision
        // tensor, or the factors of a pointwise expression such as an activation's gradient),
        // so that filling it reads and writes memory in order. (In the nest's order, the
        // operand of a weight's gradient — reduction innermost — was a transposition of what
        // it reads, one cell per cache line.) The kernel takes the buffer's strides as they
        // come.
        used.sort_by_key(|l| std::cmp::Reverse(coeff(prog, n, idx, l.var).abs()));
    }
    let dims: Vec<usize> = used.iter().map(|l| l.extent).collect();
    let id = prog.fresh_node_id();
    let label = format!("gemm operand {}", id.0);
    prog.nodes.insert(id, TensorNode::new(id, &label, &dims, prec, MemoryMode::Local));
    prog.scratch.push(Scratch { node: id, per_thread: false });
    let vars: Vec<Index> = used.iter().map(|l| Index::var(l.var)).collect();
    (Strided { node: id, idx: vars }, Some(Fill { node: id, used, value: e.clone() }))
}

/// The tensor read whose layout an operand's buffer takes: the first read of `e` indexed by
/// every loop of `used` (the one a fill in that order streams through), if any.
fn layout_source<'e>(e: &'e Expr, used: &[Loop]) -> Option<(NodeId, &'e [Index])> {
    let mut found = None;
    e.visit(&mut |x| {
        if let Expr::Get(n, idx) = x
            && found.is_none()
            && used.iter().all(|l| idx.iter().any(|i| i.uses(l.var)))
        {
            found = Some((*n, idx.as_slice()));
        }
    });
    found
}

/// An operand's buffer and how to fill it: `node[used loops] := value`, in the nest's loop
/// variables.
struct Fill {
    node: NodeId,
    used: Vec<Loop>,
    value: Expr,
}

impl Fill {
    /// Whether the buffer's loops are the product's one row loop and its reduction loops.
    fn rows_only(&self, m: &Merged, k: &Merged) -> bool {
        m.vars.len() == 1
            && self.used.first().is_some_and(|l| l.var == m.vars[0])
            && self.used.iter().filter(|l| l.var == m.vars[0]).count() == 1
            && self.used.iter().all(|l| l.var == m.vars[0] || k.vars.contains(&l.var))
    }

    /// The statements filling every cell of the buffer, in tiles when the buffer is the
    /// operand transposed ([`super::transpose`]).
    fn whole(&self, prog: &mut Program) -> Vec<Stmt> {
        let fill = self.stmts(prog, None);
        match fill.as_slice() {
            [nest] => super::transpose::tile(prog, nest).unwrap_or(fill),
            _ => fill,
        }
    }

    /// The statements filling the buffer: every cell (fresh parallel loops over the used
    /// variables), or with `block = (v, per, row var, rows)` only rows `per·v ..` of the block
    /// (a loop over the block's rows, guarded by the row count).
    fn stmts(&self, prog: &mut Program, block: Option<(Var, usize, Var, usize)>) -> Vec<Stmt> {
        let fresh: Vec<Var> = self.used.iter().map(|_| prog.fresh_var()).collect();
        let row = |k: usize| block.filter(|b| b.2 == self.used[k].var);
        let index = |k: usize| match row(k) {
            Some((v, per, ..)) => {
                Index::new(vec![(per as i64, IdxVar::Loop(v)), (1, IdxVar::Loop(fresh[k]))], 0)
            }
            None => Index::var(fresh[k]),
        };
        let sub = |v: Var| self.used.iter().position(|l| l.var == v).map(index);
        let value = self.value.clone().subst(&sub);
        let idx: Vec<Index> = (0..self.used.len()).map(index).collect();
        let mut set = Stmt::Set { node: self.node, idx, value };
        let mut guards = vec![];
        let loops: Vec<Loop> = (0..self.used.len())
            .map(|k| match row(k) {
                Some((_, per, _, rows)) => {
                    guards.push(Guard { index: index(k), bound: rows });
                    Loop { var: fresh[k], extent: per, limit: None, parallel: false }
                }
                None => Loop {
                    var: fresh[k],
                    extent: self.used[k].extent,
                    limit: self.used[k].limit,
                    parallel: block.is_none(),
                },
            })
            .collect();
        if !guards.is_empty() {
            // The row guard sits right inside the row loop (outermost, the buffer's first axis).
            let (outer, inner) = loops.split_at(1);
            set = Stmt::If { guards, body: super::wrap(inner, vec![set]) };
            return super::wrap(outer, vec![set]);
        }
        super::wrap(&loops, vec![set])
    }
}

/// Loops of one role merged into one: the loops (outermost first), and the product's axis.
#[derive(Clone, Debug)]
struct Merged {
    vars: Vec<Var>,
    axis: GemmAxis,
}

/// Merges the innermost loops of `loops` (in order) that move every tensor as one loop would:
/// `step(outer) = extent(inner) · step(inner)` in each. Returns the merged axis and the loops
/// left outside it; `None` when the innermost loop's dynamic size is not one of rows. A dynamic
/// size may sit only on the outermost merged loop (it then counts `extent(inner)` cells per
/// unit).
fn merge(prog: &Program, loops: &[Loop], tensors: &[&Strided]) -> Option<(Merged, Vec<Loop>)> {
    let (last, outer) = loops.split_last()?;
    let mut limit = match last.limit {
        Some(l) if l.per != 1 => return None,
        l => l.map(|l| (l.size, 1)),
    };
    let mut vars = vec![last.var];
    let mut extent = last.extent;
    let mut rest: Vec<Loop> = outer.to_vec();
    while let Some(o) = rest.last().copied() {
        let fits = limit.is_none()
            && o.limit.is_none_or(|l| l.per == 1)
            && tensors.iter().all(|t| {
                coeff(prog, t.node, &t.idx, o.var)
                    == extent as i64 * coeff(prog, t.node, &t.idx, last.var)
            });
        if !fits {
            break;
        }
        rest.pop();
        vars.insert(0, o.var);
        limit = o.limit.map(|l| (l.size, extent));
        extent *= o.extent;
    }
    Some((Merged { vars, axis: GemmAxis { extent, limit } }, rest))
}

fn lcm(a: usize, b: usize) -> usize {
    fn gcd(a: usize, b: usize) -> usize {
        if b == 0 { a } else { gcd(b, a % b) }
    }
    a / gcd(a, b) * b
}

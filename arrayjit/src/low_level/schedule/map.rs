//! Pointwise maps and reductions as calls of the map kernel ([`crate::kernels::map`]).
//!
//! Two forms of top-level nest become one call each:
//!
//! - a pointwise nest `for <loops> { n[idx] := e }` (layout copies, fills, broadcasts, bias
//!   adds, activations, the exponentials of a softmax), where each loop indexes one axis of
//!   `n` alone and `e` reads `n` only at the cell it writes;
//! - a recognized reduction nest ([`Nest`]) whose update is `t := t ⊕ e` with `e` anything
//!   but a product of two reads (row maxima and sums, means, bias gradients, a loss's sum;
//!   products are contractions, left to the product kernels).
//!
//! `e` must be built from tensor reads in the result's precision (f32 or f64), constants and
//! the op table, at most [`MAX_INPUTS`] distinct reads and [`MAX_CODE`] operations; guarded
//! nests (padding) stay generated. A parallel outermost loop stays around the call, so the
//! routine still splits it across threads; the other loops become the kernel's axes.

use super::{Loop, Nest, Update, wrap};
use crate::kernels::map::{MAX_AXES, MAX_CODE, MAX_INPUTS, MAX_STACK, MapCode};
use crate::low_level::{Expr, IdxVar, Index, Map, MapAxis, MapOperand, Program, Stmt, Var};
use crate::ops::{BinOp, Prec};
use crate::tnode::{NodeId, row_major_strides};

/// Cells × points below which a nest stays generated under `MapCalls::Reductions` (measured on
/// the W3 moons step, whose nests are all this small: with calls it took 2.2 µs, generated
/// 1.0 µs). `MapCalls::All` calls the kernel whatever the size.
pub const MIN_MAP_POINTS: usize = 4096;

/// A reduction nest as a call, or `None` (products, guards, expressions the kernel does not
/// take).
pub(crate) fn reduction(
    prog: &mut Program,
    nest: &Nest,
    threads: usize,
    min_points: usize,
) -> Option<Vec<Stmt>> {
    if !nest.cell_guards.is_empty() || !nest.point_guards.is_empty() {
        return None;
    }
    let Update::Op(op, e) = &nest.update else { return None };
    if is_product(e) {
        return None;
    }
    // The cell's index must not move with the reduction.
    if nest.red.iter().any(|l| nest.idx.iter().any(|i| i.uses(l.var))) {
        return None;
    }
    let site = Site {
        cells: &nest.lhs,
        points: &nest.red,
        node: nest.node,
        idx: &nest.idx,
        e,
        reduce: Some(*op),
        accumulate: nest.init.is_none(),
    };
    call(prog, site, threads, min_points)
}

/// A pointwise nest as a call, or `None`.
pub(crate) fn pointwise(
    prog: &mut Program,
    s: &Stmt,
    threads: usize,
    min_points: usize,
) -> Option<Vec<Stmt>> {
    let mut loops = Vec::new();
    let mut cur = s;
    let (node, idx, value) = loop {
        match cur {
            Stmt::For { var, extent, limit, parallel, body } if body.len() == 1 => {
                loops.push(Loop { var: *var, extent: *extent, limit: *limit, parallel: *parallel });
                cur = &body[0];
            }
            Stmt::Set { node, idx, value } => break (*node, idx, value),
            _ => return None,
        }
    };
    if loops.is_empty() {
        return None;
    }
    // Reading the result elsewhere than at the written cell would see other cells' new values
    // or not, depending on the order.
    let mut other_cell = false;
    value.visit(&mut |e| {
        if let Expr::Get(n, i) = e {
            other_cell |= *n == node && i != idx;
        }
    });
    if other_cell {
        return None;
    }
    let site =
        Site { cells: &loops, points: &[], node, idx, e: value, reduce: None, accumulate: false };
    call(prog, site, threads, min_points)
}

/// `x · y` with both factors reading tensors: a contraction's term.
fn is_product(e: &Expr) -> bool {
    let reads = |e: &Expr| {
        let mut any = false;
        e.visit(&mut |e| any |= matches!(e, Expr::Get(..)));
        any
    };
    matches!(e, Expr::Binop(BinOp::Mul, a, b) if reads(a) && reads(b))
}

/// What a call is built from: the nest's loops, its result and expression.
struct Site<'a> {
    cells: &'a [Loop],
    points: &'a [Loop],
    node: NodeId,
    idx: &'a [Index],
    e: &'a Expr,
    reduce: Option<BinOp>,
    accumulate: bool,
}

fn call(prog: &mut Program, site: Site, threads: usize, min_points: usize) -> Option<Vec<Stmt>> {
    let Site { cells, points, node, idx, e, reduce, accumulate } = site;
    // A call costs about a microsecond before its first cell (decoding, the evaluation
    // buffers): a nest this small runs faster as generated code, and costs GCC little.
    let total: usize = cells.iter().chain(points).map(|l| l.extent).product();
    if total < min_points {
        return None;
    }
    let prec = prog.nodes.get(&node)?.prec;
    if !matches!(prec, Prec::F32 | Prec::F64) || cells.is_empty() && points.is_empty() {
        return None;
    }
    // Distinct iterations write distinct cells.
    let sole = |v: Var| {
        idx.iter().filter(|i| i.uses(v)).count() == 1 && idx.iter().any(|i| i.as_var() == Some(v))
    };
    if !cells.iter().all(|l| sole(l.var)) {
        return None;
    }
    let mut postfix = Postfix::default();
    postfix.compile(prog, e, prec)?;
    let Postfix { reads, code, .. } = postfix;
    let kernel: Vec<Var> = cells.iter().chain(points).map(|l| l.var).collect();
    let axis = |l: &Loop, with_out: bool| MapAxis {
        extent: l.extent,
        count: l.limit.map(|lim| (Index::new(vec![(1, IdxVar::Sym(lim.size))], 0), lim.per)),
        out: if with_out { super::flat_stride(prog, node, idx, l.var) } else { 0 },
        steps: reads.iter().map(|(n, i)| super::flat_stride(prog, *n, i, l.var)).collect(),
    };
    let mut cell_axes: Vec<MapAxis> = cells.iter().map(|l| axis(l, true)).collect();
    let point_axes = coalesce(points.iter().map(|l| axis(l, false)).collect());
    let mut out = MapOperand { node, offset: flat_offset(prog, node, idx, &kernel) };
    let mut inputs: Vec<MapOperand> = reads
        .iter()
        .map(|(n, i)| MapOperand { node: *n, offset: flat_offset(prog, *n, i, &kernel) })
        .collect();
    // A parallel outermost loop becomes one block of its rows per thread: a loop the routine
    // splits across threads, around a call whose first axis is the block's rows (clipped in
    // the last block).
    let mut around = None;
    if let Some(first) = cells.first().filter(|l| l.parallel && threads > 1) {
        let per = first.extent.div_ceil(threads);
        let block = prog.fresh_var();
        let blocks = first.extent.div_ceil(per);
        // Rows left from this block on: the extent, or a dynamic batch's size.
        let left = match first.limit {
            None => {
                Some(Index::new(vec![(-(per as i64), IdxVar::Loop(block))], first.extent as i64))
            }
            Some(lim) if lim.per == 1 => Some(Index::new(
                vec![(1, IdxVar::Sym(lim.size)), (-(per as i64), IdxVar::Loop(block))],
                0,
            )),
            Some(_) => None,
        };
        if let Some(left) = left {
            let a = &mut cell_axes[0];
            let start = |step: i64| Index::new(vec![(step * per as i64, IdxVar::Loop(block))], 0);
            out.offset = add(&out.offset, &start(a.out));
            for (o, s) in inputs.iter_mut().zip(&a.steps) {
                o.offset = add(&o.offset, &start(*s));
            }
            a.extent = per;
            a.count = Some((left, 1));
            let limit = first.limit.map(|lim| super::Limit { size: lim.size, per: per * lim.per });
            around = Some(Loop { var: block, extent: blocks, limit, parallel: true });
        }
    }
    let cell_axes = coalesce(cell_axes);
    if cell_axes.len() > MAX_AXES || point_axes.len() > MAX_AXES {
        return None;
    }
    let map =
        Map { prec, out, inputs, cells: cell_axes, points: point_axes, reduce, accumulate, code };
    let call = Stmt::Map(Box::new(map));
    Some(match around {
        Some(l) => wrap(&[l], vec![call]),
        None => vec![call],
    })
}

/// Merges neighbouring axes that walk every operand as one axis would (`[4: 16][16: 1]` is
/// `[64: 1]`): longer runs for the kernel to vectorize, fewer steps of its odometer.
fn coalesce(axes: Vec<MapAxis>) -> Vec<MapAxis> {
    let mut out: Vec<MapAxis> = Vec::with_capacity(axes.len());
    for a in axes {
        if let Some(prev) = out.last_mut()
            && a.count.is_none()
            && prev.count.as_ref().is_none_or(|(_, per)| *per == 1)
            && prev.out == a.out * a.extent as i64
            && prev.steps.iter().zip(&a.steps).all(|(p, s)| *p == s * a.extent as i64)
        {
            let n = a.extent as i64;
            prev.extent *= a.extent;
            prev.count = prev.count.take().map(|(size, _)| (scale(&size, n), 1));
            prev.out = a.out;
            prev.steps = a.steps;
            continue;
        }
        out.push(a);
    }
    out
}

/// An expression being compiled to the kernel's postfix program.
#[derive(Default)]
struct Postfix {
    reads: Vec<(NodeId, Vec<Index>)>,
    code: Vec<MapCode>,
    depth: usize,
}

impl Postfix {
    fn compile(&mut self, prog: &Program, e: &Expr, prec: Prec) -> Option<()> {
        self.emit(prog, e, prec)?;
        (self.code.len() <= MAX_CODE).then_some(())
    }

    fn push(&mut self, c: MapCode) -> Option<()> {
        self.code.push(c);
        self.depth = (self.depth as isize + c.depth_change()) as usize;
        (self.depth <= MAX_STACK && self.code.len() <= MAX_CODE).then_some(())
    }

    fn emit(&mut self, prog: &Program, e: &Expr, prec: Prec) -> Option<()> {
        match e {
            Expr::Const(c) => self.push(MapCode::Const(*c)),
            Expr::Get(n, i) => {
                if prog.nodes.get(n)?.prec != prec {
                    return None;
                }
                let k = match self.reads.iter().position(|(m, j)| m == n && j == i) {
                    Some(k) => k,
                    None if self.reads.len() < MAX_INPUTS => {
                        self.reads.push((*n, i.clone()));
                        self.reads.len() - 1
                    }
                    None => return None,
                };
                self.push(MapCode::Input(k))
            }
            Expr::Unop(op, a) => {
                self.emit(prog, a, prec)?;
                self.push(MapCode::Un(*op))
            }
            Expr::Binop(op, a, b) => {
                self.emit(prog, a, prec)?;
                self.emit(prog, b, prec)?;
                self.push(MapCode::Bin(*op))
            }
            Expr::Ternop(op, a, b, c) => {
                self.emit(prog, a, prec)?;
                self.emit(prog, b, prec)?;
                self.emit(prog, c, prec)?;
                self.push(MapCode::Tern(*op))
            }
            Expr::Local(_) | Expr::IndexValue(_) | Expr::Uniform { .. } => None,
        }
    }
}

/// `node[idx]`'s flat offset with the kernel's loop variables at 0: affine in the loops
/// around the call and in runtime symbols.
fn flat_offset(prog: &Program, node: NodeId, idx: &[Index], kernel: &[Var]) -> Index {
    let strides = row_major_strides(&prog.nodes[&node].dims);
    let mut terms = Vec::new();
    let mut offset = 0i64;
    for (i, s) in idx.iter().zip(strides) {
        let s = s as i64;
        offset += i.offset * s;
        for &(c, x) in &i.terms {
            if !matches!(x, IdxVar::Loop(v) if kernel.contains(&v)) {
                terms.push((c * s, x));
            }
        }
    }
    Index::new(terms, offset)
}

/// `a + b`.
fn add(a: &Index, b: &Index) -> Index {
    Index::new(a.terms.iter().chain(&b.terms).copied().collect(), a.offset + b.offset)
}

/// `a · n`.
fn scale(a: &Index, n: i64) -> Index {
    Index::new(a.terms.iter().map(|&(c, x)| (c * n, x)).collect(), a.offset * n)
}

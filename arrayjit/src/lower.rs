//! Lowering: from assignments with projections to loop nests.
//!
//! An `Accum` becomes one loop per product iterator. Iterators that index the assigned tensor
//! ("lhs iterators") come first; the others are reduction iterators and go innermost, folding
//! into a scalar local so each cell is read and written once per point of the lhs loops:
//!
//! ```text
//! c[i,j] add= mul(a[i,k], b[k,j])  init      for v0, v1 par { t0 := 0
//!                                      ==>     for v2 { t0 := add(t0, mul(a[v0,v2], b[v2,v1])) }
//!                                              c[v0, v1] := t0 }
//! ```
//!
//! Three facts of the projection decide the shape of the code:
//! - not surjective and `initialize_neutral`: the tensor is first filled with the neutral
//!   element (cells no point touches must hold it);
//! - injective on the lhs iterators and `initialize_neutral`: every cell is reached once, so
//!   the accumulation starts from the neutral element instead of reading the old value (an
//!   assignment instead of an accumulation);
//! - an affine index that can leave its axis (padded convolutions) is guarded, skipping the
//!   point (its contribution is the neutral element).
//!
//! Indices that depend on runtime symbols are not guarded; they become
//! [`RuntimeCheck`]s verified when the routine runs.

use rustc_hash::{FxHashMap, FxHashSet};

use crate::assignments::{Asgn, AttentionAsgn, FetchOp, GatherAsgn, ScalarExpr};
use crate::error::Error;
use crate::indexing::{AxisIndex, Projections, Symbol};
use crate::kernels::attention::Attention;
use crate::kernels::gather::Gather;
use crate::low_level::{
    AttentionCall, Call, Expr, GatherCall, Guard, IdxVar, Index, Limit, Program, RuntimeCheck,
    Stmt, Var,
};
use crate::ops::{BinOp, Prec, TernOp, UnOp};
use crate::tnode::{NodeId, NodeTable, TensorNode, row_major_strides};

/// Lowers a whole assignment sequence into one program.
///
/// ```
/// use std::sync::Arc;
/// use rocannl_arrayjit::assignments::{Asgn, ScalarExpr};
/// use rocannl_arrayjit::indexing::{Projections, SymbolGen};
/// use rocannl_arrayjit::ops::{Prec, UnOp};
/// use rocannl_arrayjit::tnode::{MemoryMode, NodeTable};
/// let mut nodes = NodeTable::default();
/// let x = nodes.add("x", &[3], Prec::F32, MemoryMode::HostVisible);
/// let y = nodes.add("y", &[3], Prec::F32, MemoryMode::HostVisible);
/// let asgn = Asgn::Accum {
///     lhs: y,
///     accum: None,
///     rhs: vec![x],
///     expr: ScalarExpr::un(UnOp::Exp, ScalarExpr::Arg(0)),
///     projections: Arc::new(Projections::identity(&[3], 1, &mut SymbolGen::default())),
///     initialize_neutral: false,
/// };
/// let prog = rocannl_arrayjit::lower::lower("r", &asgn, &nodes).unwrap();
/// assert_eq!(prog.to_string(), "for v0 in 0..3 par {\n  n1[v0] := exp(n0[v0])\n}\n");
/// ```
pub fn lower(name: &str, asgn: &Asgn, nodes: &NodeTable) -> Result<Program, Error> {
    let mut used = FxHashMap::default();
    for id in asgn.nodes() {
        used.insert(id, nodes.get(id)?.clone());
    }
    let mut prog = Program {
        name: name.to_string(),
        body: Vec::new(),
        locals: Vec::new(),
        next_var: 0,
        nodes: used,
        virtual_nodes: Vec::new(),
        runtime_symbols: Vec::new(),
        runtime_checks: Vec::new(),
        scratch: Vec::new(),
        arena: Default::default(),
    };
    let mut body = Vec::new();
    lower_into(&mut prog, asgn, &mut body)?;
    prog.body = body;
    Ok(prog)
}

fn lower_into(prog: &mut Program, asgn: &Asgn, out: &mut Vec<Stmt>) -> Result<(), Error> {
    match asgn {
        Asgn::Noop => Ok(()),
        Asgn::Seq(items) => items.iter().try_for_each(|a| lower_into(prog, a, out)),
        Asgn::Comment(c) => {
            out.push(Stmt::Comment(c.clone()));
            Ok(())
        }
        Asgn::Fetch { lhs, fetch } => {
            let node = prog.nodes[lhs].clone();
            lower_fetch(prog, &node, fetch, out);
            Ok(())
        }
        Asgn::Accum { lhs, accum, rhs, expr, projections, initialize_neutral } => {
            let acc = AccumParts {
                lhs: prog.nodes[lhs].clone(),
                accum: *accum,
                rhs,
                expr,
                proj: projections,
                init: *initialize_neutral,
            };
            lower_accum(prog, &acc, out)
        }
        Asgn::Attention(a) => lower_attention(prog, a, out),
        Asgn::Gather(g) => lower_gather(prog, g, out),
    }
}

/// Loops over the (batch, head) pairs around one attention call each, parallel; the first
/// batch axis stops at its dynamic size, if it has one.
fn lower_attention(
    prog: &mut Program,
    a: &AttentionAsgn,
    out: &mut Vec<Stmt>,
) -> Result<(), Error> {
    let (sizes, batch) = attention_sizes(prog, a)?;
    let pairs = sizes.pairs();
    // One call per pair in one parallel loop, which the pool splits (over the heads too: a
    // batch of one still runs on every thread). A dynamic batch: a loop over the first batch
    // axis, stopping at its size, around the loop over the pairs of one of its cells.
    let limit = a.batch_limit.filter(|_| !batch.is_empty());
    let (outer, per) = match limit {
        Some(size) => {
            register_symbol(prog, size);
            let per = pairs / batch[0].max(1);
            (Some((prog.fresh_var(), batch[0], Limit { size, per: 1 })), per)
        }
        None => (None, pairs),
    };
    let p = prog.fresh_var();
    let mut pair = Index::var(p);
    if let Some((b0, _, _)) = outer {
        pair = Index::new(vec![(per as i64, IdxVar::Loop(b0)), (1, IdxVar::Loop(p))], 0);
    }
    let call = AttentionCall { asgn: a.clone(), sizes, batch_dims: batch, pair };
    let body = vec![Stmt::Call(Box::new(Call::Attention(call)))];
    let mut nest = vec![Stmt::For { var: p, extent: per, limit: None, parallel: true, body }];
    if let Some((var, extent, limit)) = outer {
        nest = vec![Stmt::For { var, extent, limit: Some(limit), parallel: true, body: nest }];
    }
    out.extend(nest);
    Ok(())
}

/// One parallel loop over the parts of a lookup (tokens forward, the table's rows backward)
/// around one call each ([`crate::low_level::gather`]).
fn lower_gather(prog: &mut Program, g: &GatherAsgn, out: &mut Vec<Stmt>) -> Result<(), Error> {
    let (sizes, token_dims, row_dims) = gather_sizes(prog, g)?;
    if let Some(s) = g.batch_limit.filter(|_| !token_dims.is_empty()) {
        register_symbol(prog, s);
    }
    let g =
        GatherAsgn { batch_limit: g.batch_limit.filter(|_| !token_dims.is_empty()), ..g.clone() };
    let (parts, count) = crate::low_level::gather::parts(&sizes, g.backward);
    let p = prog.fresh_var();
    let start = Index::new(vec![(count as i64, IdxVar::Loop(p))], 0);
    let call = GatherCall { asgn: g, sizes, token_dims, row_dims, start, count };
    let body = vec![Stmt::Call(Box::new(Call::Gather(call)))];
    out.push(Stmt::For { var: p, extent: parts, limit: None, parallel: true, body });
    Ok(())
}

/// The sizes and layout of a lookup, the ids' axes and the table's other axes, from its
/// tensors, which must have the axes [`Asgn::Gather`] describes (else an error naming the
/// tensor and the shapes).
fn gather_sizes(prog: &Program, g: &GatherAsgn) -> Result<(Gather, Vec<usize>, Vec<usize>), Error> {
    let node = |n: NodeId| prog.nodes.get(&n).ok_or(Error::UnknownNode(n.0));
    let (table, ids, out) = (node(g.table)?, node(g.ids)?, node(g.out)?);
    let bad = |reason: String| Error::InvalidAssignment { lhs: g.written().0, reason };
    let (vocab, row_dims) = match (g.vocab_first, table.dims.split_first(), table.dims.split_last())
    {
        (true, Some((v, rest)), _) => (*v, rest.to_vec()),
        (false, _, Some((v, rest))) => (*v, rest.to_vec()),
        _ => return Err(bad("a lookup's table has no axes".into())),
    };
    let want: Vec<usize> = ids.dims.iter().chain(&row_dims).copied().collect();
    if out.dims != want || vocab == 0 {
        return Err(bad(format!(
            "lookup output of dims {:?}, expected {want:?} (ids {:?}, table {:?})",
            out.dims, ids.dims, table.dims
        )));
    }
    let rows: usize = row_dims.iter().product();
    let (row_step, vocab_step) = if g.vocab_first { (1, rows) } else { (vocab, 1) };
    let sizes = Gather {
        tokens: ids.dims.iter().product(),
        rows,
        vocab,
        row_step,
        vocab_step,
        ids_f32: ids.prec == Prec::F32,
    };
    Ok((sizes, ids.dims.clone(), row_dims))
}

/// The sizes of an attention and its batch axes, from its tensors, which must have the axes
/// [`Asgn::Attention`] describes (else an error naming the tensor and both shapes).
fn attention_sizes(prog: &Program, a: &AttentionAsgn) -> Result<(Attention, Vec<usize>), Error> {
    let dims =
        |n: NodeId| prog.nodes.get(&n).map(|t| t.dims.clone()).ok_or(Error::UnknownNode(n.0));
    let bad = |reason: String| Error::InvalidAssignment { lhs: a.out.0, reason };
    let q = dims(a.q)?;
    if q.len() < 3 {
        return Err(bad(format!("attention queries of {} axes, not [batch…, s, h, d]", q.len())));
    }
    let nb = q.len() - 3;
    let batch = q[..nb].to_vec();
    let (s, h, d) = (q[nb], q[nb + 1], q[nb + 2]);
    let (k, v) = (dims(a.k)?, dims(a.v)?);
    let t = k.get(nb).copied().unwrap_or(0);
    let e = v.last().copied().unwrap_or(0);
    let with = |tail: &[usize]| batch.iter().chain(tail).copied().collect::<Vec<usize>>();
    let mut expect = vec![
        ("keys", a.k, with(&[t, h, d])),
        ("values", a.v, with(&[t, h, e])),
        ("output", a.out, with(&[s, h, e])),
        ("log-sum-exp", a.lse, with(&[s, h])),
    ];
    if let Some(g) = &a.grads {
        expect.push(("output gradient", g.d_out, with(&[s, h, e])));
        let grads = [(g.d_q, &q), (g.d_k, &k), (g.d_v, &v)];
        expect.extend(grads.into_iter().filter_map(|(n, w)| Some(("gradient", n?, w.clone()))));
    }
    for (what, node, want) in expect {
        let got = dims(node)?;
        if got != want || t == 0 {
            return Err(bad(format!(
                "attention {what} of dims {got:?}, expected {want:?} (queries {q:?}, {t} keys)"
            )));
        }
    }
    let sizes = Attention {
        batch: batch.iter().product(),
        queries: s,
        keys: t,
        heads: h,
        depth: d,
        width: e,
        causal: a.causal,
        scale: a.scale as f32,
    };
    Ok((sizes, batch))
}

/// The row-major offset of the cell at `idx` (as made by [`Program::fill_loops`]) in a tensor of `dims`.
fn linear_offset(idx: &[Index], dims: &[usize]) -> Index {
    let strides = row_major_strides(dims);
    let terms = idx
        .iter()
        .zip(strides)
        .filter_map(|(i, s)| i.as_var().map(|v| (s as i64, IdxVar::Loop(v))))
        .collect();
    Index::new(terms, 0)
}

fn lower_fetch(prog: &mut Program, node: &TensorNode, fetch: &FetchOp, out: &mut Vec<Stmt>) {
    if let FetchOp::EmbedSymbol(s) | FetchOp::Uniform { salt: Some(s), .. } = fetch {
        register_symbol(prog, *s);
    }
    let dims = node.dims.clone();
    let id = node.id;
    out.push(prog.fill_loops(&dims, |vars| {
        let value = match fetch {
            FetchOp::Constant(c) => Expr::Const(*c),
            FetchOp::Iota => Expr::IndexValue(linear_offset(vars, &dims)),
            FetchOp::EmbedSymbol(s) => Expr::IndexValue(Index::new(vec![(1, IdxVar::Sym(*s))], 0)),
            FetchOp::Uniform { seed, salt } => {
                let mut offset = linear_offset(vars, &dims);
                if let Some(s) = salt {
                    let cells: usize = dims.iter().product();
                    offset = Index::new(
                        offset
                            .terms
                            .iter()
                            .copied()
                            .chain([(cells as i64, IdxVar::Sym(*s))])
                            .collect(),
                        offset.offset,
                    );
                }
                Expr::Uniform { seed: *seed, offset }
            }
        };
        Stmt::Set { node: id, idx: vars.to_vec(), value }
    }));
}

fn register_symbol(prog: &mut Program, s: Symbol) {
    if !prog.runtime_symbols.contains(&s) {
        prog.runtime_symbols.push(s);
    }
}

struct AccumParts<'a> {
    lhs: TensorNode,
    accum: Option<BinOp>,
    rhs: &'a [NodeId],
    expr: &'a ScalarExpr,
    proj: &'a Projections,
    init: bool,
}

fn invalid(lhs: NodeId, reason: String) -> Error {
    Error::InvalidAssignment { lhs: lhs.0, reason }
}

fn check_shapes(prog: &Program, a: &AccumParts<'_>) -> Result<(), Error> {
    let p = a.proj;
    let id = a.lhs.id;
    if p.product_space.len() != p.product_iterators.len() {
        return Err(invalid(id, "product_space and product_iterators differ in length".into()));
    }
    if p.lhs_dims != a.lhs.dims || p.project_lhs.len() != a.lhs.dims.len() {
        let reason = format!(
            "projection lhs dims {:?} / {} indices do not match node dims {:?}",
            p.lhs_dims,
            p.project_lhs.len(),
            a.lhs.dims
        );
        return Err(invalid(id, reason));
    }
    if p.project_rhs.len() != a.rhs.len() || p.rhs_dims.len() != a.rhs.len() {
        let reason = format!(
            "{} arguments but {} rhs projections and {} rhs dims",
            a.rhs.len(),
            p.project_rhs.len(),
            p.rhs_dims.len()
        );
        return Err(invalid(id, reason));
    }
    if let Some(m) = a.expr.max_arg()
        && m >= a.rhs.len()
    {
        return Err(invalid(id, format!("expression reads argument {m} of {}", a.rhs.len())));
    }
    for (k, r) in a.rhs.iter().enumerate() {
        let dims = &prog.nodes[r].dims;
        if &p.rhs_dims[k] != dims || p.project_rhs[k].len() != dims.len() {
            let reason = format!(
                "argument {k} ({r}) has dims {dims:?}, projection says {:?} with {} indices",
                p.rhs_dims[k],
                p.project_rhs[k].len()
            );
            return Err(invalid(id, reason));
        }
    }
    Ok(())
}

/// Converts a projection index to a low-level index, classifying symbols as loop variables or
/// runtime symbols.
fn convert_index(prog: &mut Program, idx: &AxisIndex, loop_of: &FxHashMap<Symbol, Var>) -> Index {
    let (terms, offset) = idx.as_affine();
    let mut out = Vec::new();
    for (c, s) in terms {
        match loop_of.get(&s) {
            Some(v) => out.push((c, IdxVar::Loop(*v))),
            None => {
                register_symbol(prog, s);
                out.push((c, IdxVar::Sym(s)));
            }
        }
    }
    Index::new(out, offset)
}

/// Guards (or runtime checks) needed for one access of `node` at `idx`.
fn access_guards(
    prog: &mut Program,
    node: &TensorNode,
    idx: &[Index],
    extent: &impl Fn(Var) -> Option<usize>,
    guards: &mut Vec<Guard>,
) -> Result<(), Error> {
    for (axis, (i, &d)) in idx.iter().zip(&node.dims).enumerate() {
        let has_sym = i.terms.iter().any(|(_, x)| matches!(x, IdxVar::Sym(_)));
        if has_sym {
            let loop_part = Index::new(
                i.terms.iter().copied().filter(|(_, x)| matches!(x, IdxVar::Loop(_))).collect(),
                i.offset,
            );
            let (lo, hi) = loop_part.range(extent).unwrap_or((i.offset, i.offset));
            let sym_terms = i
                .terms
                .iter()
                .filter_map(|&(c, x)| match x {
                    IdxVar::Sym(s) => Some((c, s)),
                    IdxVar::Loop(_) => None,
                })
                .collect();
            prog.runtime_checks.push(RuntimeCheck {
                node: node.id,
                axis,
                sym_terms,
                lo,
                hi,
                bound: d,
            });
            continue;
        }
        let Some((lo, hi)) = i.range(extent) else { continue };
        if lo >= 0 && hi < d as i64 {
            continue;
        }
        if i.terms.is_empty() {
            let reason =
                format!("fixed index {} on axis {axis} of {} (size {d})", i.offset, node.id);
            return Err(Error::InvalidAssignment { lhs: node.id.0, reason });
        }
        let g = Guard { index: i.clone(), bound: d };
        if !guards.contains(&g) {
            guards.push(g);
        }
    }
    Ok(())
}

fn convert_expr(e: &ScalarExpr, args: &[Expr]) -> Expr {
    match e {
        ScalarExpr::Arg(i) => args[*i].clone(),
        ScalarExpr::Const(c) => Expr::Const(*c),
        ScalarExpr::Symbol(s) => Expr::IndexValue(Index::new(vec![(1, IdxVar::Sym(*s))], 0)),
        ScalarExpr::Unop(op, a) => Expr::Unop(*op, Box::new(convert_expr(a, args))),
        ScalarExpr::Binop(op, a, b) => Expr::bin(*op, convert_expr(a, args), convert_expr(b, args)),
        ScalarExpr::Ternop(op, a, b, c) => Expr::Ternop(
            *op,
            Box::new(convert_expr(a, args)),
            Box::new(convert_expr(b, args)),
            Box::new(convert_expr(c, args)),
        ),
    }
}

/// The limits of an assignment's lhs loops, and its reduction variables selected up to a
/// dynamic size (with that size's symbol).
type DynamicBounds = (FxHashMap<Var, Limit>, Vec<(Var, Symbol)>);

/// The bounds of dynamic iterators. A loop over the rows of a dynamic batch in the result runs
/// over the size's maximum, and gets the size as its [`Limit`]: the rows past it hold values
/// nothing reads, so computing them is harmless and skipping them is allowed. A reduction over
/// a dynamic iterator must not take in the positions at or past the size: each contribution is
/// selected, `where(v < n, e, neutral)` (a select, so that whatever the rows past the batch
/// hold, even NaN, adds nothing), which keeps the reduction loop a plain loop that the CPU
/// schedule blocks and vectorizes; an accumulation without a neutral element gets the point
/// guard `0 <= v - n + max < max` instead. A selected reduction loop gets the size as its
/// limit too: the iterations past it add the neutral element, so stopping there changes nothing. The size must be 1 to the maximum when running: a
/// runtime check on the first tensor the iterator indexes. Returns the limits of the lhs loops
/// and the reduction variables to select on, with their sizes.
fn dynamic_bounds(
    prog: &mut Program,
    a: &AccumParts<'_>,
    loop_of: &FxHashMap<Symbol, Var>,
    lhs_idx: &[Index],
    rhs_guards: &mut Vec<Guard>,
) -> Result<DynamicBounds, Error> {
    let p = a.proj;
    let mut limits = FxHashMap::default();
    let mut selects = Vec::new();
    let selectable = a.accum.and_then(|op| op.neutral()).is_some();
    for &(iter, size) in &p.dynamic {
        let Some(pos) = p.product_iterators.iter().position(|s| *s == iter) else {
            let reason = format!("dynamic iterator {iter} is not a product iterator");
            return Err(invalid(a.lhs.id, reason));
        };
        let max = p.product_space[pos];
        register_symbol(prog, size);
        let axis_of = |idx: &[AxisIndex]| idx.iter().position(|i| *i == AxisIndex::Iterator(iter));
        let (node, axis) = match axis_of(&p.project_lhs) {
            Some(k) => (a.lhs.id, k),
            None => {
                match p.project_rhs.iter().enumerate().find_map(|(r, idx)| Some((r, axis_of(idx)?)))
                {
                    Some((r, k)) => (a.rhs[r], k),
                    None => (a.lhs.id, 0),
                }
            }
        };
        let check =
            RuntimeCheck { node, axis, sym_terms: vec![(1, size)], lo: -1, hi: -1, bound: max };
        if !prog.runtime_checks.contains(&check) {
            prog.runtime_checks.push(check);
        }
        // An iterator of extent 1 has no loop: its only position is 0 < n.
        let Some(&v) = loop_of.get(&iter) else { continue };
        if lhs_idx.iter().any(|i| i.uses(v)) {
            limits.insert(v, Limit { size, per: 1 });
        } else if selectable {
            selects.push((v, size));
        } else {
            let index = Index::new(vec![(1, IdxVar::Loop(v)), (-1, IdxVar::Sym(size))], max as i64);
            rhs_guards.push(Guard { index, bound: max });
        }
    }
    Ok((limits, selects))
}

/// `where(v < n, value, neutral)` for every reduction variable `v` of a dynamic size `n`: one
/// select of the whole contribution, so the reduction stays the one-statement form the CPU
/// schedule recognizes. (A summed product is therefore rounded before it is added rather than
/// fused with the addition: results agree with a fixed batch's within rounding.)
fn select_rows(value: Expr, selects: &[(Var, Symbol)], neutral: f64) -> Expr {
    selects.iter().fold(value, |e, &(v, size)| {
        let v = Expr::IndexValue(Index::var(v));
        let n = Expr::IndexValue(Index::new(vec![(1, IdxVar::Sym(size))], 0));
        Expr::Ternop(
            TernOp::Where,
            Box::new(Expr::bin(BinOp::Lt, v, n)),
            Box::new(e),
            Box::new(Expr::Const(neutral)),
        )
    })
}

fn guarded(guards: Vec<Guard>, body: Vec<Stmt>) -> Vec<Stmt> {
    if guards.is_empty() { body } else { vec![Stmt::If { guards, body }] }
}

/// Terms from which a sum of one tensor's values (not a product's) accumulates in f64 instead
/// of its compute precision. A shorter sum accumulates in order in f32, within `(n - 1)·u·Σ|x|`
/// of the exact sum (`u = 2⁻²⁴`: 6·10⁻⁵ of `Σ|x|` at most, about `√n·u` typically), and keeps
/// the CPU kernels that take short reductions (a layer norm's statistics, a softmax's sum);
/// a longer one is within one rounding of the exact sum, `|s|·u`, plus `n·2⁻⁵³·Σ|x|`.
pub const WIDE_SUM_MIN_POINTS: usize = 1024;

/// Whether a reduction's term multiplies two factors that both vary along the reduction (a
/// matrix product's, a dot product's): such sums accumulate in the compute precision, as the
/// product kernels and every BLAS do; sums of one tensor's values accumulate in f64.
fn is_product(e: &ScalarExpr, varies: &impl Fn(usize) -> bool) -> bool {
    fn depends(e: &ScalarExpr, varies: &impl Fn(usize) -> bool) -> bool {
        match e {
            ScalarExpr::Arg(i) => varies(*i),
            ScalarExpr::Const(_) | ScalarExpr::Symbol(_) => false,
            ScalarExpr::Unop(_, a) => depends(a, varies),
            ScalarExpr::Binop(_, a, b) => depends(a, varies) || depends(b, varies),
            ScalarExpr::Ternop(_, a, b, c) => {
                depends(a, varies) || depends(b, varies) || depends(c, varies)
            }
        }
    }
    match e {
        ScalarExpr::Binop(BinOp::Mul, a, b) | ScalarExpr::Ternop(TernOp::Fma, a, b, _) => {
            depends(a, varies) && depends(b, varies)
        }
        ScalarExpr::Unop(UnOp::Neg, a) => is_product(a, varies),
        _ => false,
    }
}

/// Lowers one accumulation `lhs (op)= f(rhs…)` over its projections: loop variables for the
/// product space, indices and bounds guards, the statements at each point (a reduction
/// through a local when some iterators do not index the lhs), and the lhs loops around them.
fn lower_accum(prog: &mut Program, a: &AccumParts<'_>, out: &mut Vec<Stmt>) -> Result<(), Error> {
    check_shapes(prog, a)?;
    let p = a.proj;
    let id = a.lhs.id;
    let neutral = neutral_of(a)?;
    if p.product_space.contains(&0) {
        // No point to visit; only the initialization (if any) remains.
        if a.init {
            out.push(prog.fill_const(&a.lhs, neutral));
        }
        return Ok(());
    }
    let l = accum_loops(prog, p);
    let (lhs_guards, mut rhs_guards) = accum_guards(prog, a, &l)?;
    let (limits, selects) = dynamic_bounds(prog, a, &l.loop_of, &l.lhs_idx, &mut rhs_guards)?;

    // Lhs iterators come first, reduction iterators innermost.
    let (lhs_vars, red_vars): (Vec<Var>, Vec<Var>) =
        l.iter_vars.iter().map(|(_, v)| *v).partition(|v| l.lhs_idx.iter().any(|i| i.uses(*v)));
    // A variable that alone indexes some lhs axis writes distinct cells for distinct values.
    let sole = |v: Var| l.lhs_idx.iter().any(|i| i.terms == [(1, IdxVar::Loop(v))]);
    let injective_on_lhs_vars = lhs_vars.iter().all(|v| sole(*v));
    let self_reading = a.rhs.contains(&id);
    let start_neutral = a.init && injective_on_lhs_vars && !self_reading;

    // Cells the loops do not all reach, or old values the expression reads: initialize
    // separately, then accumulate.
    if a.init && (!p.is_surjective() || self_reading) {
        out.push(prog.fill_const(&a.lhs, neutral));
    }

    let args: Vec<Expr> =
        a.rhs.iter().zip(&l.rhs_idx).map(|(n, idx)| Expr::Get(*n, idx.clone())).collect();
    a.expr.symbols(&mut |s| register_symbol(prog, s));
    let value = select_rows(convert_expr(a.expr, &args), &selects, neutral);
    let old = Expr::Get(id, l.lhs_idx.clone());

    let point_body: Vec<Stmt> = if red_vars.is_empty() {
        let v = if start_neutral || a.accum.is_none() { value } else { combine(a, old, value) };
        guarded(rhs_guards, vec![Stmt::Set { node: id, idx: l.lhs_idx.clone(), value: v }])
    } else {
        let start = if start_neutral { Expr::Const(neutral) } else { old };
        let red = Reduction { vars: &red_vars, selects: &selects, guards: rhs_guards };
        reduction_point(prog, a, &l, red, value, start)
    };
    // Reading the lhs only at the cell being written (an optimizer's `w := w - lr·g`) keeps
    // iterations independent; reading other cells of it does not.
    let reads_other_cells =
        a.rhs.iter().zip(&l.rhs_idx).any(|(n, idx)| *n == id && *idx != l.lhs_idx);
    let mut nest = guarded(lhs_guards, point_body);
    for v in lhs_vars.iter().rev() {
        let parallel = !reads_other_cells && sole(*v);
        let limit = limits.get(v).copied();
        nest = vec![Stmt::For { var: *v, extent: l.extents[v], limit, parallel, body: nest }];
    }
    if !p.debug_info.is_empty() && p.debug_info != "identity" {
        out.push(Stmt::Comment(format!("{} {}", a.lhs.label, p.debug_info)));
    }
    out.extend(nest);
    Ok(())
}

/// The neutral element the accumulation starts from (0 for a plain assignment); an error when
/// the lhs must be initialized and the operation has none.
fn neutral_of(a: &AccumParts<'_>) -> Result<f64, Error> {
    let neutral = match a.accum {
        None => Some(0.0),
        Some(op) => op.neutral(),
    };
    if a.init && neutral.is_none() {
        return Err(Error::NoNeutral(a.accum.map_or("=", |op| op.name())));
    }
    Ok(neutral.unwrap_or(0.0))
}

/// `acc (op) v` for the accumulation's operation, or `v` for a plain assignment.
fn combine(a: &AccumParts<'_>, acc: Expr, v: Expr) -> Expr {
    match a.accum {
        None => v,
        Some(op) => Expr::bin(op, acc, v),
    }
}

/// The loops of one accumulation and the indices of its operands in their variables.
struct AccumLoops {
    /// The loop variable of each iterator of extent > 1.
    loop_of: FxHashMap<Symbol, Var>,
    /// Each loop variable's extent.
    extents: FxHashMap<Var, usize>,
    /// The iterators with a loop, in the order of the product space.
    iter_vars: Vec<(Symbol, Var)>,
    /// The lhs index of each axis.
    lhs_idx: Vec<Index>,
    /// Each rhs operand's index of each axis.
    rhs_idx: Vec<Vec<Index>>,
}

/// Loop variables for the iterators of extent > 1 (extent-1 iterators are the constant 0), and
/// the projected indices of the lhs and every rhs in them.
fn accum_loops(prog: &mut Program, p: &Projections) -> AccumLoops {
    let mut loop_of: FxHashMap<Symbol, Var> = FxHashMap::default();
    let mut extents: FxHashMap<Var, usize> = FxHashMap::default();
    let mut zero_iters = FxHashSet::default();
    let mut iter_vars = Vec::new();
    for (&s, &d) in p.product_iterators.iter().zip(&p.product_space) {
        if d == 1 {
            zero_iters.insert(s);
            continue;
        }
        let v = prog.fresh_var();
        loop_of.insert(s, v);
        extents.insert(v, d);
        iter_vars.push((s, v));
    }
    let zero_fix = |idx: &AxisIndex| {
        idx.subst(&mut |s| {
            if zero_iters.contains(&s) { AxisIndex::Fixed(0) } else { AxisIndex::Iterator(s) }
        })
    };
    let lhs_idx: Vec<Index> =
        p.project_lhs.iter().map(|i| convert_index(prog, &zero_fix(i), &loop_of)).collect();
    let rhs_idx: Vec<Vec<Index>> = p
        .project_rhs
        .iter()
        .map(|r| r.iter().map(|i| convert_index(prog, &zero_fix(i), &loop_of)).collect())
        .collect();
    AccumLoops { loop_of, extents, iter_vars, lhs_idx, rhs_idx }
}

/// The bounds guards of the lhs accesses and of the rhs accesses (those the lhs guards do not
/// already give).
fn accum_guards(
    prog: &mut Program,
    a: &AccumParts<'_>,
    l: &AccumLoops,
) -> Result<(Vec<Guard>, Vec<Guard>), Error> {
    let extent = |v: Var| l.extents.get(&v).copied();
    let mut lhs_guards = Vec::new();
    access_guards(prog, &a.lhs, &l.lhs_idx, &extent, &mut lhs_guards)?;
    let mut rhs_guards = Vec::new();
    for (k, r) in a.rhs.iter().enumerate() {
        let node = prog.nodes[r].clone();
        access_guards(prog, &node, &l.rhs_idx[k], &extent, &mut rhs_guards)?;
    }
    rhs_guards.retain(|g| !lhs_guards.contains(g));
    Ok((lhs_guards, rhs_guards))
}

/// The reduction loops of one lhs cell: their variables (innermost last), the dynamic sizes
/// selecting their rows, and the guards of the rhs accesses.
struct Reduction<'r> {
    vars: &'r [Var],
    selects: &'r [(Var, Symbol)],
    guards: Vec<Guard>,
}

/// One lhs cell of a reduction: a local starts at `start`, accumulates `value` over the
/// reduction loops, and is stored in the cell.
fn reduction_point(
    prog: &mut Program,
    a: &AccumParts<'_>,
    l: &AccumLoops,
    red: Reduction<'_>,
    value: Expr,
    start: Expr,
) -> Vec<Stmt> {
    let varies = |i: usize| l.rhs_idx[i].iter().any(|x| red.vars.iter().any(|v| x.uses(*v)));
    let points: usize = red.vars.iter().map(|v| l.extents[v]).product();
    let wide = a.accum == Some(BinOp::Add)
        && points >= WIDE_SUM_MIN_POINTS
        && matches!(a.lhs.prec, Prec::F32 | Prec::F16 | Prec::Bf16)
        && !is_product(a.expr, &varies);
    let (t, steps) = if wide {
        // A sum of one tensor's values (not a product's): each term is computed as
        // before, in the precision's compute precision, and added to an f64 accumulator,
        // rounded once when stored. Its error is then that of the final rounding for any
        // length a routine can have (see `docs/lowering.md`, "Accurate sums").
        let t = prog.fresh_local(Prec::F64);
        let u = prog.fresh_local(a.lhs.prec.compute());
        let sum = Expr::bin(BinOp::Add, Expr::Local(t), Expr::Local(u));
        (t, vec![Stmt::SetLocal { local: u, value }, Stmt::SetLocal { local: t, value: sum }])
    } else {
        let t = prog.fresh_local(a.lhs.prec.compute());
        (t, vec![Stmt::SetLocal { local: t, value: combine(a, Expr::Local(t), value) }])
    };
    let mut inner = guarded(red.guards, steps);
    for v in red.vars.iter().rev() {
        // Past the size every contribution is the neutral element: the loop may stop there.
        let limit =
            red.selects.iter().find(|(w, _)| w == v).map(|&(_, size)| Limit { size, per: 1 });
        inner =
            vec![Stmt::For { var: *v, extent: l.extents[v], limit, parallel: false, body: inner }];
    }
    let mut b = vec![Stmt::SetLocal { local: t, value: start }];
    b.extend(inner);
    b.push(Stmt::Set { node: a.lhs.id, idx: l.lhs_idx.clone(), value: Expr::Local(t) });
    b
}

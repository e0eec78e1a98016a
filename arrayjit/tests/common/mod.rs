//! Shared builders of test routines: each case is a node table, an assignment sequence, the
//! inputs to write and the outputs to compare, plus an independent reference where one is
//! simple to write.
#![allow(dead_code, clippy::needless_range_loop)]

use std::sync::Arc;

use rocannl_arrayjit::assignments::{Asgn, FetchOp, ScalarExpr};
use rocannl_arrayjit::indexing::{AxisIndex, Projections, Symbol, SymbolGen};
use rocannl_arrayjit::ops::{BinOp, Prec, TernOp, UnOp};
use rocannl_arrayjit::tnode::{MemoryMode, NodeId, NodeTable};
use rocannl_arrayjit::{BackendKind, CompileOptions, Context, NdArray};

use AxisIndex::{Fixed, Iterator as It};

pub struct Case {
    pub name: String,
    pub nodes: NodeTable,
    pub asgn: Asgn,
    pub inputs: Vec<(NodeId, Vec<f64>)>,
    pub outputs: Vec<NodeId>,
    pub bindings: Vec<(Symbol, i64)>,
    /// Expected values of each output, when the test computes them independently.
    pub expected: Option<Vec<Vec<f64>>>,
}

/// Deterministic pseudo-random inputs in `[lo, hi)`.
pub fn data(n: usize, seed: u64, lo: f64, hi: f64) -> Vec<f64> {
    (0..n).map(|i| lo + (hi - lo) * rocannl_arrayjit::ops::uniform(seed, i as u64)).collect()
}

pub fn accum(
    lhs: NodeId,
    accum: Option<BinOp>,
    rhs: Vec<NodeId>,
    expr: ScalarExpr,
    p: Projections,
    init: bool,
) -> Asgn {
    Asgn::Accum { lhs, accum, rhs, expr, projections: Arc::new(p), initialize_neutral: init }
}

pub fn proj(
    space: &[(Symbol, usize)],
    lhs_dims: &[usize],
    lhs: Vec<AxisIndex>,
    rhs: Vec<(Vec<usize>, Vec<AxisIndex>)>,
) -> Projections {
    Projections {
        product_space: space.iter().map(|(_, d)| *d).collect(),
        product_iterators: space.iter().map(|(s, _)| *s).collect(),
        lhs_dims: lhs_dims.to_vec(),
        rhs_dims: rhs.iter().map(|(d, _)| d.clone()).collect(),
        project_lhs: lhs,
        project_rhs: rhs.into_iter().map(|(_, i)| i).collect(),
        debug_info: String::new(),
        dynamic: vec![],
    }
}

/// Compiles `asgn` on `kind`, writes `values` into the `inputs`, runs it with `bindings`, and
/// returns the routine's low-level text and the `outputs`' values.
#[allow(dead_code)]
pub fn compile_and_run(
    kind: BackendKind,
    opts: CompileOptions,
    (asgn, nodes): (&Asgn, &NodeTable),
    inputs: &[(NodeId, &[f64])],
    outputs: &[NodeId],
    bindings: &[(Symbol, i64)],
) -> (String, Vec<Vec<f64>>) {
    let mut ctx = Context::new(kind, opts).unwrap();
    let r = ctx.compile("routine", asgn, nodes).unwrap();
    for &(id, vals) in inputs {
        let node = nodes.get(id).unwrap();
        ctx.ensure_buffer(node).unwrap();
        ctx.write(id, &NdArray::from_f64(node.prec, &node.dims, vals).unwrap()).unwrap();
    }
    ctx.run(&r, bindings).unwrap();
    let outs = outputs.iter().map(|o| ctx.read(*o).unwrap().to_f64_vec()).collect();
    (r.low_level_text().to_string(), outs)
}

pub fn host(nodes: &mut NodeTable, label: &str, dims: &[usize], prec: Prec) -> NodeId {
    nodes.add(label, dims, prec, MemoryMode::HostVisible)
}

pub fn virt(nodes: &mut NodeTable, label: &str, dims: &[usize], prec: Prec) -> NodeId {
    nodes.add(label, dims, prec, MemoryMode::Virtual)
}

fn domain_un(op: UnOp) -> (f64, f64) {
    match op {
        UnOp::Log | UnOp::Log2 | UnOp::Sqrt | UnOp::Recip => (0.25, 4.0),
        UnOp::Exp | UnOp::Exp2 => (-3.0, 3.0),
        _ => (-2.0, 2.0),
    }
}

/// `y = op(x)` over the given inputs (no reference values).
pub fn unop_case_on(op: UnOp, prec: Prec, xs: Vec<f64>) -> Case {
    let name = format!("{}_{}_{}", op.name(), prec.name(), xs.len());
    map_case(&name, prec, prec, ScalarExpr::un(op, ScalarExpr::Arg(0)), xs)
}

/// `y = expr(x)` cell by cell, `x` stored in `from` and `y` in `to`, over the given inputs (no
/// reference values).
pub fn map_case(name: &str, from: Prec, to: Prec, expr: ScalarExpr, xs: Vec<f64>) -> Case {
    let n = xs.len();
    let mut nodes = NodeTable::default();
    let x = host(&mut nodes, "x", &[n], from);
    let y = host(&mut nodes, "y", &[n], to);
    let p = Projections::identity(&[n], 1, &mut SymbolGen::default());
    Case {
        name: name.to_string(),
        asgn: accum(y, None, vec![x], expr, p, false),
        nodes,
        inputs: vec![(x, xs)],
        outputs: vec![y],
        bindings: vec![],
        expected: None,
    }
}

pub fn unop_case(op: UnOp, prec: Prec) -> Case {
    let n = 37;
    let mut nodes = NodeTable::default();
    let x = host(&mut nodes, "x", &[n], prec);
    let y = host(&mut nodes, "y", &[n], prec);
    let p = Projections::identity(&[n], 1, &mut SymbolGen::default());
    let (lo, hi) = domain_un(op);
    let mut xs = data(n, 1, lo, hi);
    if op == UnOp::Not {
        xs[3] = 0.0;
    }
    let xr: Vec<f64> = xs.iter().map(|v| prec.round(*v)).collect();
    let expected = xr.iter().map(|v| prec.round(op.apply(*v))).collect();
    Case {
        name: format!("{}_{}", op.name(), prec.name()),
        asgn: accum(y, None, vec![x], ScalarExpr::un(op, ScalarExpr::Arg(0)), p, false),
        nodes,
        inputs: vec![(x, xs)],
        outputs: vec![y],
        bindings: vec![],
        expected: Some(vec![expected]),
    }
}

pub fn binop_case(op: BinOp, prec: Prec) -> Case {
    let n = 29;
    let mut nodes = NodeTable::default();
    let x = host(&mut nodes, "x", &[n], prec);
    let y = host(&mut nodes, "y", &[n], prec);
    let z = host(&mut nodes, "z", &[n], prec);
    let p = Projections::identity(&[n], 2, &mut SymbolGen::default());
    let (lo, hi) = if op == BinOp::Pow { (0.5, 2.0) } else { (-2.0, 2.0) };
    let mut xs: Vec<f64> = data(n, 2, lo, hi).iter().map(|v| prec.round(*v)).collect();
    let ys: Vec<f64> = data(n, 3, lo, hi).iter().map(|v| prec.round(*v)).collect();
    xs[5] = ys[5]; // equal operands for the comparisons
    let expected = xs.iter().zip(&ys).map(|(a, b)| prec.round(op.apply(*a, *b))).collect();
    let expr = ScalarExpr::bin(op, ScalarExpr::Arg(0), ScalarExpr::Arg(1));
    Case {
        name: format!("{}_{}", op.name(), prec.name()),
        asgn: accum(z, None, vec![x, y], expr, p, false),
        nodes,
        inputs: vec![(x, xs), (y, ys)],
        outputs: vec![z],
        bindings: vec![],
        expected: Some(vec![expected]),
    }
}

pub fn ternop_case(op: TernOp, prec: Prec) -> Case {
    let n = 23;
    let mut nodes = NodeTable::default();
    let c = host(&mut nodes, "c", &[n], prec);
    let a = host(&mut nodes, "a", &[n], prec);
    let b = host(&mut nodes, "b", &[n], prec);
    let z = host(&mut nodes, "z", &[n], prec);
    let p = Projections::identity(&[n], 3, &mut SymbolGen::default());
    let cs: Vec<f64> =
        data(n, 4, -1.0, 1.0).iter().map(|v| if *v < 0.0 { 0.0 } else { prec.round(*v) }).collect();
    let as_: Vec<f64> = data(n, 5, -2.0, 2.0).iter().map(|v| prec.round(*v)).collect();
    let bs: Vec<f64> = data(n, 6, -2.0, 2.0).iter().map(|v| prec.round(*v)).collect();
    let expected = (0..n).map(|i| prec.round(op.apply(cs[i], as_[i], bs[i]))).collect();
    let expr = ScalarExpr::tern(op, ScalarExpr::Arg(0), ScalarExpr::Arg(1), ScalarExpr::Arg(2));
    Case {
        name: format!("{}_{}", op.name(), prec.name()),
        asgn: accum(z, None, vec![c, a, b], expr, p, false),
        nodes,
        inputs: vec![(c, cs), (a, as_), (b, bs)],
        outputs: vec![z],
        bindings: vec![],
        expected: Some(vec![expected]),
    }
}

/// `c[i,j] = Σ_k a[i,k] * b[k,j]`.
/// `c = a · bᵀ` with `b` stored `[n, k]` (a weight stored `[out, in]`, as in a backward
/// product): a transposed operand.
pub fn matmul_bt_case(m: usize, k: usize, n: usize, prec: Prec) -> Case {
    product_case(m, k, n, prec, true)
}

pub fn matmul_case(m: usize, k: usize, n: usize, prec: Prec) -> Case {
    product_case(m, k, n, prec, false)
}

/// `c = a · b` (`b` stored `[k, n]`) or `a · bᵀ` (`b` stored `[n, k]`), with its reference.
fn product_case(m: usize, k: usize, n: usize, prec: Prec, transposed: bool) -> Case {
    let mut nodes = NodeTable::default();
    let b_dims = if transposed { vec![n, k] } else { vec![k, n] };
    let a = host(&mut nodes, "a", &[m, k], prec);
    let b = host(&mut nodes, "b", &b_dims, prec);
    let c = host(&mut nodes, "c", &[m, n], prec);
    let (i, j, kk) = (Symbol(0), Symbol(1), Symbol(2));
    let b_idx = if transposed { vec![It(j), It(kk)] } else { vec![It(kk), It(j)] };
    let mut p = proj(
        &[(i, m), (j, n), (kk, k)],
        &[m, n],
        vec![It(i), It(j)],
        vec![(vec![m, k], vec![It(i), It(kk)]), (b_dims, b_idx)],
    );
    p.debug_info = "matmul".into();
    let av: Vec<f64> = data(m * k, 7, -1.0, 1.0).iter().map(|v| prec.round(*v)).collect();
    let bv: Vec<f64> = data(k * n, 8, -1.0, 1.0).iter().map(|v| prec.round(*v)).collect();
    let b_at = |t: usize, q: usize| if transposed { bv[q * k + t] } else { bv[t * n + q] };
    let mut cv = vec![0.0; m * n];
    for r in 0..m {
        for q in 0..n {
            cv[r * n + q] = prec.round((0..k).map(|t| av[r * k + t] * b_at(t, q)).sum());
        }
    }
    let expr = ScalarExpr::bin(BinOp::Mul, ScalarExpr::Arg(0), ScalarExpr::Arg(1));
    let kind = if transposed { "matmul_bt" } else { "matmul" };
    Case {
        name: format!("{kind}_{m}x{k}x{n}_{}", prec.name()),
        asgn: accum(c, Some(BinOp::Add), vec![a, b], expr, p, true),
        nodes,
        inputs: vec![(a, av), (b, bv)],
        outputs: vec![c],
        bindings: vec![],
        expected: Some(vec![cv]),
    }
}

/// `c += a·b` onto the values `c` already holds (no initialization): the gradient form.
pub fn matmul_onto_case(m: usize, k: usize, n: usize, prec: Prec) -> Case {
    let mut case = matmul_case(m, k, n, prec);
    let Asgn::Accum { lhs, accum, rhs, expr, projections, .. } = case.asgn else { unreachable!() };
    case.asgn = Asgn::Accum { lhs, accum, rhs, expr, projections, initialize_neutral: false };
    let c0: Vec<f64> = data(m * n, 9, -1.0, 1.0).iter().map(|v| prec.round(*v)).collect();
    if let Some(expected) = case.expected.as_mut() {
        let av = &case.inputs[0].1;
        let bv = &case.inputs[1].1;
        for r in 0..m {
            for q in 0..n {
                let dot: f64 = (0..k).map(|t| av[r * k + t] * bv[t * n + q]).sum();
                expected[0][r * n + q] = prec.round(c0[r * n + q] + dot);
            }
        }
    }
    case.inputs.push((lhs, c0));
    case.name = format!("matmul_onto_{m}x{k}x{n}_{}", prec.name());
    case
}

/// `y[i] op= x[i,k]` with initialization: sums, products, maxima, minima over the last axis.
pub fn reduce_case(op: BinOp, prec: Prec) -> Case {
    reduce_case_sized(op, prec, 5, 9)
}

/// [`reduce_case`] over `m` rows of `k`.
pub fn reduce_case_sized(op: BinOp, prec: Prec, m: usize, k: usize) -> Case {
    let mut nodes = NodeTable::default();
    let x = host(&mut nodes, "x", &[m, k], prec);
    let y = host(&mut nodes, "y", &[m], prec);
    let (i, kk) = (Symbol(0), Symbol(1));
    let p = proj(&[(i, m), (kk, k)], &[m], vec![It(i)], vec![(vec![m, k], vec![It(i), It(kk)])]);
    let xs: Vec<f64> = data(m * k, 9, 0.5, 1.5).iter().map(|v| prec.round(*v)).collect();
    let expected = (0..m)
        .map(|r| {
            let mut acc = op.neutral().unwrap_or(0.0);
            for t in 0..k {
                acc = op.apply(acc, xs[r * k + t]);
            }
            prec.round(acc)
        })
        .collect();
    Case {
        name: if (m, k) == (5, 9) {
            format!("reduce_{}_{}", op.name(), prec.name())
        } else {
            format!("reduce_{}_{}_{m}x{k}", op.name(), prec.name())
        },
        asgn: accum(y, Some(op), vec![x], ScalarExpr::Arg(0), p, true),
        nodes,
        inputs: vec![(x, xs)],
        outputs: vec![y],
        bindings: vec![],
        expected: Some(vec![expected]),
    }
}

/// `z[i,j] = x[i,j] + b[0,j]`: broadcasting a size-1 axis with a fixed index 0.
pub fn broadcast_case(prec: Prec) -> Case {
    let (m, n) = (4, 6);
    let mut nodes = NodeTable::default();
    let x = host(&mut nodes, "x", &[m, n], prec);
    let b = host(&mut nodes, "b", &[1, n], prec);
    let z = host(&mut nodes, "z", &[m, n], prec);
    let (i, j) = (Symbol(0), Symbol(1));
    let p = proj(
        &[(i, m), (j, n)],
        &[m, n],
        vec![It(i), It(j)],
        vec![(vec![m, n], vec![It(i), It(j)]), (vec![1, n], vec![Fixed(0), It(j)])],
    );
    let xs = data(m * n, 10, -1.0, 1.0);
    let bs = data(n, 11, -1.0, 1.0);
    let expected =
        (0..m * n).map(|c| prec.round(prec.round(xs[c]) + prec.round(bs[c % n]))).collect();
    let expr = ScalarExpr::bin(BinOp::Add, ScalarExpr::Arg(0), ScalarExpr::Arg(1));
    Case {
        name: format!("broadcast_{}", prec.name()),
        asgn: accum(z, None, vec![x, b], expr, p, false),
        nodes,
        inputs: vec![(x, xs), (b, bs)],
        outputs: vec![z],
        bindings: vec![],
        expected: Some(vec![expected]),
    }
}

/// `y[j] = x[2, j]` (a fixed index) and `w[0, j] = x[1, j]` (a fixed lhs index, not surjective).
pub fn fixed_index_case(prec: Prec) -> Case {
    let (m, n) = (3, 5);
    let mut nodes = NodeTable::default();
    let x = host(&mut nodes, "x", &[m, n], prec);
    let y = host(&mut nodes, "y", &[n], prec);
    let w = host(&mut nodes, "w", &[2, n], prec);
    let j = Symbol(0);
    let p1 = proj(&[(j, n)], &[n], vec![It(j)], vec![(vec![m, n], vec![Fixed(2), It(j)])]);
    let p2 =
        proj(&[(j, n)], &[2, n], vec![Fixed(0), It(j)], vec![(vec![m, n], vec![Fixed(1), It(j)])]);
    let xs: Vec<f64> = data(m * n, 12, -1.0, 1.0).iter().map(|v| prec.round(*v)).collect();
    let ey = xs[2 * n..3 * n].to_vec();
    let mut ew = vec![0.0; 2 * n];
    ew[..n].copy_from_slice(&xs[n..2 * n]);
    Case {
        name: format!("fixed_index_{}", prec.name()),
        asgn: Asgn::Seq(vec![
            accum(y, None, vec![x], ScalarExpr::Arg(0), p1, false),
            accum(w, None, vec![x], ScalarExpr::Arg(0), p2, true),
        ]),
        nodes,
        inputs: vec![(x, xs), (w, vec![7.0; 2 * n])],
        outputs: vec![y, w],
        bindings: vec![],
        expected: Some(vec![ey, ew]),
    }
}

/// A padded, strided 1-d convolution: `y[o] += x[stride*o + k - pad] * w[k]`.
pub fn conv_case(prec: Prec, stride: i64, pad: i64) -> Case {
    let (n, kw) = (10usize, 3usize);
    let out = ((n as i64 + 2 * pad - kw as i64) / stride + 1) as usize;
    let mut nodes = NodeTable::default();
    let x = host(&mut nodes, "x", &[n], prec);
    let w = host(&mut nodes, "w", &[kw], prec);
    let y = host(&mut nodes, "y", &[out], prec);
    let (o, k) = (Symbol(0), Symbol(1));
    let mut p = proj(
        &[(o, out), (k, kw)],
        &[out],
        vec![It(o)],
        vec![
            (vec![n], vec![AxisIndex::affine(vec![(stride, o), (1, k)], -pad)]),
            (vec![kw], vec![It(k)]),
        ],
    );
    p.debug_info = "conv".into();
    let xs: Vec<f64> = data(n, 13, -1.0, 1.0).iter().map(|v| prec.round(*v)).collect();
    let ws: Vec<f64> = data(kw, 14, -1.0, 1.0).iter().map(|v| prec.round(*v)).collect();
    let expected = (0..out)
        .map(|oi| {
            let mut acc = 0.0;
            for ki in 0..kw {
                let xi = stride * oi as i64 + ki as i64 - pad;
                if (0..n as i64).contains(&xi) {
                    acc += xs[xi as usize] * ws[ki];
                }
            }
            prec.round(acc)
        })
        .collect();
    let expr = ScalarExpr::bin(BinOp::Mul, ScalarExpr::Arg(0), ScalarExpr::Arg(1));
    Case {
        name: format!("conv_s{stride}_p{pad}_{}", prec.name()),
        asgn: accum(y, Some(BinOp::Add), vec![x, w], expr, p, true),
        nodes,
        inputs: vec![(x, xs), (w, ws)],
        outputs: vec![y],
        bindings: vec![],
        expected: Some(vec![expected]),
    }
}

/// `z = concat(x, y)` along the last axis: two assignments with an affine lhs offset.
pub fn concat_case(prec: Prec) -> Case {
    let (m, a, b) = (2, 3, 4);
    let mut nodes = NodeTable::default();
    let x = host(&mut nodes, "x", &[m, a], prec);
    let y = host(&mut nodes, "y", &[m, b], prec);
    let z = host(&mut nodes, "z", &[m, a + b], prec);
    let (i, j) = (Symbol(0), Symbol(1));
    let p1 = proj(
        &[(i, m), (j, a)],
        &[m, a + b],
        vec![It(i), It(j)],
        vec![(vec![m, a], vec![It(i), It(j)])],
    );
    let p2 = proj(
        &[(i, m), (j, b)],
        &[m, a + b],
        vec![It(i), AxisIndex::affine(vec![(1, j)], a as i64)],
        vec![(vec![m, b], vec![It(i), It(j)])],
    );
    let xs: Vec<f64> = data(m * a, 15, -1.0, 1.0).iter().map(|v| prec.round(*v)).collect();
    let ys: Vec<f64> = data(m * b, 16, -1.0, 1.0).iter().map(|v| prec.round(*v)).collect();
    let mut ez = Vec::new();
    for r in 0..m {
        ez.extend_from_slice(&xs[r * a..(r + 1) * a]);
        ez.extend_from_slice(&ys[r * b..(r + 1) * b]);
    }
    Case {
        name: format!("concat_{}", prec.name()),
        asgn: Asgn::Seq(vec![
            accum(z, None, vec![x], ScalarExpr::Arg(0), p1, true),
            accum(z, None, vec![y], ScalarExpr::Arg(0), p2, false),
        ]),
        nodes,
        inputs: vec![(x, xs), (y, ys)],
        outputs: vec![z],
        bindings: vec![],
        expected: Some(vec![ez]),
    }
}

/// A softmax over the last axis: max-reduce, exp of the difference, sum, divide.
pub fn softmax_case(prec: Prec, m: usize, n: usize) -> Case {
    let mut nodes = NodeTable::default();
    let x = host(&mut nodes, "x", &[m, n], prec);
    let mx = nodes.add("max", &[m, 1], prec, MemoryMode::Local);
    let e = virt(&mut nodes, "exp", &[m, n], prec);
    let s = nodes.add("sum", &[m, 1], prec, MemoryMode::Local);
    let y = host(&mut nodes, "y", &[m, n], prec);
    let (i, j) = (Symbol(0), Symbol(1));
    let full = vec![It(i), It(j)];
    let row = vec![It(i), Fixed(0)];
    let sp = [(i, m), (j, n)];
    let p_max = proj(&sp, &[m, 1], row.clone(), vec![(vec![m, n], full.clone())]);
    let p_exp = proj(
        &sp,
        &[m, n],
        full.clone(),
        vec![(vec![m, n], full.clone()), (vec![m, 1], row.clone())],
    );
    let p_sum = proj(&sp, &[m, 1], row.clone(), vec![(vec![m, n], full.clone())]);
    let p_div =
        proj(&sp, &[m, n], full.clone(), vec![(vec![m, n], full.clone()), (vec![m, 1], row)]);
    let xs: Vec<f64> = data(m * n, 17, -3.0, 3.0).iter().map(|v| prec.round(*v)).collect();
    let mut ey = vec![0.0; m * n];
    for r in 0..m {
        let row = &xs[r * n..(r + 1) * n];
        let mxv = row.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
        let sum: f64 = row.iter().map(|v| (v - mxv).exp()).sum();
        for q in 0..n {
            ey[r * n + q] = (row[q] - mxv).exp() / sum;
        }
    }
    let a0 = || ScalarExpr::Arg(0);
    let a1 = || ScalarExpr::Arg(1);
    Case {
        name: format!("softmax_{}", prec.name()),
        asgn: Asgn::Seq(vec![
            Asgn::Comment("softmax".into()),
            accum(mx, Some(BinOp::Max), vec![x], a0(), p_max, true),
            accum(
                e,
                None,
                vec![x, mx],
                ScalarExpr::un(UnOp::Exp, ScalarExpr::bin(BinOp::Sub, a0(), a1())),
                p_exp,
                false,
            ),
            accum(s, Some(BinOp::Add), vec![e], a0(), p_sum, true),
            accum(y, None, vec![e, s], ScalarExpr::bin(BinOp::Div, a0(), a1()), p_div, false),
        ]),
        nodes,
        inputs: vec![(x, xs)],
        outputs: vec![y],
        bindings: vec![],
        expected: Some(vec![ey]),
    }
}

/// Every fetch: constant, iota, embedded symbol, uniform random numbers.
pub fn fetch_case(prec: Prec) -> Case {
    let mut nodes = NodeTable::default();
    let c = host(&mut nodes, "c", &[2, 3], prec);
    let io = host(&mut nodes, "iota", &[2, 3], prec);
    let sy = host(&mut nodes, "sym", &[2], prec);
    let u = host(&mut nodes, "u", &[4, 5], prec);
    let s = Symbol(40);
    let eu = (0..20).map(|o| prec.round(rocannl_arrayjit::ops::uniform(99, o))).collect();
    Case {
        name: format!("fetch_{}", prec.name()),
        asgn: Asgn::Seq(vec![
            Asgn::Fetch { lhs: c, fetch: FetchOp::Constant(2.5) },
            Asgn::Fetch { lhs: io, fetch: FetchOp::Iota },
            Asgn::Fetch { lhs: sy, fetch: FetchOp::EmbedSymbol(s) },
            Asgn::Fetch { lhs: u, fetch: FetchOp::Uniform { seed: 99, salt: None } },
        ]),
        nodes,
        inputs: vec![],
        outputs: vec![c, io, sy, u],
        bindings: vec![(s, 7)],
        expected: Some(vec![vec![2.5; 6], (0..6).map(|v| v as f64).collect(), vec![7.0; 2], eu]),
    }
}

/// A batch slice: `y[j] = x[s, j]` with a runtime symbol `s`.
pub fn batch_slice_case(prec: Prec, s_value: i64) -> Case {
    let (b, n) = (4, 3);
    let mut nodes = NodeTable::default();
    let x = host(&mut nodes, "x", &[b, n], prec);
    let y = host(&mut nodes, "y", &[n], prec);
    let (j, s) = (Symbol(0), Symbol(50));
    let p = proj(&[(j, n)], &[n], vec![It(j)], vec![(vec![b, n], vec![It(s), It(j)])]);
    let xs: Vec<f64> = data(b * n, 18, -1.0, 1.0).iter().map(|v| prec.round(*v)).collect();
    let sv = s_value.clamp(0, b as i64 - 1) as usize;
    let ey = xs[sv * n..(sv + 1) * n].to_vec();
    Case {
        name: format!("batch_slice_{}", prec.name()),
        asgn: accum(y, None, vec![x], ScalarExpr::Arg(0), p, false),
        nodes,
        inputs: vec![(x, xs)],
        outputs: vec![y],
        bindings: vec![(s, s_value)],
        expected: Some(vec![ey]),
    }
}

/// A dynamic batch: the rows `i` of `c = a·b` (then `w = aᵀ·d`, reducing over the rows, and the
/// column means `m = Σ_i d[i]/n`) stop at the runtime size `n` of a maximum `mm`. A backend may
/// compute the rows of `c` past `n` or not (`a` is zero there, so they are zero either way);
/// the reductions must not read `d` past `n` (it is not zero there).
pub fn dynamic_case(prec: Prec, n_value: usize) -> Case {
    let (mm, k, n) = (24, 20, 32);
    let mut nodes = NodeTable::default();
    let a = host(&mut nodes, "a", &[mm, k], prec);
    let b = host(&mut nodes, "b", &[k, n], prec);
    let d = host(&mut nodes, "d", &[mm, n], prec);
    let c = host(&mut nodes, "c", &[mm, n], prec);
    let w = host(&mut nodes, "w", &[k, n], prec);
    let m = host(&mut nodes, "m", &[n], prec);
    let size = Symbol(60);
    let (i, j, kk) = (Symbol(0), Symbol(1), Symbol(2));
    let mut pc = proj(
        &[(i, mm), (j, n), (kk, k)],
        &[mm, n],
        vec![It(i), It(j)],
        vec![(vec![mm, k], vec![It(i), It(kk)]), (vec![k, n], vec![It(kk), It(j)])],
    );
    pc.dynamic = vec![(i, size)];
    let (i2, j2, k2) = (Symbol(3), Symbol(4), Symbol(5));
    let mut pw = proj(
        &[(k2, k), (j2, n), (i2, mm)],
        &[k, n],
        vec![It(k2), It(j2)],
        vec![(vec![mm, k], vec![It(i2), It(k2)]), (vec![mm, n], vec![It(i2), It(j2)])],
    );
    pw.dynamic = vec![(i2, size)];
    let (i3, j3) = (Symbol(6), Symbol(7));
    let mut pm =
        proj(&[(j3, n), (i3, mm)], &[n], vec![It(j3)], vec![(vec![mm, n], vec![It(i3), It(j3)])]);
    pm.dynamic = vec![(i3, size)];
    let rows = n_value;
    let av: Vec<f64> = data(mm * k, 31, -1.0, 1.0)
        .iter()
        .enumerate()
        .map(|(p, v)| if p / k < rows { prec.round(*v) } else { 0.0 })
        .collect();
    let bv: Vec<f64> = data(k * n, 32, -1.0, 1.0).iter().map(|v| prec.round(*v)).collect();
    let dv: Vec<f64> = data(mm * n, 33, -1.0, 1.0).iter().map(|v| prec.round(*v)).collect();
    let mut cv = vec![0.0; mm * n];
    for r in 0..rows {
        for q in 0..n {
            cv[r * n + q] = prec.round((0..k).map(|t| av[r * k + t] * bv[t * n + q]).sum());
        }
    }
    let mut wv = vec![0.0; k * n];
    for t in 0..k {
        for q in 0..n {
            wv[t * n + q] = prec.round((0..rows).map(|r| av[r * k + t] * dv[r * n + q]).sum());
        }
    }
    let mv: Vec<f64> = (0..n)
        .map(|q| prec.round((0..rows).map(|r| dv[r * n + q]).sum::<f64>() / rows as f64))
        .collect();
    let mul = |x, y| ScalarExpr::bin(BinOp::Mul, x, y);
    let mean =
        mul(ScalarExpr::Arg(0), ScalarExpr::Unop(UnOp::Recip, Box::new(ScalarExpr::Symbol(size))));
    Case {
        name: format!("dynamic_batch_{}", prec.name()),
        asgn: Asgn::Seq(vec![
            accum(
                c,
                Some(BinOp::Add),
                vec![a, b],
                mul(ScalarExpr::Arg(0), ScalarExpr::Arg(1)),
                pc,
                true,
            ),
            accum(
                w,
                Some(BinOp::Add),
                vec![a, d],
                mul(ScalarExpr::Arg(0), ScalarExpr::Arg(1)),
                pw,
                true,
            ),
            accum(m, Some(BinOp::Add), vec![d], mean, pm, true),
        ]),
        nodes,
        inputs: vec![(a, av), (b, bv), (d, dv)],
        outputs: vec![c, w, m],
        bindings: vec![(size, n_value as i64)],
        expected: Some(vec![cv, wv, mv]),
    }
}

/// Mixed precisions in one assignment: `z(f64) = x(f16) * y(f32) + 1`.
pub fn mixed_prec_case() -> Case {
    let n = 8;
    let mut nodes = NodeTable::default();
    let x = host(&mut nodes, "x", &[n], Prec::F16);
    let y = host(&mut nodes, "y", &[n], Prec::F32);
    let z = host(&mut nodes, "z", &[n], Prec::F64);
    let p = Projections::identity(&[n], 2, &mut SymbolGen::default());
    let xs: Vec<f64> = data(n, 19, -1.0, 1.0).iter().map(|v| Prec::F16.round(*v)).collect();
    let ys: Vec<f64> = data(n, 20, -1.0, 1.0).iter().map(|v| Prec::F32.round(*v)).collect();
    let ez = (0..n).map(|i| xs[i] * ys[i] + 1.0).collect();
    let expr = ScalarExpr::bin(
        BinOp::Add,
        ScalarExpr::bin(BinOp::Mul, ScalarExpr::Arg(0), ScalarExpr::Arg(1)),
        ScalarExpr::Const(1.0),
    );
    Case {
        name: "mixed_precision".into(),
        asgn: accum(z, None, vec![x, y], expr, p, false),
        nodes,
        inputs: vec![(x, xs), (y, ys)],
        outputs: vec![z],
        bindings: vec![],
        expected: Some(vec![ez]),
    }
}

/// Runs a case on a backend; returns each output's values.
pub fn run_case(kind: BackendKind, opts: CompileOptions, case: &Case) -> Vec<Vec<f64>> {
    let mut ctx = Context::new(kind, opts).unwrap_or_else(|e| panic!("{}: {e}", case.name));
    let r = ctx
        .compile(&case.name, &case.asgn, &case.nodes)
        .unwrap_or_else(|e| panic!("{}: {e}", case.name));
    for (id, vals) in &case.inputs {
        let node = case.nodes.get(*id).unwrap();
        ctx.ensure_buffer(node).unwrap();
        ctx.write(*id, &NdArray::from_f64(node.prec, &node.dims, vals).unwrap()).unwrap();
    }
    ctx.run(&r, &case.bindings).unwrap_or_else(|e| panic!("{}: {e}", case.name));
    case.outputs.iter().map(|o| ctx.read(*o).unwrap().to_f64_vec()).collect()
}

/// Relative tolerance of comparisons of values stored in `prec`.
pub fn tolerance(prec: Prec) -> f64 {
    match prec {
        Prec::F16 => 4e-3,
        Prec::Bf16 => 2e-2,
        Prec::F32 => 2e-5,
        Prec::F64 => 1e-11,
        Prec::U32 => 0.0,
    }
}

pub fn assert_close(name: &str, got: &[f64], want: &[f64], tol: f64) {
    assert_eq!(got.len(), want.len(), "{name}: lengths differ");
    for (i, (g, w)) in got.iter().zip(want).enumerate() {
        let ok = (g.is_nan() && w.is_nan())
            || g == w
            || (g - w).abs() <= tol * (1.0 + w.abs().max(g.abs()));
        assert!(ok, "{name}: element {i}: got {g}, want {w} (tolerance {tol})");
    }
}

/// The precision of a case's first output, for its tolerance.
pub fn case_prec(case: &Case) -> Prec {
    case.nodes.get(case.outputs[0]).unwrap().prec
}

/// Every case of the conformance suite in the given precisions.
pub fn all_cases(precs: &[Prec]) -> Vec<Case> {
    let mut cases = Vec::new();
    for &prec in precs {
        cases.extend(UnOp::ALL.iter().map(|op| unop_case(*op, prec)));
        cases.extend(BinOp::ALL.iter().map(|op| binop_case(*op, prec)));
        cases.extend(TernOp::ALL.iter().map(|op| ternop_case(*op, prec)));
        for op in [BinOp::Add, BinOp::Mul, BinOp::Max, BinOp::Min] {
            cases.push(reduce_case(op, prec));
        }
        cases.push(matmul_case(7, 5, 6, prec));
        cases.push(broadcast_case(prec));
        cases.push(fixed_index_case(prec));
        cases.push(conv_case(prec, 1, 1));
        cases.push(conv_case(prec, 2, 2));
        cases.push(concat_case(prec));
        cases.push(softmax_case(prec, 3, 7));
        cases.push(fetch_case(prec));
        cases.push(batch_slice_case(prec, 2));
        cases.push(dynamic_case(prec, 7));
    }
    cases.push(mixed_prec_case());
    cases
}

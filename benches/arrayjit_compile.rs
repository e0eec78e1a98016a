//! Compile latency: lowering and optimization alone (interp, no code generation) of pointwise
//! chains of 1k, 4k and 16k nodes — the time per node must stay flat, every pass being linear —
//! and of a 2-layer transformer's whole training step; then a routine of about 1000 statements
//! (a chain of pointwise operations and small reductions, as in a training step) on gccjit at
//! -O0, -O2 and -O3.

use std::sync::Arc;

use criterion::{BenchmarkId, Criterion, criterion_group, criterion_main};
use rocannl::arrayjit::assignments::{Asgn, ScalarExpr};
use rocannl::arrayjit::indexing::{AxisIndex, Projections, Symbol, SymbolGen};
use rocannl::arrayjit::ops::{BinOp, Prec, UnOp};
use rocannl::arrayjit::tnode::{MemoryMode, NodeTable};
use rocannl::arrayjit::{BackendKind, CompileOptions, Context};

/// `steps` groups of: a pointwise op, a row reduction and a broadcast update, every node kept
/// (OnDevice) so nothing is virtualized away: about 3 loop nests and 4 statements per group.
fn routine(steps: usize) -> (Asgn, NodeTable) {
    let (m, n) = (16, 32);
    let mut nodes = NodeTable::default();
    let mut g = SymbolGen::default();
    let mut cur = nodes.add("x", &[m, n], Prec::F32, MemoryMode::HostVisible);
    let mut seq = Vec::new();
    let (i, j) = (Symbol(1000), Symbol(1001));
    let it = AxisIndex::Iterator;
    for s in 0..steps {
        let y = nodes.add(&format!("y{s}"), &[m, n], Prec::F32, MemoryMode::OnDevice);
        let r = nodes.add(&format!("r{s}"), &[m, 1], Prec::F32, MemoryMode::OnDevice);
        let z = nodes.add(&format!("z{s}"), &[m, n], Prec::F32, MemoryMode::OnDevice);
        let op = [UnOp::Tanh, UnOp::Relu, UnOp::Exp, UnOp::Sigmoid][s % 4];
        seq.push(Asgn::Accum {
            lhs: y,
            accum: None,
            rhs: vec![cur],
            expr: ScalarExpr::un(op, ScalarExpr::Arg(0)),
            projections: Arc::new(Projections::identity(&[m, n], 1, &mut g)),
            initialize_neutral: false,
        });
        let red = Projections {
            product_space: vec![m, n],
            product_iterators: vec![i, j],
            lhs_dims: vec![m, 1],
            rhs_dims: vec![vec![m, n]],
            project_lhs: vec![it(i), AxisIndex::Fixed(0)],
            project_rhs: vec![vec![it(i), it(j)]],
            debug_info: "sum".into(),
            dynamic: vec![],
        };
        seq.push(Asgn::Accum {
            lhs: r,
            accum: Some(BinOp::Add),
            rhs: vec![y],
            expr: ScalarExpr::Arg(0),
            projections: Arc::new(red),
            initialize_neutral: true,
        });
        let bcast = Projections {
            product_space: vec![m, n],
            product_iterators: vec![i, j],
            lhs_dims: vec![m, n],
            rhs_dims: vec![vec![m, n], vec![m, 1]],
            project_lhs: vec![it(i), it(j)],
            project_rhs: vec![vec![it(i), it(j)], vec![it(i), AxisIndex::Fixed(0)]],
            debug_info: "sub".into(),
            dynamic: vec![],
        };
        seq.push(Asgn::Accum {
            lhs: z,
            accum: None,
            rhs: vec![y, r],
            expr: ScalarExpr::bin(
                BinOp::Sub,
                ScalarExpr::Arg(0),
                ScalarExpr::bin(BinOp::Mul, ScalarExpr::Arg(1), ScalarExpr::Const(0.03125)),
            ),
            projections: Arc::new(bcast),
            initialize_neutral: false,
        });
        cur = z;
    }
    (Asgn::Seq(seq), nodes)
}

/// A chain of `n` pointwise adds, every intermediate inlinable (as `gen_docs.py chain` without
/// the named outputs), each node read by the next and by a balanced tree of adds at the end.
fn chain(n: usize) -> (Asgn, NodeTable) {
    let len = 4;
    let mut nodes = NodeTable::default();
    let mut g = SymbolGen::default();
    let mut seq = Vec::new();
    let add = |nodes: &mut NodeTable, seq: &mut Vec<Asgn>, g: &mut SymbolGen, a, b, mode| {
        let out = nodes.add("t", &[len], Prec::F32, mode);
        seq.push(Asgn::Accum {
            lhs: out,
            accum: None,
            rhs: vec![a, b],
            expr: ScalarExpr::bin(BinOp::Add, ScalarExpr::Arg(0), ScalarExpr::Arg(1)),
            projections: Arc::new(Projections::identity(&[len], 2, g)),
            initialize_neutral: false,
        });
        out
    };
    let one = nodes.add("one", &[len], Prec::F32, MemoryMode::HostVisible);
    let mut prev = nodes.add("x", &[len], Prec::F32, MemoryMode::HostVisible);
    let mut level = Vec::with_capacity(n);
    for _ in 0..n {
        // Every chain node is kept (it is read twice and is no cheap recomputation target once
        // the tree reads it), the tree's nodes are inlined.
        prev = add(&mut nodes, &mut seq, &mut g, prev, one, MemoryMode::OnDevice);
        level.push(prev);
    }
    while level.len() > 1 {
        let mut next = Vec::with_capacity(level.len() / 2 + 1);
        for pair in level.chunks(2) {
            next.push(match pair {
                [a, b] => add(&mut nodes, &mut seq, &mut g, *a, *b, MemoryMode::Virtual),
                [a] => *a,
                _ => unreachable!(),
            });
        }
        level = next;
    }
    // The result, read by the host.
    add(&mut nodes, &mut seq, &mut g, level[0], one, MemoryMode::HostVisible);
    (Asgn::Seq(seq), nodes)
}

/// Lowering and optimization of a 2-layer transformer's training step (forward, backprop and
/// Adam update), the kind of program the compile-latency work is measured on.
fn transformer_step() -> (rocannl::tensor::Session, rocannl::tensor::Tensor) {
    use rocannl::tensor::nn::attention::{
        AttentionConfig, TransformerBlock, TransformerBlockConfig,
    };
    use rocannl::tensor::nn::loss;
    use rocannl::tensor::{Axes, Graph, Session, SessionOptions};
    let g = Graph::with_seed(0);
    let mut x = g.data("tokens", Axes::new().batch(&[32, 16]).output(&[64]));
    for l in 0..2 {
        let cfg = TransformerBlockConfig::new(AttentionConfig::new(4, 16), 256);
        x = TransformerBlock::new(&g, &format!("layer{l}"), cfg).apply(&x);
    }
    let y = g.data("targets", Axes::new().batch(&[32, 16]).output(&[64]));
    let l = loss::mse(&x, &y, loss::Reduction::Mean);
    let opts = SessionOptions { backend: BackendKind::Interp, ..SessionOptions::default() };
    (Session::with_options(&g, opts).expect("session"), l)
}

fn lowering(c: &mut Criterion) {
    let mut group = c.benchmark_group("lower_and_optimize");
    group.sample_size(10);
    for n in [1000usize, 4000, 16000] {
        let (asgn, nodes) = chain(n);
        group.bench_function(BenchmarkId::new("chain", n), |b| {
            let opts = CompileOptions::default();
            b.iter(|| {
                rocannl::arrayjit::compile_program("chain", &asgn, &nodes, &opts).expect("lowered")
            })
        });
    }
    group.bench_function("transformer2_train_step", |b| {
        b.iter_batched(
            transformer_step,
            |(mut s, l)| {
                s.train_step(
                    &l,
                    &rocannl::tensor::Optimizer::Adam(Default::default()),
                    &[],
                    &Default::default(),
                )
                .expect("compiled")
            },
            criterion::BatchSize::LargeInput,
        )
    });
    group.finish();
}

fn statements(text: &str) -> usize {
    text.lines().filter(|l| l.contains(":=")).count()
}

fn bench(c: &mut Criterion) {
    let (asgn, nodes) = routine(250);
    let mut group = c.benchmark_group("compile_1000_statements");
    group.sample_size(10);
    for opt_level in [0u8, 2, 3] {
        // A whole build at this level each time (no quick first tier).
        let opts = CompileOptions { opt_level, tiered: false, ..CompileOptions::default() };
        let mut ctx = Context::new(BackendKind::Gccjit, opts).expect("context");
        let r = ctx.compile("probe", &asgn, &nodes).expect("compile");
        eprintln!("low-level statements: {}", statements(r.low_level_text()));
        group.bench_function(BenchmarkId::new("gccjit", format!("O{opt_level}")), |b| {
            b.iter(|| ctx.compile("step", &asgn, &nodes).expect("compile"))
        });
    }
    group.finish();
}

criterion_group!(benches, lowering, bench);
criterion_main!(benches);

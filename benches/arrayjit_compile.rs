//! Compile latency of a routine of about 1000 statements (a chain of pointwise operations and
//! small reductions, as in a training step) on gccjit at -O0, -O2 and -O3.

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

fn statements(text: &str) -> usize {
    text.lines().filter(|l| l.contains(":=")).count()
}

fn bench(c: &mut Criterion) {
    let (asgn, nodes) = routine(250);
    let mut group = c.benchmark_group("compile_1000_statements");
    group.sample_size(10);
    for opt_level in [0u8, 2, 3] {
        let opts = CompileOptions { opt_level, ..CompileOptions::default() };
        let mut ctx = Context::new(BackendKind::Gccjit, opts).expect("context");
        let r = ctx.compile("probe", &asgn, &nodes).expect("compile");
        eprintln!("low-level statements: {}", statements(r.low_level_text()));
        group.bench_function(BenchmarkId::new("gccjit", format!("O{opt_level}")), |b| {
            b.iter(|| ctx.compile("step", &asgn, &nodes).expect("compile"))
        });
    }
    group.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);

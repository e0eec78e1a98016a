//! Matrix multiplication `c = a · b` (f32, n×n) on the compiled backends, in GFLOP/s; and in
//! bf16 (`matmul_bf16`: bf16 factors and result, gccjit), where the host's bf16 dot products
//! compute it and round the result as they store it.
//!
//! Criterion's throughput is set to the 2n³ floating-point operations of one call, so its
//! "elem/s" figures read as FLOP/s. The routine is compiled once; each iteration is one run.

use std::sync::Arc;

use criterion::{BenchmarkId, Criterion, Throughput, criterion_group, criterion_main};
use rocannl::arrayjit::assignments::{Asgn, ScalarExpr};
use rocannl::arrayjit::indexing::{AxisIndex, Projections, Symbol};
use rocannl::arrayjit::ops::{BinOp, Prec};
use rocannl::arrayjit::tnode::{MemoryMode, NodeTable};
use rocannl::arrayjit::{BackendKind, CompileOptions, Context, NdArray, Routine};

fn matmul(ctx: &mut Context, n: usize, prec: Prec) -> Routine {
    let mut nodes = NodeTable::default();
    let a = nodes.add("a", &[n, n], prec, MemoryMode::HostVisible);
    let b = nodes.add("b", &[n, n], prec, MemoryMode::HostVisible);
    let c = nodes.add("c", &[n, n], prec, MemoryMode::HostVisible);
    let (i, j, k) = (Symbol(0), Symbol(1), Symbol(2));
    let it = AxisIndex::Iterator;
    let projections = Arc::new(Projections {
        product_space: vec![n, n, n],
        product_iterators: vec![i, j, k],
        lhs_dims: vec![n, n],
        rhs_dims: vec![vec![n, n], vec![n, n]],
        project_lhs: vec![it(i), it(j)],
        project_rhs: vec![vec![it(i), it(k)], vec![it(k), it(j)]],
        debug_info: "matmul".into(),
        dynamic: vec![],
    });
    let asgn = Asgn::Accum {
        lhs: c,
        accum: Some(BinOp::Add),
        rhs: vec![a, b],
        expr: ScalarExpr::bin(BinOp::Mul, ScalarExpr::Arg(0), ScalarExpr::Arg(1)),
        projections,
        initialize_neutral: true,
    };
    let r = ctx.compile("matmul", &asgn, &nodes).expect("compile");
    let data: Vec<f64> = (0..n * n).map(|x| ((x % 17) as f64 - 8.0) / 8.0).collect();
    for id in [a, b] {
        ctx.write(id, &NdArray::from_f64(prec, &[n, n], &data).expect("data")).expect("write");
    }
    r
}

fn bench(c: &mut Criterion) {
    let mut group = c.benchmark_group("matmul_f32");
    group.sample_size(10);
    for kind in [BackendKind::Gccjit, BackendKind::Interp] {
        for n in [256, 512, 1024] {
            // Steady state: the optimized build, not a quick first tier.
            let opts = CompileOptions { tiered: false, ..CompileOptions::default() };
            let mut ctx = Context::new(kind, opts).expect("context");
            let r = matmul(&mut ctx, n, Prec::F32);
            group.throughput(Throughput::Elements(2 * (n as u64).pow(3)));
            group.bench_function(BenchmarkId::new(kind.name(), n), |bench| {
                bench.iter(|| ctx.run(&r, &[]).expect("run"))
            });
        }
    }
    group.finish();
    let mut group = c.benchmark_group("matmul_bf16");
    group.sample_size(10);
    for n in [256, 512, 1024] {
        let opts = CompileOptions { tiered: false, ..CompileOptions::default() };
        let mut ctx = Context::new(BackendKind::Gccjit, opts).expect("context");
        let r = matmul(&mut ctx, n, Prec::Bf16);
        group.throughput(Throughput::Elements(2 * (n as u64).pow(3)));
        group.bench_function(BenchmarkId::new("gccjit", n), |bench| {
            bench.iter(|| ctx.run(&r, &[]).expect("run"))
        });
    }
    group.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);

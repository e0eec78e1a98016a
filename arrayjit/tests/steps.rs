//! gccjit compiles each distinct step once: steps that differ only in their tensors share
//! machine code, and each call runs on its own tensors.
#![cfg(feature = "gccjit")]

mod common;

use common::*;
use rocannl_arrayjit::assignments::{Asgn, ScalarExpr};
use rocannl_arrayjit::indexing::{AxisIndex, Symbol};
use rocannl_arrayjit::ops::{BinOp, Prec};
use rocannl_arrayjit::tnode::{NodeId, NodeTable};
use rocannl_arrayjit::{BackendKind, CompileOptions, Context, NdArray};

#[test]
fn identical_steps_on_different_tensors_compile_once_and_compute_their_own_values() {
    let (m, k, n) = (24, 20, 32);
    let mut nodes = NodeTable::default();
    let (code, layers): (Vec<Asgn>, Vec<[NodeId; 3]>) =
        (0..3).map(|l| matmul(&mut nodes, &l.to_string(), m, k, n)).unzip();
    let asgn = Asgn::Seq(code);
    // Each matmul its own (parallel) step.
    let opts = CompileOptions {
        cache: rocannl_arrayjit::cache::CacheMode::Off,
        threads: Some(2),
        min_parallel_work: 1,
        ..CompileOptions::default()
    };
    let mut ctx = Context::new(BackendKind::Gccjit, opts).unwrap();
    let r = ctx.compile("three", &asgn, &nodes).unwrap();
    let src = r.source_text();
    let defined = src.matches("\nvoid step_").count();
    let calls = src.split("/* calls, in order:").nth(1).unwrap().matches("   step_").count();
    assert!(calls >= 3 && defined * 3 <= calls, "{defined} steps for {calls} calls:\n{src}");
    let mut inputs = Vec::new();
    for (l, &[a, b, _]) in layers.iter().enumerate() {
        let av: Vec<f64> = data(m * k, 10 + l as u64, -1.0, 1.0);
        let bv: Vec<f64> = data(k * n, 20 + l as u64, -1.0, 1.0);
        ctx.write(a, &NdArray::from_f64(Prec::F32, &[m, k], &av).unwrap()).unwrap();
        ctx.write(b, &NdArray::from_f64(Prec::F32, &[k, n], &bv).unwrap()).unwrap();
        inputs.push((av, bv));
    }
    ctx.run(&r, &[]).unwrap();
    for (l, &[_, _, c]) in layers.iter().enumerate() {
        let (av, bv) = &inputs[l];
        let want: Vec<f64> = (0..m * n)
            .map(|cell| {
                let (r, q) = (cell / n, cell % n);
                (0..k).map(|t| (av[r * k + t] as f32 as f64) * (bv[t * n + q] as f32 as f64)).sum()
            })
            .collect();
        assert_close(&format!("c{l}"), &ctx.read(c).unwrap().to_f64_vec(), &want, 1e-5);
    }
}

/// `c = a·b` with `a: m×k`, `b: k×n`, as a fresh set of host nodes.
fn matmul(nodes: &mut NodeTable, tag: &str, m: usize, k: usize, n: usize) -> (Asgn, [NodeId; 3]) {
    let a = host(nodes, &format!("a{tag}"), &[m, k], Prec::F32);
    let b = host(nodes, &format!("b{tag}"), &[k, n], Prec::F32);
    let c = host(nodes, &format!("c{tag}"), &[m, n], Prec::F32);
    let (i, j, kk) = (Symbol(0), Symbol(1), Symbol(2));
    let p = proj(
        &[(i, m), (j, n), (kk, k)],
        &[m, n],
        vec![AxisIndex::Iterator(i), AxisIndex::Iterator(j)],
        vec![
            (vec![m, k], vec![AxisIndex::Iterator(i), AxisIndex::Iterator(kk)]),
            (vec![k, n], vec![AxisIndex::Iterator(kk), AxisIndex::Iterator(j)]),
        ],
    );
    let mul = ScalarExpr::bin(BinOp::Mul, ScalarExpr::Arg(0), ScalarExpr::Arg(1));
    (accum(c, Some(BinOp::Add), vec![a, b], mul, p, true), [a, b, c])
}

#[test]
fn a_routine_sharing_its_steps_with_one_compiled_before_is_served_from_the_cache() {
    use rocannl_arrayjit::CacheOutcome;
    let dir = rocannl_arrayjit::env::temp_dir()
        .join(format!("rocannl-test-steps-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let opts = CompileOptions {
        cache: rocannl_arrayjit::cache::CacheMode::Dir(dir.clone()),
        threads: Some(2),
        min_parallel_work: 1,
        // Each compile stores its steps before it returns.
        tiered: false,
        ..CompileOptions::default()
    };
    // A program of two matmuls of different shapes...
    let mut nodes = NodeTable::default();
    let (first, _) = matmul(&mut nodes, "0", 24, 20, 32);
    let (second, _) = matmul(&mut nodes, "1", 16, 32, 8);
    let mut ctx = Context::new(BackendKind::Gccjit, opts.clone()).unwrap();
    let r = ctx.compile("both", &Asgn::Seq(vec![first, second]), &nodes).unwrap();
    assert_eq!(r.report().cache, CacheOutcome::Miss);
    // ...then, in another context (as another program would), a routine of only the second
    // shape, on tensors of its own: its one step is found in the library built for the first.
    let mut other = NodeTable::default();
    let (_, _) = matmul(&mut other, "x", 3, 3, 3);
    let (only, [a, b, c]) = matmul(&mut other, "y", 16, 32, 8);
    let mut ctx = Context::new(BackendKind::Gccjit, opts).unwrap();
    let r = ctx.compile("only", &only, &other).unwrap();
    assert_eq!(r.report().cache, CacheOutcome::Hit, "{:?}", r.report());
    let av = data(16 * 32, 1, -1.0, 1.0);
    let bv = data(32 * 8, 2, -1.0, 1.0);
    ctx.write(a, &NdArray::from_f64(Prec::F32, &[16, 32], &av).unwrap()).unwrap();
    ctx.write(b, &NdArray::from_f64(Prec::F32, &[32, 8], &bv).unwrap()).unwrap();
    ctx.run(&r, &[]).unwrap();
    let want: Vec<f64> = (0..16 * 8)
        .map(|cell| {
            let (r, q) = (cell / 8, cell % 8);
            (0..32).map(|t| (av[r * 32 + t] as f32 as f64) * (bv[t * 8 + q] as f32 as f64)).sum()
        })
        .collect();
    assert_close("c", &ctx.read(c).unwrap().to_f64_vec(), &want, 1e-5);
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn bf16_stores_round_to_nearest_even_exactly_as_the_interpreter() {
    use rocannl_arrayjit::ops::UnOp;
    // Ties (1 + 2⁻⁸ lies halfway between two bf16 values), values just off ties, the largest
    // finite values, infinities, NaN, subnormals and signed zeros.
    let mut xs: Vec<f32> = vec![
        1.0 + 1.0 / 256.0,
        1.0 + 3.0 / 256.0,
        1.0 + 1.0 / 256.0 + 1.0 / 65536.0,
        -(1.0 + 1.0 / 256.0),
        f32::MAX,
        f32::MIN,
        f32::INFINITY,
        f32::NEG_INFINITY,
        f32::NAN,
        1e-40,
        -1e-40,
        0.0,
        -0.0,
    ];
    xs.extend((0..499).map(|i| ((i as f32) * 0.7311).sin() * 10f32.powi(i % 9 - 4)));
    let n = xs.len();
    let mut nodes = NodeTable::default();
    let x = host(&mut nodes, "x", &[n], Prec::F32);
    let y = host(&mut nodes, "y", &[n], Prec::Bf16);
    let mut g = rocannl_arrayjit::indexing::SymbolGen::default();
    let p = rocannl_arrayjit::indexing::Projections::identity(&[n], 1, &mut g);
    let asgn =
        accum(y, None, vec![x], ScalarExpr::un(UnOp::Identity, ScalarExpr::Arg(0)), p, false);
    let mut results = Vec::new();
    for kind in [BackendKind::Interp, BackendKind::Gccjit] {
        let mut ctx = Context::new(kind, CompileOptions::default()).unwrap();
        let r = ctx.compile("round", &asgn, &nodes).unwrap();
        let values: Vec<f64> = xs.iter().map(|v| *v as f64).collect();
        ctx.write(x, &NdArray::from_f64(Prec::F32, &[n], &values).unwrap()).unwrap();
        ctx.run(&r, &[]).unwrap();
        results.push(ctx.read(y).unwrap().to_f64_vec());
    }
    for (k, v) in xs.iter().enumerate() {
        let want = half::bf16::from_f32(*v).to_f32() as f64;
        for got in &results {
            assert!(
                got[k].to_bits() == want.to_bits() || (got[k].is_nan() && want.is_nan()),
                "{v:e}: got {:e}, want {want:e}",
                got[k]
            );
        }
    }
}

/// Two fills from the generator, `x := uniform(seed_x)` and `y := uniform(seed_y)`, on tensors
/// of one shape.
fn fills(nodes: &mut NodeTable, seeds: [u64; 2], n: usize) -> (Asgn, [NodeId; 2]) {
    use rocannl_arrayjit::assignments::FetchOp;
    let x = host(nodes, "x", &[n], Prec::F32);
    let y = host(nodes, "y", &[n], Prec::F32);
    let fill = |lhs, seed| Asgn::Fetch { lhs, fetch: FetchOp::Uniform { seed, salt: None } };
    (Asgn::Seq(vec![fill(x, seeds[0]), fill(y, seeds[1])]), [x, y])
}

#[test]
fn seeds_are_values_of_a_call_not_code_so_another_seed_is_served_from_the_cache() {
    use rocannl_arrayjit::CacheOutcome;
    let dir = rocannl_arrayjit::env::temp_dir()
        .join(format!("rocannl-test-seeds-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let opts = CompileOptions {
        cache: rocannl_arrayjit::cache::CacheMode::Dir(dir.clone()),
        tiered: false,
        ..CompileOptions::default()
    };
    let n = 1000;
    for (k, seeds) in [[7u64, 11], [123_456_789, u64::MAX], [11, 7]].into_iter().enumerate() {
        let mut nodes = NodeTable::default();
        let (asgn, [x, y]) = fills(&mut nodes, seeds, n);
        let mut ctx = Context::new(BackendKind::Gccjit, opts.clone()).unwrap();
        let r = ctx.compile("fills", &asgn, &nodes).unwrap();
        let want = if k == 0 { CacheOutcome::Miss } else { CacheOutcome::Hit };
        assert_eq!(r.report().cache, want, "seeds {seeds:?}: {:?}", r.report());
        // One function for both fills: they differ only in their tensors and seeds.
        let src = r.source_text();
        assert_eq!(src.matches("\nvoid step_").count(), 1, "{src}");
        ctx.run(&r, &[]).unwrap();
        for (node, seed) in [(x, seeds[0]), (y, seeds[1])] {
            let got = ctx.read(node).unwrap().to_f64_vec();
            let want: Vec<f64> =
                (0..n as u64).map(|i| rocannl_arrayjit::ops::uniform(seed, i)).collect();
            assert_eq!(got, want, "seed {seed}");
        }
    }
    let _ = std::fs::remove_dir_all(&dir);
}

//! The memory plan: intermediates share a routine's arena while their lifetimes do not
//! overlap, start from zeros where their first statement reads them, and the memory limit
//! counts their peak rather than their sum.

mod common;

use common::*;
use expect_test::expect;
use rocannl_arrayjit::assignments::{Asgn, FetchOp, ScalarExpr};
use rocannl_arrayjit::indexing::{Projections, SymbolGen};
use rocannl_arrayjit::low_level::estimate::{Limits, WorkLimit};
use rocannl_arrayjit::ops::{BinOp, Prec};
use rocannl_arrayjit::tnode::{MemoryMode, NodeId, NodeTable};
use rocannl_arrayjit::{BackendKind, CompileOptions, Context, Error, NdArray};

fn backends() -> Vec<BackendKind> {
    BackendKind::available().into_iter().filter(|k| *k != BackendKind::Cuda).collect()
}

/// The arena lines of a routine's low-level text.
fn arena_lines(text: &str) -> String {
    text.lines().skip_while(|l| !l.starts_with("# arena")).collect::<Vec<_>>().join("\n")
}

fn scale(arg: usize, by: f64, plus: f64) -> ScalarExpr {
    ScalarExpr::bin(
        BinOp::Add,
        ScalarExpr::bin(BinOp::Mul, ScalarExpr::Arg(arg), ScalarExpr::Const(by)),
        ScalarExpr::Const(plus),
    )
}

/// `x -> a -> b -> c -> d -> y = d + a`, every intermediate kept (`Local`): `a` lives until
/// the last statement, `b`, `c` and `d` one statement past their own.
fn chain(n: usize) -> (NodeTable, Asgn, [NodeId; 6]) {
    let mut nodes = NodeTable::default();
    let x = host(&mut nodes, "x", &[n], Prec::F32);
    let [a, b, c, d] =
        ["a", "b", "c", "d"].map(|l| nodes.add(l, &[n], Prec::F32, MemoryMode::Local));
    let y = host(&mut nodes, "y", &[n], Prec::F32);
    let mut g = SymbolGen::default();
    let mut p = |k| Projections::identity(&[n], k, &mut g);
    let asgn = Asgn::Seq(vec![
        accum(a, None, vec![x], scale(0, 2.0, 0.0), p(1), false),
        accum(b, None, vec![a], scale(0, 1.0, 1.0), p(1), false),
        accum(c, None, vec![b], scale(0, 3.0, 0.0), p(1), false),
        accum(d, None, vec![c], scale(0, 1.0, -1.0), p(1), false),
        accum(
            y,
            None,
            vec![d, a],
            ScalarExpr::bin(BinOp::Add, ScalarExpr::Arg(0), ScalarExpr::Arg(1)),
            p(2),
            false,
        ),
    ]);
    (nodes, asgn, [x, a, b, c, d, y])
}

#[test]
fn intermediates_whose_lifetimes_do_not_overlap_share_memory() {
    let n = 1000;
    let (nodes, asgn, [x, a, b, c, d, y]) = chain(n);
    let xs = data(n, 5, -1.0, 1.0);
    for kind in backends() {
        let mut ctx = Context::new(kind, CompileOptions::default()).unwrap();
        let r = ctx.compile("chain", &asgn, &nodes).unwrap();
        // 4000 bytes each, 4032 with alignment: `b` and `d` take turns in one slot; `a` and `c`
        // cannot share, as `a` lives until the end.
        let arena = arena_lines(r.low_level_text());
        expect![[r#"
            # arena of 12096 bytes:
            #   n1 at 0 for statements 0..=4
            #   n2 at 4032 for statements 1..=2
            #   n3 at 8064 for statements 2..=3
            #   n4 at 4032 for statements 3..=4"#]]
        .assert_eq(&arena);
        ctx.write(x, &NdArray::from_f64(Prec::F32, &[n], &xs).unwrap()).unwrap();
        for _ in 0..2 {
            ctx.run(&r, &[]).unwrap();
            let got = ctx.read(y).unwrap().to_f64_vec();
            let want: Vec<f64> = xs
                .iter()
                .map(|&v| {
                    let a = (v as f32) * 2.0;
                    ((a + 1.0) * 3.0 - 1.0 + a) as f64
                })
                .collect();
            assert_close(&format!("{kind:?}"), &got, &want, tolerance(Prec::F32));
        }
        for id in [a, b, c, d] {
            assert!(!ctx.has_buffer(id), "{kind:?}: {id} lives in the arena");
            assert!(matches!(ctx.read(id), Err(Error::NotMaterialized { .. })), "{kind:?}");
        }
    }
}

#[test]
fn an_intermediate_read_before_written_starts_from_zeros_in_every_run() {
    let n = 16;
    let mut nodes = NodeTable::default();
    let x = host(&mut nodes, "x", &[n], Prec::F32);
    let p_ = nodes.add("p", &[n], Prec::F32, MemoryMode::Local);
    let z = host(&mut nodes, "z", &[n], Prec::F32);
    let acc = nodes.add("acc", &[n], Prec::F32, MemoryMode::Local);
    let y = host(&mut nodes, "y", &[n], Prec::F32);
    let mut g = SymbolGen::default();
    let mut p = || Projections::identity(&[n], 1, &mut g);
    let asgn = Asgn::Seq(vec![
        // `p` ends before `acc` begins, so they share bytes: `acc` would start from `100·x`.
        accum(p_, None, vec![x], scale(0, 100.0, 0.0), p(), false),
        accum(z, None, vec![p_], scale(0, 1.0, 1.0), p(), false),
        // An accumulation that does not initialize: it reads what is there, a fresh buffer's
        // zeros.
        accum(acc, Some(BinOp::Add), vec![x], ScalarExpr::Arg(0), p(), false),
        accum(y, None, vec![acc], scale(0, 1.0, 0.5), p(), false),
    ]);
    let xs = data(n, 9, -1.0, 1.0);
    for kind in backends() {
        let mut ctx = Context::new(kind, CompileOptions::default()).unwrap();
        let r = ctx.compile("zeros", &asgn, &nodes).unwrap();
        expect![[r#"
            for v0 in 0..16 par {
              n1[v0] := mul(n0[v0], 100)
            }
            for v1 in 0..16 par {
              n2[v1] := add(n1[v1], 1)
            }
            for v4 in 0..16 par {
              n3[v4] := 0
            }
            for v2 in 0..16 par {
              n3[v2] := add(n3[v2], n0[v2])
            }
            for v3 in 0..16 par {
              n4[v3] := add(n3[v3], 0.5)
            }
            # arena of 64 bytes:
            #   n1 at 0 for statements 0..=1
            #   n3 at 0 for statements 2..=4
        "#]]
        .assert_eq(r.low_level_text());
        ctx.write(x, &NdArray::from_f64(Prec::F32, &[n], &xs).unwrap()).unwrap();
        let want: Vec<f64> = xs.iter().map(|&v| (v as f32 + 0.5) as f64).collect();
        for _ in 0..3 {
            ctx.run(&r, &[]).unwrap();
            assert_close(&format!("{kind:?}"), &ctx.read(y).unwrap().to_f64_vec(), &want, 0.0);
        }
    }
}

#[test]
fn the_memory_limit_counts_the_peak_of_intermediates_not_their_sum() {
    // Ten intermediates of 1 MiB in a chain: two are live at a time.
    let n = 1 << 18;
    let mut nodes = NodeTable::default();
    let x = host(&mut nodes, "x", &[n], Prec::F32);
    let mid: Vec<NodeId> =
        (0..10).map(|k| nodes.add(&format!("m{k}"), &[n], Prec::F32, MemoryMode::Local)).collect();
    let y = host(&mut nodes, "y", &[n], Prec::F32);
    let mut g = SymbolGen::default();
    let mut code = Vec::new();
    let mut prev = x;
    for &m in mid.iter().chain([&y]) {
        code.push(accum(
            m,
            None,
            vec![prev],
            scale(0, 1.0, 1.0),
            Projections::identity(&[n], 1, &mut g),
            false,
        ));
        prev = m;
    }
    let asgn = Asgn::Seq(code);
    let mib = 1u64 << 20;
    // x and y have buffers of their own: 2 MiB, plus a 2 MiB arena.
    let opts = |max| CompileOptions {
        limits: Limits { max_memory: Some(max), max_work: WorkLimit::Unlimited },
        ..CompileOptions::default()
    };
    let mut ctx = Context::new(BackendKind::Interp, opts(3 * mib)).unwrap();
    match ctx.compile("chain", &asgn, &nodes) {
        Err(Error::LimitExceeded { resource: "memory", estimate, .. }) => {
            assert_eq!(estimate, 4 * mib)
        }
        other => panic!("expected a memory limit, got {other:?}"),
    }
    let mut ctx = Context::new(BackendKind::Interp, opts(4 * mib)).unwrap();
    let r = ctx.compile("chain", &asgn, &nodes).unwrap();
    let xs = data(n, 3, -1.0, 1.0);
    ctx.write(x, &NdArray::from_f64(Prec::F32, &[n], &xs).unwrap()).unwrap();
    ctx.run(&r, &[]).unwrap();
    let got = ctx.read(y).unwrap().to_f64_vec();
    let want: Vec<f64> =
        xs.iter().map(|&v| (0..11).fold(v as f32, |acc, _| acc + 1.0) as f64).collect();
    assert_close("chain", &got, &want, 0.0);
}

#[test]
fn a_gradient_zeroed_up_front_is_live_only_from_its_first_use() {
    // Backpropagation zeroes every gradient first; the fills move down to their first use, so
    // the two gradients below take turns in one slot. (Their first updates are maxima: a sum
    // onto a fill reads +0 instead, and the fill goes, `zero_fill_folds_into_the_first_sum`.)
    let n = 16;
    let mut nodes = NodeTable::default();
    let x = host(&mut nodes, "x", &[n], Prec::F32);
    let g1 = nodes.add("g1", &[n], Prec::F32, MemoryMode::Local);
    let g2 = nodes.add("g2", &[n], Prec::F32, MemoryMode::Local);
    let y1 = host(&mut nodes, "y1", &[n], Prec::F32);
    let y2 = host(&mut nodes, "y2", &[n], Prec::F32);
    let mut g = SymbolGen::default();
    let mut p = || Projections::identity(&[n], 1, &mut g);
    let zero = |lhs| Asgn::Fetch { lhs, fetch: FetchOp::Constant(0.0) };
    let asgn = Asgn::Seq(vec![
        zero(g1),
        zero(g2),
        accum(g1, Some(BinOp::Max), vec![x], ScalarExpr::Arg(0), p(), false),
        accum(y1, None, vec![g1], scale(0, 1.0, 1.0), p(), false),
        accum(g2, Some(BinOp::Max), vec![x], scale(0, 2.0, 0.0), p(), false),
        accum(y2, None, vec![g2], scale(0, 1.0, 1.0), p(), false),
    ]);
    let xs = data(n, 4, -1.0, 1.0);
    for kind in backends() {
        let mut ctx = Context::new(kind, CompileOptions::default()).unwrap();
        let r = ctx.compile("grads", &asgn, &nodes).unwrap();
        let arena = arena_lines(r.low_level_text());
        expect![[r#"
            # arena of 64 bytes:
            #   n1 at 0 for statements 0..=2
            #   n2 at 0 for statements 3..=5"#]]
        .assert_eq(&arena);
        ctx.write(x, &NdArray::from_f64(Prec::F32, &[n], &xs).unwrap()).unwrap();
        for _ in 0..2 {
            ctx.run(&r, &[]).unwrap();
            let want1: Vec<f64> = xs.iter().map(|&v| ((v as f32).max(0.0) + 1.0) as f64).collect();
            let want2: Vec<f64> =
                xs.iter().map(|&v| ((v as f32 * 2.0).max(0.0) + 1.0) as f64).collect();
            assert_close("y1", &ctx.read(y1).unwrap().to_f64_vec(), &want1, 0.0);
            assert_close("y2", &ctx.read(y2).unwrap().to_f64_vec(), &want2, 0.0);
        }
    }
}

//! Calls of the map kernel (maps and reductions) against the interpreter, on chosen and on
//! random nests.

use super::*;

/// Calls of the map kernel (every map and reduction, with and without threads, a dynamic
/// size) give the interpreter's bits exactly: each cell's operations in the nest's order. The
/// scheduled program run by the interpreter (which runs a call as the nest it stands for)
/// gives them too.
fn check_map_calls(case: &Case) {
    let want = run_case(BackendKind::Interp, CompileOptions::default(), case);
    let mut prog =
        compile_program(&case.name, &case.asgn, &case.nodes, &CompileOptions::default()).unwrap();
    schedule_cpu(&mut prog, &CpuSchedule { map_calls: MapCalls::All, ..CpuSchedule::default() });
    verify(&prog, "schedule").unwrap();
    let mut calls = 0;
    for s in &prog.body {
        s.visit(&mut |s| calls += usize::from(matches!(s, Stmt::Map(_))));
    }
    assert!(calls > 0, "{}: no map call in\n{prog}", case.name);
    for opts in [
        CompileOptions::default(),
        CompileOptions { threads: Some(1), ..CompileOptions::default() },
        CompileOptions { threads: Some(3), min_parallel_work: 1, ..CompileOptions::default() },
    ] {
        let got = run_case(
            BackendKind::Gccjit,
            CompileOptions { map_calls: MapCalls::All, ..opts },
            case,
        );
        for (g, w) in got.iter().zip(&want) {
            assert_eq!(bits(g), bits(w), "{}", case.name);
        }
    }
}

#[test]
fn map_calls_give_the_interpreters_bits() {
    for prec in [Prec::F32, Prec::F64] {
        for op in [BinOp::Add, BinOp::Mul, BinOp::Max, BinOp::Min] {
            for init in [true, false] {
                // Rows (contiguous reduction: each cell alone, points in runs) and columns
                // (cells together); odd and prime sizes, one longer than a chunk.
                check_map_calls(&contraction(
                    &format!("map_rows_{}_{}_{init}", op.name(), prec.name()),
                    "ik",
                    &[6, 701],
                    Arg(&[6], "i", prec),
                    &[Arg(&[6, 701], "i,k", prec)],
                    op,
                    init,
                ));
                check_map_calls(&contraction(
                    &format!("map_cols_{}_{}_{init}", op.name(), prec.name()),
                    "kj",
                    &[9, 131],
                    Arg(&[131], "j", prec),
                    &[Arg(&[9, 131], "k,j", prec)],
                    op,
                    init,
                ));
            }
        }
        // A bias gradient over a batch and a sequence; a layout copy (pointwise).
        check_map_calls(&contraction(
            &format!("map_bias_grad_{}", prec.name()),
            "bsj",
            &[5, 7, 33],
            Arg(&[33], "j", prec),
            &[Arg(&[5, 7, 33], "b,s,j", prec)],
            BinOp::Add,
            false,
        ));
        check_map_calls(&contraction(
            &format!("map_transpose_{}", prec.name()),
            "hqd",
            &[3, 17, 4],
            Arg(&[17, 3, 4], "q,h,d", prec),
            &[Arg(&[3, 17, 4], "h,q,d", prec)],
            BinOp::Add,
            true,
        ));
    }
}

proptest::proptest! {
    #![proptest_config(proptest::test_runner::Config { cases: 24, ..Default::default() })]

    /// Random reductions and maps through the map kernel (`MapCalls::All`) against the
    /// interpreter, bit for bit: iteration spaces of 1 to 3 axes of sizes 1 to 37, the result
    /// over a subset of them in any order, a first argument over all of them in any order, an
    /// optional second one broadcast over a subset, combined by an operation that is not a
    /// product; every reduction operator, from the neutral element or onto old values, f32 and
    /// f64, with 1 to 3 threads.
    #[test]
    fn random_map_calls_give_the_interpreters_bits(
        extents in proptest::collection::vec(1usize..38, 1..4),
        order in proptest::collection::vec(0usize..6, 3),
        out_mask in 1usize..8,
        second in 0usize..8,
        combine in 0usize..4,
        op in 0usize..4,
        init: bool,
        f64_: bool,
        threads in 1usize..4,
    ) {
        let letters = &"ijk"[..extents.len()];
        let r = extents.len();
        // Permutations of the letters from `order`.
        let perm = |seed: usize, of: &[usize]| -> Vec<usize> {
            let mut v = of.to_vec();
            let n = v.len().max(1);
            v.rotate_left(seed % n);
            if seed % 2 == 1 && v.len() > 1 {
                v.swap(0, 1);
            }
            v
        };
        let all: Vec<usize> = (0..r).collect();
        let out_axes: Vec<usize> = perm(order[0], &all.iter().copied().filter(|a| out_mask >> a & 1 == 1).collect::<Vec<_>>());
        let out_axes = if out_axes.is_empty() { vec![0] } else { out_axes };
        let a_axes = perm(order[1], &all);
        let b_axes: Vec<usize> = perm(order[2], &all.iter().copied().filter(|a| second >> a & 1 == 1).collect::<Vec<_>>());
        let prec = if f64_ { Prec::F64 } else { Prec::F32 };
        let dims = |axes: &[usize]| axes.iter().map(|a| extents[*a]).collect::<Vec<_>>();
        let spec = |axes: &[usize]| {
            axes.iter().map(|a| letters[*a..*a + 1].to_string()).collect::<Vec<_>>().join(",")
        };
        let (out_dims, a_dims, b_dims) = (dims(&out_axes), dims(&a_axes), dims(&b_axes));
        let (out_spec, a_spec, b_spec) = (spec(&out_axes), spec(&a_axes), spec(&b_axes));
        let mut args = vec![Arg(&a_dims, &a_spec, prec)];
        let with_b = !b_axes.is_empty() && combine > 0;
        if with_b {
            args.push(Arg(&b_dims, &b_spec, prec));
        }
        let expr = match (with_b, combine) {
            (false, _) => ScalarExpr::Arg(0),
            (true, 1) => ScalarExpr::bin(BinOp::Add, ScalarExpr::Arg(0), ScalarExpr::Arg(1)),
            (true, 2) => ScalarExpr::bin(BinOp::Max, ScalarExpr::Arg(0), ScalarExpr::Arg(1)),
            (true, _) => ScalarExpr::bin(BinOp::Sub, ScalarExpr::Arg(1), ScalarExpr::Arg(0)),
        };
        let op = [BinOp::Add, BinOp::Mul, BinOp::Max, BinOp::Min][op];
        let case = accumulation(
            &format!("random_map_{extents:?}_{out_spec}_{a_spec}_{b_spec}_{combine}_{}", op.name()),
            letters,
            &extents,
            Arg(&out_dims, &out_spec, prec),
            &args,
            expr,
            op,
            init,
        );
        let want = run_case(BackendKind::Interp, CompileOptions::default(), &case);
        let opts = CompileOptions {
            map_calls: MapCalls::All,
            threads: Some(threads),
            min_parallel_work: 1,
            ..CompileOptions::default()
        };
        let got = run_case(BackendKind::Gccjit, opts, &case);
        proptest::prop_assert_eq!(bits(&got[0]), bits(&want[0]), "{}", case.name);
    }
}

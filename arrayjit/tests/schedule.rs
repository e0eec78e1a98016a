//! The CPU schedule against the interpreter: every kernel of `low_level::schedule` (in-place
//! with packing, lanes) on the layouts training and attention produce — transposed operands,
//! batched products, padded and strided convolutions and both of their gradients, row
//! reductions — at edge sizes (1, primes, sizes no tile divides), in several precisions, with
//! and without threads; plus snapshots of what each kernel looks like.

mod common;

use std::sync::Arc;

use common::*;
use expect_test::expect;
use rocannl_arrayjit::assignments::{Asgn, ScalarExpr};
use rocannl_arrayjit::indexing::{AxisIndex, Projections, Symbol};
use rocannl_arrayjit::low_level::Stmt;
use rocannl_arrayjit::low_level::schedule::{CpuSchedule, MapCalls, schedule_cpu};
use rocannl_arrayjit::low_level::verify::verify;
use rocannl_arrayjit::ops::{BinOp, Prec};
use rocannl_arrayjit::tnode::{NodeId, NodeTable};
use rocannl_arrayjit::{BackendKind, CompileOptions, NdArray, compile_program};

/// An axis index written like `2*o + k - 1` over single-letter iterators.
fn ax(s: &str, letters: &str) -> AxisIndex {
    let mut terms = Vec::new();
    let mut offset = 0;
    let s = s.replace(' ', "").replace('-', "+-");
    for part in s.split('+').filter(|p| !p.is_empty()) {
        let (neg, p) = match part.strip_prefix('-') {
            Some(p) => (-1, p),
            None => (1, part),
        };
        let (c, name) = match p.split_once('*') {
            Some((c, n)) => (c.parse::<i64>().unwrap(), n),
            None => (1, p),
        };
        match name.parse::<i64>() {
            Ok(n) => offset += neg * n,
            Err(_) => {
                let pos = letters.find(name).unwrap_or_else(|| panic!("unknown iterator {name}"));
                terms.push((neg * c, Symbol(pos as u32)));
            }
        }
    }
    AxisIndex::affine(terms, offset)
}

/// One tensor of a contraction: dims, index per axis (comma-separated), precision.
struct Arg<'a>(&'a [usize], &'a str, Prec);

/// `out[..] op= Π args[..]` (product of the arguments, or the single argument) over the
/// iterators `letters` with `extents`; `init` starts from the neutral element, otherwise the
/// output's initial values are data too.
fn contraction(
    name: &str,
    letters: &str,
    extents: &[usize],
    out: Arg<'_>,
    args: &[Arg<'_>],
    op: BinOp,
    init: bool,
) -> Case {
    let expr = (1..args.len())
        .fold(ScalarExpr::Arg(0), |e, k| ScalarExpr::bin(BinOp::Mul, e, ScalarExpr::Arg(k)));
    accumulation(name, letters, extents, out, args, expr, op, init)
}

/// `out[..] op= expr(args[..])`, as [`contraction`] for any expression of the arguments.
#[allow(clippy::too_many_arguments)]
fn accumulation(
    name: &str,
    letters: &str,
    extents: &[usize],
    out: Arg<'_>,
    args: &[Arg<'_>],
    expr: ScalarExpr,
    op: BinOp,
    init: bool,
) -> Case {
    let mut nodes = NodeTable::default();
    let idx = |s: &str| s.split(',').map(|a| ax(a, letters)).collect::<Vec<_>>();
    let ids: Vec<NodeId> = args
        .iter()
        .enumerate()
        .map(|(k, a)| host(&mut nodes, &format!("x{k}"), a.0, a.2))
        .collect();
    let y = host(&mut nodes, "y", out.0, out.2);
    let space: Vec<(Symbol, usize)> =
        extents.iter().enumerate().map(|(k, d)| (Symbol(k as u32), *d)).collect();
    let p = Projections {
        product_space: space.iter().map(|(_, d)| *d).collect(),
        product_iterators: space.iter().map(|(s, _)| *s).collect(),
        lhs_dims: out.0.to_vec(),
        rhs_dims: args.iter().map(|a| a.0.to_vec()).collect(),
        project_lhs: idx(out.1),
        project_rhs: args.iter().map(|a| idx(a.1)).collect(),
        debug_info: name.to_string(),
        dynamic: vec![],
    };
    let mut inputs: Vec<(NodeId, Vec<f64>)> = args
        .iter()
        .zip(&ids)
        .enumerate()
        .map(|(k, (a, id))| {
            let n = a.0.iter().product();
            (*id, data(n, 40 + k as u64, -1.0, 1.0).iter().map(|v| a.2.round(*v)).collect())
        })
        .collect();
    if !init {
        let n = out.0.iter().product();
        inputs.push((y, data(n, 99, -1.0, 1.0).iter().map(|v| out.2.round(*v)).collect()));
    }
    Case {
        name: name.to_string(),
        asgn: Asgn::Accum {
            lhs: y,
            accum: Some(op),
            rhs: ids,
            expr,
            projections: Arc::new(p),
            initialize_neutral: init,
        },
        nodes,
        inputs,
        outputs: vec![y],
        bindings: vec![],
        expected: None,
    }
}

/// The optimized program after the CPU schedule (verified).
fn scheduled(case: &Case) -> String {
    let mut prog =
        compile_program(&case.name, &case.asgn, &case.nodes, &CompileOptions::default()).unwrap();
    schedule_cpu(&mut prog, &Default::default());
    verify(&prog, "schedule").unwrap();
    prog.to_string()
}

/// Which kernel the schedule chose: "gemm" (a call of the shape-generic product), "packed" (in
/// place with a packed operand), "lanes", "in place" or "as lowered".
fn kernel(case: &Case) -> &'static str {
    if generated_kernel(case, true) == "gemm" { "gemm" } else { generated_kernel(case, false) }
}

/// The kernel chosen with or without calls of the shape-generic product.
fn generated_kernel(case: &Case, kernel_calls: bool) -> &'static str {
    let mut prog =
        compile_program(&case.name, &case.asgn, &case.nodes, &CompileOptions::default()).unwrap();
    let before = prog.to_string();
    schedule_cpu(&mut prog, &CpuSchedule { threads: 2, kernel_calls, ..CpuSchedule::default() });
    verify(&prog, "schedule").unwrap();
    if prog.body.iter().any(|s| {
        let mut found = false;
        s.visit(&mut |s| found |= matches!(s, Stmt::Gemm(_)));
        found
    }) {
        "gemm"
    } else if prog.scratch.iter().any(|s| s.per_thread) {
        "lanes"
    } else if !prog.scratch.is_empty() {
        "packed"
    } else if prog.to_string() != before {
        "in place"
    } else {
        "as lowered"
    }
}

/// gccjit (default options, one thread, and every nest split across three threads; with the
/// shape-generic product and with generated kernels only) against the interpreter. A product
/// the kernel computes gives the interpreter's bits exactly.
fn check(case: &Case) {
    let want = run_case(BackendKind::Interp, CompileOptions::default(), case);
    let tol = tolerance(case_prec(case)).max(1e-4 * f64::from(case_prec(case) == Prec::F32));
    let exact = kernel(case) == "gemm";
    for kernel_calls in [true, false] {
        for opts in [
            CompileOptions::default(),
            CompileOptions { threads: Some(1), ..CompileOptions::default() },
            CompileOptions { threads: Some(3), min_parallel_work: 1, ..CompileOptions::default() },
        ] {
            let got = run_case(BackendKind::Gccjit, CompileOptions { kernel_calls, ..opts }, case);
            if exact && kernel_calls {
                assert_eq!(bits(&got[0]), bits(&want[0]), "{}", case.name);
            } else {
                assert_close(&case.name, &got[0], &want[0], tol);
            }
        }
    }
}

fn bits(a: &[f64]) -> Vec<u64> {
    a.iter().map(|x| x.to_bits()).collect()
}

/// `c[i,j] = Σ_k a[i,k]·b[j,k]` (weights stored `[out, in]`, attention scores).
fn abt(m: usize, k: usize, n: usize, prec: Prec, init: bool) -> Case {
    contraction(
        &format!("abt_{m}x{k}x{n}_{}_{init}", prec.name()),
        "ijk",
        &[m, n, k],
        Arg(&[m, n], "i,j", prec),
        &[Arg(&[m, k], "i,k", prec), Arg(&[n, k], "j,k", prec)],
        BinOp::Add,
        init,
    )
}

/// `c[i,j] = Σ_k a[k,i]·b[k,j]` (weight gradients: the batch is the reduction).
fn atb(m: usize, k: usize, n: usize, prec: Prec, init: bool) -> Case {
    contraction(
        &format!("atb_{m}x{k}x{n}_{}_{init}", prec.name()),
        "ijk",
        &[m, n, k],
        Arg(&[m, n], "i,j", prec),
        &[Arg(&[k, m], "k,i", prec), Arg(&[k, n], "k,j", prec)],
        BinOp::Add,
        init,
    )
}

/// A padded (`pad`) or valid 2-d convolution with stride `s`, channels last, kernel
/// `[d, kh, kw, c]`.
fn conv2d(b: usize, hw: usize, c: usize, d: usize, s: usize, pad: usize, prec: Prec) -> Case {
    let o = (hw + 2 * pad - 3) / s + 1;
    let h = format!("{s}*h + i - {pad}");
    let w = format!("{s}*w + j - {pad}");
    contraction(
        &format!("conv_b{b}_hw{hw}_c{c}_d{d}_s{s}_p{pad}_{}", prec.name()),
        "nhwdijc",
        &[b, o, o, d, 3, 3, c],
        Arg(&[b, o, o, d], "n,h,w,d", prec),
        &[Arg(&[b, hw, hw, c], &format!("n,{h},{w},c"), prec), Arg(&[d, 3, 3, c], "d,i,j,c", prec)],
        BinOp::Add,
        true,
    )
}

#[test]
fn transposed_operands_are_packed() {
    for (m, k, n) in [(128, 256, 256), (17, 19, 31), (8, 16, 16), (64, 7, 33), (9, 64, 128)] {
        let case = abt(m, k, n, Prec::F32, true);
        assert_eq!(generated_kernel(&case, false), "packed", "{}", case.name);
        check(&case);
    }
    for prec in [Prec::F64, Prec::F16, Prec::Bf16] {
        check(&abt(24, 40, 48, prec, true));
    }
    check(&abt(16, 33, 20, Prec::F32, false));
}

#[test]
fn transposed_left_operands_accumulate_in_place() {
    for (m, k, n) in [(256, 128, 784), (10, 128, 256), (13, 5, 17), (1, 64, 16), (256, 1, 16)] {
        let case = atb(m, k, n, Prec::F32, false);
        check(&case);
    }
    assert_eq!(generated_kernel(&atb(16, 16, 16, Prec::F32, true), false), "in place");
    check(&atb(12, 31, 40, Prec::F64, true));
}

#[test]
fn narrow_outputs_use_lanes() {
    for (m, k, n) in [(128, 256, 10), (3, 1400, 1), (5, 301, 3), (7, 100, 15), (2, 1030, 2)] {
        let case = abt(m, k, n, Prec::F32, true);
        assert_eq!(generated_kernel(&case, false), "lanes", "{}", case.name);
        check(&case);
    }
    // Long reductions: partial sums instead of a packed copy, 4 × 4 cells at a time.
    for (m, k, n) in [(128, 784, 256), (33, 600, 20), (6, 513, 17)] {
        let case = abt(m, k, n, Prec::F32, true);
        assert_eq!(generated_kernel(&case, false), "lanes", "{}", case.name);
        check(&case);
    }
    // Too little work to be worth the compile time.
    assert_eq!(generated_kernel(&abt(3, 16, 1, Prec::F32, true), false), "as lowered");
    check(&abt(4, 373, 3, Prec::F64, false));
    check(&abt(4, 373, 3, Prec::F16, true));
    // A matrix-vector product: too few rows to pack.
    let mv = contraction(
        "matvec",
        "ik",
        &[37, 120],
        Arg(&[37], "i", Prec::F32),
        &[Arg(&[37, 120], "i,k", Prec::F32), Arg(&[120], "k", Prec::F32)],
        BinOp::Add,
        true,
    );
    assert_eq!(generated_kernel(&mv, false), "lanes");
    check(&mv);
}

#[test]
fn row_reductions_of_every_operator() {
    for op in [BinOp::Add, BinOp::Mul, BinOp::Max, BinOp::Min] {
        for init in [true, false] {
            let rows = contraction(
                &format!("rows_{}_{init}", op.name()),
                "ik",
                &[6, 701],
                Arg(&[6], "i", Prec::F32),
                &[Arg(&[6, 701], "i,k", Prec::F32)],
                op,
                init,
            );
            assert_eq!(generated_kernel(&rows, false), "lanes");
            check(&rows);
            let cols = contraction(
                &format!("cols_{}_{init}", op.name()),
                "kj",
                &[9, 64],
                Arg(&[64], "j", Prec::F32),
                &[Arg(&[9, 64], "k,j", Prec::F32)],
                op,
                init,
            );
            assert_eq!(generated_kernel(&cols, false), "in place");
            check(&cols);
        }
    }
}

/// A column sum of 1024 rows or more (a bias gradient over a large batch) accumulates in f64
/// (docs/lowering.md, "Accurate sums"): the schedule gives it an f64 copy of its result, which
/// the in-place kernel takes, and every backend configuration gives the interpreter's bits.
#[test]
fn long_column_sums_accumulate_in_an_f64_copy_with_the_interpreters_bits() {
    for (rows, init) in [(1024, true), (1500, false), (4096, true)] {
        let cols = contraction(
            &format!("long_cols_{rows}_{init}"),
            "kj",
            &[rows, 48],
            Arg(&[48], "j", Prec::F32),
            &[Arg(&[rows, 48], "k,j", Prec::F32)],
            BinOp::Add,
            init,
        );
        let mut prog =
            compile_program(&cols.name, &cols.asgn, &cols.nodes, &CompileOptions::default())
                .unwrap();
        schedule_cpu(&mut prog, &CpuSchedule::default());
        verify(&prog, "schedule").unwrap();
        let text = prog.to_string();
        assert!(
            prog.nodes.values().any(|n| n.prec == Prec::F64 && n.label.ends_with(".f64")),
            "{text}"
        );
        let want = run_case(BackendKind::Interp, CompileOptions::default(), &cols);
        for threads in [1, 3] {
            let opts = CompileOptions { threads: Some(threads), ..CompileOptions::default() };
            let got = run_case(BackendKind::Gccjit, opts, &cols);
            assert_eq!(bits(&got[0]), bits(&want[0]), "{} on {threads} threads", cols.name);
        }
    }
}

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

#[test]
fn attention_scores_and_batched_products() {
    let scores = contraction(
        "scores",
        "bhqkd",
        &[2, 3, 17, 33, 19],
        Arg(&[2, 3, 17, 33], "b,h,q,k", Prec::F32),
        &[Arg(&[2, 3, 17, 19], "b,h,q,d", Prec::F32), Arg(&[2, 3, 33, 19], "b,h,k,d", Prec::F32)],
        BinOp::Add,
        true,
    );
    assert_eq!(generated_kernel(&scores, false), "packed");
    check(&scores);
    let bmm = contraction(
        "bmm",
        "bijk",
        &[5, 12, 16, 7],
        Arg(&[5, 12, 16], "b,i,j", Prec::F32),
        &[Arg(&[5, 12, 7], "b,i,k", Prec::F32), Arg(&[5, 7, 16], "b,k,j", Prec::F32)],
        BinOp::Add,
        true,
    );
    assert_eq!(generated_kernel(&bmm, false), "in place");
    check(&bmm);
}

#[test]
fn convolutions_forward() {
    for (b, hw, c, d, s, pad) in
        [(4, 8, 1, 16, 1, 1), (3, 4, 16, 32, 1, 1), (2, 7, 3, 17, 2, 1), (2, 9, 5, 16, 1, 0)]
    {
        let case = conv2d(b, hw, c, d, s, pad, Prec::F32);
        assert_eq!(generated_kernel(&case, false), "packed", "{}", case.name);
        check(&case);
    }
    check(&conv2d(2, 5, 4, 16, 1, 1, Prec::F64));
}

#[test]
fn convolution_gradients() {
    // Input gradient: the output index is affine (a scatter), accumulated in place.
    let dx = contraction(
        "conv_dx",
        "nhwijcd",
        &[3, 4, 4, 3, 3, 16, 32],
        Arg(&[3, 4, 4, 16], "n,h+i-1,w+j-1,c", Prec::F32),
        &[Arg(&[3, 4, 4, 32], "n,h,w,d", Prec::F32), Arg(&[32, 3, 3, 16], "d,i,j,c", Prec::F32)],
        BinOp::Add,
        false,
    );
    assert_eq!(generated_kernel(&dx, false), "in place");
    check(&dx);
    // Kernel gradient: reductions over the batch and the image, guarded.
    let dk = contraction(
        "conv_dk",
        "dijcnhw",
        &[32, 3, 3, 16, 5, 4, 4],
        Arg(&[32, 3, 3, 16], "d,i,j,c", Prec::F32),
        &[
            Arg(&[5, 4, 4, 32], "n,h,w,d", Prec::F32),
            Arg(&[5, 4, 4, 16], "n,h+i-1,w+j-1,c", Prec::F32),
        ],
        BinOp::Add,
        false,
    );
    assert_eq!(generated_kernel(&dk, false), "in place");
    check(&dk);
    // Kernel gradient with one input channel: `dk` is contiguous along no loop, so it
    // accumulates in a packed copy.
    for init in [false, true] {
        let dk1 = contraction(
            &format!("conv_dk1_{init}"),
            "dijnhw",
            &[16, 3, 3, 6, 8, 8],
            Arg(&[16, 3, 3, 1], "d,i,j,0", Prec::F32),
            &[
                Arg(&[6, 8, 8, 16], "n,h,w,d", Prec::F32),
                Arg(&[6, 8, 8, 1], "n,h+i-1,w+j-1,0", Prec::F32),
            ],
            BinOp::Add,
            init,
        );
        assert_eq!(generated_kernel(&dk1, false), "packed");
        check(&dk1);
    }
    // Bias gradient: three reduction loops.
    let db = contraction(
        "conv_db",
        "cnhw",
        &[32, 7, 4, 4],
        Arg(&[32], "c", Prec::F32),
        &[Arg(&[7, 4, 4, 32], "n,h,w,c", Prec::F32)],
        BinOp::Add,
        false,
    );
    assert_eq!(generated_kernel(&db, false), "in place");
    check(&db);
}

#[test]
fn snapshot_packed_transpose() {
    let case = abt(8, 4, 16, Prec::F32, true);
    expect![[r#"
        # y abt_8x4x16_f32_true
        for v3 in 0..1 par {
          for v5 in 0..16 {
            for v6 in 0..4 {
              n3[v6, 16*v3 + v5] := n1[16*v3 + v5, v6]
            }
          }
        }
        for v7 in 0..2 par {
          t1 := n0[4*v7, 0]
          t2 := n0[4*v7, 1]
          t3 := n0[4*v7, 2]
          t4 := n0[4*v7, 3]
          t5 := n0[4*v7 + 1, 0]
          t6 := n0[4*v7 + 1, 1]
          t7 := n0[4*v7 + 1, 2]
          t8 := n0[4*v7 + 1, 3]
          t9 := n0[4*v7 + 2, 0]
          t10 := n0[4*v7 + 2, 1]
          t11 := n0[4*v7 + 2, 2]
          t12 := n0[4*v7 + 2, 3]
          t13 := n0[4*v7 + 3, 0]
          t14 := n0[4*v7 + 3, 1]
          t15 := n0[4*v7 + 3, 2]
          t16 := n0[4*v7 + 3, 3]
          for v12 in 0..16 par {
            t17 := n3[3, v12]
            t18 := n3[2, v12]
            t19 := n3[1, v12]
            t20 := n3[0, v12]
            n2[4*v7, v12] := fma(t4, t17, fma(t3, t18, fma(t2, t19, fma(t1, t20, 0))))
            n2[4*v7 + 1, v12] := fma(t8, t17, fma(t7, t18, fma(t6, t19, fma(t5, t20, 0))))
            n2[4*v7 + 2, v12] := fma(t12, t17, fma(t11, t18, fma(t10, t19, fma(t9, t20, 0))))
            n2[4*v7 + 3, v12] := fma(t16, t17, fma(t15, t18, fma(t14, t19, fma(t13, t20, 0))))
          }
        }
    "#]]
    .assert_eq(&scheduled(&case));
}

#[test]
fn snapshot_lanes() {
    let case = abt(2, 1030, 2, Prec::F32, true);
    expect![[r#"
        # y abt_2x1030x2_f32_true
        for v4 in 0..1 par {
          for v5 in 0..16 par {
            n3[0, v5] := 0
            n3[1, v5] := 0
            n3[2, v5] := 0
            n3[3, v5] := 0
          }
          for v6 in 0..64 {
            for v7 in 0..16 par {
              n3[0, v7] := fma(n0[2*v4, 16*v6 + v7], n1[0, 16*v6 + v7], n3[0, v7])
              n3[1, v7] := fma(n0[2*v4 + 1, 16*v6 + v7], n1[0, 16*v6 + v7], n3[1, v7])
              n3[2, v7] := fma(n0[2*v4, 16*v6 + v7], n1[1, 16*v6 + v7], n3[2, v7])
              n3[3, v7] := fma(n0[2*v4 + 1, 16*v6 + v7], n1[1, 16*v6 + v7], n3[3, v7])
            }
          }
          for v8 in 0..6 par {
            n3[0, v8] := fma(n0[2*v4, v8 + 1024], n1[0, v8 + 1024], n3[0, v8])
            n3[1, v8] := fma(n0[2*v4 + 1, v8 + 1024], n1[0, v8 + 1024], n3[1, v8])
            n3[2, v8] := fma(n0[2*v4, v8 + 1024], n1[1, v8 + 1024], n3[2, v8])
            n3[3, v8] := fma(n0[2*v4 + 1, v8 + 1024], n1[1, v8 + 1024], n3[3, v8])
          }
          t1 := 0
          for v9 in 0..16 {
            t1 := add(t1, n3[0, v9])
          }
          n2[2*v4, 0] := t1
          t2 := 0
          for v10 in 0..16 {
            t2 := add(t2, n3[1, v10])
          }
          n2[2*v4 + 1, 0] := t2
          t3 := 0
          for v11 in 0..16 {
            t3 := add(t3, n3[2, v11])
          }
          n2[2*v4, 1] := t3
          t4 := 0
          for v12 in 0..16 {
            t4 := add(t4, n3[3, v12])
          }
          n2[2*v4 + 1, 1] := t4
        }
    "#]]
    .assert_eq(&scheduled(&case));
}

#[test]
fn snapshot_guarded_convolution() {
    let case = conv2d(4, 4, 2, 16, 1, 1, Prec::F32);
    expect![[r#"
        # y conv_b4_hw4_c2_d16_s1_p1_f32
        for v0 in 0..4 par {
          for v1 in 0..4 par {
            for v2 in 0..4 par {
              for v3 in 0..16 par {
                n2[v0, v1, v2, v3] := 0
              }
            }
          }
        }
        for v4 in 0..3 par {
          for v5 in 0..3 {
            for v9 in 0..16 {
              for v10 in 0..2 {
                n3[v4, v5, v10, v9] := n1[v9, v4, v5, v10]
              }
            }
          }
        }
        for v11 in 0..1 par {
          for v1 in 0..4 {
            for v2 in 0..4 {
              for v4 in 0..3 {
                for v5 in 0..3 {
                  if 0 <= v1 + v4 - 1 < 4 && 0 <= v2 + v5 - 1 < 4 {
                    t1 := n0[4*v11, v1 + v4 - 1, v2 + v5 - 1, 0]
                    t2 := n0[4*v11, v1 + v4 - 1, v2 + v5 - 1, 1]
                    t3 := n0[4*v11 + 1, v1 + v4 - 1, v2 + v5 - 1, 0]
                    t4 := n0[4*v11 + 1, v1 + v4 - 1, v2 + v5 - 1, 1]
                    t5 := n0[4*v11 + 2, v1 + v4 - 1, v2 + v5 - 1, 0]
                    t6 := n0[4*v11 + 2, v1 + v4 - 1, v2 + v5 - 1, 1]
                    t7 := n0[4*v11 + 3, v1 + v4 - 1, v2 + v5 - 1, 0]
                    t8 := n0[4*v11 + 3, v1 + v4 - 1, v2 + v5 - 1, 1]
                    for v16 in 0..16 par {
                      t9 := n3[v4, v5, 1, v16]
                      t10 := n3[v4, v5, 0, v16]
                      n2[4*v11, v1, v2, v16] := fma(t2, t9, fma(t1, t10, n2[4*v11, v1, v2, v16]))
                      n2[4*v11 + 1, v1, v2, v16] := fma(t4, t9, fma(t3, t10, n2[4*v11 + 1, v1, v2, v16]))
                      n2[4*v11 + 2, v1, v2, v16] := fma(t6, t9, fma(t5, t10, n2[4*v11 + 2, v1, v2, v16]))
                      n2[4*v11 + 3, v1, v2, v16] := fma(t8, t9, fma(t7, t10, n2[4*v11 + 3, v1, v2, v16]))
                    }
                  }
                }
              }
            }
          }
        }
    "#]].assert_eq(&scheduled(&case));
}

#[test]
fn maxima_propagate_nan() {
    for op in [BinOp::Max, BinOp::Min] {
        // Rows of 1000 (lanes), and columns (in place).
        for (letters, ext, out, arg, want) in [
            ("ik", [5, 1000], Arg(&[5], "i", Prec::F32), "i,k", "lanes"),
            ("kj", [16, 64], Arg(&[64], "j", Prec::F32), "k,j", "in place"),
        ] {
            let mut case = contraction(
                &format!("nan_{}_{letters}", op.name()),
                letters,
                &ext,
                out,
                &[Arg(&ext, arg, Prec::F32)],
                op,
                true,
            );
            assert_eq!(generated_kernel(&case, false), want);
            // NaN first, last and in the middle of some reductions; infinities elsewhere.
            let x = &mut case.inputs[0].1;
            for (i, v) in [(0, f64::NAN), (63, f64::NAN), (77, f64::NAN), (999, f64::NAN)] {
                x[i] = v;
            }
            x[100] = f64::INFINITY;
            x[150] = f64::NEG_INFINITY;
            check(&case);
        }
    }
}

#[test]
fn products_with_rows_and_columns_call_the_shape_generic_kernel() {
    // Every layout of a training step's products, batched products and attention scores, at
    // sizes no tile or block divides: one call each, and the interpreter's bits exactly.
    let cases = [
        abt(128, 256, 256, Prec::F32, true),
        abt(97, 131, 61, Prec::F64, true),
        abt(128, 256, 10, Prec::F32, true),
        atb(256, 128, 784, Prec::F32, false),
        atb(10, 128, 256, Prec::F32, true),
        abt(64, 130, 48, Prec::Bf16, true),
        abt(40, 128, 48, Prec::F16, false),
        contraction(
            "scores_big",
            "bhqkd",
            &[2, 3, 33, 35, 129],
            Arg(&[2, 3, 33, 35], "b,h,q,k", Prec::F32),
            &[
                Arg(&[2, 3, 33, 129], "b,h,q,d", Prec::F32),
                Arg(&[2, 3, 35, 129], "b,h,k,d", Prec::F32),
            ],
            BinOp::Add,
            true,
        ),
        // Rows over two loops (a batch of sequences through a dense layer): one product of
        // 4·37 rows.
        contraction(
            "dense_seq",
            "bsoi",
            &[4, 37, 45, 150],
            Arg(&[4, 37, 45], "b,s,o", Prec::F32),
            &[Arg(&[4, 37, 150], "b,s,i", Prec::F32), Arg(&[45, 150], "o,i", Prec::F32)],
            BinOp::Add,
            true,
        ),
    ];
    for case in &cases {
        assert_eq!(kernel(case), "gemm", "{}", case.name);
        check(case);
    }
    // The batch of sequences is one call over merged rows, split in two blocks.
    let text = scheduled(&cases[8]);
    assert!(text.contains("(m 148 in blocks"), "{text}");
    // A reduction with too little work or too few steps, and a matrix-vector product, stay
    // generated.
    assert_ne!(kernel(&abt(8, 16, 16, Prec::F32, true)), "gemm");
    assert_ne!(kernel(&abt(64, 64, 64, Prec::F32, true)), "gemm");
    assert_ne!(kernel(&abt(300, 300, 1, Prec::F32, true)), "gemm");
    // A shallow reduction is called when each call is wide (`MIN_WIDE_CELLS`), with the
    // interpreter's bits.
    let wide = abt(160, 64, 130, Prec::F32, true);
    assert_eq!(kernel(&wide), "gemm");
    check(&wide);
    assert_ne!(kernel(&abt(128, 48, 128, Prec::F32, true)), "gemm");
}

/// Products of two bf16 tensors call the bf16 dot-product kernel where the host has it
/// (`kernels::bf16`: the factors read as they are, no f32 copies), which rounds each cell of
/// the bf16 result once when it stores it (and reads the result when the product adds onto
/// it). The interpreter running the scheduled program computes the kernel's pairwise product
/// and gives its bits; both are within one rounding of the nest's sequential product.
#[test]
fn bf16_products_use_the_pairwise_kernel_and_the_interpreter_agrees() {
    use rocannl_arrayjit::Backend;
    use rocannl_arrayjit::backend::interp::Interp;
    use rocannl_arrayjit::kernels::bf16::has_native;
    for case in [
        matmul_case(64, 256, 48, Prec::Bf16),
        matmul_bt_case(33, 301, 40, Prec::Bf16),
        matmul_onto_case(40, 130, 33, Prec::Bf16),
        // Depth 64: called too (`MIN_PAIR_DEPTH`), reading row-major `A` in place.
        matmul_case(70, 64, 40, Prec::Bf16),
    ] {
        let mut prog =
            compile_program(&case.name, &case.asgn, &case.nodes, &CompileOptions::default())
                .unwrap();
        schedule_cpu(
            &mut prog,
            &CpuSchedule {
                threads: 2,
                kernel_calls: true,
                bf16_pairs: true,
                ..CpuSchedule::default()
            },
        );
        verify(&prog, "schedule").unwrap();
        let text = prog.to_string();
        // The kernel rounds into the bf16 result (and reads it when accumulating onto it): no
        // f32 copy of the result, no copy back.
        assert!(text.contains("gemm bf16 bf16-pairs"), "{text}");
        assert!(!text.contains(".f32"), "no f32 copy of the result: {text}");
        assert!(!text.contains("gemm operand"), "no f32 copies of the factors: {text}");
        // The scheduled program on the interpreter.
        let mut interp = Interp::new(&CompileOptions::default());
        // Every tensor gets a buffer.
        for node in prog.nodes.values() {
            if !prog.virtual_nodes.contains(&node.id) {
                interp.alloc(node).unwrap();
            }
        }
        for (id, vals) in &case.inputs {
            let node = case.nodes.get(*id).unwrap();
            interp.write(*id, &NdArray::from_f64(node.prec, &node.dims, vals).unwrap()).unwrap();
        }
        let r = interp
            .compile(
                &prog,
                &rocannl_arrayjit::backend::BuildRequest::from_options(&CompileOptions::default()),
            )
            .unwrap()
            .routine;
        interp.run(r, &[]).unwrap();
        let pairs = interp.read(case.outputs[0]).unwrap().to_f64_vec();
        let sequential = run_case(BackendKind::Interp, CompileOptions::default(), &case);
        assert_close(&case.name, &pairs, &sequential[0], tolerance(Prec::Bf16));
        if cfg!(feature = "gccjit") && has_native() {
            let got = run_case(BackendKind::Gccjit, CompileOptions::default(), &case);
            assert_eq!(bits(&got[0]), bits(&pairs), "{}: gccjit and the interpreter", case.name);
        }
    }
}

/// A bf16 product shallower than `MIN_PAIR_DEPTH` stays generated code.
#[test]
fn shallow_bf16_products_stay_generated() {
    use rocannl_arrayjit::low_level::schedule::MIN_PAIR_DEPTH;
    let case = matmul_case(70, MIN_PAIR_DEPTH - 16, 40, Prec::Bf16);
    let mut prog =
        compile_program(&case.name, &case.asgn, &case.nodes, &CompileOptions::default()).unwrap();
    let opts = CpuSchedule { threads: 2, bf16_pairs: true, ..CpuSchedule::default() };
    schedule_cpu(&mut prog, &opts);
    let text = prog.to_string();
    assert!(!text.contains("gemm"), "{text}");
}

/// `c := 0` then `c += a·b` (a gradient's fill and its first accumulation): the product starts
/// from 0 and the fill goes, with the interpreter's bits; not when `c` is read in between.
#[test]
fn a_sum_onto_a_zeroed_tensor_starts_from_zero() {
    use rocannl_arrayjit::assignments::FetchOp;
    for prec in [Prec::F32, Prec::F64, Prec::Bf16] {
        for read_between in [false, true] {
            let mut case = matmul_onto_case(48, 160, 40, prec);
            let c = case.outputs[0];
            case.inputs.retain(|(id, _)| *id != c);
            let product = case.asgn.clone();
            let mut steps = vec![Asgn::Fetch { lhs: c, fetch: FetchOp::Constant(0.0) }];
            if read_between {
                let d = host(&mut case.nodes, "d", &[48, 40], prec);
                let mut g = rocannl_arrayjit::indexing::SymbolGen::default();
                let p = rocannl_arrayjit::indexing::Projections::identity(&[48, 40], 1, &mut g);
                steps.push(accum(d, None, vec![c], ScalarExpr::Arg(0), p, false));
                case.outputs.push(d);
            }
            steps.push(product);
            case.asgn = Asgn::Seq(steps);
            case.name = format!("zeroed_{}_{read_between}", prec.name());
            let text = scheduled(&case);
            let folded = text.contains("the next reduction starts from 0");
            assert_eq!(folded, !read_between, "{}:\n{text}", case.name);
            let want = run_case(BackendKind::Interp, CompileOptions::default(), &case);
            let got = run_case(BackendKind::Gccjit, CompileOptions::default(), &case);
            for (g, w) in got.iter().zip(&want) {
                if prec == Prec::Bf16 {
                    assert_close(&case.name, g, w, tolerance(prec));
                } else {
                    assert_eq!(bits(g), bits(w), "{}", case.name);
                }
            }
        }
    }
}

/// The same with a dynamic number of rows: the sum starts from 0 on the rows it writes, and the
/// fill keeps only the rows past the runtime size (still zero afterwards).
#[test]
fn a_sum_with_dynamic_rows_onto_zeros_keeps_the_fill_past_them() {
    use rocannl_arrayjit::assignments::FetchOp;
    for rows in [1, 17, 48] {
        let mut case = matmul_onto_case(48, 160, 40, Prec::F32);
        let c = case.outputs[0];
        case.inputs.retain(|(id, _)| *id != c);
        let Asgn::Accum { lhs, accum, rhs, expr, projections, initialize_neutral } = case.asgn
        else {
            unreachable!()
        };
        let size = Symbol(60);
        let mut p = (*projections).clone();
        p.dynamic = vec![(Symbol(0), size)];
        let product =
            Asgn::Accum { lhs, accum, rhs, expr, projections: Arc::new(p), initialize_neutral };
        case.asgn = Asgn::Seq(vec![Asgn::Fetch { lhs: c, fetch: FetchOp::Constant(0.0) }, product]);
        case.bindings = vec![(size, rows as i64)];
        case.name = format!("zeroed_dynamic_{rows}");
        let text = scheduled(&case);
        assert!(text.contains("if 0 <= v0 - i60 < 48") && text.contains("1] := n0["), "{text}");
        let want = run_case(BackendKind::Interp, CompileOptions::default(), &case);
        let got = run_case(BackendKind::Gccjit, CompileOptions::default(), &case);
        assert_eq!(bits(&got[0]), bits(&want[0]), "{}", case.name);
        assert!(want[0][rows * 40..].iter().all(|x| *x == 0.0));
    }
}

/// `g := 0` then `g += x` then `g += 2y` (a gradient's fill and its contributions): the first
/// accumulation reads `+0` instead of `g` and the fill goes (kept past a dynamic number of
/// rows), with the interpreter's bits — a `-0` contribution gives `+0`, as the read zeros did;
/// not when `g` is read in between.
#[test]
fn an_accumulation_onto_a_zeroed_tensor_reads_zero() {
    use rocannl_arrayjit::assignments::FetchOp;
    use rocannl_arrayjit::indexing::{Projections, SymbolGen};
    let (m, n) = (48, 40);
    for prec in [Prec::F32, Prec::F64, Prec::Bf16] {
        for read_between in [false, true] {
            for rows in [None, Some(1), Some(17), Some(48)] {
                let mut nodes = NodeTable::default();
                let x = host(&mut nodes, "x", &[m, n], prec);
                let y = host(&mut nodes, "y", &[m, n], prec);
                let g = host(&mut nodes, "g", &[m, n], prec);
                let size = Symbol(60);
                let onto = |rhs, expr| {
                    let mut p = Projections::identity(&[m, n], 1, &mut SymbolGen::default());
                    if rows.is_some() {
                        p.dynamic = vec![(p.product_iterators[0], size)];
                    }
                    accum(g, Some(BinOp::Add), vec![rhs], expr, p, false)
                };
                let mut steps = vec![Asgn::Fetch { lhs: g, fetch: FetchOp::Constant(0.0) }];
                let mut outputs = vec![g];
                if read_between {
                    let d = host(&mut nodes, "d", &[m, n], prec);
                    let p = Projections::identity(&[m, n], 1, &mut SymbolGen::default());
                    steps.push(accum(d, None, vec![g], ScalarExpr::Arg(0), p, false));
                    outputs.push(d);
                }
                steps.push(onto(x, ScalarExpr::Arg(0)));
                let twice = ScalarExpr::bin(BinOp::Mul, ScalarExpr::Arg(0), ScalarExpr::Const(2.0));
                steps.push(onto(y, twice));
                let mut xs = data(m * n, 1, -1.0, 1.0);
                // Negative zeros: `+0 + -0` is `+0`.
                xs.iter_mut().step_by(7).for_each(|v| *v = -0.0);
                let ys = data(m * n, 2, -1.0, 1.0).iter().map(|v| prec.round(*v)).collect();
                let case = Case {
                    name: format!("accumulated_{}_{read_between}_{rows:?}", prec.name()),
                    nodes,
                    asgn: Asgn::Seq(steps),
                    inputs: vec![(x, xs.iter().map(|v| prec.round(*v)).collect()), (y, ys)],
                    outputs,
                    bindings: rows.map(|r| vec![(size, r as i64)]).unwrap_or_default(),
                    expected: None,
                };
                let text = scheduled(&case);
                // The fill goes, or stays guarded for the rows past the dynamic size.
                let folded = match rows {
                    None => text.contains("the next accumulation reads +0"),
                    Some(_) => text.contains("if "),
                };
                assert_eq!(folded, !read_between, "{}:\n{text}", case.name);
                let want = run_case(BackendKind::Interp, CompileOptions::default(), &case);
                for threads in [1, 2] {
                    let opts = CompileOptions {
                        threads: Some(threads),
                        min_parallel_work: 1,
                        ..CompileOptions::default()
                    };
                    let got = run_case(BackendKind::Gccjit, opts, &case);
                    for (g, w) in got.iter().zip(&want) {
                        assert_eq!(bits(g), bits(w), "{} ({threads} threads)", case.name);
                    }
                }
            }
        }
    }
}

/// A row's variance, `d := x - m` then `t := t + d·d` over 48 steps per cell, for `rows`.
fn variance(rows: usize, prec: Prec) -> Case {
    let d = || ScalarExpr::bin(BinOp::Sub, ScalarExpr::Arg(0), ScalarExpr::Arg(1));
    accumulation(
        &format!("variance_{}", prec.name()),
        "ik",
        &[rows, 48],
        Arg(&[rows], "i", prec),
        &[Arg(&[rows, 48], "i,k", prec), Arg(&[rows], "i", prec)],
        ScalarExpr::bin(BinOp::Mul, d(), d()),
        BinOp::Add,
        true,
    )
}

/// A short reduction over many cells that no kernel takes (a row's variance) runs 8 cells at a
/// time, each cell's steps in the nest's order: the interpreter's bits exactly, in every
/// precision and thread count. A tiny one (64 rows × 48 steps) stays as lowered.
#[test]
fn short_reductions_interleave_their_cells() {
    assert!(!scheduled(&variance(64, Prec::F32)).contains("8*v"));
    for prec in [Prec::F32, Prec::F64, Prec::Bf16] {
        let case = variance(128, prec);
        let text = scheduled(&case);
        // Eight accumulators, eight stores per block of cells.
        assert_eq!(text.matches("n2[8*v2").count(), 8, "{text}");
        if prec == Prec::F32 {
            expect![[r#"
                # y variance_f32
                for v2 in 0..16 par {
                  t2 := 0
                  t4 := 0
                  t6 := 0
                  t8 := 0
                  t10 := 0
                  t12 := 0
                  t14 := 0
                  t16 := 0
                  for v1 in 0..48 {
                    t3 := sub(n0[8*v2, v1], n1[8*v2])
                    t2 := fma(t3, t3, t2)
                    t5 := sub(n0[8*v2 + 1, v1], n1[8*v2 + 1])
                    t4 := fma(t5, t5, t4)
                    t7 := sub(n0[8*v2 + 2, v1], n1[8*v2 + 2])
                    t6 := fma(t7, t7, t6)
                    t9 := sub(n0[8*v2 + 3, v1], n1[8*v2 + 3])
                    t8 := fma(t9, t9, t8)
                    t11 := sub(n0[8*v2 + 4, v1], n1[8*v2 + 4])
                    t10 := fma(t11, t11, t10)
                    t13 := sub(n0[8*v2 + 5, v1], n1[8*v2 + 5])
                    t12 := fma(t13, t13, t12)
                    t15 := sub(n0[8*v2 + 6, v1], n1[8*v2 + 6])
                    t14 := fma(t15, t15, t14)
                    t17 := sub(n0[8*v2 + 7, v1], n1[8*v2 + 7])
                    t16 := fma(t17, t17, t16)
                  }
                  n2[8*v2] := t2
                  n2[8*v2 + 1] := t4
                  n2[8*v2 + 2] := t6
                  n2[8*v2 + 3] := t8
                  n2[8*v2 + 4] := t10
                  n2[8*v2 + 5] := t12
                  n2[8*v2 + 6] := t14
                  n2[8*v2 + 7] := t16
                }
            "#]]
            .assert_eq(&text);
        }
        let want = run_case(BackendKind::Interp, CompileOptions::default(), &case);
        for opts in [
            CompileOptions::default(),
            CompileOptions { threads: Some(1), ..CompileOptions::default() },
            CompileOptions { threads: Some(3), min_parallel_work: 1, ..CompileOptions::default() },
        ] {
            let got = run_case(BackendKind::Gccjit, opts, &case);
            assert_eq!(bits(&got[0]), bits(&want[0]), "{}", case.name);
        }
    }
}

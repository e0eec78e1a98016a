//! The backend conformance suite: every case on every backend, against an independent
//! reference and against the interpreter (the oracle).

mod common;

use common::*;
use rocannl_arrayjit::ops::Prec;
use rocannl_arrayjit::{BackendKind, CompileOptions};

fn conformance(kind: BackendKind, precs: &[Prec], opts: CompileOptions) {
    for case in all_cases(precs) {
        let tol = tolerance(case_prec(&case));
        let got = run_case(kind, opts.clone(), &case);
        if let Some(expected) = &case.expected {
            for (k, (g, w)) in got.iter().zip(expected).enumerate() {
                assert_close(&format!("{} output {k} vs reference", case.name), g, w, tol);
            }
        }
        if kind != BackendKind::Interp {
            let oracle = run_case(BackendKind::Interp, CompileOptions::default(), &case);
            for (k, (g, w)) in got.iter().zip(&oracle).enumerate() {
                assert_close(&format!("{} output {k} vs interp", case.name), g, w, tol);
            }
        }
    }
}

#[test]
fn interp_all_precisions() {
    conformance(BackendKind::Interp, &Prec::ALL, CompileOptions::default());
}

/// The CUDA backend's kernels, executed by the simulator: every conformance case in every
/// precision, with the checks for races, barriers and bounds on every launch.
#[test]
fn cuda_kernels_simulated_all_precisions() {
    conformance(BackendKind::CudaSim, &Prec::ALL, CompileOptions::default());
}

#[test]
fn interp_without_virtualization() {
    let opts = CompileOptions { virtualize: false, ..CompileOptions::default() };
    conformance(BackendKind::Interp, &[Prec::F32, Prec::F64], opts);
}

/// Native code as it runs in steady state: the optimized build, with no quick first tier.
#[cfg(feature = "gccjit")]
fn optimized() -> CompileOptions {
    CompileOptions { tiered: false, ..CompileOptions::default() }
}

#[cfg(feature = "gccjit")]
#[test]
fn gccjit_all_precisions() {
    conformance(BackendKind::Gccjit, &Prec::ALL, optimized());
}

/// The first run of a tiered routine runs its quick `-O0` build.
#[cfg(feature = "gccjit")]
#[test]
fn gccjit_first_tier_all_precisions() {
    conformance(BackendKind::Gccjit, &Prec::ALL, CompileOptions::default());
}

#[cfg(feature = "gccjit")]
#[test]
fn gccjit_unoptimized_single_thread() {
    let opts = CompileOptions {
        opt_level: 0,
        threads: Some(1),
        march_native: false,
        ..CompileOptions::default()
    };
    conformance(BackendKind::Gccjit, &[Prec::F32, Prec::F64], opts);
}

#[cfg(feature = "gccjit")]
#[test]
fn gccjit_bounds_checked_threads_always_split() {
    let opts = CompileOptions {
        bounds_check: true,
        threads: Some(3),
        min_parallel_work: 1,
        ..CompileOptions::default()
    };
    conformance(BackendKind::Gccjit, &[Prec::F32], opts);
}

#[cfg(feature = "gccjit")]
#[test]
fn gccjit_large_matmuls_match_interp() {
    for (m, k, n) in
        [(64, 64, 64), (33, 47, 65), (128, 96, 80), (5, 300, 17), (2, 3, 1024), (96, 520, 1040)]
    {
        for prec in [Prec::F32, Prec::F64] {
            let case = matmul_case(m, k, n, prec);
            let got = run_case(BackendKind::Gccjit, optimized(), &case);
            let want = run_case(BackendKind::Interp, CompileOptions::default(), &case);
            assert_close(&case.name, &got[0], &want[0], 1e-4);
        }
    }
    // Half-precision results: the kernels accumulate in an f32 copy and round once, as the
    // interpreter does (the sums' order differs, so equal within one rounding of the result).
    // (A transposed half-precision operand is converted into a buffer laid out as it is.)
    for (m, k, n) in [(64, 64, 64), (33, 47, 65), (5, 300, 17), (64, 256, 48)] {
        for prec in [Prec::Bf16, Prec::F16] {
            let cases = [
                matmul_case(m, k, n, prec),
                matmul_onto_case(m, k, n, prec),
                matmul_bt_case(m, k, n, prec),
            ];
            for case in cases {
                let got = run_case(BackendKind::Gccjit, optimized(), &case);
                let want = run_case(BackendKind::Interp, CompileOptions::default(), &case);
                assert_close(&case.name, &got[0], &want[0], tolerance(prec));
                let reference = &case.expected.as_ref().unwrap()[0];
                assert_close(
                    &format!("{} vs reference", case.name),
                    &got[0],
                    reference,
                    tolerance(prec),
                );
            }
        }
    }
}

#[test]
fn a_dynamic_size_outside_one_to_its_maximum_is_an_error() {
    let kinds = BackendKind::available().into_iter().chain([BackendKind::CudaSim]);
    for kind in kinds.filter(|k| *k != BackendKind::Cuda) {
        let case = dynamic_case(Prec::F32, 7);
        let mut ctx = rocannl_arrayjit::Context::new(kind, CompileOptions::default()).unwrap();
        let r = ctx.compile(&case.name, &case.asgn, &case.nodes).unwrap();
        for node in case.nodes.iter() {
            ctx.ensure_buffer(node).unwrap();
        }
        let (size, _) = case.bindings[0];
        for bad in [0, 25, -3] {
            let err = ctx.run(&r, &[(size, bad)]).unwrap_err();
            assert!(
                matches!(err, rocannl_arrayjit::Error::SymbolOutOfRange { .. }),
                "{kind:?} size {bad}: {err}"
            );
        }
        for good in [1, 24] {
            ctx.run(&r, &[(size, good)]).unwrap();
        }
    }
}

/// The optimization level changes speed, never values: GCC is not allowed to reassociate
/// floating-point arithmetic (no `-ffast-math`) nor to contract it (`-ffp-contract=off`), so
/// code built at `-O0`, `-O1` and `-O3` computes the same bits. That is what makes a tiered
/// routine's quick `-O0` build, later swapped for the optimized one, safe.
#[cfg(feature = "gccjit")]
#[test]
fn gccjit_optimization_levels_compute_the_same_bits() {
    let mut cases = all_cases(&Prec::ALL);
    cases.extend(
        [(64, 64, 64), (33, 47, 65), (5, 300, 17)].map(|(m, k, n)| matmul_case(m, k, n, Prec::F32)),
    );
    cases.push(matmul_onto_case(40, 70, 50, Prec::Bf16));
    for case in cases {
        let at = |level: u8| {
            let opts = CompileOptions { opt_level: level, ..optimized() };
            run_case(BackendKind::Gccjit, opts, &case)
        };
        let o3 = at(3);
        for level in [0, 1] {
            let other = at(level);
            for (k, (a, b)) in other.iter().zip(&o3).enumerate() {
                let same = a
                    .iter()
                    .zip(b)
                    .all(|(x, y)| x.to_bits() == y.to_bits() || x.is_nan() && y.is_nan());
                assert!(same, "{} output {k}: -O{level} and -O3 differ", case.name);
            }
        }
    }
}

/// gccjit at `-O0` and `-O3` gives the interpreter's bits on a map over inputs `xs` (any NaN
/// for a NaN).
#[cfg(feature = "gccjit")]
fn assert_gccjit_gives_the_interpreters_bits(case: &Case, xs: &[f64]) {
    let want = run_case(BackendKind::Interp, CompileOptions::default(), case);
    for level in [0, 3] {
        let opts = CompileOptions { opt_level: level, ..optimized() };
        let got = run_case(BackendKind::Gccjit, opts, case);
        for (i, (g, w)) in got[0].iter().zip(&want[0]).enumerate() {
            assert!(
                g.to_bits() == w.to_bits() || g.is_nan() && w.is_nan(),
                "{} at -O{level}: x = {:e}: gccjit {g:e}, interp {w:e}",
                case.name,
                xs[i]
            );
        }
    }
}

/// The special functions (`exp`, `exp2`, `log`, `log2`, `sin`, `cos`, `tanh`, `erf`, and
/// `sigmoid`, which calls `exp`) in compiled, vectorized loops compute the interpreter's bits
/// (`rocannl_arrayjit::math`): over the whole range of inputs, special values, subnormals,
/// overflow and vector tails included, at `-O3` and `-O0`, in every precision computed in
/// `f32`.
#[cfg(feature = "gccjit")]
#[test]
fn gccjit_special_functions_compute_the_interpreters_bits() {
    use rocannl_arrayjit::ops::UnOp;
    let mut xs: Vec<f64> = vec![
        0.0,
        -0.0,
        f64::NAN,
        f64::INFINITY,
        f64::NEG_INFINITY,
        1e-40,
        -1e-40,
        88.72,
        88.73,
        -87.0,
        -103.0,
        -104.5,
        0.9,
        -0.9,
        9.5,
        1.0,
        -1.0,
        3.9,
        4.5,
        -149.5,
        128.0,
        1e-45,
        3e38,
        // Near multiples of π/2, the hardest argument reductions among them.
        std::f64::consts::FRAC_PI_4,
        std::f64::consts::FRAC_PI_2,
        252.898_21,
        2.199_938_5e10,
        7.729_179e28,
        1e30,
        3.4e38,
    ];
    // Every magnitude from 2^-140 to 2^127, both signs, with varied significands.
    xs.extend((0..4084).map(|i| {
        let e = -140.0 + 267.0 * (i as f64) / 4084.0;
        let sign = if i % 2 == 0 { 1.0 } else { -1.0 };
        sign * 2f64.powf(e) * (1.0 + rocannl_arrayjit::ops::uniform(9, i as u64))
    }));
    // And from 2^-30 to 2^7, where the functions bend.
    xs.extend((0..4084).map(|i| {
        let e = -30.0 + 37.0 * (i as f64) / 4084.0;
        let sign = if i % 2 == 0 { 1.0 } else { -1.0 };
        sign * 2f64.powf(e) * (1.0 + rocannl_arrayjit::ops::uniform(10, i as u64))
    }));
    let ops = [
        UnOp::Exp,
        UnOp::Exp2,
        UnOp::Log,
        UnOp::Log2,
        UnOp::Sin,
        UnOp::Cos,
        UnOp::Tanh,
        UnOp::Erf,
        UnOp::Sigmoid,
    ];
    for prec in [Prec::F32, Prec::Bf16, Prec::F16] {
        for op in ops {
            let case = unop_case_on(op, prec, xs.clone());
            assert_gccjit_gives_the_interpreters_bits(&case, &xs);
        }
    }
}

/// `pow(x, y)` with both arguments varying, in compiled, vectorized loops, computes the
/// interpreter's bits (`rocannl_arrayjit::math::pow`): every pair of special values, and pairs
/// whose results span the range (subnormal, overflowing, negative bases with integer powers).
#[cfg(feature = "gccjit")]
#[test]
fn gccjit_pow_computes_the_interpreters_bits() {
    use rocannl_arrayjit::assignments::ScalarExpr;
    use rocannl_arrayjit::indexing::{Projections, SymbolGen};
    use rocannl_arrayjit::ops::BinOp;
    use rocannl_arrayjit::tnode::NodeTable;
    let specials = [
        0.0,
        -0.0,
        1.0,
        -1.0,
        0.5,
        -0.5,
        2.0,
        -3.0,
        2.5,
        -2.5,
        1e-45,
        3e38,
        16_777_215.0,
        f64::INFINITY,
        f64::NEG_INFINITY,
        f64::NAN,
    ];
    let mut xs = vec![];
    let mut ys = vec![];
    for &x in &specials {
        for &y in &specials {
            xs.push(x);
            ys.push(y);
        }
    }
    for i in 0..3000u64 {
        let u = rocannl_arrayjit::ops::uniform(21, i);
        let v = rocannl_arrayjit::ops::uniform(22, i);
        let x = 2f64.powf(-60.0 + 120.0 * u) * if i % 3 == 0 { -1.0 } else { 1.0 };
        let y = if i % 3 == 0 {
            (v * 40.0 - 20.0).round()
        } else {
            (v - 0.5) * 300.0 / x.abs().log2().abs().max(0.5)
        };
        xs.push(x);
        ys.push(y);
    }
    for prec in [Prec::F32, Prec::Bf16] {
        let n = xs.len();
        let mut nodes = NodeTable::default();
        let x = host(&mut nodes, "x", &[n], prec);
        let y = host(&mut nodes, "y", &[n], prec);
        let z = host(&mut nodes, "z", &[n], prec);
        let p = Projections::identity(&[n], 2, &mut SymbolGen::default());
        let expr = ScalarExpr::bin(BinOp::Pow, ScalarExpr::Arg(0), ScalarExpr::Arg(1));
        let case = Case {
            name: format!("pow_pairs_{}", prec.name()),
            asgn: accum(z, None, vec![x, y], expr, p, false),
            nodes,
            inputs: vec![(x, xs.clone()), (y, ys.clone())],
            outputs: vec![z],
            bindings: vec![],
            expected: None,
        };
        assert_gccjit_gives_the_interpreters_bits(&case, &xs);
    }
}

/// Half-precision stores round as compiled code does, in the interpreter too: 2¹⁸ uniform
/// draws (exact in f32, some just above a bf16 tie, where a conversion that drops low bits
/// rounds the wrong way) stored in bf16 and f16 are bit for bit gccjit's.
#[cfg(feature = "gccjit")]
#[test]
fn half_precision_stores_round_as_compiled_code_does() {
    use rocannl_arrayjit::assignments::{Asgn, FetchOp};
    use rocannl_arrayjit::tnode::NodeTable;
    for prec in [Prec::Bf16, Prec::F16] {
        let mut nodes = NodeTable::default();
        let u = host(&mut nodes, "u", &[512, 512], prec);
        let seed = 13_064_396_156_225_473_817;
        let case = Case {
            name: format!("uniform_{}", prec.name()),
            asgn: Asgn::Fetch { lhs: u, fetch: FetchOp::Uniform { seed, salt: None } },
            nodes,
            inputs: vec![],
            outputs: vec![u],
            bindings: vec![],
            expected: None,
        };
        let want = run_case(BackendKind::Interp, CompileOptions::default(), &case);
        let got = run_case(BackendKind::Gccjit, optimized(), &case);
        let differ = got[0].iter().zip(&want[0]).filter(|(g, w)| g.to_bits() != w.to_bits());
        assert_eq!(differ.count(), 0, "{}", case.name);
        // And each is the draw correctly rounded.
        for (i, v) in want[0].iter().enumerate() {
            let exact = rocannl_arrayjit::ops::uniform(seed, i as u64);
            assert_eq!(*v, prec.round(exact), "{} cell {i}", case.name);
        }
    }
}

/// f16 and bf16 loads and stores, inline in compiled code, convert exactly as the interpreter
/// does: every f16 and bf16 value to f32, and f32 values across the whole range (ties between
/// neighbours and either side of them, f16's subnormals, the overflow thresholds, infinities,
/// NaN) back, at `-O0` and `-O3`.
#[cfg(feature = "gccjit")]
#[test]
fn gccjit_half_precision_conversions_match_the_interpreter() {
    use rocannl_arrayjit::assignments::ScalarExpr;
    let copy = |from: Prec, to: Prec, xs: Vec<f64>| {
        let name = format!("copy_{}_{}", from.name(), to.name());
        map_case(&name, from, to, ScalarExpr::Arg(0), xs)
    };
    let every_f16: Vec<f64> = (0..=u16::MAX).map(|b| half::f16::from_bits(b).to_f64()).collect();
    let mut f32s: Vec<f64> =
        (0..=u32::MAX / 4099).map(|i| f32::from_bits(i.wrapping_mul(4099)) as f64).collect();
    for b in 0..=u16::MAX {
        // Each f16 value, the midpoints to its neighbours, and just either side of those.
        let v = half::f16::from_bits(b).to_f32();
        let next = half::f16::from_bits(b.wrapping_add(1)).to_f32();
        if v.is_finite() && next.is_finite() && (b & 0x7fff) != 0x7bff {
            let mid = (v as f64 + next as f64) / 2.0;
            let m = mid as f32;
            for d in [-1i32, 0, 1] {
                f32s.push(f32::from_bits((m.to_bits() as i32 + d) as u32) as f64);
            }
        }
    }
    f32s.extend([65504.0, 65519.99, 65520.0, 65536.0, 1e10, f64::INFINITY, f64::NAN, 6e-8, 3e-8]);
    // bf16 too: every value, and the ties between neighbours (and either side of them).
    let every_bf16: Vec<f64> = (0..=u16::MAX).map(|b| half::bf16::from_bits(b).to_f64()).collect();
    let mut bf16_ties: Vec<f64> = vec![3.4e38, f64::INFINITY, f64::NAN, 1e-40];
    for b in (0..=u16::MAX).step_by(7) {
        let mid = f32::from_bits(((b as u32) << 16) | 0x8000);
        for d in [-1i32, 0, 1] {
            bf16_ties.push(f32::from_bits((mid.to_bits() as i32 + d) as u32) as f64);
        }
    }
    let cases = [
        copy(Prec::F16, Prec::F32, every_f16),
        copy(Prec::F32, Prec::F16, f32s),
        copy(Prec::Bf16, Prec::F32, every_bf16),
        copy(Prec::F32, Prec::Bf16, bf16_ties),
    ];
    for case in cases {
        let want = run_case(BackendKind::Interp, CompileOptions::default(), &case);
        for level in [0, 3] {
            let opts = CompileOptions { opt_level: level, ..optimized() };
            let got = run_case(BackendKind::Gccjit, opts, &case);
            let bad = got[0]
                .iter()
                .zip(&want[0])
                .enumerate()
                .find(|(_, (g, w))| g.to_bits() != w.to_bits() && !(g.is_nan() && w.is_nan()));
            assert!(bad.is_none(), "{} at -O{level}: {bad:?}", case.name);
        }
    }
}

/// u32 tensors (ids): loads give the integers to f32 arithmetic (rounded as compiled code
/// rounds them past 2²⁴), and a computed value stored as u32 is truncated toward zero and
/// saturated, `nan` to 0 — on every backend, bit for bit.
#[test]
fn u32_tensors_load_and_store_alike_everywhere() {
    use rocannl_arrayjit::assignments::{Asgn, ScalarExpr};
    use rocannl_arrayjit::indexing::{Projections, SymbolGen};
    use rocannl_arrayjit::ops::BinOp;
    use rocannl_arrayjit::tnode::NodeTable;
    let ids: Vec<f64> =
        vec![0.0, 1.0, 7.0, 26.0, 16_777_217.0, 4_294_967_295.0, 123_456_789.0, 3.0];
    let xs: Vec<f64> =
        vec![-3.5, 0.99, 2.5, 1e12, f64::NAN, 4_294_967_295.5, 17.0, f64::NEG_INFINITY];
    let n = ids.len();
    let mut nodes = NodeTable::default();
    let id = host(&mut nodes, "ids", &[n], Prec::U32);
    let x = host(&mut nodes, "x", &[n], Prec::F32);
    let y = host(&mut nodes, "y", &[n], Prec::F32);
    let z = host(&mut nodes, "z", &[n], Prec::U32);
    let mut symbols = SymbolGen::default();
    let p1 = Projections::identity(&[n], 2, &mut symbols);
    let p2 = Projections::identity(&[n], 1, &mut symbols);
    // y = ids · 0.5 + x, z = x (as an id).
    let expr = ScalarExpr::bin(
        BinOp::Add,
        ScalarExpr::bin(BinOp::Mul, ScalarExpr::Arg(0), ScalarExpr::Const(0.5)),
        ScalarExpr::Arg(1),
    );
    let case = Case {
        name: "u32".into(),
        asgn: Asgn::Seq(vec![
            accum(y, None, vec![id, x], expr, p1, false),
            accum(z, None, vec![x], ScalarExpr::Arg(0), p2, false),
        ]),
        nodes,
        inputs: vec![(id, ids.clone()), (x, xs.clone())],
        outputs: vec![y, z],
        bindings: vec![],
        expected: None,
    };
    let want = run_case(BackendKind::Interp, CompileOptions::default(), &case);
    // The ids reach f32 arithmetic as f32 values; the stored ids saturate.
    for i in 0..n {
        let v = ((ids[i] as f32) * 0.5 + xs[i] as f32) as f64;
        assert!(want[0][i].to_bits() == v.to_bits() || (v.is_nan() && want[0][i].is_nan()));
    }
    let xs32: Vec<f64> = xs.iter().map(|v| *v as f32 as f64).collect();
    assert_eq!(want[1], xs32.iter().map(|v| *v as u32 as f64).collect::<Vec<_>>());
    assert_eq!(want[1][5], 4_294_967_295.0, "saturates");
    assert_eq!((want[1][0], want[1][4]), (0.0, 0.0), "negatives and nan are 0");
    #[cfg(feature = "gccjit")]
    for level in [0, 3] {
        let opts = CompileOptions { opt_level: level, ..optimized() };
        let got = run_case(BackendKind::Gccjit, opts, &case);
        for (k, (g, w)) in got.iter().zip(&want).enumerate() {
            let same = g
                .iter()
                .zip(w)
                .all(|(a, b)| a.to_bits() == b.to_bits() || a.is_nan() && b.is_nan());
            assert!(same, "output {k} at -O{level}: {g:?} vs {w:?}");
        }
    }
    // Writing a value that is not an id is an error naming the cell.
    let err = rocannl_arrayjit::NdArray::from_f64(Prec::U32, &[2], &[1.0, 2.5]).unwrap_err();
    assert!(err.to_string().contains("cell 1 holds 2.5"), "{err}");
}

/// `pow` with a constant exponent is the C library's `pow` in compiled code too: GCC must not
/// rewrite `pow(x, 0.5)` as `sqrt(x)` (which gives `-0` for `-0` and NaN for `-inf`, where
/// `pow` gives `+0` and `+inf`), nor other constant powers as products, at `-O0` and `-O3`, in
/// f32 and f64: the interpreter's bits at the IEEE corners.
#[cfg(feature = "gccjit")]
#[test]
fn gccjit_pow_by_a_constant_keeps_signed_zeros_and_infinities() {
    use rocannl_arrayjit::assignments::ScalarExpr;
    use rocannl_arrayjit::ops::BinOp;
    let xs = vec![
        0.0,
        -0.0,
        f64::INFINITY,
        f64::NEG_INFINITY,
        f64::NAN,
        1e-45,
        -1e-45,
        3e38,
        -3e38,
        1.0,
        -1.0,
        0.5,
        2.0,
        -2.5,
    ];
    for prec in [Prec::F32, Prec::F64] {
        for e in [0.5, -0.5, 0.0, 1.0, 2.0, 3.0, -1.0, -2.0, 1.5, 1.0 / 3.0] {
            let expr = ScalarExpr::bin(BinOp::Pow, ScalarExpr::Arg(0), ScalarExpr::Const(e));
            let case = map_case(&format!("pow_{e}_{}", prec.name()), prec, prec, expr, xs.clone());
            assert_gccjit_gives_the_interpreters_bits(&case, &xs);
        }
    }
}

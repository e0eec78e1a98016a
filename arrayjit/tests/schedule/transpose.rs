//! Pointwise transpositions (a result written along its rows from a tensor read across them)
//! run in 16 × 16 tiles, with the interpreter's bits; nests that are small, not transposing or
//! of sizes no tile divides stay as lowered.

use super::*;

/// `y[..] := expr(args[..])`: a pointwise assignment over the iterators `letters`.
fn pointwise(letters: &str, extents: &[usize], out: Arg<'_>, args: &[Arg<'_>]) -> Case {
    // `0.5 · x0 · x1`, as a GELU's gradient multiplies two activations.
    let expr = ScalarExpr::bin(
        BinOp::Mul,
        ScalarExpr::bin(BinOp::Mul, ScalarExpr::Arg(0), ScalarExpr::Const(0.5)),
        ScalarExpr::Arg(args.len() - 1),
    );
    let name = format!(
        "transpose_{}",
        extents.iter().map(|e| e.to_string()).collect::<Vec<_>>().join("x")
    );
    let mut case = accumulation(&name, letters, extents, out, args, expr, BinOp::Add, false);
    if let Asgn::Accum { accum, initialize_neutral, .. } = &mut case.asgn {
        *accum = None;
        *initialize_neutral = false;
    }
    case
}

/// `y[o, m, i] := 0.5 · a[m, i, o] · b[m, i, o]`: `o` contiguous in the arguments, `i` in the
/// result.
fn across(o: usize, m: usize, i: usize, prec: Prec) -> Case {
    let arg = [m, i, o];
    pointwise(
        "omi",
        &[o, m, i],
        Arg(&[o, m, i], "o,m,i", prec),
        &[Arg(&arg, "m,i,o", prec), Arg(&arg, "m,i,o", prec)],
    )
}

fn bits_of(case: &Case, opts: CompileOptions, backend: BackendKind) -> Vec<u64> {
    bits(&run_case(backend, opts, case)[0])
}

#[test]
fn transpositions_run_in_tiles_with_the_interpreters_bits() {
    for prec in [Prec::F32, Prec::F64, Prec::Bf16] {
        let case = across(64, 3, 256, prec);
        let text = scheduled(&case);
        assert!(text.contains("16*v") && text.contains("in 0..16"), "{text}");
        let want = bits_of(&case, CompileOptions::default(), BackendKind::Interp);
        for opts in [
            CompileOptions::default(),
            CompileOptions { threads: Some(1), ..CompileOptions::default() },
            CompileOptions { threads: Some(3), min_parallel_work: 1, ..CompileOptions::default() },
        ] {
            assert_eq!(bits_of(&case, opts, BackendKind::Gccjit), want, "{prec:?}");
        }
    }
}

#[test]
fn the_tiled_nest_reads_and_writes_one_tile_at_a_time() {
    expect![[r#"
        # y transpose_32x2x512
        for v3 in 0..2 par {
          for v1 in 0..2 par {
            for v5 in 0..32 {
              for v4 in 0..16 {
                for v6 in 0..16 {
                  n2[16*v3 + v4, v1, 16*v5 + v6] := mul(mul(n0[v1, 16*v5 + v6, 16*v3 + v4], 0.5), n1[v1, 16*v5 + v6, 16*v3 + v4])
                }
              }
            }
          }
        }
    "#]]
    .assert_eq(&scheduled(&across(32, 2, 512, Prec::F32)));
}

#[test]
fn small_untiled_or_aligned_nests_stay_as_lowered() {
    // Too small to leave the L1 cache.
    assert!(!scheduled(&across(16, 1, 256, Prec::F32)).contains("16*v"));
    // No tile divides 100.
    assert!(!scheduled(&across(64, 3, 100, Prec::F32)).contains("16*v"));
    // Not a transposition: every tensor contiguous along the innermost loop.
    let same = [64, 3, 256];
    let aligned = pointwise(
        "omi",
        &same,
        Arg(&same, "o,m,i", Prec::F32),
        &[Arg(&same, "o,m,i", Prec::F32), Arg(&same, "o,m,i", Prec::F32)],
    );
    assert!(!scheduled(&aligned).contains("16*v"));
}

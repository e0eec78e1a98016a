//! Long sums are accurate: a sum of one tensor's values of 1024 terms or more accumulates in
//! f64 on every backend (docs/lowering.md, "Accurate sums"), so the examples that a sequential
//! f32 sum gets wrong — 10⁶ × 0.1 (100958.34) and 2²⁵ ones (2²⁴) — give numpy's values, and the
//! interpreter and gccjit give the same bits.

use rocannl_tensor::{Axes, BackendKind, Graph, Prec, Session, SessionOptions};

fn backends() -> Vec<BackendKind> {
    let mut b = vec![BackendKind::Interp];
    if cfg!(feature = "gccjit") {
        b.push(BackendKind::Gccjit);
    }
    b
}

/// `sum_all` and `mean_all` of `n` copies of `value` (`range(n)·0 + value`).
fn sum_and_mean(n: usize, value: f64, prec: Prec, backend: BackendKind) -> (f64, f64) {
    let g = Graph::new();
    let x = &g.range(n).scale(0.0) + value;
    let (sum, mean) = (x.sum_all(), x.mean_all());
    let opts = SessionOptions { backend, prec, ..SessionOptions::default() };
    let mut s = Session::with_options(&g, opts).unwrap();
    let r = s.forward(&[&sum, &mean]).unwrap();
    s.run(&r).unwrap();
    (s.read(&sum).unwrap()[0], s.read(&mean).unwrap()[0])
}

#[test]
fn the_sum_of_a_million_tenths_is_a_hundred_thousand() {
    for backend in backends() {
        let (sum, mean) = sum_and_mean(1_000_000, 0.1, Prec::F32, backend);
        // The f32 nearest to 10⁶ × (0.1 in f32) = 100000.0015: 100000.0, as numpy and PyTorch.
        assert_eq!(sum, 100000.0, "{backend:?}");
        assert!((mean - 0.1).abs() <= 2.0 * 2f64.powi(-27), "{backend:?}: {mean}");
        let (sum, _) = sum_and_mean(1_000_000, 0.1, Prec::F64, backend);
        // f64 sums accumulate in order: within n·2⁻⁵³·Σ|x| (1.1·10⁻⁵ here) of the exact sum.
        assert!((sum - 100000.0).abs() <= 1e6 * 2f64.powi(-53) * 1e5, "{backend:?}: {sum}");
    }
}

#[test]
fn two_to_the_25_ones_sum_exactly() {
    for backend in backends() {
        // The interpreter in a debug build takes a shorter sum that still passes 2²⁴, where an
        // f32 accumulator stops growing.
        let n = if backend == BackendKind::Interp && cfg!(debug_assertions) {
            (1 << 24) + 64
        } else {
            1 << 25
        };
        for prec in [Prec::F32, Prec::Bf16, Prec::F16] {
            let (sum, mean) = sum_and_mean(n, 1.0, prec, backend);
            assert_eq!(sum, n as f64, "{backend:?} {prec:?}");
            assert_eq!(mean, 1.0, "{backend:?} {prec:?}");
        }
    }
}

#[test]
fn long_sums_give_the_interpreters_bits_on_gccjit() {
    if !cfg!(feature = "gccjit") {
        return;
    }
    // Terms of every magnitude and both signs, in rows of 700 to 5000.
    for n in [700usize, 1024, 1500, 5000] {
        let values: Vec<f64> = (0..3 * n)
            .map(|i| ((i * 7919 % 1013) as f64 - 506.0) * 1.37f64.powi((i % 23) as i32))
            .collect();
        let run = |backend| {
            let g = Graph::new();
            let x = g.ndarray("x", Axes::new().batch(&[3]).output(&[n]), &values);
            let rows = x.einsum("b|i => b|", []).named("rows");
            let cols = x.einsum("b|i => |i", []).named("cols");
            let all = x.mean_all();
            let opts = SessionOptions { backend, ..SessionOptions::default() };
            let mut s = Session::with_options(&g, opts).unwrap();
            let r = s.forward(&[&rows, &cols, &all]).unwrap();
            s.run(&r).unwrap();
            [s.read(&rows).unwrap(), s.read(&cols).unwrap(), s.read(&all).unwrap()]
        };
        assert_eq!(run(BackendKind::Interp), run(BackendKind::Gccjit), "rows of {n}");
    }
}

//! Measuring the functions against `f64` references, for the tests of every function file.

/// The error of `got` against the exact `want`, in units in the last place of `want` as an
/// `f32` (the subnormal spacing below the normal range). A `want` beyond `f32`'s range must be
/// met by the rounded overflow, `inf`, exactly.
pub(super) fn ulps(got: f32, want: f64) -> f64 {
    let want = if want.abs() > f32::MAX as f64 { want.signum() * f64::INFINITY } else { want };
    if got as f64 == want || (got.is_nan() && want.is_nan()) {
        return 0.0;
    }
    if !want.is_finite() || !got.is_finite() {
        // Overflow must agree exactly: inf against a finite value is a failure, as is nan
        // against a number.
        return f64::INFINITY;
    }
    // 2^(⌊log2 w⌋ - 23), from the exponent bits of `w` (a normal `f64`).
    let w = want.abs().max(f32::MIN_POSITIVE as f64);
    let exponent = (w.to_bits() >> 52) & 0x7ff;
    let spacing = f64::from_bits((exponent - 23) << 52);
    (got as f64 - want).abs() / spacing
}

/// The largest error over `inputs`, with the input where it happens.
pub(super) fn worst(
    f: fn(f32) -> f32,
    exact: fn(f64) -> f64,
    inputs: impl Iterator<Item = f32>,
) -> (f64, f32) {
    let mut worst = (0.0, 0.0);
    for x in inputs {
        let e = ulps(f(x), exact(x as f64));
        if e > worst.0 {
            worst = (e, x);
        }
    }
    worst
}

/// Every `f32` but the `nan`s, spaced by `step` bit patterns, both signs, ±inf included.
pub(super) fn every(step: u32) -> impl Iterator<Item = f32> {
    (0..=u32::MAX / step).map(move |i| f32::from_bits(i.wrapping_mul(step))).filter(|x| !x.is_nan())
}

/// A million bit patterns over the whole range (both signs, subnormals, ±0, ±inf), then a
/// million points evenly spread over `[lo, hi]`: where a function bends.
pub(super) fn sample(lo: f32, hi: f32) -> impl Iterator<Item = f32> {
    let specials = [0.0, -0.0, f32::INFINITY, f32::NEG_INFINITY, f32::MIN_POSITIVE, 1e-45, -1e-45];
    let dense = (0..1_000_000).map(move |i| lo + (hi - lo) * (i as f32 / 1_000_000.0));
    specials.into_iter().chain(every(4099)).chain(dense)
}

/// Asserts that `f` and `f64`'s `exact` agree within `bound` ulps on [`sample`] over
/// `[lo, hi]`, and that `nan` gives `nan`.
pub(super) fn assert_within(
    name: &str,
    f: fn(f32) -> f32,
    exact: fn(f64) -> f64,
    bound: f64,
    (lo, hi): (f32, f32),
) {
    let (e, x) = worst(f, exact, sample(lo, hi));
    assert!(e <= bound, "{name}: {e} ulps at {x:e} (bound {bound})");
    assert!(f(f32::NAN).is_nan(), "{name}(nan)");
}

/// Whether computing `f(x)` raised the processor's underflow flag: without flush-to-zero, an
/// x86 core finishes every vector instruction whose result underflows (is subnormal, or `0`
/// from nonzero factors) in a microcode assist, about ten times the instruction's cost. The
/// scalar evaluation performs the operations the vector code performs, so the flag tells.
#[cfg(target_arch = "x86_64")]
pub(super) fn underflows(f: fn(f32) -> f32, x: f32) -> bool {
    use std::arch::asm;
    use std::hint::black_box;
    const UNDERFLOW: u32 = 1 << 4;
    const EXCEPTION_FLAGS: u32 = 0x3f;
    let mut csr = 0u32;
    // SAFETY: reads and writes this thread's MXCSR, clearing only its sticky exception flags.
    // The assembly counts as a side effect: `f` runs between the two reads, since its input
    // and its result pass through `black_box` in between.
    unsafe {
        asm!("stmxcsr [{}]", in(reg) &mut csr, options(nostack));
        let cleared = csr & !EXCEPTION_FLAGS;
        asm!("ldmxcsr [{}]", in(reg) &cleared, options(nostack));
    }
    black_box(f(black_box(x)));
    let mut after = 0u32;
    // SAFETY: as above.
    unsafe { asm!("stmxcsr [{}]", in(reg) &mut after, options(nostack)) };
    after & UNDERFLOW != 0
}

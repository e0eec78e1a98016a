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

/// The scalar arithmetic, counting the `f32` products, quotients and fused multiply-adds whose
/// result underflows (is subnormal, or `0` from nonzero factors): each is a microcode assist on
/// x86 processors, about ten times the cost of the instruction.
#[derive(Default)]
pub(super) struct Underflows(pub usize);

impl Underflows {
    fn count(&mut self, factors_nonzero: bool, r: f32) -> f32 {
        let subnormal = r != 0.0 && r.abs() < f32::MIN_POSITIVE;
        if subnormal || (r == 0.0 && factors_nonzero) {
            self.0 += 1;
        }
        r
    }
}

impl super::Emit for Underflows {
    type F = f32;
    type U = u32;
    type D = f64;
    fn f(&mut self, c: f32) -> f32 {
        c
    }
    fn u(&mut self, c: u32) -> u32 {
        c
    }
    fn d(&mut self, c: f64) -> f64 {
        c
    }
    fn add(&mut self, a: f32, b: f32) -> f32 {
        a + b
    }
    fn sub(&mut self, a: f32, b: f32) -> f32 {
        a - b
    }
    fn mul(&mut self, a: f32, b: f32) -> f32 {
        self.count(a != 0.0 && b != 0.0, a * b)
    }
    fn div(&mut self, a: f32, b: f32) -> f32 {
        self.count(a != 0.0 && b.is_finite(), a / b)
    }
    fn fma(&mut self, a: f32, b: f32, c: f32) -> f32 {
        self.count(a != 0.0 && b != 0.0, a.mul_add(b, c))
    }
    fn lt_select(&mut self, a: f32, b: f32, x: f32, y: f32) -> f32 {
        if a < b { x } else { y }
    }
    fn to_bits(&mut self, a: f32) -> u32 {
        a.to_bits()
    }
    fn bits_to_f32(&mut self, a: u32) -> f32 {
        f32::from_bits(a)
    }
    fn uadd(&mut self, a: u32, b: u32) -> u32 {
        a.wrapping_add(b)
    }
    fn usub(&mut self, a: u32, b: u32) -> u32 {
        a.wrapping_sub(b)
    }
    fn and(&mut self, a: u32, b: u32) -> u32 {
        a & b
    }
    fn or(&mut self, a: u32, b: u32) -> u32 {
        a | b
    }
    fn shl(&mut self, a: u32, s: u32) -> u32 {
        a << s
    }
    fn sar(&mut self, a: u32, s: u32) -> u32 {
        ((a as i32) >> s) as u32
    }
    fn widen(&mut self, a: f32) -> f64 {
        a as f64
    }
    fn narrow(&mut self, a: f64) -> f32 {
        self.count(a != 0.0, a as f32)
    }
    fn dadd(&mut self, a: f64, b: f64) -> f64 {
        a + b
    }
    fn dsub(&mut self, a: f64, b: f64) -> f64 {
        a - b
    }
    fn dmul(&mut self, a: f64, b: f64) -> f64 {
        a * b
    }
    fn ddiv(&mut self, a: f64, b: f64) -> f64 {
        a / b
    }
    fn dfma(&mut self, a: f64, b: f64, c: f64) -> f64 {
        a.mul_add(b, c)
    }
    fn dlt_select(&mut self, a: f64, b: f64, x: f64, y: f64) -> f64 {
        if a < b { x } else { y }
    }
    fn keep(&mut self, a: f32) -> f32 {
        a
    }
    fn keep_u(&mut self, a: u32) -> u32 {
        a
    }
    fn keep_d(&mut self, a: f64) -> f64 {
        a
    }
}

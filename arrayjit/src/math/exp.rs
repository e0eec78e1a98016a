//! `exp`, `exp2` and `tanh`: a reduction to `|r| ≤ 1/2` (in units of the base's logarithm),
//! a polynomial, and an exact scaling by a power of two.
//!
//! Special values follow C: `exp` overflows to `+inf` above 88.72 and underflows through
//! subnormals to `+0` below -103.97, `exp2` likewise above 128 and below -150; both give `nan`
//! for `nan`. `tanh` is odd (`tanh(-0) = -0`), saturates to ±1, and gives `nan` for `nan`.

use super::{Emit, ROUNDER, horner, pow2_factors, rounded_int, split_sign, with_sign};

/// The largest error of [`exp_f32`] in units in the last place, over every `f32` input
/// (0.901, at -59.26; below the normal range, in units of the subnormal spacing).
pub const EXP_MAX_ULPS: f64 = 0.91;
/// The largest error of [`exp2_f32`] in units in the last place, over every `f32` input
/// (0.910, at -126.4997; below the normal range, in units of the subnormal spacing).
pub const EXP2_MAX_ULPS: f64 = 0.92;
/// The largest error of [`tanh_f32`] in units in the last place, over every `f32` input
/// (1.027, at 0.9755).
pub const TANH_MAX_ULPS: f64 = 1.03;

const LOG2_E: f32 = std::f32::consts::LOG2_E;
/// `ln 2` split so that `n · LN2_HI` is exact for every `n` the reduction produces.
const LN2_HI: f32 = 0.693_359_4;
const LN2_LO: f32 = -2.121_944_4e-4;
/// `(eʳ - 1 - r) / r²` on `|r| ≤ ln2 / 2`, a least-squares fit on Chebyshev nodes (degree 4;
/// 0.06 ulp before rounding), highest degree first.
pub(super) const EXP_POLY: [f32; 5] =
    [0.001_375_066_3, 0.008_369_121, 0.041_669_566, 0.166_665_17, 0.499_999_88];
/// `(2ʳ - 1) / r` on `|r| ≤ 1/2`, a near-minimax fit (degree 5; 7.5e-9 absolute before
/// rounding, 0.03 ulp of `2ʳ`), highest degree first.
const EXP2_POLY: [f32; 6] = [
    0.000_154_697_3,
    0.001_339_086_7,
    0.009_618_031,
    0.055_503_57,
    0.240_226_5,
    // The fit's value is ln 2 rounded to `f32`.
    std::f32::consts::LN_2,
];
/// Below this magnitude `tanh` is the odd polynomial, above it `1 - 2 / (e^{2a} + 1)`.
const TANH_SPLIT: f32 = 0.9;
/// `(tanh a - a) / a³` as a polynomial in `a²` on `[0, 0.9]`, fitted as [`EXP_POLY`] (0.15 ulp
/// before rounding), highest degree first.
pub(super) const TANH_POLY: [f32; 7] = [
    -0.000_452_485,
    0.002_574_164_2,
    -0.008_254_99,
    0.021_658_221,
    -0.053_927_787,
    0.133_329_59,
    -0.333_333_22,
];

/// `x` capped at `hi`; `nan` passes (the comparison is false).
#[inline(always)]
fn cap<E: Emit>(e: &mut E, x: E::F, hi: f32) -> E::F {
    let x = e.keep(x);
    let hi = e.f(hi);
    let x = e.lt_select(hi.clone(), x.clone(), hi, x);
    e.keep(x)
}

/// Below this input `exp` is `+0` (`e^-104` is under half the smallest subnormal).
const EXP_ZERO_BELOW: f32 = -104.0;
/// Below this input `exp2` is `+0`.
const EXP2_ZERO_BELOW: f32 = -151.0;

/// For an input `x` whose result is `+0` below `lo`: `x` kept, and the input to compute from
/// (`0` in place of anything below `lo`, `x` elsewhere, `nan` kept); [`zero_below`] puts the
/// `+0` back into the computed result.
///
/// Computing such a lane from `lo` itself would give the same `+0`, but through products that
/// underflow, and an x86 processor (without flush-to-zero, which would change the bits of the
/// subnormal results) finishes every vector instruction whose result underflows in a microcode
/// assist about ten times slower than the instruction. A causal mask's `-inf` scores made half
/// of a softmax's exponentials take that path. Computing them from `0` instead and selecting
/// the `+0` afterwards gives the same bits without any underflow.
#[inline(always)]
fn safe_input<E: Emit>(e: &mut E, x: E::F, lo: f32) -> (E::F, E::F) {
    let x = e.keep(x);
    let lo = e.f(lo);
    let zero = e.f(0.0);
    let safe = e.lt_select(x.clone(), lo, zero, x.clone());
    (x, safe)
}

/// `+0` where the input `x` is below `lo`, else the computed `y`.
#[inline(always)]
fn zero_below<E: Emit>(e: &mut E, x: E::F, lo: f32, y: E::F) -> E::F {
    let lo = e.f(lo);
    let zero = e.f(0.0);
    e.lt_select(x, lo, zero, y)
}

/// `p · 2ⁿ` with `n` rounded into `t = n + ROUNDER`, in two exact power-of-two steps (so that
/// results in the subnormal range are rounded once, correctly).
#[inline(always)]
fn scale<E: Emit>(e: &mut E, p: E::F, t: E::F) -> E::F {
    let n = rounded_int(e, t);
    let (s1, s2) = pow2_factors(e, n);
    let p = e.mul(p, s1);
    e.mul(p, s2)
}

/// `eˣ`: `x = n·ln2 + r` with `n` an integer and `|r| ≤ ln2/2`, `eʳ` by a polynomial, then
/// scaled by `2ⁿ`.
#[inline(always)]
pub fn exp<E: Emit>(e: &mut E, x: E::F) -> E::F {
    let (input, x) = safe_input(e, x, EXP_ZERO_BELOW);
    // Cap at where the result is certainly infinite.
    let x = cap(e, x, 89.0);
    // n = round(x / ln2), as an integer in the low bits of `t` and as a float.
    let log2e = e.f(LOG2_E);
    let rounder = e.f(ROUNDER);
    let t = e.fma(x.clone(), log2e, rounder);
    let t = e.keep(t);
    let rounder = e.f(ROUNDER);
    let n_float = e.sub(t.clone(), rounder);
    let n_float = e.keep(n_float);
    let minus_hi = e.f(-LN2_HI);
    let r = e.fma(n_float.clone(), minus_hi, x);
    let minus_lo = e.f(-LN2_LO);
    let r = e.fma(n_float, minus_lo, r);
    let r = e.keep(r);
    // eʳ = 1 + r·(1 + r·P(r)).
    let p = horner(e, &r, &EXP_POLY);
    let one = e.f(1.0);
    let p = e.fma(p, r.clone(), one);
    let one = e.f(1.0);
    let p = e.fma(p, r, one);
    let y = scale(e, p, t);
    zero_below(e, input, EXP_ZERO_BELOW, y)
}

/// `2ˣ`: `x = n + r` with `n = round(x)` and `r` exact, `2ʳ = 1 + r·P(r)`, then scaled by
/// `2ⁿ`.
pub fn exp2<E: Emit>(e: &mut E, x: E::F) -> E::F {
    // Below -151 the result rounds to +0, above 129 to +inf.
    let (input, x) = safe_input(e, x, EXP2_ZERO_BELOW);
    let x = cap(e, x, 129.0);
    let rounder = e.f(ROUNDER);
    let t = e.add(x.clone(), rounder);
    let t = e.keep(t);
    let rounder = e.f(ROUNDER);
    let n_float = e.sub(t.clone(), rounder);
    // Exact: `x` and its nearest integer are within a factor two of each other (or `n = 0`).
    let r = e.sub(x, n_float);
    let r = e.keep(r);
    let p = horner(e, &r, &EXP2_POLY);
    let one = e.f(1.0);
    let p = e.fma(p, r, one);
    let y = scale(e, p, t);
    zero_below(e, input, EXP2_ZERO_BELOW, y)
}

/// `tanh x`: for `|x| < 0.9` the odd polynomial `a + a³·P(a²)`, else `1 - 2 / (e^{2a} + 1)`,
/// with the sign of `x` put back.
pub fn tanh<E: Emit>(e: &mut E, x: E::F) -> E::F {
    let (a, sign) = split_sign(e, x);
    // Large: 1 - 2 / (e^{2a} + 1); e^{2a} = inf gives exactly 1.
    let two_a = e.add(a.clone(), a.clone());
    let ex = exp(e, two_a);
    let one = e.f(1.0);
    let den = e.add(ex, one);
    let two = e.f(2.0);
    let q = e.div(two, den);
    let one = e.f(1.0);
    let large = e.sub(one, q);
    // Small: a + a³·P(a²).
    let a2 = e.mul(a.clone(), a.clone());
    let a2 = e.keep(a2);
    let p = horner(e, &a2, &TANH_POLY);
    let a3 = e.mul(a.clone(), a2);
    let small = e.fma(a3, p, a.clone());
    let split = e.f(TANH_SPLIT);
    let result = e.lt_select(a, split, small, large);
    // Sign back: `nan` stays `nan`, -0 stays -0.
    with_sign(e, result, sign)
}

/// `eˣ` in `f32`, as every backend computes it.
///
/// ```
/// use rocannl_arrayjit::math::exp_f32;
/// assert_eq!(exp_f32(0.0), 1.0);
/// assert!((exp_f32(1.0) - std::f32::consts::E).abs() <= f32::EPSILON * 3.0);
/// assert_eq!(exp_f32(100.0), f32::INFINITY);
/// assert_eq!(exp_f32(-200.0), 0.0);
/// ```
#[inline(always)]
pub fn exp_f32(x: f32) -> f32 {
    exp(&mut super::Scalar, x)
}

/// `2ˣ` in `f32`, as every backend computes it.
///
/// ```
/// use rocannl_arrayjit::math::exp2_f32;
/// assert_eq!(exp2_f32(10.0), 1024.0);
/// assert_eq!(exp2_f32(-149.0), 1e-45);
/// assert_eq!(exp2_f32(128.0), f32::INFINITY);
/// ```
#[inline]
pub fn exp2_f32(x: f32) -> f32 {
    exp2(&mut super::Scalar, x)
}

/// `tanh x` in `f32`, as every backend computes it.
///
/// ```
/// use rocannl_arrayjit::math::tanh_f32;
/// assert_eq!(tanh_f32(0.0), 0.0);
/// assert!(tanh_f32(-0.0).is_sign_negative());
/// assert_eq!(tanh_f32(20.0), 1.0);
/// assert!((tanh_f32(0.5) - 0.5f64.tanh() as f32).abs() <= f32::EPSILON);
/// ```
#[inline]
pub fn tanh_f32(x: f32) -> f32 {
    tanh(&mut super::Scalar, x)
}

#[cfg(test)]
mod tests {
    use super::super::check::{assert_within, every, worst};
    use super::*;

    #[test]
    fn a_million_inputs_are_within_the_stated_accuracy() {
        assert_within("exp", exp_f32, f64::exp, EXP_MAX_ULPS, (-20.0, 20.0));
        assert_within("exp2", exp2_f32, f64::exp2, EXP2_MAX_ULPS, (-30.0, 30.0));
        assert_within("tanh", tanh_f32, f64::tanh, TANH_MAX_ULPS, (-20.0, 20.0));
    }

    #[test]
    #[ignore = "every f32 input: minutes in release"]
    fn exhaustive_accuracy() {
        let (e, x) = worst(exp_f32, f64::exp, every(1));
        let (e2, x2) = worst(exp2_f32, f64::exp2, every(1));
        let (t, y) = worst(tanh_f32, f64::tanh, every(1));
        eprintln!("exp: {e} ulps at {x:e}; exp2: {e2} ulps at {x2:e}; tanh: {t} ulps at {y:e}");
        assert!(e <= EXP_MAX_ULPS && e2 <= EXP2_MAX_ULPS && t <= TANH_MAX_ULPS);
    }

    #[test]
    #[cfg(target_arch = "x86_64")]
    fn inputs_whose_result_is_zero_compute_nothing_that_underflows() {
        use super::super::check::underflows;
        // The old clamp to these bounds computed the same `+0` for every input below them.
        assert_eq!(exp_f32(EXP_ZERO_BELOW).to_bits(), 0);
        assert_eq!(exp2_f32(EXP2_ZERO_BELOW).to_bits(), 0);
        let huge = [f32::NEG_INFINITY, f32::MIN, -1e30, -1000.0];
        for x in huge.into_iter().chain([-151.5, -104.5]) {
            assert_eq!(exp_f32(x).to_bits(), 0, "exp({x})");
            assert!(!underflows(exp_f32, x), "exp({x}) computed a product that underflows");
        }
        for x in huge.into_iter().chain([-151.5]) {
            assert_eq!(exp2_f32(x).to_bits(), 0, "exp2({x})");
            assert!(!underflows(exp2_f32, x), "exp2({x}) computed a product that underflows");
        }
        // A subnormal result still rounds once through its product, which the flag sees.
        assert_eq!(exp_f32(-100.0), (-100f64).exp() as f32);
        assert!(underflows(exp_f32, -100.0));
        assert!(!underflows(exp_f32, -1.0));
    }

    #[test]
    fn special_values_follow_c() {
        assert_eq!(exp_f32(0.0).to_bits(), 1f32.to_bits());
        assert_eq!(exp_f32(-0.0).to_bits(), 1f32.to_bits());
        assert_eq!(exp_f32(f32::INFINITY), f32::INFINITY);
        assert_eq!(exp_f32(f32::NEG_INFINITY).to_bits(), 0);
        assert!(exp_f32(f32::NAN).is_nan());
        assert_eq!(exp_f32(88.72), (88.72f32 as f64).exp() as f32);
        assert_eq!(exp_f32(88.73), f32::INFINITY);
        assert_eq!(exp_f32(-103.0), (-103f64).exp() as f32, "a subnormal result rounds once");
        assert_eq!(exp_f32(-104.0), 0.0);
        for (x, want) in
            [(0.0f32, 1.0f32), (-0.0, 1.0), (1.0, 2.0), (-1.0, 0.5), (127.0, 2f32.powi(127))]
        {
            assert_eq!(exp2_f32(x), want, "exp2({x})");
        }
        assert_eq!(exp2_f32(-149.0), f32::from_bits(1));
        assert_eq!(exp2_f32(-149.5), (-149.5f64).exp2() as f32, "a subnormal result rounds once");
        assert_eq!(exp2_f32(-150.0), 0.0, "the tie rounds to even");
        assert_eq!(exp2_f32(128.0), f32::INFINITY);
        assert_eq!(exp2_f32(f32::INFINITY), f32::INFINITY);
        assert_eq!(exp2_f32(f32::NEG_INFINITY).to_bits(), 0);
        assert!(exp2_f32(f32::NAN).is_nan());
        assert_eq!(tanh_f32(0.0).to_bits(), 0);
        assert_eq!(tanh_f32(-0.0).to_bits(), (-0f32).to_bits());
        assert_eq!(tanh_f32(f32::INFINITY), 1.0);
        assert_eq!(tanh_f32(f32::NEG_INFINITY), -1.0);
        assert_eq!(tanh_f32(1e-40), 1e-40, "subnormals pass through");
        assert!(tanh_f32(f32::NAN).is_nan());
        for x in [0.1f32, 0.5, 0.9, 1.0, 3.0, 9.5] {
            assert_eq!(tanh_f32(-x).to_bits(), (-tanh_f32(x)).to_bits(), "odd at {x}");
        }
    }
}

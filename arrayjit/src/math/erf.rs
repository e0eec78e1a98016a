//! `erf`, the error function, for exact GELU (`x·(1 + erf(x/√2))/2`).
//!
//! `erf` is odd; on `a = |x|`:
//! - below 1, `erf(a) = a + a·P(a²)`, `P` a polynomial (`erf(a)/a → 2/√π`);
//! - from 1 on, `erf(a) = 1 - e^(-a²)·R(1/a)`, where `R(1/a) = erfc(a)·e^(a²)` varies slowly
//!   (like `1/(a√π)`) and is a polynomial in `1/a - 5/8`; `a²` is split exactly into `hi + lo`
//!   (`lo` by a fused multiply-add) and `e^(-a²) = e^(-hi)·(1 - lo)`, because the rounding of
//!   `a²` alone would cost up to 2.5 ulps. From 4 on the result rounds to 1, so `a` is clamped
//!   there and `inf` gives exactly 1.
//!
//! Both branches are computed and one is selected, so the sequence has no branch. Special
//! values follow C: `erf(±0) = ±0`, `erf(±inf) = ±1`, `erf(nan) = nan`; subnormals give their
//! correctly rounded `2/√π · x`.

use super::{Emit, horner, split_sign, with_sign};

/// The largest error of [`erf_f32`] in units in the last place, over every `f32` input
/// (1.214, at 0.9988955, just below the switch to the second form, where the polynomial's
/// rounding errors add up most).
pub const ERF_MAX_ULPS: f64 = 1.22;

/// `erf(a)/a - 1` as a polynomial in `a²` on `[0, 1]`, a near-minimax fit (degree 6; 1.2e-9
/// absolute), highest degree first.
const ERF_SMALL: [f32; 7] = [
    7.889_119e-5,
    -0.000_802_084_1,
    0.005_189_535,
    -0.026_854_444,
    0.112_836,
    -0.376_126_26,
    0.128_379_17,
];
/// `erfc(a)·e^(a²)` as a polynomial in `u = 1/a - 5/8` on `a ∈ [1, 4]`, a near-minimax fit in
/// relative error (degree 9; 1.5e-8), highest degree first.
const ERF_LARGE: [f32; 10] = [
    0.030_712_852,
    -0.006_946_697_4,
    -0.028_408_168,
    0.044_619_95,
    -0.046_786_06,
    0.023_261_98,
    0.043_760_803,
    -0.172_393_6,
    0.382_283_84,
    0.305_953,
];
/// The centre of `1/a` on `[1, 4]`.
const ERF_CENTRE: f32 = 0.625;

/// `1 - erfc(a)` for `a ≥ 1` (`a` clamped to `[1, 4]`; `nan` passes).
fn large<E: Emit>(e: &mut E, a: E::F) -> E::F {
    let four = e.f(4.0);
    let a = e.lt_select(four.clone(), a.clone(), four, a);
    let a = e.keep(a);
    let one = e.f(1.0);
    let a = e.lt_select(a.clone(), one.clone(), one, a);
    let a = e.keep(a);
    // a² = hi + lo exactly; e^(-a²) = e^(-hi)·(1 - lo).
    let hi = e.mul(a.clone(), a.clone());
    let hi = e.keep(hi);
    let zero = e.f(0.0);
    let minus_a = e.sub(zero.clone(), a.clone());
    let minus_lo = e.fma(minus_a, a.clone(), hi.clone());
    let minus_hi = e.sub(zero, hi);
    let ex = super::exp(e, minus_hi);
    // R(1/a).
    let one = e.f(1.0);
    let t = e.div(one, a);
    let centre = e.f(ERF_CENTRE);
    let u = e.sub(t, centre);
    let u = e.keep(u);
    let r = horner(e, &u, &ERF_LARGE);
    let q = e.mul(ex, r);
    let q = e.keep(q);
    let erfc = e.fma(q.clone(), minus_lo, q);
    let one = e.f(1.0);
    e.sub(one, erfc)
}

/// `erf x`: the odd polynomial below 1, `1 - e^(-a²)·R(1/a)` above, the sign of `x` put back.
pub fn erf<E: Emit>(e: &mut E, x: E::F) -> E::F {
    let (a, sign) = split_sign(e, x);
    let large = large(e, a.clone());
    let a2 = e.mul(a.clone(), a.clone());
    let a2 = e.keep(a2);
    let p = horner(e, &a2, &ERF_SMALL);
    let small = e.fma(a.clone(), p, a.clone());
    let one = e.f(1.0);
    let result = e.lt_select(a, one, small, large);
    with_sign(e, result, sign)
}

/// `erf x` in `f32`, as every backend computes it.
///
/// ```
/// use rocannl_arrayjit::math::erf_f32;
/// assert_eq!(erf_f32(0.0), 0.0);
/// assert!(erf_f32(-0.0).is_sign_negative());
/// assert_eq!(erf_f32(5.0), 1.0);
/// assert!((erf_f32(0.5) - 0.520_499_9).abs() <= f32::EPSILON);
/// ```
#[inline]
pub fn erf_f32(x: f32) -> f32 {
    erf(&mut super::Scalar, x)
}

#[cfg(test)]
mod tests {
    use super::super::check::{assert_within, every, worst};
    use super::*;

    #[test]
    fn a_million_inputs_are_within_the_stated_accuracy() {
        assert_within("erf", erf_f32, libm::erf, ERF_MAX_ULPS, (-5.0, 5.0));
    }

    #[test]
    #[ignore = "every f32 input: minutes in release"]
    fn exhaustive_accuracy() {
        let (e, x) = worst(erf_f32, libm::erf, every(1));
        eprintln!("erf: {e} ulps at {x:e}");
        assert!(e <= ERF_MAX_ULPS);
    }

    #[test]
    fn special_values_follow_c() {
        assert_eq!(erf_f32(0.0).to_bits(), 0);
        assert_eq!(erf_f32(-0.0).to_bits(), (-0f32).to_bits());
        assert_eq!(erf_f32(f32::INFINITY), 1.0);
        assert_eq!(erf_f32(f32::NEG_INFINITY), -1.0);
        assert_eq!(erf_f32(3.95), 1.0, "rounds to 1 before the clamp at 4");
        assert!(erf_f32(f32::NAN).is_nan());
        let tiny = f32::from_bits(7);
        assert_eq!(erf_f32(tiny), (tiny as f64 * 2.0 / std::f64::consts::PI.sqrt()) as f32);
        for x in [0.1f32, 0.5, 0.99, 1.0, 1.01, 2.0, 3.5] {
            assert_eq!(erf_f32(-x).to_bits(), (-erf_f32(x)).to_bits(), "odd at {x}");
        }
    }
}

//! `log` and `log2`: `x = 2ᵏ·m` with `m` in `[√2/2, √2)` read from the bits, then
//! `log(m) = log1p(f)` for `f = m - 1` (exact) through `s = f / (2 + f)`:
//! `log1p(f) = 2·atanh(s) = f - s·(f - 2·T(s²))`, with `T(z) = atanh(√z)/√z - 1` a short
//! polynomial (`z ≤ 0.0295`). The correction `s·(f - 2T)` is small against `f`, so its
//! rounding errors hardly show; `k·ln2 + f` (or `k + f·log2 e`) is added with its exact
//! rounding error carried along, so the result is rounded about once.
//!
//! Special values follow C: `log(±0) = -inf`, `log(x < 0) = nan`, `log(+inf) = +inf`,
//! `log(nan) = nan`, `log(1) = +0`; subnormal inputs are scaled by 2²³ first.

use super::{Emit, INF_BITS, NAN_BITS, fbits, horner, int_to_f32};

/// The largest error of [`log_f32`] in units in the last place, over every `f32` input
/// (0.954, at 0.7065256, where `k = -1` and the result is `-0.35`: the sum of `-ln 2` and
/// `log1p(f)` cancels a bit).
pub const LOG_MAX_ULPS: f64 = 0.96;
/// The largest error of [`log2_f32`] in units in the last place, over every `f32` input
/// (1.198, at 1.4102844, near the top of the reduced range, where `f·log2 e` is largest).
pub const LOG2_MAX_ULPS: f64 = 1.2;

/// The bits of `√2/2` rounded to `f32`: significands from there up to twice it are `m`.
const SQRT_HALF_BITS: u32 = 0x3f35_04f3;
/// `ln 2 = LN2_HI + LN2_LO`, `LN2_HI` with 9 significant bits so that `k · LN2_HI` is exact.
const LN2_HI: f32 = 0.693_359_4;
const LN2_LO: f32 = -2.121_944_4e-4;
/// `log2 e = L2E + L2E_LO`.
const L2E: f32 = std::f32::consts::LOG2_E;
const L2E_LO: f32 = 1.925_963e-8;
/// `T(z) / z = 1/3 + z/5 + …` on `[0, 0.0295]`, a near-minimax fit (degree 2; `T` within
/// 2.7e-9), highest degree first.
pub(super) const LOG_POLY: [f32; 3] = [0.147_915_44, 0.199_943_48, 0.333_333_43];

/// `x = 2ᵏ·(1 + f)` for a positive finite `x` (subnormals included): `k` as an `f32` and the
/// exact `f` in `[√2/2 - 1, √2 - 1)`. Other inputs give some finite `k` and `f`.
pub(super) fn reduce<E: Emit>(e: &mut E, x: E::F) -> (E::F, E::F) {
    let x = e.keep(x);
    // Subnormals: scaled by 2²³, with 23 taken off the exponent.
    let tiny = e.f(f32::MIN_POSITIVE);
    let two23 = e.f(8_388_608.0);
    let scaled = e.mul(x.clone(), two23);
    let xs = e.lt_select(x.clone(), tiny.clone(), scaled, x.clone());
    let minus23 = e.f(-23.0);
    let zero = e.f(0.0);
    let adjust = e.lt_select(x, tiny, minus23, zero);
    // The exponent relative to √2/2's, and the significand moved into [√2/2, √2).
    let bits = e.to_bits(xs);
    let offset = e.u(SQRT_HALF_BITS);
    let ix = e.usub(bits, offset.clone());
    let ix = e.keep_u(ix);
    let k = e.sar(ix.clone(), 23);
    let k = int_to_f32(e, k);
    let k = e.add(k, adjust);
    let k = e.keep(k);
    let mask = e.u(0x007f_ffff);
    let m_bits = e.and(ix, mask);
    let m_bits = e.uadd(m_bits, offset);
    let m = e.bits_to_f32(m_bits);
    let one = e.f(1.0);
    let f = e.sub(m, one);
    (k, e.keep(f))
}

/// `log1p(f) = f - c`: the correction `c = s·(f - 2·T(s²))` with `s = f / (2 + f)`.
fn correction<E: Emit>(e: &mut E, f: &E::F) -> E::F {
    let two = e.f(2.0);
    let den = e.add(two, f.clone());
    let s = e.div(f.clone(), den);
    let s = e.keep(s);
    let z = e.mul(s.clone(), s.clone());
    let z = e.keep(z);
    let u = horner(e, &z, &LOG_POLY);
    let t = e.mul(z, u);
    let minus_two = e.f(-2.0);
    let g = e.fma(t, minus_two, f.clone());
    e.mul(s, g)
}

/// The C special values on top of `r`, computed for positive finite `x`.
fn specials<E: Emit>(e: &mut E, x: E::F, r: E::F) -> E::F {
    let zero = e.f(0.0);
    let neg_inf = fbits(e, INF_BITS | super::SIGN);
    // x ≤ 0 (and nan, for now): -inf.
    let r = e.lt_select(zero.clone(), x.clone(), r, neg_inf);
    // x < 0: nan.
    let nan = fbits(e, NAN_BITS);
    let r = e.lt_select(x.clone(), zero, nan, r);
    // x = +inf: +inf; x = nan: nan.
    let inf = fbits(e, INF_BITS);
    e.lt_select(x.clone(), inf, r, x)
}

/// `ln x`: `k·ln2 + f - c`, with `k·LN2_HI + f` summed exactly into a rounded sum and its
/// error (`|k·LN2_HI| ≥ |f|` whenever `k ≠ 0`).
pub fn log<E: Emit>(e: &mut E, x: E::F) -> E::F {
    let x = e.keep(x);
    let (k, f) = reduce(e, x.clone());
    let c = correction(e, &f);
    let ln2_hi = e.f(LN2_HI);
    let khi = e.mul(k.clone(), ln2_hi);
    let khi = e.keep(khi);
    let s1 = e.add(khi.clone(), f.clone());
    let s1 = e.keep(s1);
    let back = e.sub(s1.clone(), khi);
    let err = e.sub(f, back);
    let low = e.sub(err, c);
    let ln2_lo = e.f(LN2_LO);
    let low = e.fma(k, ln2_lo, low);
    let r = e.add(s1, low);
    specials(e, x, r)
}

/// `log2 x`: `k + (f - c)·log2 e`, with `f·L2E` split exactly into a product and its error,
/// and `k` plus the product summed exactly into a rounded sum and its error.
pub fn log2<E: Emit>(e: &mut E, x: E::F) -> E::F {
    let x = e.keep(x);
    let (k, f) = reduce(e, x.clone());
    let c = correction(e, &f);
    let l2e = e.f(L2E);
    let hi = e.mul(f.clone(), l2e.clone());
    let hi = e.keep(hi);
    let minus_hi = e.f(-1.0);
    let minus_hi = e.mul(hi.clone(), minus_hi);
    let prod_err = e.fma(f.clone(), l2e, minus_hi);
    let s1 = e.add(k.clone(), hi.clone());
    let s1 = e.keep(s1);
    let back = e.sub(s1.clone(), k);
    let sum_err = e.sub(hi, back);
    let minus_l2e = e.f(-L2E);
    let tail = e.mul(c, minus_l2e);
    let l2e_lo = e.f(L2E_LO);
    let tail = e.fma(f, l2e_lo, tail);
    let low = e.add(sum_err, prod_err);
    let low = e.add(low, tail);
    let r = e.add(s1, low);
    specials(e, x, r)
}

/// `ln x` in `f32`, as every backend computes it.
///
/// ```
/// use rocannl_arrayjit::math::log_f32;
/// assert_eq!(log_f32(1.0), 0.0);
/// assert_eq!(log_f32(0.0), f32::NEG_INFINITY);
/// assert!(log_f32(-1.0).is_nan());
/// assert!((log_f32(10.0) - 10f32.ln()).abs() <= f32::EPSILON * 3.0);
/// ```
#[inline]
pub fn log_f32(x: f32) -> f32 {
    log(&mut super::Scalar, x)
}

/// `log2 x` in `f32`, as every backend computes it.
///
/// ```
/// use rocannl_arrayjit::math::log2_f32;
/// assert_eq!(log2_f32(1024.0), 10.0);
/// assert_eq!(log2_f32(1e-45), -149.0);
/// assert_eq!(log2_f32(f32::INFINITY), f32::INFINITY);
/// ```
#[inline]
pub fn log2_f32(x: f32) -> f32 {
    log2(&mut super::Scalar, x)
}

#[cfg(test)]
mod tests {
    use super::super::check::{assert_within, every, worst};
    use super::*;

    #[test]
    fn a_million_inputs_are_within_the_stated_accuracy() {
        assert_within("log", log_f32, f64::ln, LOG_MAX_ULPS, (0.0, 4.0));
        assert_within("log2", log2_f32, f64::log2, LOG2_MAX_ULPS, (0.0, 4.0));
    }

    #[test]
    #[ignore = "every f32 input: minutes in release"]
    fn exhaustive_accuracy() {
        let (l, x) = worst(log_f32, f64::ln, every(1));
        let (l2, y) = worst(log2_f32, f64::log2, every(1));
        eprintln!("log: {l} ulps at {x:e}; log2: {l2} ulps at {y:e}");
        assert!(l <= LOG_MAX_ULPS && l2 <= LOG2_MAX_ULPS);
    }

    #[test]
    fn special_values_follow_c() {
        for f in [log_f32, log2_f32] {
            assert_eq!(f(1.0).to_bits(), 0, "+0 at 1");
            assert_eq!(f(0.0), f32::NEG_INFINITY);
            assert_eq!(f(-0.0), f32::NEG_INFINITY);
            assert_eq!(f(f32::INFINITY), f32::INFINITY);
            assert!(f(f32::NEG_INFINITY).is_nan());
            assert!(f(-1e-45).is_nan());
            assert!(f(-2.0).is_nan());
            assert!(f(f32::NAN).is_nan());
        }
        for k in -149..128 {
            assert_eq!(log2_f32((k as f64).exp2() as f32), k as f32, "powers of two are exact");
        }
    }
}

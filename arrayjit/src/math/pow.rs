//! `pow(x, y) = 2^(y·log2|x|)`, then C99's signs and special cases.
//!
//! `y·log2|x|` reaches ±150 before the result leaves `f32`'s range, and an absolute error `δ`
//! in it is a relative error `δ·ln2` in the result: `f32` arithmetic would cost hundreds of
//! ulps. So the logarithm and the power of two are computed in `f64` arithmetic (which still
//! vectorizes, at half the lanes): `|x| = 2ᵏ·(1 + f)` is reduced in `f32` as for [`super::log`]
//! (exactly), `log1p(f) = 2s·(1 + T(s²))` with `s = f/(2 + f)` in `f64`, and `2ᵗ = 2ⁿ·2ʳ` with
//! a polynomial for `2ʳ`, `|r| ≤ 1/2`; `2ⁿ` is applied as two `f32` powers of two widened to
//! `f64`, so the single rounding is the final narrowing to `f32` (subnormal results included).
//! (On a GPU with slow `f64` arithmetic this `pow` costs more than the other functions.)
//!
//! Then C99 (`powf`): a negative `x` with an odd integer `y` gives the negated power; a finite
//! negative `x` with a finite non-integer `y` gives `nan`; `pow(x, ±0) = 1` and
//! `pow(1, y) = 1` for any `x`, `y` (even `nan`); `pow(-1, ±inf) = 1`. The rest follows from
//! the arithmetic of infinities: `log2(+0) = -inf` (so `pow(±0, y < 0) = +inf`, `-inf` for odd
//! `y`), `log2(inf) = inf`, `|x| < 1` with `y = +inf` gives `+0`, and so on.

use super::{
    Emit, INF_BITS, MAGNITUDE, NAN_BITS, ROUNDER, SIGN, fbits, horner_d, log, pow2_factors,
    rounded_int,
};

/// The largest error of [`pow_f32`] in units in the last place over the samples of the tests
/// (two arguments: no exhaustive check): 0.50005 over two hundred million pairs, at
/// `(0.7197059, -127.6891)` — `f64` carries the logarithm, so about the final rounding alone.
pub const POW_MAX_ULPS: f64 = 0.501;

/// `T(z)/z` of [`super::log`] to `f64` precision: degree 4, `T` within 1.1e-13.
const LOG_POLY_D: [f64; 5] = [
    0.096_827_349_116_093_68,
    0.110_956_220_312_507_03,
    0.142_858_786_267_953,
    0.199_999_993_911_609_22,
    0.333_333_333_336_939_9,
];
/// `(2ʳ - 1)/r` on `|r| ≤ 0.502`, a near-minimax fit (degree 7; 3.2e-12), highest degree
/// first.
const EXP2_POLY_D: [f64; 8] = [
    1.325_999_857_967_509_5e-6,
    1.530_411_142_143_785e-5,
    1.540_343_500_454_610_6e-4,
    1.333_347_718_411_965_5e-3,
    9.618_129_185_415_897e-3,
    5.550_410_907_298_003_5e-2,
    2.402_265_069_573_185_4e-1,
    6.931_471_805_567_299e-1,
];
/// `1.5 · 2⁵²`: adding it rounds an `f64` of magnitude below 2⁵¹ to an integer.
const ROUNDER_D: f64 = 6_755_399_441_055_744.0;

/// `log2 a` in `f64` for `a ≥ 0` (`-inf` at 0, `+inf` at `+inf`, `nan` for `nan`).
fn log2_d<E: Emit>(e: &mut E, a: E::F) -> E::D {
    let a = e.keep(a);
    let (k, f) = log::reduce(e, a.clone());
    let f = e.widen(f);
    let f = e.keep_d(f);
    let two = e.d(2.0);
    let den = e.dadd(two, f.clone());
    let s = e.ddiv(f, den);
    let s = e.keep_d(s);
    let z = e.dmul(s.clone(), s.clone());
    let z = e.keep_d(z);
    let u = horner_d(e, &z, &LOG_POLY_D);
    let t = e.dmul(z, u);
    let s2 = e.dadd(s.clone(), s);
    let s2 = e.keep_d(s2);
    let l1p = e.dfma(s2.clone(), t, s2);
    let k = e.widen(k);
    let log2e = e.d(std::f64::consts::LOG2_E);
    let l = e.dfma(l1p, log2e, k);
    let a = e.widen(a);
    let a = e.keep_d(a);
    let tiny = e.d(1e-300);
    let neg_inf = fbits(e, INF_BITS | SIGN);
    let neg_inf = e.widen(neg_inf);
    let l = e.dlt_select(a.clone(), tiny, neg_inf, l);
    let inf = fbits(e, INF_BITS);
    let inf = e.widen(inf);
    e.dlt_select(a.clone(), inf, l, a)
}

/// `2ᵗ` rounded to `f32`, for any `f64` `t` (`nan` gives `nan`).
fn exp2_d<E: Emit>(e: &mut E, t: E::D) -> E::F {
    let t = e.keep_d(t);
    let lo = e.d(-152.0);
    let t = e.dlt_select(t.clone(), lo.clone(), lo, t);
    let t = e.keep_d(t);
    let hi = e.d(130.0);
    let t = e.dlt_select(hi.clone(), t.clone(), hi, t);
    let t = e.keep_d(t);
    let rounder = e.d(ROUNDER_D);
    let n = e.dadd(t.clone(), rounder);
    let rounder = e.d(ROUNDER_D);
    let n = e.dsub(n, rounder);
    let n = e.keep_d(n);
    let r = e.dsub(t, n.clone());
    let r = e.keep_d(r);
    let p = horner_d(e, &r, &EXP2_POLY_D);
    let one = e.d(1.0);
    let p = e.dfma(p, r, one);
    // n as a word, through the f32 rounder (exact: |n| ≤ 152).
    let n = e.narrow(n);
    let rounder = e.f(ROUNDER);
    let n = e.add(n, rounder);
    let n = rounded_int(e, n);
    let (s1, s2) = pow2_factors(e, n);
    let s1 = e.widen(s1);
    let s2 = e.widen(s2);
    let p = e.dmul(p, s1);
    let p = e.dmul(p, s2);
    e.narrow(p)
}

/// `1.0` where `lo ≤ v < hi`, else `0.0` (`0.0` for `nan`).
fn in_range<E: Emit>(e: &mut E, v: E::F, lo: f32, hi: f32) -> E::F {
    let v = e.keep(v);
    let (lo, hi) = (e.f(lo), e.f(hi));
    let (zero, one) = (e.f(0.0), e.f(1.0));
    let below_hi = e.lt_select(v.clone(), hi, one, zero.clone());
    e.lt_select(v, lo, zero, below_hi)
}

/// `|v|`.
fn abs<E: Emit>(e: &mut E, v: E::F) -> E::F {
    let bits = e.to_bits(v);
    let mask = e.u(MAGNITUDE);
    let bits = e.and(bits, mask);
    e.bits_to_f32(bits)
}

/// `a` rounded to an integer (valid below 2²³), and `|a - round(a)|`.
fn fraction<E: Emit>(e: &mut E, a: E::F) -> E::F {
    let a = e.keep(a);
    let two23 = e.f(8_388_608.0);
    let r = e.add(a.clone(), two23);
    let two23 = e.f(8_388_608.0);
    let r = e.sub(r, two23);
    let d = e.sub(a, r);
    abs(e, d)
}

/// `1.0` where `y` (with `ay = |y|`) is an odd integer, and where it is a non-integer (finite),
/// else `0.0` each.
fn parity<E: Emit>(e: &mut E, ay: E::F) -> (E::F, E::F) {
    // Odd: |ay/2 - round(ay/2)| = 1/2 exactly (only possible below 2²⁴, where it is exact;
    // above, the difference is 0 or at least 1, and `nan` at infinity).
    let half = e.f(0.5);
    let h = e.mul(ay.clone(), half);
    let hf = fraction(e, h);
    let odd = in_range(e, hf, 0.5, f32::from_bits(0.5f32.to_bits() + 1));
    // Non-integer: below 2²³ (every larger float is an integer), a non-zero fraction.
    let frac = fraction(e, ay.clone());
    let nonzero = in_range(e, frac, f32::from_bits(1), f32::MAX);
    let (zero, two23) = (e.f(0.0), e.f(8_388_608.0));
    let nonint = e.lt_select(ay, two23, nonzero, zero);
    (odd, nonint)
}

/// `v` where `flag` (1.0 or 0.0) is set, else `other`.
fn when<E: Emit>(e: &mut E, flag: E::F, v: E::F, other: E::F) -> E::F {
    let half = e.f(0.5);
    e.lt_select(half, flag, v, other)
}

/// `xʸ`, with C99's special cases.
pub fn pow<E: Emit>(e: &mut E, x: E::F, y: E::F) -> E::F {
    let x = e.keep(x);
    let y = e.keep(y);
    let ax = abs(e, x.clone());
    let ax = e.keep(ax);
    let ay = abs(e, y.clone());
    let ay = e.keep(ay);
    let l = log2_d(e, ax.clone());
    let yd = e.widen(y);
    let t = e.dmul(yd, l);
    let mag = exp2_d(e, t);
    let mag = e.keep(mag);
    let (odd, nonint) = parity(e, ay.clone());
    // A negative x (sign bit, -0 and -inf included) to an odd power: negated.
    let x_bits = e.to_bits(x.clone());
    let sign_mask = e.u(SIGN);
    let sign = e.and(x_bits, sign_mask);
    let mag_bits = e.to_bits(mag.clone());
    let negated = e.or(mag_bits, sign);
    let negated = e.bits_to_f32(negated);
    let r = when(e, odd, negated, mag);
    // A finite negative x to a non-integer power: nan.
    let finite_negative = in_range(e, x.clone(), -f32::MAX, 0.0);
    let nan_flag = e.mul(finite_negative, nonint);
    let nan = fbits(e, NAN_BITS);
    let r = when(e, nan_flag, nan, r);
    // |x| = 1 with y = ±inf: 1.
    let one_abs = in_range(e, ax, 1.0, f32::from_bits(1f32.to_bits() + 1));
    let (zero, one) = (e.f(0.0), e.f(1.0));
    let max = e.f(f32::MAX);
    let y_inf = e.lt_select(max, ay.clone(), one.clone(), zero);
    let flag = e.mul(one_abs, y_inf);
    let r = when(e, flag, one.clone(), r);
    // y = ±0, or x = 1: 1.
    let y_zero = in_range(e, ay, -1.0, f32::from_bits(1));
    let r = when(e, y_zero, one.clone(), r);
    let x_one = in_range(e, x, 1.0, f32::from_bits(1f32.to_bits() + 1));
    when(e, x_one, one, r)
}

/// `xʸ` in `f32`, as every backend computes it.
///
/// ```
/// use rocannl_arrayjit::math::pow_f32;
/// assert_eq!(pow_f32(2.0, 0.5), std::f32::consts::SQRT_2);
/// assert_eq!(pow_f32(-2.0, 3.0), -8.0);
/// assert!(pow_f32(-2.0, 0.5).is_nan());
/// assert_eq!(pow_f32(f32::NAN, 0.0), 1.0);
/// assert_eq!(pow_f32(-0.0, -1.0), f32::NEG_INFINITY);
/// ```
#[inline]
pub fn pow_f32(x: f32, y: f32) -> f32 {
    pow(&mut super::Scalar, x, y)
}

#[cfg(test)]
mod tests;

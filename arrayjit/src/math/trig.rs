//! `sin` and `cos`: `x·2/π = n + r` with `n` an integer and `|r| ≤ 1/2`, then a polynomial in
//! `r` for `sin(r·π/2)` or `cos(r·π/2)` chosen and signed by `n mod 4`.
//!
//! The reduction is exact enough for every `f32`, up to 3.4·10³⁸, without a table. `x` has 24
//! significant bits, so `x = m·2ᵏ` with `m` an integer below 2²⁴. 2/π is split into pieces `cᵢ` of
//! 26 bits each ([`TWO_OVER_PI`], 208 bits in all), and every product `pᵢ = x·cᵢ` (50 bits) is
//! exact in `f64`. A piece whose product is a multiple of 4 (`|x| ≥ 2^(26i + 51)`: the lowest bit
//! of `pᵢ` weighs at least 4) adds a whole number of turns and is dropped (a comparison of `x²`,
//! exact, with the bound's square); every product kept is below 2⁵¹, where adding and subtracting
//! 1.5·2⁵² rounds it to an integer exactly. The products are summed in `f64` in order, as an
//! integer part `N` (exact: below 2⁵²) and a fraction `S`: for each piece the integer `w` nearest
//! the rounded `S + pᵢ` goes into `N`, and `S` becomes `S + (pᵢ - w)`. Let `j` be the first piece
//! with a fraction; `S` is 0 until then, and `|S| ≤ 1/2` after it (its product is below 2⁵¹, so `w`
//! is its nearest integer). Piece `j + 1`'s product is below 2²⁴ and its lowest bit weighs at least
//! 2⁻⁵² (when `|x| ≥ 2²³`), so `S + pᵢ` is within 2⁻²⁹ of its rounding, and `pᵢ - w` and the new
//! `S` (within 1/2 + 2⁻²⁹) are exact. Every product from `j + 2` on (from piece 1 on when
//! `|x| < 2²³`) is below 1/8 and has the sign of `x`: its sum with `S` stays within 5/8 and is
//! rounded only as much as its own size, and where an integer is taken out (`w = ±1`) the new `S`
//! is at least 3/8 away from 0, never a cancellation. So the final `r` carries an error of about
//! 2⁻⁵³ of itself plus what the pieces beyond the eighth would have added (`|x|·2⁻²⁰⁸ < 2⁻⁸⁰`),
//! while no `f32` has its `x·2/π` closer than 2⁻²⁹·⁸⁶ to a nonzero integer (the closest is
//! `16367173·2⁷²`, found by trying every significand in every binade).
//!
//! The polynomials are evaluated in `f64` too, and their value rounded to `f32` once: the
//! result is about correctly rounded. Every step is an operation of the vector units (the
//! `f64` ones at half the lanes), and both polynomials are computed and one selected, so the
//! sequence has no branch.
//!
//! Special values follow C: `sin(±0) = ±0`, `cos(±0) = 1`, `nan` for `±inf` and `nan`;
//! subnormal inputs give `sin x = x` (correctly rounded) and `cos x = 1`.

use super::{Emit, ROUNDER, horner_d, rounded_int};

/// The largest error of [`sin_f32`] in units in the last place, over every `f32` input
/// (0.50007, at 3.1585805e33: the final rounding and little more).
pub const SIN_MAX_ULPS: f64 = 0.5001;
/// The largest error of [`cos_f32`] in units in the last place, over every `f32` input
/// (0.50007, at 2.340895e14).
pub const COS_MAX_ULPS: f64 = 0.5001;

/// `2ᵏ` (`-1022 ≤ k ≤ 1023`).
const fn pow2(k: i64) -> f64 {
    f64::from_bits(((1023 + k) as u64) << 52)
}

/// The piece of 26 bits `bits · 2^(-26·(i + 1))`.
const fn piece(bits: u32, i: i64) -> f64 {
    bits as f64 * pow2(-26 * (i + 1))
}

/// 2/π in pieces of 26 bits, the `i`-th the bits from 2^(-26i - 1) to 2^(-26i - 26): their sum
/// is 2/π truncated after 208 bits. Each is exact in `f64`, and its product with any `f32` too.
pub(super) const TWO_OVER_PI: [f64; 8] = [
    piece(0x28b_e60d, 0),
    piece(0x2e4_e441, 1),
    piece(0x14a_7f09, 2),
    piece(0x357_d1f5, 3),
    piece(0x0d3_7703, 4),
    piece(0x1b6_2959, 5),
    piece(0x24f_10e4, 6),
    piece(0x041_fe51, 7),
];
/// The pieces that may be multiples of 4, and from what magnitude of `x` they are: pieces 3 and
/// on never are (their products' lowest bits weigh at most 2^(104 - 104)).
const DROP_FROM: [f64; 3] = [pow2(51), pow2(77), pow2(103)];
/// The pieces before this one may hold an integer part; from it on, every product is below
/// 1/8 (`2¹²⁸·2⁻¹³¹`).
const WHOLE_PIECES: usize = 5;
/// `1.5 · 2⁵²`: adding it rounds an `f64` of magnitude below 2⁵¹ to an integer.
const ROUNDER_D: f64 = 6_755_399_441_055_744.0;
/// `sin(r·π/2) / r` as a polynomial in `r²` on `|r| ≤ 1/2`, a least-squares fit on Chebyshev
/// nodes (degree 4; 4.8·10⁻¹² relative), highest degree first.
const SIN_POLY: [f64; 5] = [
    0.000_158_206_523_632_107_5,
    -0.004_681_266_366_774_173,
    0.079_692_582_742_827_82,
    -0.645_964_096_147_655_4,
    1.570_796_326_788_106_7,
];
/// `(cos(r·π/2) - 1) / r²` as a polynomial in `r²`, fitted as [`SIN_POLY`] (degree 4;
/// `cos` within 2.2·10⁻¹³), highest degree first.
const COS_POLY: [f64; 5] = [
    -2.490_925_342_518_028_7e-5,
    0.000_919_196_346_681_455_4,
    -0.020_863_475_060_807_49,
    0.253_669_507_722_943_3,
    -1.233_700_550_135_279_6,
];

/// `v` rounded to an integer (`|v| < 2⁵¹`; larger values give some multiple of 2).
fn round_d<E: Emit>(e: &mut E, v: E::D) -> E::D {
    let rounder = e.d(ROUNDER_D);
    let t = e.dadd(v, rounder);
    let rounder = e.d(ROUNDER_D);
    e.dsub(t, rounder)
}

/// `x·2/π` as `n mod 4` (a word, two's complement) and `r` in `[-1/2, 1/2]`.
fn reduce<E: Emit>(e: &mut E, x: E::F) -> (E::U, E::D) {
    let x = e.widen(x);
    let x = e.keep_d(x);
    // x² is exact (48 bits): comparing it with a threshold's square compares |x| with it.
    let x2 = e.dmul(x.clone(), x.clone());
    let x2 = e.keep_d(x2);
    let mut n: Option<E::D> = None;
    let mut s: Option<E::D> = None;
    for (i, &c) in TWO_OVER_PI.iter().enumerate() {
        let c = e.d(c);
        if i >= WHOLE_PIECES {
            // Below 1/8: a fused multiply-add (the product is exact, so one rounding either way).
            let sum = s.take().expect("earlier pieces");
            s = Some(e.dfma(x.clone(), c, sum));
            continue;
        }
        let mut p = e.dmul(x.clone(), c);
        if let Some(&from) = DROP_FROM.get(i) {
            let from = e.d(from * from);
            let zero = e.d(0.0);
            p = e.dlt_select(x2.clone(), from, p, zero);
        }
        let p = e.keep_d(p);
        let (sum, total) = match (s.take(), n.take()) {
            (Some(s), Some(n)) => {
                // The integer nearest `S + p` (or next to it: `S + p` is rounded) into `N`,
                // `S + (p - w)` exact whenever it must be (see above).
                let s = e.keep_d(s);
                let t = e.dadd(s.clone(), p.clone());
                let w = round_d(e, t);
                let w = e.keep_d(w);
                let q = e.dsub(p, w.clone());
                (e.dadd(s, q), e.dadd(n, w))
            }
            _ => {
                let w = round_d(e, p.clone());
                let w = e.keep_d(w);
                (e.dsub(p, w.clone()), w)
            }
        };
        s = Some(sum);
        n = Some(total);
    }
    let (s, n) = (s.expect("pieces"), n.expect("pieces"));
    let s = e.keep_d(s);
    let carry = round_d(e, s.clone());
    let carry = e.keep_d(carry);
    let r = e.dsub(s, carry.clone());
    let n = e.dadd(n, carry);
    let n = e.keep_d(n);
    // n mod 4 in [-2, 2], then as a word through the f32 rounder (exact: small integers).
    let quarter = e.d(0.25);
    let turns = e.dmul(n.clone(), quarter);
    let turns = round_d(e, turns);
    let minus_four = e.d(-4.0);
    let n = e.dfma(turns, minus_four, n);
    let n = e.narrow(n);
    let rounder = e.f(ROUNDER);
    let t = e.add(n, rounder);
    (rounded_int(e, t), r)
}

/// `sin x` (`quarter = 0`) or `cos x = sin(x + π/2)` (`quarter = 1`).
fn sin_cos<E: Emit>(e: &mut E, x: E::F, quarter: u32) -> E::F {
    let (n, r) = reduce(e, x);
    let shift = e.u(quarter);
    let n = e.uadd(n, shift);
    let n = e.keep_u(n);
    let r = e.keep_d(r);
    let z = e.dmul(r.clone(), r.clone());
    let z = e.keep_d(z);
    let ps = horner_d(e, &z, &SIN_POLY);
    let sin = e.dmul(ps, r);
    let sin = e.narrow(sin);
    let pc = horner_d(e, &z, &COS_POLY);
    let one = e.d(1.0);
    let cos = e.dfma(pc, z, one);
    let cos = e.narrow(cos);
    // Odd quadrants take the cosine: `1.0` or `2.0` from bit 0 of `n`.
    let one_bits = e.u(1f32.to_bits());
    let low = e.u(1);
    let odd = e.and(n.clone(), low);
    let odd = e.shl(odd, 23);
    let odd = e.uadd(odd, one_bits.clone());
    let odd = e.bits_to_f32(odd);
    let middle = e.f(1.5);
    let v = e.lt_select(middle, odd, cos, sin);
    // Quadrants 2 and 3 negate: `±1.0` from bit 1 of `n` (a product keeps -0 and nan).
    let high = e.u(2);
    let negative = e.and(n, high);
    let negative = e.shl(negative, 30);
    let sign = e.or(negative, one_bits);
    let sign = e.bits_to_f32(sign);
    e.mul(v, sign)
}

/// `sin x`.
pub fn sin<E: Emit>(e: &mut E, x: E::F) -> E::F {
    sin_cos(e, x, 0)
}

/// `cos x`.
pub fn cos<E: Emit>(e: &mut E, x: E::F) -> E::F {
    sin_cos(e, x, 1)
}

/// `sin x` in `f32`, as every backend computes it.
///
/// ```
/// use rocannl_arrayjit::math::sin_f32;
/// assert_eq!(sin_f32(0.0), 0.0);
/// assert!(sin_f32(-0.0).is_sign_negative());
/// assert_eq!(sin_f32(1.0), 1f64.sin() as f32);
/// assert_eq!(sin_f32(1e30), (1e30f32 as f64).sin() as f32);
/// assert!(sin_f32(f32::INFINITY).is_nan());
/// ```
#[inline]
pub fn sin_f32(x: f32) -> f32 {
    sin(&mut super::Scalar, x)
}

/// `cos x` in `f32`, as every backend computes it.
///
/// ```
/// use rocannl_arrayjit::math::cos_f32;
/// assert_eq!(cos_f32(0.0), 1.0);
/// assert_eq!(cos_f32(2.0), 2f64.cos() as f32);
/// assert_eq!(cos_f32(f32::MAX), (f32::MAX as f64).cos() as f32);
/// assert!(cos_f32(f32::NAN).is_nan());
/// ```
#[inline]
pub fn cos_f32(x: f32) -> f32 {
    cos(&mut super::Scalar, x)
}

#[cfg(test)]
mod tests;

//! `exp` and `tanh` in `f32`, written once and run by every backend, so that compiled loops
//! vectorize and still compute the interpreter's bits.
//!
//! The C library's `expf` and `tanhf` are scalar calls: GCC cannot vectorize a loop that makes
//! them, and a transformer's GELU and softmax spent a third of a training step in them (`tanhf`
//! goes through `expm1f`). Here each function is a short, branch-free sequence of `f32`
//! additions, products, fused multiply-adds, comparisons and bit operations, written once
//! against the [`Emit`] trait:
//! - the interpreter evaluates it on scalars ([`exp_f32`], [`tanh_f32`]);
//! - gccjit emits the same operations inline into the loop body, where the vectorizer turns
//!   them into vector instructions;
//! - the C-family renderer prints them as helper functions ([`c_function`]), for CUDA and for
//!   the C view of gccjit's code.
//!
//! Every backend performs the same correctly rounded operations in the same order (fused
//! multiply-adds only where written, none contracted), so every backend gives the same bits.
//!
//! Accuracy, checked against `f64` over every `f32` input (`tests::exhaustive_accuracy`,
//! ignored by default; a sample of a million inputs runs with the unit tests): see
//! [`EXP_MAX_ULPS`] and [`TANH_MAX_ULPS`]. Special values follow C: `exp` overflows to `+inf`
//! above 88.72, underflows through subnormals to `+0` below -103.97, and gives `nan` for
//! `nan`; `tanh` is odd (`tanh(-0) = -0`), saturates to ±1, and gives `nan` for `nan`.
//!
//! `f64` keeps the C library's functions: nothing in a model runs `f64` `exp` in bulk.

/// The largest error of [`exp_f32`] in units in the last place, over every `f32` input
/// (0.901, at -59.26; below the normal range, in units of the subnormal spacing).
pub const EXP_MAX_ULPS: f64 = 0.91;
/// The largest error of [`tanh_f32`] in units in the last place, over every `f32` input
/// (1.027, at 0.9755).
pub const TANH_MAX_ULPS: f64 = 1.03;

/// The operations the functions are written in. `F` is an `f32` value, `U` a 32-bit word.
/// A value used more than once goes through [`Emit::keep`] (or [`Emit::keep_u`]) first, so
/// that a code generator computes it once.
pub trait Emit {
    /// An `f32` value.
    type F: Clone;
    /// A 32-bit unsigned word.
    type U: Clone;
    /// An `f32` constant.
    fn f(&mut self, c: f32) -> Self::F;
    /// A word constant.
    fn u(&mut self, c: u32) -> Self::U;
    /// `a + b`, rounded.
    fn add(&mut self, a: Self::F, b: Self::F) -> Self::F;
    /// `a - b`, rounded.
    fn sub(&mut self, a: Self::F, b: Self::F) -> Self::F;
    /// `a · b`, rounded.
    fn mul(&mut self, a: Self::F, b: Self::F) -> Self::F;
    /// `a / b`, rounded.
    fn div(&mut self, a: Self::F, b: Self::F) -> Self::F;
    /// `a · b + c`, rounded once.
    fn fma(&mut self, a: Self::F, b: Self::F, c: Self::F) -> Self::F;
    /// `a < b ? x : y` (false when either side is `nan`).
    fn lt_select(&mut self, a: Self::F, b: Self::F, x: Self::F, y: Self::F) -> Self::F;
    /// The bits of `a`.
    fn to_bits(&mut self, a: Self::F) -> Self::U;
    /// The `f32` with bits `a`.
    fn bits_to_f32(&mut self, a: Self::U) -> Self::F;
    /// `a + b` modulo 2³².
    fn uadd(&mut self, a: Self::U, b: Self::U) -> Self::U;
    /// `a - b` modulo 2³².
    fn usub(&mut self, a: Self::U, b: Self::U) -> Self::U;
    /// `a & b`.
    fn and(&mut self, a: Self::U, b: Self::U) -> Self::U;
    /// `a | b`.
    fn or(&mut self, a: Self::U, b: Self::U) -> Self::U;
    /// `a << s`.
    fn shl(&mut self, a: Self::U, s: u32) -> Self::U;
    /// `a >> s` with `a` read as a two's-complement `i32` (the sign bit copied in).
    fn sar(&mut self, a: Self::U, s: u32) -> Self::U;
    /// A value to be used more than once.
    fn keep(&mut self, a: Self::F) -> Self::F;
    /// A word to be used more than once.
    fn keep_u(&mut self, a: Self::U) -> Self::U;
}

/// `1.5 · 2²³`: adding it to a value of magnitude below 2²² leaves that value rounded to an
/// integer in the low bits of the sum's significand.
const ROUNDER: f32 = 12_582_912.0;
const LOG2_E: f32 = std::f32::consts::LOG2_E;
/// `ln 2` split so that `n · LN2_HI` is exact for every `n` the reduction produces.
const LN2_HI: f32 = 0.693_359_4;
const LN2_LO: f32 = -2.121_944_4e-4;
/// `(eʳ - 1 - r) / r²` on `|r| ≤ ln2 / 2`, a least-squares fit on Chebyshev nodes (degree 4;
/// 0.06 ulp before rounding), highest degree first.
const EXP_POLY: [f32; 5] =
    [0.001_375_066_3, 0.008_369_121, 0.041_669_566, 0.166_665_17, 0.499_999_88];
/// Below this magnitude `tanh` is the odd polynomial, above it `1 - 2 / (e^{2a} + 1)`.
const TANH_SPLIT: f32 = 0.9;
/// `(tanh a - a) / a³` as a polynomial in `a²` on `[0, 0.9]`, fitted as [`EXP_POLY`] (0.15 ulp
/// before rounding), highest degree first.
const TANH_POLY: [f32; 7] = [
    -0.000_452_485,
    0.002_574_164_2,
    -0.008_254_99,
    0.021_658_221,
    -0.053_927_787,
    0.133_329_59,
    -0.333_333_22,
];

/// Horner's rule with fused multiply-adds: `((c₀·x + c₁)·x + …)`.
fn horner<E: Emit>(e: &mut E, x: &E::F, coefs: &[f32]) -> E::F {
    let mut p = e.f(coefs[0]);
    for &c in &coefs[1..] {
        let c = e.f(c);
        p = e.fma(p, x.clone(), c);
    }
    p
}

/// `eˣ`: `x = n·ln2 + r` with `n` an integer and `|r| ≤ ln2/2`, `eʳ` by a polynomial, then
/// scaled by `2ⁿ` in two exact power-of-two steps (so that results in the subnormal range are
/// rounded once, correctly).
pub fn exp<E: Emit>(e: &mut E, x: E::F) -> E::F {
    // Clamp to where the result is neither certainly infinite nor certainly zero; `nan` passes
    // (both comparisons are false).
    let x = e.keep(x);
    let lo = e.f(-104.0);
    let x = e.lt_select(x.clone(), lo.clone(), lo, x);
    let x = e.keep(x);
    let hi = e.f(89.0);
    let x = e.lt_select(hi.clone(), x.clone(), hi, x);
    let x = e.keep(x);
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
    // 2ⁿ = 2^(n - n/2) · 2^(n/2), each factor a normal number.
    let t_bits = e.to_bits(t);
    let rounder_bits = e.u(ROUNDER.to_bits());
    let n = e.usub(t_bits, rounder_bits);
    let n = e.keep_u(n);
    let half = e.sar(n.clone(), 1);
    let half = e.keep_u(half);
    let rest = e.usub(n, half.clone());
    let scale = |e: &mut E, k: E::U| {
        let bias = e.u(127);
        let biased = e.uadd(k, bias);
        let bits = e.shl(biased, 23);
        e.bits_to_f32(bits)
    };
    let s1 = scale(e, half);
    let s2 = scale(e, rest);
    let p = e.mul(p, s1);
    e.mul(p, s2)
}

/// `tanh x`: for `|x| < 0.9` the odd polynomial `a + a³·P(a²)`, else `1 - 2 / (e^{2a} + 1)`,
/// with the sign of `x` put back.
pub fn tanh<E: Emit>(e: &mut E, x: E::F) -> E::F {
    let bits = e.to_bits(x);
    let bits = e.keep_u(bits);
    let mask = e.u(0x7fff_ffff);
    let magnitude = e.and(bits.clone(), mask);
    let a = e.bits_to_f32(magnitude);
    let a = e.keep(a);
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
    let result_bits = e.to_bits(result);
    let sign_mask = e.u(0x8000_0000);
    let sign = e.and(bits, sign_mask);
    let with_sign = e.or(result_bits, sign);
    e.bits_to_f32(with_sign)
}

/// Evaluation on scalars: the interpreter's arithmetic.
struct Scalar;

impl Emit for Scalar {
    type F = f32;
    type U = u32;
    fn f(&mut self, c: f32) -> f32 {
        c
    }
    fn u(&mut self, c: u32) -> u32 {
        c
    }
    fn add(&mut self, a: f32, b: f32) -> f32 {
        a + b
    }
    fn sub(&mut self, a: f32, b: f32) -> f32 {
        a - b
    }
    fn mul(&mut self, a: f32, b: f32) -> f32 {
        a * b
    }
    fn div(&mut self, a: f32, b: f32) -> f32 {
        a / b
    }
    fn fma(&mut self, a: f32, b: f32, c: f32) -> f32 {
        a.mul_add(b, c)
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
    fn keep(&mut self, a: f32) -> f32 {
        a
    }
    fn keep_u(&mut self, a: u32) -> u32 {
        a
    }
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
#[inline]
pub fn exp_f32(x: f32) -> f32 {
    exp(&mut Scalar, x)
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
    tanh(&mut Scalar, x)
}

/// Printing as C statements: each kept value becomes a variable.
struct CText {
    body: String,
    next: usize,
}

impl CText {
    fn var(&mut self, ty: &str, value: String) -> String {
        let name = format!("m{}", self.next);
        self.next += 1;
        self.body.push_str(&format!("  {ty} {name} = {value};\n"));
        name
    }
}

impl Emit for CText {
    type F = String;
    type U = String;
    fn f(&mut self, c: f32) -> String {
        // Exact: the shortest decimal that reads back as `c`, with an `f` suffix.
        let s = format!("{c:?}");
        format!("{s}f")
    }
    fn u(&mut self, c: u32) -> String {
        format!("{c:#x}u")
    }
    fn add(&mut self, a: String, b: String) -> String {
        format!("({a} + {b})")
    }
    fn sub(&mut self, a: String, b: String) -> String {
        format!("({a} - {b})")
    }
    fn mul(&mut self, a: String, b: String) -> String {
        format!("({a} * {b})")
    }
    fn div(&mut self, a: String, b: String) -> String {
        format!("({a} / {b})")
    }
    fn fma(&mut self, a: String, b: String, c: String) -> String {
        format!("fmaf({a}, {b}, {c})")
    }
    fn lt_select(&mut self, a: String, b: String, x: String, y: String) -> String {
        format!("({a} < {b} ? {x} : {y})")
    }
    fn to_bits(&mut self, a: String) -> String {
        self.var("unsigned int", format!("rc_f32_bits({a})"))
    }
    fn bits_to_f32(&mut self, a: String) -> String {
        format!("rc_bits_f32({a})")
    }
    fn uadd(&mut self, a: String, b: String) -> String {
        format!("({a} + {b})")
    }
    fn usub(&mut self, a: String, b: String) -> String {
        format!("({a} - {b})")
    }
    fn and(&mut self, a: String, b: String) -> String {
        format!("({a} & {b})")
    }
    fn or(&mut self, a: String, b: String) -> String {
        format!("({a} | {b})")
    }
    fn shl(&mut self, a: String, s: u32) -> String {
        format!("({a} << {s})")
    }
    fn sar(&mut self, a: String, s: u32) -> String {
        format!("(unsigned int)((int){a} >> {s})")
    }
    fn keep(&mut self, a: String) -> String {
        self.var("float", a)
    }
    fn keep_u(&mut self, a: String) -> String {
        self.var("unsigned int", a)
    }
}

/// A function defined here.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub enum Function {
    /// [`exp`].
    Exp,
    /// [`tanh`].
    Tanh,
}

impl Function {
    /// The function's operations on `x`.
    pub fn emit<E: Emit>(self, e: &mut E, x: E::F) -> E::F {
        match self {
            Function::Exp => exp(e, x),
            Function::Tanh => tanh(e, x),
        }
    }
}

/// A C function `float name(float x)` computing `f`, with `qualifier` before its return type
/// (`static inline`, or `__device__` for CUDA). It needs the helpers `rc_f32_bits` and
/// `rc_bits_f32` (bit casts) and `fmaf`.
///
/// ```
/// use rocannl_arrayjit::math::{Function, c_function};
/// let c = c_function("static", "rc_expf", Function::Exp);
/// assert!(c.starts_with("static float rc_expf(float x) {"));
/// assert!(c.contains("fmaf("));
/// ```
pub fn c_function(qualifier: &str, name: &str, f: Function) -> String {
    let mut t = CText { body: String::new(), next: 0 };
    let result = f.emit(&mut t, "x".to_string());
    format!("{qualifier} float {name}(float x) {{\n{}  return {result};\n}}\n", t.body)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The error of `got` against the exact `want`, in units in the last place of `want` as an
    /// `f32` (the subnormal spacing below the normal range).
    fn ulps(got: f32, want: f64) -> f64 {
        if got as f64 == want || (got.is_nan() && want.is_nan()) {
            return 0.0;
        }
        if !want.is_finite() || !got.is_finite() {
            // Overflow must agree exactly: inf against a finite value is a failure.
            return f64::INFINITY;
        }
        let w = want.abs().max(f32::MIN_POSITIVE as f64);
        let spacing = 2f64.powi(w.log2().floor() as i32 - 23);
        (got as f64 - want).abs() / spacing
    }

    /// The largest error over `inputs`, with the input where it happens.
    fn worst(
        f: fn(f32) -> f32,
        exact: fn(f64) -> f64,
        inputs: impl Iterator<Item = f32>,
    ) -> (f64, f32) {
        let mut worst = (0.0, 0.0);
        for x in inputs {
            let want = exact(x as f64);
            // Beyond f32's range the result must be exactly the rounded overflow.
            let want =
                if want.abs() > f32::MAX as f64 { want.signum() * f64::INFINITY } else { want };
            let e = ulps(f(x), want);
            if e > worst.0 {
                worst = (e, x);
            }
        }
        worst
    }

    /// Every finite `f32`, spaced by `step` bit patterns.
    fn every(step: u32) -> impl Iterator<Item = f32> {
        (0..=u32::MAX / step)
            .map(move |i| f32::from_bits(i.wrapping_mul(step)))
            .filter(|x| x.is_finite())
    }

    #[test]
    fn a_million_inputs_are_within_the_stated_accuracy() {
        // About a million bit patterns over the whole range, both signs.
        let (e, x) = worst(exp_f32, f64::exp, every(4099));
        assert!(e <= EXP_MAX_ULPS, "exp: {e} ulps at {x:e}");
        let (t, x) = worst(tanh_f32, f64::tanh, every(4099));
        assert!(t <= TANH_MAX_ULPS, "tanh: {t} ulps at {x:e}");
        // Densely where the functions bend: around 0, the reduction's steps, the tanh split.
        let dense = (0..1_000_000).map(|i| -20.0 + 40.0 * i as f32 / 1_000_000.0);
        let (e, x) = worst(exp_f32, f64::exp, dense.clone());
        assert!(e <= EXP_MAX_ULPS, "exp: {e} ulps at {x:e}");
        let (t, x) = worst(tanh_f32, f64::tanh, dense);
        assert!(t <= TANH_MAX_ULPS, "tanh: {t} ulps at {x:e}");
    }

    #[test]
    #[ignore = "every f32 input: about five minutes in release on one core"]
    fn exhaustive_accuracy() {
        let (e, x) = worst(exp_f32, f64::exp, every(1));
        let (t, y) = worst(tanh_f32, f64::tanh, every(1));
        eprintln!("exp: {e} ulps at {x:e}; tanh: {t} ulps at {y:e}");
        assert!(e <= EXP_MAX_ULPS && t <= TANH_MAX_ULPS);
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

    #[test]
    fn the_c_text_is_the_same_sequence() {
        let c = c_function("static inline", "rc_tanhf", Function::Tanh);
        // One fused multiply-add per polynomial coefficient past the first, three in the
        // reduction and two closing exp's polynomial.
        let fmas = c.matches("fmaf(").count();
        assert_eq!(fmas, (TANH_POLY.len() - 1) + 1 + (EXP_POLY.len() - 1) + 3 + 2, "{c}");
        assert!(c.contains("return rc_bits_f32("));
    }
}

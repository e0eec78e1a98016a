//! The `f32` special functions, written once and run by every backend, so that compiled loops
//! vectorize and still compute the interpreter's bits.
//!
//! The C library's `expf`, `tanhf`, `logf`, `erff`, `powf`, `sinf`… are scalar calls: GCC cannot
//! vectorize a loop that makes them, and a transformer's GELU and softmax spent a third of a
//! training step in them (`tanhf` goes through `expm1f`, exact GELU through `erff`). Here each
//! function is a short, branch-free sequence of additions, products, fused multiply-adds,
//! comparisons and bit operations, written once against the [`Emit`] trait:
//! - the interpreter evaluates it on scalars ([`exp_f32`], [`log_f32`], [`sin_f32`]…);
//! - gccjit emits the same operations inline into the loop body, where the vectorizer turns
//!   them into vector instructions;
//! - the C-family renderer prints them as helper functions ([`c_function`]), for CUDA and for
//!   the C view of gccjit's code.
//!
//! Every backend performs the same correctly rounded operations in the same order (fused
//! multiply-adds only where written, none contracted), so every backend gives the same bits.
//!
//! | function | file | largest error over every `f32` input (ulps) |
//! | --- | --- | --- |
//! | `exp` | `exp.rs` | [`EXP_MAX_ULPS`] |
//! | `exp2` | `exp.rs` | [`EXP2_MAX_ULPS`] |
//! | `tanh` | `exp.rs` | [`TANH_MAX_ULPS`] |
//! | `log` | `log.rs` | [`LOG_MAX_ULPS`] |
//! | `log2` | `log.rs` | [`LOG2_MAX_ULPS`] |
//! | `erf` | `erf.rs` | [`ERF_MAX_ULPS`] |
//! | `pow` | `pow.rs` | [`POW_MAX_ULPS`] (over samples: two inputs) |
//! | `sin` | `trig.rs` | [`SIN_MAX_ULPS`] |
//! | `cos` | `trig.rs` | [`COS_MAX_ULPS`] |
//!
//! Each is checked against an `f64` reference over every `f32` input (the
//! `exhaustive_accuracy` tests, ignored by default; a sample of a million inputs runs with the
//! unit tests), and its special values (±0, ±inf, nan, subnormals) follow C99. `pow` computes
//! `y·log2|x|` and its power of two in `f64` arithmetic (still vectorizable): the product needs
//! more precision than `f32` carries. So do `sin` and `cos`, whose argument reduction is exact
//! enough for every `f32` up to 3.4·10³⁸ without a table of 2/π's bits: the input times each
//! of eight 26-bit pieces of 2/π is exact in `f64`, and the pieces whose product is a whole
//! number of turns are dropped by a comparison.
//!
//! Every function in `f64` stays the C library's.

mod c_text;
#[cfg(test)]
mod check;
mod erf;
mod exp;
mod log;
mod pow;
mod trig;

pub use c_text::{Function, c_function};
pub use erf::{ERF_MAX_ULPS, erf, erf_f32};
pub use exp::{
    EXP_MAX_ULPS, EXP2_MAX_ULPS, TANH_MAX_ULPS, exp, exp_f32, exp2, exp2_f32, tanh, tanh_f32,
};
pub use log::{LOG_MAX_ULPS, LOG2_MAX_ULPS, log, log_f32, log2, log2_f32};
pub use pow::{POW_MAX_ULPS, pow, pow_f32};
pub use trig::{COS_MAX_ULPS, SIN_MAX_ULPS, cos, cos_f32, sin, sin_f32};

/// The operations the functions are written in. `F` is an `f32` value, `U` a 32-bit word, `D`
/// an `f64` value. A value used more than once goes through [`Emit::keep`] (or
/// [`Emit::keep_u`], [`Emit::keep_d`]) first, so that a code generator computes it once.
pub trait Emit {
    /// An `f32` value.
    type F: Clone;
    /// A 32-bit unsigned word.
    type U: Clone;
    /// An `f64` value.
    type D: Clone;
    /// An `f32` constant (finite; the functions build a non-finite one from its bits).
    fn f(&mut self, c: f32) -> Self::F;
    /// A word constant.
    fn u(&mut self, c: u32) -> Self::U;
    /// An `f64` constant (finite and normal).
    fn d(&mut self, c: f64) -> Self::D;
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
    /// `a` as an `f64` (exact).
    fn widen(&mut self, a: Self::F) -> Self::D;
    /// `a` rounded to `f32`.
    fn narrow(&mut self, a: Self::D) -> Self::F;
    /// `a + b` in `f64`, rounded.
    fn dadd(&mut self, a: Self::D, b: Self::D) -> Self::D;
    /// `a - b` in `f64`, rounded.
    fn dsub(&mut self, a: Self::D, b: Self::D) -> Self::D;
    /// `a · b` in `f64`, rounded.
    fn dmul(&mut self, a: Self::D, b: Self::D) -> Self::D;
    /// `a / b` in `f64`, rounded.
    fn ddiv(&mut self, a: Self::D, b: Self::D) -> Self::D;
    /// `a · b + c` in `f64`, rounded once.
    fn dfma(&mut self, a: Self::D, b: Self::D, c: Self::D) -> Self::D;
    /// `a < b ? x : y` in `f64` (false when either side is `nan`).
    fn dlt_select(&mut self, a: Self::D, b: Self::D, x: Self::D, y: Self::D) -> Self::D;
    /// A value to be used more than once.
    fn keep(&mut self, a: Self::F) -> Self::F;
    /// A word to be used more than once.
    fn keep_u(&mut self, a: Self::U) -> Self::U;
    /// An `f64` value to be used more than once.
    fn keep_d(&mut self, a: Self::D) -> Self::D;
}

/// `1.5 · 2²³`: adding it to a value of magnitude below 2²² leaves that value rounded to an
/// integer in the low bits of the sum's significand.
const ROUNDER: f32 = 12_582_912.0;
/// The bits of `+inf`.
const INF_BITS: u32 = 0x7f80_0000;
/// The bits of the quiet `nan` the functions return.
const NAN_BITS: u32 = 0x7fc0_0000;
/// All bits but the sign.
const MAGNITUDE: u32 = 0x7fff_ffff;
/// The sign bit.
const SIGN: u32 = 0x8000_0000;

/// Horner's rule with fused multiply-adds: `((c₀·x + c₁)·x + …)`.
#[inline(always)]
fn horner<E: Emit>(e: &mut E, x: &E::F, coefs: &[f32]) -> E::F {
    let mut p = e.f(coefs[0]);
    for &c in &coefs[1..] {
        let c = e.f(c);
        p = e.fma(p, x.clone(), c);
    }
    p
}

/// [`horner`] in `f64`.
fn horner_d<E: Emit>(e: &mut E, x: &E::D, coefs: &[f64]) -> E::D {
    let mut p = e.d(coefs[0]);
    for &c in &coefs[1..] {
        let c = e.d(c);
        p = e.dfma(p, x.clone(), c);
    }
    p
}

/// The `f32` with the given bits, as a constant: how `inf`, `nan` and subnormal constants are
/// written, so that no backend has to print them as literals.
fn fbits<E: Emit>(e: &mut E, bits: u32) -> E::F {
    let b = e.u(bits);
    e.bits_to_f32(b)
}

/// `|x|` and the sign bit of `x` (`x` kept).
fn split_sign<E: Emit>(e: &mut E, x: E::F) -> (E::F, E::U) {
    let bits = e.to_bits(x);
    let bits = e.keep_u(bits);
    let mask = e.u(MAGNITUDE);
    let magnitude = e.and(bits.clone(), mask);
    let a = e.bits_to_f32(magnitude);
    let a = e.keep(a);
    let sign_mask = e.u(SIGN);
    let sign = e.and(bits, sign_mask);
    (a, sign)
}

/// `r` with the sign bit `sign` or-ed in (`r` non-negative or `nan`).
fn with_sign<E: Emit>(e: &mut E, r: E::F, sign: E::U) -> E::F {
    let bits = e.to_bits(r);
    let bits = e.or(bits, sign);
    e.bits_to_f32(bits)
}

/// The small integer `n` (|n| < 2²²) held as a word, as an `f32`: the word added to the bits
/// of [`ROUNDER`] is the float `ROUNDER + n`.
fn int_to_f32<E: Emit>(e: &mut E, n: E::U) -> E::F {
    let rounder_bits = e.u(ROUNDER.to_bits());
    let bits = e.uadd(n, rounder_bits);
    let sum = e.bits_to_f32(bits);
    let rounder = e.f(ROUNDER);
    e.sub(sum, rounder)
}

/// `2ᵏ` for `-126 ≤ k ≤ 127` held as a word.
#[inline(always)]
fn pow2<E: Emit>(e: &mut E, k: E::U) -> E::F {
    let bias = e.u(127);
    let biased = e.uadd(k, bias);
    let bits = e.shl(biased, 23);
    e.bits_to_f32(bits)
}

/// The two normal factors `2^(n/2)` and `2^(n - n/2)` of `2ⁿ` (`|n| ≤ 252`), so that scaling
/// by both rounds once, also into the subnormal range or to infinity.
#[inline(always)]
fn pow2_factors<E: Emit>(e: &mut E, n: E::U) -> (E::F, E::F) {
    let n = e.keep_u(n);
    let half = e.sar(n.clone(), 1);
    let half = e.keep_u(half);
    let rest = e.usub(n, half.clone());
    (pow2(e, half), pow2(e, rest))
}

/// The integer `n` rounded into the low bits of `t = v + ROUNDER`, as a word.
#[inline(always)]
fn rounded_int<E: Emit>(e: &mut E, t: E::F) -> E::U {
    let t_bits = e.to_bits(t);
    let rounder_bits = e.u(ROUNDER.to_bits());
    e.usub(t_bits, rounder_bits)
}

/// Evaluation on scalars: the interpreter's arithmetic.
struct Scalar;

impl Emit for Scalar {
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
    fn widen(&mut self, a: f32) -> f64 {
        a as f64
    }
    fn narrow(&mut self, a: f64) -> f32 {
        a as f32
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

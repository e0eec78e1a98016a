//! Storage precisions and correct rounding into them.
//!
//! Rounding an `f64` to a 16-bit float must happen once: rounding first to `f32` and then to
//! bf16 or f16 can create a tie that was not there (double rounding). The functions here round
//! to odd on the way, so every backend and the interpreter store the same bits.

use std::fmt;

/// A storage precision. `F16` and `Bf16` are storage-only: arithmetic is done in `f32` and the
/// result is rounded when stored.
///
/// ```
/// use rocannl_arrayjit::ops::Prec;
/// assert_eq!(Prec::from_name("bf16"), Some(Prec::Bf16));
/// assert_eq!(Prec::F64.size_in_bytes(), 8);
/// assert_eq!(Prec::F16.name(), "f16");
/// ```
#[derive(Copy, Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Prec {
    /// IEEE 754 half precision (crate `half`).
    F16,
    /// bfloat16 (crate `half`).
    Bf16,
    /// IEEE 754 single precision.
    F32,
    /// IEEE 754 double precision.
    F64,
    /// Unsigned 32-bit integers: a storage type for token ids and class labels. A load gives
    /// the integer as a value of the compute precision (exact below 2²⁴ in f32); a store of a
    /// computed value truncates toward zero and saturates (`nan` and negatives to 0).
    U32,
}

impl Prec {
    /// Every floating-point precision, narrowest first.
    pub const ALL: [Prec; 4] = [Prec::F16, Prec::Bf16, Prec::F32, Prec::F64];

    /// The short name: `f16`, `bf16`, `f32`, `f64` or `u32`.
    pub fn name(self) -> &'static str {
        match self {
            Prec::F16 => "f16",
            Prec::Bf16 => "bf16",
            Prec::F32 => "f32",
            Prec::F64 => "f64",
            Prec::U32 => "u32",
        }
    }

    /// The inverse of [`Prec::name`].
    pub fn from_name(name: &str) -> Option<Prec> {
        Prec::ALL.into_iter().chain([Prec::U32]).find(|p| p.name() == name)
    }

    /// Whether `x` is a value [`Prec::U32`] holds: an integer in `0 .. 2³²`.
    ///
    /// ```
    /// use rocannl_arrayjit::ops::Prec;
    /// assert!(Prec::is_u32_value(7.0) && !Prec::is_u32_value(2.5) && !Prec::is_u32_value(-1.0));
    /// ```
    pub fn is_u32_value(x: f64) -> bool {
        (0.0..4_294_967_296.0).contains(&x) && x.fract() == 0.0
    }

    /// Whether values of this precision are floating-point numbers (every one but [`Prec::U32`]).
    pub fn is_float(self) -> bool {
        self != Prec::U32
    }

    /// Bytes per element.
    pub fn size_in_bytes(self) -> usize {
        match self {
            Prec::F16 | Prec::Bf16 => 2,
            Prec::F32 | Prec::U32 => 4,
            Prec::F64 => 8,
        }
    }

    /// The precision arithmetic on values of this precision is carried out in.
    pub fn compute(self) -> Prec {
        match self {
            Prec::F64 => Prec::F64,
            _ => Prec::F32,
        }
    }

    /// Rounds an `f64` to this precision (round to nearest even) and back.
    ///
    /// ```
    /// use rocannl_arrayjit::ops::Prec;
    /// assert_eq!(Prec::F32.round(0.1), 0.1f32 as f64);
    /// assert_eq!(Prec::Bf16.round(1.0 + 1.0 / 512.0), 1.0);
    /// ```
    pub fn round(self, x: f64) -> f64 {
        match self {
            Prec::F16 => f16_from_f64(x).to_f64(),
            Prec::Bf16 => bf16_from_f64(x).to_f64(),
            Prec::F32 => x as f32 as f64,
            Prec::F64 => x,
            Prec::U32 => x as u32 as f64,
        }
    }
}

/// `x` rounded to `f32` toward zero, its last bit set when that was inexact ("round to odd").
/// Rounding this to nearest even at 22 significant bits or fewer gives the correctly rounded
/// `x`: the odd last bit stands for everything below it, so no tie is created or lost.
fn f32_round_to_odd(x: f64) -> f32 {
    let y = x as f32;
    if !x.is_finite() || y as f64 == x {
        return y;
    }
    let mut bits = y.to_bits();
    if (y as f64).abs() > x.abs() {
        // One step toward zero (sign and magnitude: the magnitude's bits); from an overflow
        // to infinity, that is `f32::MAX`.
        bits -= 1;
    }
    f32::from_bits(bits | 1)
}

/// `x` correctly rounded (to nearest even) to bf16.
///
/// `half`'s own `bf16::from_f64` loses low bits before rounding: 0x202001·2⁻²⁴, just above a
/// tie, comes out rounded down. This rounds once, correctly.
///
/// ```
/// use rocannl_arrayjit::ops::bf16_from_f64;
/// assert_eq!(bf16_from_f64(0x202001 as f64 / 16777216.0).to_f64(), 0.1259765625);
/// assert_eq!(bf16_from_f64(1.0 + 1.0 / 256.0 + 1e-12).to_f64(), 1.0078125);
/// ```
pub fn bf16_from_f64(x: f64) -> half::bf16 {
    half::bf16::from_f32(f32_round_to_odd(x))
}

/// `x` correctly rounded (to nearest even) to f16, subnormals included.
///
/// ```
/// use rocannl_arrayjit::ops::f16_from_f64;
/// assert_eq!(f16_from_f64(1.0 + 1.0 / 2048.0 + 1e-12).to_f64(), 1.0 + 1.0 / 1024.0);
/// assert_eq!(f16_from_f64(65520.0).to_f64(), f64::INFINITY);
/// ```
pub fn f16_from_f64(x: f64) -> half::f16 {
    half::f16::from_f32(f32_round_to_odd(x))
}

impl fmt::Display for Prec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

#[cfg(test)]
mod rounding_tests {
    use super::*;
    use crate::ops::uniform;

    /// Rounds `x` to `bits` significant bits, to nearest even, by exact integer arithmetic on
    /// its significand (normal results only).
    fn reference(x: f64, bits: u32) -> f64 {
        let e = x.abs().log2().floor() as i32;
        let scale = 2f64.powi(bits as i32 - 1 - e);
        // `x · scale` is exact (a power of two) and below 2⁵³.
        let m = x * scale;
        let (fl, frac) = (m.floor(), m - m.floor());
        let r = if frac > 0.5 || (frac == 0.5 && fl % 2.0 != 0.0) { fl + 1.0 } else { fl };
        r / scale
    }

    #[test]
    fn half_precisions_round_f64_once_and_correctly() {
        // Values with bits far below f32's last place, ties and near-ties included.
        let mut xs = vec![];
        for k in 0..200_000u64 {
            let u = uniform(3, k);
            let tail = uniform(4, k) * 2f64.powi(-30);
            xs.push(1.0 + u + tail);
            xs.push(-(0.001 + u) * (1.0 + tail));
            // Exactly on a bf16 tie, plus or minus a tiny amount.
            let tie = 1.0 + ((k % 128) as f64 + 0.5) / 128.0;
            xs.push(tie + 1e-13);
            xs.push(tie - 1e-13);
            xs.push(tie);
        }
        for x in xs {
            assert_eq!(bf16_from_f64(x).to_f64(), reference(x, 8), "bf16 of {x:e}");
            assert_eq!(f16_from_f64(x).to_f64(), reference(x, 11), "f16 of {x:e}");
        }
        assert_eq!(bf16_from_f64(1e39).to_f64(), f64::INFINITY);
        assert!(bf16_from_f64(f64::NAN).is_nan());
        assert_eq!(bf16_from_f64(-0.0).to_bits(), 0x8000);
        assert_eq!(f16_from_f64(1e-9).to_f64(), 0.0);
        assert_eq!(f16_from_f64(6e-8).to_f64(), 2f64.powi(-24), "the smallest subnormal");
    }
}

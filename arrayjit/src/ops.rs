//! Precisions and the table of per-operation facts.
//!
//! Every backend needs the same handful of facts about an operation: its printed name, how to
//! write it in C, what element is neutral when it is used to accumulate, and what it computes.
//! Keeping them in one place (the `facts` methods below) means a new operation is added once
//! and every backend, printer and optimization pass sees it. [`UnOp::apply`], [`BinOp::apply`]
//! and [`TernOp::apply`] are the reference semantics (in `f64`) that the interpreter uses and
//! the compiled backends are tested against.

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

/// How an operation is written in C: a function-like call or an infix operator.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub enum CSyntax {
    /// `name(args)`; the `f32` variant of a libm function gets an `f` suffix.
    Func(&'static str),
    /// `(a op b)`.
    Infix(&'static str),
    /// A small expression written by the C renderer itself (e.g. comparisons giving 1.0/0.0).
    Custom,
}

/// The facts about one operation.
#[derive(Copy, Clone, Debug, PartialEq)]
pub struct OpFacts {
    /// The printed name used by every IR printer.
    pub name: &'static str,
    /// How the C renderer writes it.
    pub c_syntax: CSyntax,
    /// The element `e` with `e ⊕ x = x ⊕ e = x`, for operations usable as accumulations.
    pub neutral: Option<f64>,
    /// Rough cost in simple arithmetic operations, used to decide what is cheap to inline.
    pub cost: u32,
}

/// Unary operations.
#[derive(Copy, Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum UnOp {
    /// `x`.
    Identity,
    /// `-x`.
    Neg,
    /// `max(0, x)` (NaN stays NaN).
    Relu,
    /// `x` clamped to `[0, 1]`.
    Sat01,
    /// `e^x`.
    Exp,
    /// Natural logarithm.
    Log,
    /// `2^x`.
    Exp2,
    /// Base-2 logarithm.
    Log2,
    /// Square root.
    Sqrt,
    /// `1 / x`.
    Recip,
    /// Sine.
    Sin,
    /// Cosine.
    Cos,
    /// Hyperbolic tangent.
    Tanh,
    /// The error function `erf(x) = 2/√π ∫₀ˣ e^(-t²) dt` (exact GELU is `x·(1 + erf(x/√2))/2`).
    Erf,
    /// `1 / (1 + e^-x)`.
    Sigmoid,
    /// Absolute value.
    Abs,
    /// `1` if `x == 0`, else `0`.
    Not,
}

impl UnOp {
    /// Every unary operation.
    pub const ALL: [UnOp; 17] = [
        UnOp::Identity,
        UnOp::Neg,
        UnOp::Relu,
        UnOp::Sat01,
        UnOp::Exp,
        UnOp::Log,
        UnOp::Exp2,
        UnOp::Log2,
        UnOp::Sqrt,
        UnOp::Recip,
        UnOp::Sin,
        UnOp::Cos,
        UnOp::Tanh,
        UnOp::Erf,
        UnOp::Sigmoid,
        UnOp::Abs,
        UnOp::Not,
    ];

    /// The table of facts.
    pub fn facts(self) -> OpFacts {
        use CSyntax::*;
        let (name, c_syntax, cost) = match self {
            UnOp::Identity => ("id", Custom, 0),
            UnOp::Neg => ("neg", Custom, 1),
            UnOp::Relu => ("relu", Custom, 1),
            UnOp::Sat01 => ("sat01", Custom, 2),
            UnOp::Exp => ("exp", Custom, 10),
            UnOp::Log => ("log", Custom, 10),
            UnOp::Exp2 => ("exp2", Custom, 10),
            UnOp::Log2 => ("log2", Custom, 10),
            UnOp::Sqrt => ("sqrt", Func("sqrt"), 4),
            UnOp::Recip => ("recip", Custom, 4),
            UnOp::Sin => ("sin", Func("sin"), 10),
            UnOp::Cos => ("cos", Func("cos"), 10),
            UnOp::Tanh => ("tanh", Custom, 12),
            UnOp::Erf => ("erf", Custom, 12),
            UnOp::Sigmoid => ("sigmoid", Custom, 12),
            UnOp::Abs => ("abs", Func("fabs"), 1),
            UnOp::Not => ("not", Custom, 1),
        };
        OpFacts { name, c_syntax, neutral: None, cost }
    }

    /// The printed name.
    pub fn name(self) -> &'static str {
        self.facts().name
    }

    /// The reference semantics.
    ///
    /// ```
    /// use rocannl_arrayjit::ops::UnOp;
    /// assert_eq!(UnOp::Relu.apply(-2.0), 0.0);
    /// assert_eq!(UnOp::Sat01.apply(1.5), 1.0);
    /// assert_eq!(UnOp::Not.apply(0.0), 1.0);
    /// ```
    pub fn apply(self, x: f64) -> f64 {
        self.compute(x)
    }

    /// The operation computed in `f32`, as compiled `f32` code computes it (the same formula,
    /// every step rounded to `f32`; `exp`, `log`, `exp2`, `log2`, `tanh` and `erf` from
    /// [`crate::math`], `sqrt` correctly rounded, `sin` and `cos` the C library's).
    ///
    /// ```
    /// use rocannl_arrayjit::ops::UnOp;
    /// assert_eq!(UnOp::Exp.apply_f32(100.0), f32::INFINITY);
    /// ```
    pub fn apply_f32(self, x: f32) -> f32 {
        self.compute(x)
    }

    /// The one definition of the operation, in either precision.
    #[inline(always)]
    pub(crate) fn compute<T: Real>(self, x: T) -> T {
        match self {
            UnOp::Identity => x,
            UnOp::Neg => -x,
            UnOp::Relu => {
                if x < T::ZERO {
                    T::ZERO
                } else {
                    x
                }
            }
            UnOp::Sat01 => x.clamp01(),
            UnOp::Exp => x.exp(),
            UnOp::Log => x.ln(),
            UnOp::Exp2 => x.exp2(),
            UnOp::Log2 => x.log2(),
            UnOp::Sqrt => x.sqrt(),
            UnOp::Recip => T::ONE / x,
            UnOp::Sin => x.sin(),
            UnOp::Cos => x.cos(),
            UnOp::Tanh => x.tanh(),
            UnOp::Erf => x.erf(),
            UnOp::Sigmoid => T::ONE / (T::ONE + (-x).exp()),
            UnOp::Abs => x.abs(),
            UnOp::Not => T::of_bool(x == T::ZERO),
        }
    }
}

/// Binary operations; also the accumulation operators of assignments.
#[derive(Copy, Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum BinOp {
    /// `a + b`.
    Add,
    /// `a - b`.
    Sub,
    /// `a * b`.
    Mul,
    /// `a / b` (IEEE: `1/0 = inf`, `0/0 = nan`).
    Div,
    /// `a^b`.
    Pow,
    /// Maximum, propagating NaN.
    Max,
    /// Minimum, propagating NaN.
    Min,
    /// `1` if `a < b` else `0`.
    Lt,
    /// `1` if `a <= b` else `0`.
    Le,
    /// `1` if `a > b` else `0`.
    Gt,
    /// `1` if `a == b` else `0`.
    Eq,
    /// `1` if `a != b` else `0`.
    Ne,
    /// Returns `b`: the accumulation of a plain assignment `=` when used as an operator.
    Second,
}

impl BinOp {
    /// Every binary operation.
    pub const ALL: [BinOp; 13] = [
        BinOp::Add,
        BinOp::Sub,
        BinOp::Mul,
        BinOp::Div,
        BinOp::Pow,
        BinOp::Max,
        BinOp::Min,
        BinOp::Lt,
        BinOp::Le,
        BinOp::Gt,
        BinOp::Eq,
        BinOp::Ne,
        BinOp::Second,
    ];

    /// The table of facts.
    pub fn facts(self) -> OpFacts {
        use CSyntax::*;
        let (name, c_syntax, neutral, cost) = match self {
            BinOp::Add => ("add", Infix("+"), Some(0.0), 1),
            BinOp::Sub => ("sub", Infix("-"), None, 1),
            BinOp::Mul => ("mul", Infix("*"), Some(1.0), 1),
            BinOp::Div => ("div", Infix("/"), None, 4),
            BinOp::Pow => ("pow", Custom, None, 20),
            BinOp::Max => ("max", Custom, Some(f64::NEG_INFINITY), 2),
            BinOp::Min => ("min", Custom, Some(f64::INFINITY), 2),
            BinOp::Lt => ("lt", Custom, None, 1),
            BinOp::Le => ("le", Custom, None, 1),
            BinOp::Gt => ("gt", Custom, None, 1),
            BinOp::Eq => ("eq", Custom, None, 1),
            BinOp::Ne => ("ne", Custom, None, 1),
            BinOp::Second => ("second", Custom, None, 0),
        };
        OpFacts { name, c_syntax, neutral, cost }
    }

    /// The printed name.
    pub fn name(self) -> &'static str {
        self.facts().name
    }

    /// The neutral element, when this operation can start an accumulation from scratch.
    ///
    /// ```
    /// use rocannl_arrayjit::ops::BinOp;
    /// assert_eq!(BinOp::Add.neutral(), Some(0.0));
    /// assert_eq!(BinOp::Max.neutral(), Some(f64::NEG_INFINITY));
    /// assert_eq!(BinOp::Sub.neutral(), None);
    /// ```
    pub fn neutral(self) -> Option<f64> {
        self.facts().neutral
    }

    /// Whether `(a ⊕ b) ⊕ c = a ⊕ (b ⊕ c)` and `a ⊕ b = b ⊕ a` (up to rounding), so that a
    /// reduction with this operator may be reordered.
    pub fn is_reorderable(self) -> bool {
        matches!(self, BinOp::Add | BinOp::Mul | BinOp::Max | BinOp::Min)
    }

    /// The reference semantics.
    ///
    /// ```
    /// use rocannl_arrayjit::ops::BinOp;
    /// assert_eq!(BinOp::Lt.apply(1.0, 2.0), 1.0);
    /// assert!(BinOp::Max.apply(f64::NAN, 1.0).is_nan());
    /// assert_eq!(BinOp::Div.apply(1.0, 0.0), f64::INFINITY);
    /// ```
    pub fn apply(self, a: f64, b: f64) -> f64 {
        self.compute(a, b)
    }

    /// The operation computed in `f32`, as compiled `f32` code computes it.
    ///
    /// ```
    /// use rocannl_arrayjit::ops::BinOp;
    /// assert_eq!(BinOp::Mul.apply_f32(3e38, 10.0), f32::INFINITY);
    /// ```
    pub fn apply_f32(self, a: f32, b: f32) -> f32 {
        self.compute(a, b)
    }

    /// The one definition of the operation, in either precision.
    #[inline(always)]
    pub(crate) fn compute<T: Real>(self, a: T, b: T) -> T {
        match self {
            BinOp::Add => a + b,
            BinOp::Sub => a - b,
            BinOp::Mul => a * b,
            BinOp::Div => a / b,
            BinOp::Pow => a.powf(b),
            BinOp::Max => {
                if a > b || a.is_nan() {
                    a
                } else {
                    b
                }
            }
            BinOp::Min => {
                if a < b || a.is_nan() {
                    a
                } else {
                    b
                }
            }
            BinOp::Lt => T::of_bool(a < b),
            BinOp::Le => T::of_bool(a <= b),
            BinOp::Gt => T::of_bool(a > b),
            BinOp::Eq => T::of_bool(a == b),
            BinOp::Ne => T::of_bool(a != b),
            BinOp::Second => b,
        }
    }
}

/// Ternary operations.
#[derive(Copy, Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum TernOp {
    /// `where(c, a, b) = c != 0 ? a : b`.
    Where,
    /// `fma(a, b, c) = a * b + c`, rounded once.
    Fma,
}

impl TernOp {
    /// Every ternary operation.
    pub const ALL: [TernOp; 2] = [TernOp::Where, TernOp::Fma];

    /// The table of facts.
    pub fn facts(self) -> OpFacts {
        match self {
            TernOp::Where => {
                OpFacts { name: "where", c_syntax: CSyntax::Custom, neutral: None, cost: 1 }
            }
            TernOp::Fma => {
                OpFacts { name: "fma", c_syntax: CSyntax::Func("fma"), neutral: None, cost: 1 }
            }
        }
    }

    /// The printed name.
    pub fn name(self) -> &'static str {
        self.facts().name
    }

    /// The reference semantics.
    ///
    /// ```
    /// use rocannl_arrayjit::ops::TernOp;
    /// assert_eq!(TernOp::Where.apply(0.0, 1.0, 2.0), 2.0);
    /// assert_eq!(TernOp::Fma.apply(2.0, 3.0, 1.0), 7.0);
    /// ```
    pub fn apply(self, a: f64, b: f64, c: f64) -> f64 {
        self.compute(a, b, c)
    }

    /// The operation computed in `f32`, as compiled `f32` code computes it.
    ///
    /// ```
    /// use rocannl_arrayjit::ops::TernOp;
    /// assert_eq!(TernOp::Fma.apply_f32(2.0, 3.0, 1.0), 7.0);
    /// ```
    pub fn apply_f32(self, a: f32, b: f32, c: f32) -> f32 {
        self.compute(a, b, c)
    }

    /// The one definition of the operation, in either precision.
    #[inline(always)]
    pub(crate) fn compute<T: Real>(self, a: T, b: T, c: T) -> T {
        match self {
            TernOp::Where => {
                if a != T::ZERO {
                    b
                } else {
                    c
                }
            }
            TernOp::Fma => a.mul_add(b, c),
        }
    }
}

/// The arithmetic the op table is defined with, in `f64` (the reference semantics) and `f32`
/// (what compiled `f32` code computes: the same formulas, the C library's `f32` functions).
pub(crate) trait Real:
    Copy
    + PartialOrd
    + std::ops::Add<Output = Self>
    + std::ops::Sub<Output = Self>
    + std::ops::Mul<Output = Self>
    + std::ops::Div<Output = Self>
    + std::ops::Neg<Output = Self>
{
    const ZERO: Self;
    const ONE: Self;
    fn of_bool(b: bool) -> Self {
        if b { Self::ONE } else { Self::ZERO }
    }
    fn clamp01(self) -> Self;
    fn exp(self) -> Self;
    fn ln(self) -> Self;
    fn exp2(self) -> Self;
    fn log2(self) -> Self;
    fn sqrt(self) -> Self;
    fn sin(self) -> Self;
    fn cos(self) -> Self;
    fn tanh(self) -> Self;
    fn erf(self) -> Self;
    fn abs(self) -> Self;
    fn powf(self, b: Self) -> Self;
    fn mul_add(self, b: Self, c: Self) -> Self;
    fn is_nan(self) -> bool;
}

macro_rules! real {
    ($t:ty, $exp:path, $ln:path, $exp2:path, $log2:path, $tanh:path, $erf:path, $pow:path) => {
        impl Real for $t {
            const ZERO: Self = 0.0;
            const ONE: Self = 1.0;
            #[inline(always)]
            fn clamp01(self) -> Self {
                self.clamp(0.0, 1.0)
            }
            #[inline(always)]
            fn exp(self) -> Self {
                $exp(self)
            }
            #[inline(always)]
            fn ln(self) -> Self {
                $ln(self)
            }
            #[inline(always)]
            fn exp2(self) -> Self {
                $exp2(self)
            }
            #[inline(always)]
            fn log2(self) -> Self {
                $log2(self)
            }
            #[inline(always)]
            fn sqrt(self) -> Self {
                <$t>::sqrt(self)
            }
            #[inline(always)]
            fn sin(self) -> Self {
                <$t>::sin(self)
            }
            #[inline(always)]
            fn cos(self) -> Self {
                <$t>::cos(self)
            }
            #[inline(always)]
            fn tanh(self) -> Self {
                $tanh(self)
            }
            #[inline(always)]
            fn erf(self) -> Self {
                $erf(self)
            }
            #[inline(always)]
            fn abs(self) -> Self {
                <$t>::abs(self)
            }
            #[inline(always)]
            fn powf(self, b: Self) -> Self {
                $pow(self, b)
            }
            #[inline(always)]
            fn mul_add(self, b: Self, c: Self) -> Self {
                <$t>::mul_add(self, b, c)
            }
            #[inline(always)]
            fn is_nan(self) -> bool {
                <$t>::is_nan(self)
            }
        }
    };
}

// `f32` `exp`, `log`, `exp2`, `log2`, `tanh`, `erf` and `pow` are this crate's
// (`crate::math`), which every backend computes bit for bit; `f64` keeps the C library's.
real!(
    f32,
    crate::math::exp_f32,
    crate::math::log_f32,
    crate::math::exp2_f32,
    crate::math::log2_f32,
    crate::math::tanh_f32,
    crate::math::erf_f32,
    crate::math::pow_f32
);
real!(f64, f64::exp, f64::ln, f64::exp2, f64::log2, f64::tanh, c_erf, f64::powf);

// The error function of the C library, the one compiled `f64` code calls: Rust's own is not
// stable, and computing exactly what the native backends compute is the interpreter's job.
unsafe extern "C" {
    #[link_name = "erf"]
    safe fn c_erf(x: f64) -> f64;
}

/// The counter-based generator behind `FetchOp::Uniform`: SplitMix64's finalizer applied to
/// `seed + (offset + 1) · γ` (γ the golden-ratio constant), keeping the top 24 bits, so the
/// value is a multiple of `2^-24` in `[0, 1)`, exact in `f32`, and depends only on the seed and
/// the cell's offset. Every backend implements exactly this function.
///
/// ```
/// use rocannl_arrayjit::ops::uniform;
/// let x = uniform(42, 7);
/// assert!((0.0..1.0).contains(&x));
/// assert_eq!(x, uniform(42, 7));
/// assert_ne!(x, uniform(43, 7));
/// ```
pub fn uniform(seed: u64, offset: u64) -> f64 {
    let mut z = seed.wrapping_add(offset.wrapping_add(1).wrapping_mul(SPLITMIX_GAMMA));
    z = (z ^ (z >> 30)).wrapping_mul(SPLITMIX_M1);
    z = (z ^ (z >> 27)).wrapping_mul(SPLITMIX_M2);
    z ^= z >> 31;
    (z >> 40) as f64 * (1.0 / 16_777_216.0)
}

/// SplitMix64's increment, the golden-ratio constant.
pub const SPLITMIX_GAMMA: u64 = 0x9E37_79B9_7F4A_7C15;
/// SplitMix64's first finalizer multiplier.
pub const SPLITMIX_M1: u64 = 0xBF58_476D_1CE4_E5B9;
/// SplitMix64's second finalizer multiplier.
pub const SPLITMIX_M2: u64 = 0x94D0_49BB_1331_11EB;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_unique() {
        let mut names: Vec<&str> = UnOp::ALL.iter().map(|o| o.name()).collect();
        names.extend(BinOp::ALL.iter().map(|o| o.name()));
        names.extend(TernOp::ALL.iter().map(|o| o.name()));
        let n = names.len();
        names.sort();
        names.dedup();
        assert_eq!(names.len(), n);
    }

    #[test]
    fn neutral_elements_are_neutral() {
        for op in BinOp::ALL {
            if let Some(e) = op.neutral() {
                for x in [-3.5, 0.0, 2.0, 1e10] {
                    assert_eq!(op.apply(e, x), x, "{op:?}");
                    assert_eq!(op.apply(x, e), x, "{op:?}");
                }
            }
        }
    }

    #[test]
    fn min_max_propagate_nan() {
        for op in [BinOp::Max, BinOp::Min] {
            assert!(op.apply(f64::NAN, 1.0).is_nan());
            assert!(op.apply(1.0, f64::NAN).is_nan());
        }
        assert!(UnOp::Relu.apply(f64::NAN).is_nan());
    }

    #[test]
    fn uniform_is_spread_over_unit_interval() {
        let xs: Vec<f64> = (0..1000).map(|i| uniform(1, i)).collect();
        let mean = xs.iter().sum::<f64>() / 1000.0;
        assert!((mean - 0.5).abs() < 0.05, "{mean}");
        assert!(xs.iter().all(|x| (0.0..1.0).contains(x)));
    }
}

#[cfg(test)]
mod rounding_tests {
    use super::*;

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

//! The table of per-operation facts, and precisions.
//!
//! Every backend needs the same handful of facts about an operation: its printed name, how
//! compiled code computes it ([`Lowering`], read by the C renderer and the libgccjit builder
//! alike), what element is neutral when it is used to accumulate, and what it computes.
//! Keeping them in one place (the `facts` methods below) means a new operation is added once
//! and every backend, printer and optimization pass sees it. [`UnOp::apply`], [`BinOp::apply`]
//! and [`TernOp::apply`] are the reference semantics (in `f64`) that the interpreter uses and
//! the compiled backends are tested against.

mod lowering;
mod prec;
mod real;

pub use lowering::{Arith, Compare, Helper, Libm, Lowering};
pub use prec::{Prec, bf16_from_f64, f16_from_f64};
pub(crate) use real::Real;

use crate::math::Function;

/// The facts about one operation.
#[derive(Copy, Clone, Debug, PartialEq)]
pub struct OpFacts {
    /// The printed name used by every IR printer.
    pub name: &'static str,
    /// How compiled code computes it.
    pub lowering: Lowering,
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
        use Lowering::*;
        let (name, lowering, cost) = match self {
            UnOp::Identity => ("id", Operand(0), 0),
            UnOp::Neg => ("neg", Neg, 1),
            UnOp::Relu => ("relu", Helper(lowering::Helper::Relu), 1),
            UnOp::Sat01 => ("sat01", Helper(lowering::Helper::Sat01), 2),
            UnOp::Exp => ("exp", Math(Function::Exp), 10),
            UnOp::Log => ("log", Math(Function::Log), 10),
            UnOp::Exp2 => ("exp2", Math(Function::Exp2), 10),
            UnOp::Log2 => ("log2", Math(Function::Log2), 10),
            UnOp::Sqrt => ("sqrt", Libm(lowering::Libm::Builtin("sqrt")), 4),
            UnOp::Recip => ("recip", Recip, 4),
            UnOp::Sin => ("sin", Math(Function::Sin), 10),
            UnOp::Cos => ("cos", Math(Function::Cos), 10),
            UnOp::Tanh => ("tanh", Math(Function::Tanh), 12),
            UnOp::Erf => ("erf", Math(Function::Erf), 12),
            UnOp::Sigmoid => ("sigmoid", Helper(lowering::Helper::Sigmoid), 12),
            UnOp::Abs => ("abs", Libm(lowering::Libm::Builtin("fabs")), 1),
            UnOp::Not => ("not", Compare(lowering::Compare::Eq), 1),
        };
        OpFacts { name, lowering, neutral: None, cost }
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
    /// every step rounded to `f32`; `exp`, `log`, `exp2`, `log2`, `sin`, `cos`, `tanh` and
    /// `erf` from [`crate::math`], `sqrt` correctly rounded).
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
        use Lowering::*;
        use lowering::Compare as C;
        let (name, lowering, neutral, cost) = match self {
            BinOp::Add => ("add", Arith(lowering::Arith::Add), Some(0.0), 1),
            BinOp::Sub => ("sub", Arith(lowering::Arith::Sub), None, 1),
            BinOp::Mul => ("mul", Arith(lowering::Arith::Mul), Some(1.0), 1),
            BinOp::Div => ("div", Arith(lowering::Arith::Div), None, 4),
            BinOp::Pow => ("pow", Math(Function::Pow), None, 20),
            BinOp::Max => ("max", Helper(lowering::Helper::Max), Some(f64::NEG_INFINITY), 2),
            BinOp::Min => ("min", Helper(lowering::Helper::Min), Some(f64::INFINITY), 2),
            BinOp::Lt => ("lt", Compare(C::Lt), None, 1),
            BinOp::Le => ("le", Compare(C::Le), None, 1),
            BinOp::Gt => ("gt", Compare(C::Gt), None, 1),
            BinOp::Eq => ("eq", Compare(C::Eq), None, 1),
            BinOp::Ne => ("ne", Compare(C::Ne), None, 1),
            BinOp::Second => ("second", Operand(1), None, 0),
        };
        OpFacts { name, lowering, neutral, cost }
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
        let (name, lowering) = match self {
            TernOp::Where => ("where", Lowering::Where),
            TernOp::Fma => ("fma", Lowering::Libm(Libm::Builtin("fma"))),
        };
        OpFacts { name, lowering, neutral: None, cost: 1 }
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

    /// Every code generator indexes a lowering's operands as the kind says: each table entry
    /// must give its operation's number of operands.
    #[test]
    fn lowerings_fit_their_operations_arity() {
        let fits = |l: Lowering, n: usize| match l {
            Lowering::Operand(k) => k < n,
            Lowering::Neg | Lowering::Recip => n == 1,
            Lowering::Arith(_) => n == 2,
            Lowering::Compare(_) => n <= 2,
            Lowering::Libm(_) => true,
            Lowering::Math(f) => f.arity() == n,
            Lowering::Helper(h) => matches!(h, Helper::Max | Helper::Min) == (n == 2),
            Lowering::Where => n == 3,
        };
        let facts = UnOp::ALL.iter().map(|o| (o.facts(), 1));
        let facts = facts.chain(BinOp::ALL.iter().map(|o| (o.facts(), 2)));
        for (f, n) in facts.chain(TernOp::ALL.iter().map(|o| (o.facts(), 3))) {
            assert!(fits(f.lowering, n), "{}", f.name);
        }
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

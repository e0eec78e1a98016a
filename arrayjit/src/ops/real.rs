//! The arithmetic the op table's reference semantics are written in.
//!
//! One generic definition of each operation (`UnOp::compute` and its siblings) runs in
//! `f64` for the reference semantics and in `f32` as compiled `f32` code computes; this trait is
//! what that definition needs from a number type.

/// The arithmetic the op table is defined with, in `f64` (the reference semantics) and `f32`
/// (what compiled `f32` code computes: the same formulas, the special functions of `crate::math`).
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
    (
        $t:ty,
        $exp:path,
        $ln:path,
        $exp2:path,
        $log2:path,
        $sin:path,
        $cos:path,
        $tanh:path,
        $erf:path,
        $pow:path
    ) => {
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
                $sin(self)
            }
            #[inline(always)]
            fn cos(self) -> Self {
                $cos(self)
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

// `f32` `exp`, `log`, `exp2`, `log2`, `sin`, `cos`, `tanh`, `erf` and `pow` are this crate's
// (`crate::math`), which every backend computes bit for bit; `f64` keeps the C library's.
real!(
    f32,
    crate::math::exp_f32,
    crate::math::log_f32,
    crate::math::exp2_f32,
    crate::math::log2_f32,
    crate::math::sin_f32,
    crate::math::cos_f32,
    crate::math::tanh_f32,
    crate::math::erf_f32,
    crate::math::pow_f32
);
real!(
    f64,
    f64::exp,
    f64::ln,
    f64::exp2,
    f64::log2,
    f64::sin,
    f64::cos,
    f64::tanh,
    c_erf,
    f64::powf
);

// The error function of the C library, the one compiled `f64` code calls: Rust's own is not
// stable, and computing exactly what the native backends compute is the interpreter's job.
unsafe extern "C" {
    #[link_name = "erf"]
    safe fn c_erf(x: f64) -> f64;
}

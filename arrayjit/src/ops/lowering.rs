//! How compiled code computes each operation: the op table's column for the code generators.
//!
//! The C-family renderer (`backend::c_syntax`, for CUDA C and the C listing of gccjit's code)
//! and the libgccjit builder (`backend::gccjit::ops`) both read an operation's [`Lowering`]
//! from the table ([`super::OpFacts::lowering`]) and each turns every *kind* of lowering into
//! code in one place. An operation that computes like an existing one (another C library
//! function, another comparison, another `crate::math` function) is one table entry; one that
//! needs a new [`Helper`] adds that helper's definition once per code generator.

use crate::math;

/// How compiled code computes an operation of the table.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub enum Lowering {
    /// Operand `k` unchanged (`id` returns its only operand, `second` its second).
    Operand(usize),
    /// `-a`.
    Neg,
    /// An arithmetic operator of the compute type.
    Arith(Arith),
    /// `1 / a`.
    Recip,
    /// `1` where `a ⋈ b` holds, else `0`; a unary operation compares its operand with `0`.
    Compare(Compare),
    /// A C library function: `name` in `f64`, `name` + `f` in `f32`.
    Libm(Libm),
    /// In `f32`, a function of [`crate::math`] (inline in gccjit's loops, a prelude helper
    /// `rc_{name}f` in C); in `f64`, the C library's (see [`math::Function::f64_libm`]).
    Math(math::Function),
    /// A small helper each code generator defines once ([`Helper`]).
    Helper(Helper),
    /// `b` where `a != 0`, else `c`.
    Where,
}

/// An arithmetic operator.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub enum Arith {
    /// `a + b`.
    Add,
    /// `a - b`.
    Sub,
    /// `a * b`.
    Mul,
    /// `a / b`.
    Div,
}

impl Arith {
    /// The C operator.
    pub fn c_operator(self) -> &'static str {
        match self {
            Arith::Add => "+",
            Arith::Sub => "-",
            Arith::Mul => "*",
            Arith::Div => "/",
        }
    }
}

/// A comparison giving `1` or `0`.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub enum Compare {
    /// `a < b`.
    Lt,
    /// `a <= b`.
    Le,
    /// `a > b`.
    Gt,
    /// `a == b`.
    Eq,
    /// `a != b`.
    Ne,
}

impl Compare {
    /// The C operator.
    pub fn c_operator(self) -> &'static str {
        match self {
            Compare::Lt => "<",
            Compare::Le => "<=",
            Compare::Gt => ">",
            Compare::Eq => "==",
            Compare::Ne => "!=",
        }
    }
}

/// A C library function and how a compiler may treat it.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub enum Libm {
    /// A function GCC knows as a builtin (it may expand it inline: `sqrt` becomes the
    /// instruction, since generated code does not set `errno`).
    Builtin(&'static str),
    /// A function called as a plain external one, which GCC cannot rewrite (it turns
    /// `__builtin_pow(x, 0.5)` into `sqrt(x)`, which differs at `-0` and `-inf`).
    Extern(&'static str),
}

impl Libm {
    /// The function's name in `f64` (the `f32` one adds `f`).
    pub fn name(self) -> &'static str {
        match self {
            Libm::Builtin(n) | Libm::Extern(n) => n,
        }
    }
}

/// Operations whose code is a small helper, defined once by each code generator: a function
/// `rc_{name}` / `rc_{name}f` in the C prelude, a few libgccjit selections in gccjit.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub enum Helper {
    /// `a < 0 ? 0 : a` (NaN stays NaN).
    Relu,
    /// `a` clamped to `[0, 1]`.
    Sat01,
    /// `1 / (1 + exp(-a))`, with `exp` lowered as [`super::UnOp::Exp`] is.
    Sigmoid,
    /// `(a > b || a != a) ? a : b`: the maximum, propagating NaN.
    Max,
    /// `(a < b || a != a) ? a : b`: the minimum, propagating NaN.
    Min,
}

impl Helper {
    /// Every helper, in the order the C prelude defines them.
    pub const ALL: [Helper; 5] =
        [Helper::Max, Helper::Min, Helper::Relu, Helper::Sat01, Helper::Sigmoid];

    /// The helper's name (its C function is `rc_{name}`, `rc_{name}f` in `f32`).
    pub fn name(self) -> &'static str {
        match self {
            Helper::Relu => "relu",
            Helper::Sat01 => "sat01",
            Helper::Sigmoid => "sigmoid",
            Helper::Max => "max",
            Helper::Min => "min",
        }
    }
}

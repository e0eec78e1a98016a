//! The functions printed as C: the helpers the C-family renderer puts before every CUDA kernel
//! and into the C view of gccjit's code, the same operations as every other backend's.

use super::Emit;

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
    type D = String;
    fn f(&mut self, c: f32) -> String {
        // Exact: the shortest decimal that reads back as `c`, with an `f` suffix.
        let s = format!("{c:?}");
        format!("{s}f")
    }
    fn u(&mut self, c: u32) -> String {
        format!("{c:#x}u")
    }
    fn d(&mut self, c: f64) -> String {
        // Exact, as for `f32`; Rust's shortest form may lack a point (`1e-5`), C accepts it.
        format!("{c:?}")
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
    fn widen(&mut self, a: String) -> String {
        format!("((double){a})")
    }
    fn narrow(&mut self, a: String) -> String {
        format!("((float){a})")
    }
    fn dadd(&mut self, a: String, b: String) -> String {
        format!("({a} + {b})")
    }
    fn dsub(&mut self, a: String, b: String) -> String {
        format!("({a} - {b})")
    }
    fn dmul(&mut self, a: String, b: String) -> String {
        format!("({a} * {b})")
    }
    fn ddiv(&mut self, a: String, b: String) -> String {
        format!("({a} / {b})")
    }
    fn dfma(&mut self, a: String, b: String, c: String) -> String {
        format!("fma({a}, {b}, {c})")
    }
    fn dlt_select(&mut self, a: String, b: String, x: String, y: String) -> String {
        format!("({a} < {b} ? {x} : {y})")
    }
    fn keep(&mut self, a: String) -> String {
        self.var("float", a)
    }
    fn keep_u(&mut self, a: String) -> String {
        self.var("unsigned int", a)
    }
    fn keep_d(&mut self, a: String) -> String {
        self.var("double", a)
    }
}

/// A function defined in [`crate::math`].
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub enum Function {
    /// [`super::exp`].
    Exp,
    /// [`super::exp2`].
    Exp2,
    /// [`super::log`].
    Log,
    /// [`super::log2`].
    Log2,
    /// [`super::tanh`].
    Tanh,
    /// [`super::erf`].
    Erf,
    /// [`super::pow`], of two arguments.
    Pow,
    /// [`super::sin`].
    Sin,
    /// [`super::cos`].
    Cos,
}

impl Function {
    /// Every function.
    pub const ALL: [Function; 9] = [
        Function::Exp,
        Function::Exp2,
        Function::Log,
        Function::Log2,
        Function::Tanh,
        Function::Erf,
        Function::Pow,
        Function::Sin,
        Function::Cos,
    ];

    /// The function's name, as its C library counterpart's (`exp`, `pow`, ...).
    pub fn name(self) -> &'static str {
        match self {
            Function::Exp => "exp",
            Function::Exp2 => "exp2",
            Function::Log => "log",
            Function::Log2 => "log2",
            Function::Tanh => "tanh",
            Function::Erf => "erf",
            Function::Pow => "pow",
            Function::Sin => "sin",
            Function::Cos => "cos",
        }
    }

    /// What compiled `f64` code calls instead: the C library's function, as a builtin except
    /// for `pow`, which GCC would rewrite (see [`crate::ops::Libm::Extern`]).
    pub fn f64_libm(self) -> crate::ops::Libm {
        match self {
            Function::Pow => crate::ops::Libm::Extern("pow"),
            f => crate::ops::Libm::Builtin(f.name()),
        }
    }

    /// How many arguments the function takes.
    pub fn arity(self) -> usize {
        if self == Function::Pow { 2 } else { 1 }
    }

    /// The function's operations on `args` (one value, two for [`Function::Pow`]).
    ///
    /// ```
    /// use rocannl_arrayjit::math::{Function, pow_f32};
    /// assert_eq!(Function::Pow.arity(), 2);
    /// assert_eq!(pow_f32(2.0, 10.0), 1024.0);
    /// ```
    pub fn emit<E: Emit>(self, e: &mut E, args: &[E::F]) -> E::F {
        let x = args[0].clone();
        match self {
            Function::Exp => super::exp(e, x),
            Function::Exp2 => super::exp2(e, x),
            Function::Log => super::log(e, x),
            Function::Log2 => super::log2(e, x),
            Function::Tanh => super::tanh(e, x),
            Function::Erf => super::erf(e, x),
            Function::Pow => super::pow(e, x, args[1].clone()),
            Function::Sin => super::sin(e, x),
            Function::Cos => super::cos(e, x),
        }
    }
}

/// A C function `float name(float x)` (`float name(float x, float y)` for
/// [`Function::Pow`]) computing `f`, with `qualifier` before its return type (`static inline`,
/// or `__device__` for CUDA). It needs the helpers `rc_f32_bits` and `rc_bits_f32` (bit casts),
/// `fmaf` and `fma`.
///
/// ```
/// use rocannl_arrayjit::math::{Function, c_function};
/// let c = c_function("static", "rc_expf", Function::Exp);
/// assert!(c.starts_with("static float rc_expf(float x) {"));
/// assert!(c.contains("fmaf("));
/// let c = c_function("static", "rc_powf", Function::Pow);
/// assert!(c.starts_with("static float rc_powf(float x, float y) {"));
/// ```
pub fn c_function(qualifier: &str, name: &str, f: Function) -> String {
    let mut t = CText { body: String::new(), next: 0 };
    let names = ["x", "y"];
    let args: Vec<String> = names[..f.arity()].iter().map(|s| s.to_string()).collect();
    let params: Vec<String> = args.iter().map(|a| format!("float {a}")).collect();
    let result = f.emit(&mut t, &args);
    format!(
        "{qualifier} float {name}({}) {{\n{}  return {result};\n}}\n",
        params.join(", "),
        t.body
    )
}

#[cfg(test)]
mod tests {
    use super::super::exp::{EXP_POLY, TANH_POLY};
    use super::*;

    #[test]
    fn the_c_text_is_the_same_sequence() {
        let c = c_function("static inline", "rc_tanhf", Function::Tanh);
        // One fused multiply-add per polynomial coefficient past the first, three in the
        // reduction and two closing exp's polynomial.
        let fmas = c.matches("fmaf(").count();
        assert_eq!(fmas, (TANH_POLY.len() - 1) + 1 + (EXP_POLY.len() - 1) + 3 + 2, "{c}");
        assert!(c.contains("return rc_bits_f32("));
    }

    #[test]
    fn every_function_prints_without_non_finite_literals() {
        for f in Function::ALL {
            let c = c_function("static", "g", f);
            for bad in ["inf", "NaN", "nan"] {
                assert!(!c.contains(bad), "{f:?}: {c}");
            }
        }
    }
}

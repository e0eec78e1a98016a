//! A C-family renderer of the low-level IR, shared by CUDA C and the C view of gccjit code.
//!
//! The renderer writes statements and expressions; a [`Dialect`] decides the few things that
//! differ: function qualifiers of the helper prelude, how runtime symbols are reached, and how
//! f16/bf16 are converted. Operations are written from the op table's [`Lowering`] (one arm
//! per kind of lowering in `lowered`, none per operation); those needing more than an operator
//! or a libm call (NaN-propagating `max`, `relu`, the `f32` special functions, the
//! counter-based generator) call small helpers defined once in the [`prelude`].

use std::fmt::Write as _;

use crate::low_level::{
    Epilogue, Expr, Gemm, GemmOperand, IdxVar, Index, Limit, Map, Program, Stmt, Var,
};
use crate::math;
use crate::ops::{Helper, Lowering, Prec, SPLITMIX_GAMMA, SPLITMIX_M1, SPLITMIX_M2};
use crate::tnode::{NodeId, row_major_strides};

/// The nodes a run of statements touches (what each step function loads pointers for).
pub use crate::low_level::nodes_of;

/// The C dialect being written.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub enum Dialect {
    /// Plain C (the view of what the gccjit backend builds); symbols are `syms[slot]`.
    C,
    /// CUDA C for NVRTC; symbols are kernel parameters `sym{slot}`.
    Cuda,
}

impl Dialect {
    fn qualifier(self) -> &'static str {
        match self {
            Dialect::C => "static inline",
            Dialect::Cuda => "__device__ __forceinline__",
        }
    }
}

/// The C type used to compute in `prec`.
pub fn compute_ctype(prec: Prec) -> &'static str {
    if prec == Prec::F64 { "double" } else { "float" }
}

/// The C type of a buffer element of precision `prec`.
pub fn storage_ctype(prec: Prec) -> &'static str {
    match prec {
        Prec::F16 | Prec::Bf16 => "unsigned short",
        Prec::F32 => "float",
        Prec::F64 => "double",
        Prec::U32 => "unsigned int",
    }
}

/// The helper functions every rendered unit starts with.
pub fn prelude(d: Dialect) -> String {
    let q = d.qualifier();
    let mut s = String::new();
    let _ = writeln!(s, "/* rocannl helpers */");
    match d {
        Dialect::Cuda => cuda_conversions(&mut s, q),
        Dialect::C => c_externs(&mut s),
    }
    bit_casts(&mut s, d);
    // A computed value stored as an id: toward zero, saturating, `nan` to 0 (as Rust's `as`).
    let _ = writeln!(
        s,
        "{q} unsigned int rc_to_u32(double x) {{ return (x != x || x <= 0) ? 0u : (x >= 4294967295.0 ? 4294967295u : (unsigned int)x); }}"
    );
    // The special functions in `f32` are the operations of `crate::math`, as in every
    // backend; in `f64`, the library's.
    for f in math::Function::ALL {
        let name = f.name();
        s.push_str(&math::c_function(q, &format!("rc_{name}f"), f));
        let (params, args) =
            if f.arity() == 2 { ("double x, double y", "x, y") } else { ("double x", "x") };
        let libm = f.f64_libm().name();
        let _ = writeln!(s, "{q} double rc_{name}({params}) {{ return {libm}({args}); }}");
    }
    for (t, sfx) in [("float", "f"), ("double", "")] {
        for h in Helper::ALL {
            let _ = writeln!(s, "{q} {t} rc_{}{sfx}{}", h.name(), helper_definition(h, t, sfx));
        }
        uniform_definition(&mut s, q, t, sfx);
    }
    s
}

/// A [`Helper`]'s C definition after its name: parameters and body, in C type `t` whose
/// functions take the suffix `sfx`.
fn helper_definition(h: Helper, t: &str, sfx: &str) -> String {
    match h {
        Helper::Max => format!("({t} a, {t} b) {{ return (a > b || a != a) ? a : b; }}"),
        Helper::Min => format!("({t} a, {t} b) {{ return (a < b || a != a) ? a : b; }}"),
        Helper::Relu => format!("({t} x) {{ return x < 0 ? ({t})0 : x; }}"),
        Helper::Sat01 => format!("({t} x) {{ return x < 0 ? ({t})0 : (x > 1 ? ({t})1 : x); }}"),
        Helper::Sigmoid => format!("({t} x) {{ return ({t})1 / (({t})1 + rc_exp{sfx}(-x)); }}"),
    }
}

/// The counter-based generator ([`crate::ops::uniform`]) in C type `t`.
fn uniform_definition(s: &mut String, q: &str, t: &str, sfx: &str) {
    let _ = writeln!(
        s,
        "{q} {t} rc_uniform{sfx}(unsigned long long seed, long long off) {{\n  \
         unsigned long long z = seed + ((unsigned long long)off + 1ULL) * {SPLITMIX_GAMMA:#x}ULL;\n  \
         z = (z ^ (z >> 30)) * {SPLITMIX_M1:#x}ULL;\n  \
         z = (z ^ (z >> 27)) * {SPLITMIX_M2:#x}ULL;\n  \
         z ^= z >> 31;\n  \
         return ({t})(long long)(z >> 40) * ({t})(1.0 / 16777216.0);\n}}"
    );
}

/// CUDA's f16/bf16 conversions, by PTX instructions.
fn cuda_conversions(s: &mut String, q: &str) {
    let _ = writeln!(
        s,
        "{q} float rc_f16_to_f32(unsigned short h) {{ float f; asm(\"cvt.f32.f16 %0, %1;\" : \"=f\"(f) : \"h\"(h)); return f; }}"
    );
    let _ = writeln!(
        s,
        "{q} unsigned short rc_f32_to_f16(float f) {{ unsigned short h; asm(\"cvt.rn.f16.f32 %0, %1;\" : \"=h\"(h) : \"f\"(f)); return h; }}"
    );
    let _ = writeln!(
        s,
        "{q} float rc_bf16_to_f32(unsigned short h) {{ return __uint_as_float(((unsigned int)h) << 16); }}"
    );
    let _ = writeln!(
        s,
        "{q} unsigned short rc_f32_to_bf16(float f) {{ unsigned short h; asm(\"cvt.rn.bf16.f32 %0, %1;\" : \"=h\"(h) : \"f\"(f)); return h; }}"
    );
}

/// What the C view of gccjit's code calls outside itself: the f16/bf16 conversions and the
/// shape-generic kernels ([`crate::kernels`]).
fn c_externs(s: &mut String) {
    let _ = writeln!(s, "extern float rc_f16_to_f32(unsigned short h);");
    let _ = writeln!(s, "extern unsigned short rc_f32_to_f16(float f);");
    let _ = writeln!(s, "extern float rc_bf16_to_f32(unsigned short h);");
    let _ = writeln!(s, "extern unsigned short rc_f32_to_bf16(float f);");
    for (t, p) in [("float", "f32"), ("double", "f64")] {
        let _ = writeln!(
            s,
            "extern void rc_gemm_{p}({t} *c, const {t} *a, const {t} *b, const long long *desc);"
        );
        let _ = writeln!(s, "extern void rc_map_{p}({t} *const *ptrs, const long long *desc);");
    }
    let _ = writeln!(
        s,
        "extern void rc_gemm_bf16(float *c, const unsigned short *a, const unsigned short *b, const long long *desc);"
    );
}

/// The bit casts between `float` and `unsigned int` the `f32` special functions use.
fn bit_casts(s: &mut String, d: Dialect) {
    let q = d.qualifier();
    let (to_bits, from_bits) = match d {
        Dialect::Cuda => ("return __float_as_uint(x);", "return __uint_as_float(u);"),
        Dialect::C => (
            "unsigned int u; __builtin_memcpy(&u, &x, 4); return u;",
            "float x; __builtin_memcpy(&x, &u, 4); return x;",
        ),
    };
    let _ = writeln!(s, "{q} unsigned int rc_f32_bits(float x) {{ {to_bits} }}");
    let _ = writeln!(s, "{q} float rc_bits_f32(unsigned int u) {{ {from_bits} }}");
}

/// Renders statements and expressions of one program.
pub struct CRenderer<'a> {
    /// The program.
    pub prog: &'a Program,
    /// The dialect.
    pub dialect: Dialect,
    /// Whether every access is preceded by a bounds check (C dialect only).
    pub bounds_check: bool,
    /// Whether a `uniform`'s seed is a number into the step's `seeds` array (gccjit's
    /// canonical steps, whose calls pass their seeds) rather than the seed itself.
    pub seed_numbers: bool,
}

impl CRenderer<'_> {
    /// The name of a node's typed pointer.
    pub fn ptr_name(n: NodeId) -> String {
        format!("p_n{}", n.0)
    }

    /// Renders an index.
    pub fn index(&self, i: &Index) -> String {
        let mut parts = Vec::new();
        for &(c, x) in &i.terms {
            let v = match x {
                IdxVar::Loop(v) => v.to_string(),
                IdxVar::Sym(s) => {
                    let slot = self.prog.symbol_slot(s).unwrap_or(0);
                    match self.dialect {
                        Dialect::C => format!("syms[{slot}]"),
                        Dialect::Cuda => format!("sym{slot}"),
                    }
                }
            };
            parts.push(if c == 1 { v } else { format!("{c}LL * {v}") });
        }
        if parts.is_empty() {
            return format!("{}LL", i.offset);
        }
        let mut s = parts.join(" + ");
        match i.offset {
            0 => {}
            o if o > 0 => s.push_str(&format!(" + {o}LL")),
            o => s.push_str(&format!(" - {}LL", -o)),
        }
        s
    }

    /// Renders the flat offset of a cell.
    pub fn cell(&self, node: NodeId, idx: &[Index]) -> String {
        let dims = &self.prog.nodes[&node].dims;
        let strides = row_major_strides(dims);
        let mut terms = Vec::new();
        let mut offset = 0;
        for (i, s) in idx.iter().zip(strides) {
            terms.extend(i.terms.iter().map(|&(c, x)| (c * s as i64, x)));
            offset += i.offset * s as i64;
        }
        format!("{}[{}]", Self::ptr_name(node), self.index(&Index::new(terms, offset)))
    }

    fn load(&self, node: NodeId, idx: &[Index], ty: &str) -> String {
        let cell = self.cell(node, idx);
        let v = match self.prog.nodes[&node].prec {
            Prec::F16 => format!("rc_f16_to_f32({cell})"),
            Prec::Bf16 => format!("rc_bf16_to_f32({cell})"),
            _ => cell,
        };
        format!("({ty}){v}")
    }

    /// Renders an expression computed in C type `ty` (`float` or `double`).
    pub fn expr(&self, e: &Expr, ty: &str) -> String {
        let sfx = if ty == "float" { "f" } else { "" };
        match e {
            Expr::Const(c) => render_const(*c, ty),
            Expr::Get(n, idx) => self.load(*n, idx, ty),
            Expr::Local(l) => format!("({ty}){l}"),
            Expr::IndexValue(i) => format!("({ty})({})", self.index(i)),
            Expr::Uniform { seed, offset } if self.seed_numbers => {
                format!("rc_uniform{sfx}(seeds[{seed}], {})", self.index(offset))
            }
            Expr::Uniform { seed, offset } => {
                format!("rc_uniform{sfx}({seed}ULL, {})", self.index(offset))
            }
            Expr::Unop(op, a) => {
                let args = [self.expr(a, ty)];
                lowered(op.facts().lowering, &args, ty)
            }
            Expr::Binop(op, a, b) => {
                let args = [self.expr(a, ty), self.expr(b, ty)];
                lowered(op.facts().lowering, &args, ty)
            }
            Expr::Ternop(op, a, b, c) => {
                let args = [self.expr(a, ty), self.expr(b, ty), self.expr(c, ty)];
                lowered(op.facts().lowering, &args, ty)
            }
        }
    }

    fn store(&self, prec: Prec, v: String) -> String {
        match prec {
            Prec::F16 => format!("rc_f32_to_f16((float)({v}))"),
            Prec::Bf16 => format!("rc_f32_to_bf16((float)({v}))"),
            Prec::F32 => format!("(float)({v})"),
            Prec::F64 => format!("(double)({v})"),
            Prec::U32 => format!("rc_to_u32((double)({v}))"),
        }
    }

    /// Renders statements at `depth` levels of indentation. `outer` optionally replaces the
    /// bounds of the first loop met (`lo`, `hi`) for split parallel loops.
    pub fn stmts(&self, out: &mut String, body: &[Stmt], depth: usize) {
        for s in body {
            self.stmt(out, s, depth);
        }
    }

    /// Renders one loop header over `from..to`.
    pub fn for_header(out: &mut String, depth: usize, var: &str, from: &str, to: &str) {
        let pad = "  ".repeat(depth);
        let _ = writeln!(out, "{pad}for (long long {var} = {from}; {var} < {to}; ++{var}) {{");
    }

    /// Renders one statement.
    pub fn stmt(&self, out: &mut String, s: &Stmt, depth: usize) {
        let pad = "  ".repeat(depth);
        match s {
            Stmt::Comment(c) => {
                let _ = writeln!(out, "{pad}/* {} */", c.replace("*/", "* /"));
            }
            Stmt::For { var, extent, limit, body, .. } => {
                let end = self.loop_end(*extent, *limit);
                Self::for_header(out, depth, &var.to_string(), "0", &end);
                self.stmts(out, body, depth + 1);
                let _ = writeln!(out, "{pad}}}");
            }
            Stmt::If { guards, body } => {
                let conds: Vec<String> = guards
                    .iter()
                    .map(|g| {
                        let i = self.index(&g.index);
                        format!("({i}) >= 0 && ({i}) < {}", g.bound)
                    })
                    .collect();
                let _ = writeln!(out, "{pad}if ({}) {{", conds.join(" && "));
                self.stmts(out, body, depth + 1);
                let _ = writeln!(out, "{pad}}}");
            }
            Stmt::Set { node, idx, value } => self.set(out, *node, idx, value, depth),
            Stmt::SetLocal { local, value } => {
                let prec = self.prog.locals[local.0 as usize];
                if self.bounds_check {
                    self.expr_checks(out, value, depth);
                }
                let ty = compute_ctype(self.prog.compute_prec(value, prec));
                let lty = compute_ctype(prec);
                let _ = writeln!(out, "{pad}{local} = ({lty})({});", self.expr(value, ty));
            }
            Stmt::Gemm(g) => self.gemm(out, g, depth),
            Stmt::Map(m) => self.map(out, m, depth),
            Stmt::Call(c) => self.call(out, c, depth),
        }
    }

    /// A loop's end: its extent, or for a dynamic batch's loop, which stops after its rows,
    /// `min(extent, ceil(size / per))`.
    fn loop_end(&self, extent: usize, limit: Option<Limit>) -> String {
        match limit {
            Some(l) => {
                let n = self.index(&Index::new(vec![(1, IdxVar::Sym(l.size))], 0));
                let rows = format!("(({n}) + {}LL) / {}LL", l.per - 1, l.per);
                format!("({rows} < {extent}LL ? {rows} : {extent}LL)")
            }
            None => extent.to_string(),
        }
    }

    fn set(&self, out: &mut String, node: NodeId, idx: &[Index], value: &Expr, depth: usize) {
        let pad = "  ".repeat(depth);
        let prec = self.prog.nodes[&node].prec;
        if self.bounds_check {
            self.expr_checks(out, value, depth);
            self.checks(out, node, idx, depth);
        }
        let ty = compute_ctype(self.prog.compute_prec(value, prec));
        let v = self.store(prec, self.expr(value, ty));
        let _ = writeln!(out, "{pad}{} = {v};", self.cell(node, idx));
    }

    /// An operand's first cell: its typed pointer plus its offset.
    fn operand_ptr(&self, node: NodeId, offset: &Index) -> String {
        format!("{} + ({})", Self::ptr_name(node), self.index(offset))
    }

    /// A call of the shape-generic product, with its epilogue written out after it.
    fn gemm(&self, out: &mut String, g: &Gemm, depth: usize) {
        let pad = "  ".repeat(depth);
        let desc: Vec<String> = g.descriptor().iter().map(|i| self.index(i)).collect();
        let ptr = |o: &GemmOperand| self.operand_ptr(o.node, &o.offset);
        let _ = writeln!(out, "{pad}{{");
        let _ = writeln!(out, "{pad}  const long long d[] = {{{}}};", desc.join(", "));
        // A bf16 result: the kernel reads the descriptor's flag and stores bf16 cells.
        let c = if g.bf16_pairs && g.prec == Prec::Bf16 {
            format!("(float *)({})", ptr(&g.c))
        } else {
            ptr(&g.c)
        };
        let _ = writeln!(
            out,
            "{pad}  rc_gemm_{}({c}, {}, {}, d);",
            if g.bf16_pairs { "bf16" } else { g.prec.name() },
            ptr(&g.a),
            ptr(&g.b)
        );
        if let Some(e) = &g.epilogue {
            self.epilogue(out, e, depth);
        }
        let _ = writeln!(out, "{pad}}}");
    }

    /// A product's epilogue as the loops it is equivalent to: after the call, on the call's
    /// rows (`d[6]`, up to `d[7]` of them, below `m = d[8]`) and every column.
    fn epilogue(&self, out: &mut String, e: &Epilogue, depth: usize) {
        let pad = "  ".repeat(depth);
        let _ = writeln!(
            out,
            "{pad}  /* epilogue: the kernel runs it on strips of this call's rows as \
             they become final; the same as: */"
        );
        let split = |out: &mut String, x: &str, axis: &[(Var, usize)], pad: &str| {
            let mut inner = 1usize;
            for (v, extent) in axis.iter().rev() {
                let _ = writeln!(out, "{pad}long long {v} = ({x} / {inner}LL) % {extent}LL;");
                inner *= extent.max(&1);
            }
        };
        let _ = writeln!(
            out,
            "{pad}  for (long long row = d[6]; row < d[6] + d[7] && row < d[8]; ++row) {{"
        );
        split(out, "row", &e.rows, &format!("{pad}    "));
        let _ = writeln!(out, "{pad}    for (long long col = 0; col < d[10]; ++col) {{");
        split(out, "col", &e.cols, &format!("{pad}      "));
        self.stmts(out, &e.body, depth + 3);
        let _ = writeln!(out, "{pad}    }}");
        let _ = writeln!(out, "{pad}  }}");
    }

    /// A call of the map kernel.
    fn map(&self, out: &mut String, m: &Map, depth: usize) {
        let pad = "  ".repeat(depth);
        let desc: Vec<String> = m.descriptor().iter().map(|i| self.index(i)).collect();
        let ptrs: Vec<String> = m.operands().map(|o| self.operand_ptr(o.node, &o.offset)).collect();
        let t = if m.prec == Prec::F64 { "double" } else { "float" };
        let _ = writeln!(out, "{pad}{{");
        let _ = writeln!(out, "{pad}  {t} *const p[] = {{{}}};", ptrs.join(", "));
        let _ = writeln!(out, "{pad}  const long long d[] = {{{}}};", desc.join(", "));
        let _ = writeln!(out, "{pad}  rc_map_{}(p, d);", m.prec.name());
        let _ = writeln!(out, "{pad}}}");
    }

    /// A call of the fused attention (the listing of a native routine).
    fn call(&self, out: &mut String, c: &crate::low_level::Call, depth: usize) {
        let pad = "  ".repeat(depth);
        let desc: Vec<String> = c.descriptor().iter().map(|i| self.index(i)).collect();
        let ptrs: Vec<String> = c
            .pointers()
            .iter()
            .map(|n| match n {
                None => "0".to_string(),
                // The kernels read other precisions (a lookup's ids) through the same array.
                Some(n) if self.prog.nodes[n].prec != Prec::F32 => {
                    format!("(float *){}", Self::ptr_name(*n))
                }
                Some(n) => Self::ptr_name(*n).to_string(),
            })
            .collect();
        let _ = writeln!(out, "{pad}{{");
        let _ = writeln!(out, "{pad}  float *const p[] = {{{}}};", ptrs.join(", "));
        let _ = writeln!(out, "{pad}  const long long d[] = {{{}}};", desc.join(", "));
        let _ = writeln!(out, "{pad}  {}(p, d);", c.kernel().name());
        let _ = writeln!(out, "{pad}}}");
    }

    fn expr_checks(&self, out: &mut String, e: &Expr, depth: usize) {
        e.visit(&mut |e| {
            if let Expr::Get(n, idx) = e {
                self.checks(out, *n, idx, depth);
            }
        });
    }

    fn checks(&self, out: &mut String, node: NodeId, idx: &[Index], depth: usize) {
        let pad = "  ".repeat(depth);
        let dims = &self.prog.nodes[&node].dims;
        for (axis, (i, d)) in idx.iter().zip(dims).enumerate() {
            let i = self.index(i);
            let _ = writeln!(
                out,
                "{pad}if (({i}) < 0 || ({i}) >= {d}) {{ rc_report(err, {}, {axis}, {i}, {d}); return; }}",
                node.0
            );
        }
    }

    /// Declarations of every local assigned in `body`.
    pub fn declarations(&self, out: &mut String, body: &[Stmt], depth: usize) {
        let pad = "  ".repeat(depth);
        let mut locals = Vec::new();
        for s in body {
            s.visit(&mut |s| {
                if let Stmt::SetLocal { local, .. } = s {
                    locals.push(*local);
                }
            });
        }
        locals.sort();
        locals.dedup();
        for l in locals {
            let _ = writeln!(out, "{pad}{} {l};", compute_ctype(self.prog.locals[l.0 as usize]));
        }
    }
}

fn render_const(c: f64, ty: &str) -> String {
    if c.is_nan() {
        format!("(({ty})(0.0 / 0.0))")
    } else if c.is_infinite() {
        let sign = if c < 0.0 { "-" } else { "" };
        format!("({sign}({ty})(1.0 / 0.0))")
    } else if ty == "float" {
        format!("{:?}f", c as f32)
    } else {
        format!("{c:?}")
    }
}

/// An operation of the table on rendered operands `args`, computed in C type `ty`, as its
/// [`Lowering`] says.
fn lowered(lowering: Lowering, args: &[String], ty: &str) -> String {
    let sfx = if ty == "float" { "f" } else { "" };
    let a = &args[0];
    match lowering {
        Lowering::Operand(k) => args[k].clone(),
        Lowering::Neg => format!("(-{a})"),
        Lowering::Arith(o) => format!("({a} {} {})", o.c_operator(), args[1]),
        Lowering::Recip => format!("(({ty})1 / {a})"),
        Lowering::Compare(o) => {
            let b = args.get(1).map_or("0".to_string(), |b| format!("({b})"));
            format!("(({a}) {} {b} ? ({ty})1 : ({ty})0)", o.c_operator())
        }
        Lowering::Libm(f) => format!("{}{sfx}({})", f.name(), args.join(", ")),
        Lowering::Math(f) => format!("rc_{}{sfx}({})", f.name(), args.join(", ")),
        Lowering::Helper(h) => format!("rc_{}{sfx}({})", h.name(), args.join(", ")),
        Lowering::Where => format!("(({a}) != 0 ? {} : {})", args[1], args[2]),
    }
}

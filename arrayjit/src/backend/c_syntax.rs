//! A C-family renderer of the low-level IR, shared by CUDA C and the C view of gccjit code.
//!
//! The renderer writes statements and expressions; a [`Dialect`] decides the few things that
//! differ: function qualifiers of the helper prelude, how runtime symbols are reached, and how
//! f16/bf16 are converted. Operations are written from the op table's [`CSyntax`]; those needing
//! more than an operator or a libm call (NaN-propagating `max`, `relu`, comparisons giving
//! 1.0/0.0, the counter-based generator) call small helpers defined once in the [`prelude`].

use std::fmt::Write as _;

use crate::low_level::{Expr, IdxVar, Index, Program, Stmt, Var};
use crate::math;
use crate::ops::{BinOp, CSyntax, Prec, SPLITMIX_GAMMA, SPLITMIX_M1, SPLITMIX_M2, TernOp, UnOp};
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
        Dialect::Cuda => {
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
        Dialect::C => {
            let _ = writeln!(s, "extern float rc_f16_to_f32(unsigned short h);");
            let _ = writeln!(s, "extern unsigned short rc_f32_to_f16(float f);");
            let _ = writeln!(s, "extern float rc_bf16_to_f32(unsigned short h);");
            let _ = writeln!(s, "extern unsigned short rc_f32_to_bf16(float f);");
            for t in ["float", "double"] {
                let _ = writeln!(
                    s,
                    "extern void rc_gemm_{}({t} *c, const {t} *a, const {t} *b, const long long *desc);",
                    if t == "float" { "f32" } else { "f64" }
                );
                let _ = writeln!(
                    s,
                    "extern void rc_map_{}({t} *const *ptrs, const long long *desc);",
                    if t == "float" { "f32" } else { "f64" }
                );
            }
            let _ = writeln!(
                s,
                "extern void rc_gemm_bf16(float *c, const unsigned short *a, const unsigned short *b, const long long *desc);"
            );
        }
    }
    // The special functions in `f32` are the operations of `crate::math`, as in every
    // backend; in `f64`, the library's.
    match d {
        Dialect::Cuda => {
            let _ = writeln!(
                s,
                "{q} unsigned int rc_f32_bits(float x) {{ return __float_as_uint(x); }}"
            );
            let _ = writeln!(
                s,
                "{q} float rc_bits_f32(unsigned int u) {{ return __uint_as_float(u); }}"
            );
        }
        Dialect::C => {
            let _ = writeln!(
                s,
                "{q} unsigned int rc_f32_bits(float x) {{ unsigned int u; __builtin_memcpy(&u, &x, 4); return u; }}"
            );
            let _ = writeln!(
                s,
                "{q} float rc_bits_f32(unsigned int u) {{ float x; __builtin_memcpy(&x, &u, 4); return x; }}"
            );
        }
    }
    // A computed value stored as an id: toward zero, saturating, `nan` to 0 (as Rust's `as`).
    let _ = writeln!(
        s,
        "{q} unsigned int rc_to_u32(double x) {{ return (x != x || x <= 0) ? 0u : (x >= 4294967295.0 ? 4294967295u : (unsigned int)x); }}"
    );
    for (name, f) in [
        ("exp", math::Function::Exp),
        ("exp2", math::Function::Exp2),
        ("log", math::Function::Log),
        ("log2", math::Function::Log2),
        ("tanh", math::Function::Tanh),
        ("erf", math::Function::Erf),
    ] {
        s.push_str(&math::c_function(q, &format!("rc_{name}f"), f));
        let _ = writeln!(s, "{q} double rc_{name}(double x) {{ return {name}(x); }}");
    }
    s.push_str(&math::c_function(q, "rc_powf", math::Function::Pow));
    let _ = writeln!(s, "{q} double rc_pow(double x, double y) {{ return pow(x, y); }}");
    for (t, sfx) in [("float", "f"), ("double", "")] {
        let _ = writeln!(
            s,
            "{q} {t} rc_max{sfx}({t} a, {t} b) {{ return (a > b || a != a) ? a : b; }}"
        );
        let _ = writeln!(
            s,
            "{q} {t} rc_min{sfx}({t} a, {t} b) {{ return (a < b || a != a) ? a : b; }}"
        );
        let _ = writeln!(s, "{q} {t} rc_relu{sfx}({t} x) {{ return x < 0 ? ({t})0 : x; }}");
        let _ = writeln!(
            s,
            "{q} {t} rc_sat01{sfx}({t} x) {{ return x < 0 ? ({t})0 : (x > 1 ? ({t})1 : x); }}"
        );
        let _ = writeln!(
            s,
            "{q} {t} rc_sigmoid{sfx}({t} x) {{ return ({t})1 / (({t})1 + rc_exp{sfx}(-x)); }}"
        );
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
    s
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
                let a = self.expr(a, ty);
                match (op, op.facts().c_syntax) {
                    (_, CSyntax::Func(f)) => format!("{f}{sfx}({a})"),
                    (UnOp::Identity, _) => a,
                    (UnOp::Neg, _) => format!("(-{a})"),
                    (UnOp::Relu, _) => format!("rc_relu{sfx}({a})"),
                    (UnOp::Sat01, _) => format!("rc_sat01{sfx}({a})"),
                    (UnOp::Sigmoid, _) => format!("rc_sigmoid{sfx}({a})"),
                    (
                        UnOp::Exp | UnOp::Exp2 | UnOp::Log | UnOp::Log2 | UnOp::Tanh | UnOp::Erf,
                        _,
                    ) => {
                        format!("rc_{}{sfx}({a})", op.name())
                    }
                    (UnOp::Recip, _) => format!("(({ty})1 / {a})"),
                    (UnOp::Not, _) => format!("(({a}) == 0 ? ({ty})1 : ({ty})0)"),
                    (op, _) => format!("{}{sfx}({a})", op.name()),
                }
            }
            Expr::Binop(op, a, b) => {
                let (a, b) = (self.expr(a, ty), self.expr(b, ty));
                let cmp = |o: &str| format!("(({a}) {o} ({b}) ? ({ty})1 : ({ty})0)");
                match (op, op.facts().c_syntax) {
                    (_, CSyntax::Infix(o)) => format!("({a} {o} {b})"),
                    (_, CSyntax::Func(f)) => format!("{f}{sfx}({a}, {b})"),
                    (BinOp::Pow, _) => format!("rc_pow{sfx}({a}, {b})"),
                    (BinOp::Max, _) => format!("rc_max{sfx}({a}, {b})"),
                    (BinOp::Min, _) => format!("rc_min{sfx}({a}, {b})"),
                    (BinOp::Lt, _) => cmp("<"),
                    (BinOp::Le, _) => cmp("<="),
                    (BinOp::Gt, _) => cmp(">"),
                    (BinOp::Eq, _) => cmp("=="),
                    (BinOp::Ne, _) => cmp("!="),
                    (_, _) => b,
                }
            }
            Expr::Ternop(op, a, b, c) => {
                let (a, b, c) = (self.expr(a, ty), self.expr(b, ty), self.expr(c, ty));
                match op {
                    TernOp::Fma => format!("fma{sfx}({a}, {b}, {c})"),
                    TernOp::Where => format!("(({a}) != 0 ? {b} : {c})"),
                }
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
                // A dynamic batch's loop stops after its rows: min(extent, ceil(size / per)).
                let end = match limit {
                    Some(l) => {
                        let n = self.index(&Index::new(vec![(1, IdxVar::Sym(l.size))], 0));
                        let rows = format!("(({n}) + {}LL) / {}LL", l.per - 1, l.per);
                        format!("({rows} < {extent}LL ? {rows} : {extent}LL)")
                    }
                    None => extent.to_string(),
                };
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
            Stmt::Set { node, idx, value } => {
                let prec = self.prog.nodes[node].prec;
                if self.bounds_check {
                    self.expr_checks(out, value, depth);
                    self.checks(out, *node, idx, depth);
                }
                let ty = compute_ctype(self.prog.compute_prec(value, prec));
                let v = self.store(prec, self.expr(value, ty));
                let _ = writeln!(out, "{pad}{} = {v};", self.cell(*node, idx));
            }
            Stmt::SetLocal { local, value } => {
                let prec = self.prog.locals[local.0 as usize];
                if self.bounds_check {
                    self.expr_checks(out, value, depth);
                }
                let ty = compute_ctype(self.prog.compute_prec(value, prec));
                let lty = compute_ctype(prec);
                let _ = writeln!(out, "{pad}{local} = ({lty})({});", self.expr(value, ty));
            }
            Stmt::Gemm(g) => {
                let desc: Vec<String> = g.descriptor().iter().map(|i| self.index(i)).collect();
                let ptr = |o: &crate::low_level::GemmOperand| {
                    format!("{} + ({})", Self::ptr_name(o.node), self.index(&o.offset))
                };
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
                    // The same values as the epilogue: after the call, on the call's rows
                    // (`d[6]`, up to `d[7]` of them, below `m = d[8]`) and every column.
                    let _ = writeln!(
                        out,
                        "{pad}  /* epilogue: the kernel runs it on strips of this call's rows as \
                         they become final; the same as: */"
                    );
                    let split = |out: &mut String, x: &str, axis: &[(Var, usize)], pad: &str| {
                        let mut inner = 1usize;
                        for (v, extent) in axis.iter().rev() {
                            let _ = writeln!(
                                out,
                                "{pad}long long {v} = ({x} / {inner}LL) % {extent}LL;"
                            );
                            inner *= extent.max(&1);
                        }
                    };
                    let _ = writeln!(
                        out,
                        "{pad}  for (long long row = d[6]; row < d[6] + d[7] && row < d[8]; ++row) {{"
                    );
                    split(out, "row", &e.rows, &format!("{pad}    "));
                    let _ =
                        writeln!(out, "{pad}    for (long long col = 0; col < d[10]; ++col) {{");
                    split(out, "col", &e.cols, &format!("{pad}      "));
                    self.stmts(out, &e.body, depth + 3);
                    let _ = writeln!(out, "{pad}    }}");
                    let _ = writeln!(out, "{pad}  }}");
                }
                let _ = writeln!(out, "{pad}}}");
            }
            Stmt::Map(m) => {
                let desc: Vec<String> = m.descriptor().iter().map(|i| self.index(i)).collect();
                let ptrs: Vec<String> = m
                    .operands()
                    .map(|o| format!("{} + ({})", Self::ptr_name(o.node), self.index(&o.offset)))
                    .collect();
                let t = if m.prec == Prec::F64 { "double" } else { "float" };
                let _ = writeln!(out, "{pad}{{");
                let _ = writeln!(out, "{pad}  {t} *const p[] = {{{}}};", ptrs.join(", "));
                let _ = writeln!(out, "{pad}  const long long d[] = {{{}}};", desc.join(", "));
                let _ = writeln!(out, "{pad}  rc_map_{}(p, d);", m.prec.name());
                let _ = writeln!(out, "{pad}}}");
            }
        }
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

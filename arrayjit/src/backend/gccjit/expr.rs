//! Values of generated code: expressions, built from the op table's [`Lowering`] of each
//! operation (one arm per kind of lowering in [`Gen::lowered`], one per [`Helper`] in
//! [`Gen::helper_op`], none per operation), and the selections and temporaries they use.
//!
//! Selections (`where`, `max`, `relu`, ...) are small diamonds GCC if-converts.

use gccjit::{BinaryOp, ComparisonOp, FunctionType, RValue, ToRValue, Type, UnaryOp};

use super::emit::Gen;
use super::inline_math::Inline;
use crate::low_level::{Expr, Index};
use crate::ops::{
    Arith, Compare, Helper, Libm, Lowering, Prec, SPLITMIX_GAMMA, SPLITMIX_M1, SPLITMIX_M2, UnOp,
};

impl<'c> Gen<'c> {
    pub(super) fn cast(&self, v: RValue<'c>, ty: Type<'c>) -> RValue<'c> {
        if v.get_type() == ty { v } else { self.ctx.new_cast(None, v, ty) }
    }

    pub(super) fn float(&self, x: f64, ty: Type<'c>) -> RValue<'c> {
        // Rounded to `f32` here: libgccjit keeps a `float` constant's `double` value as given,
        // and GCC's constant folding then computes with the unrounded value (widened to
        // `double`, `pow(x, 1.0/3)` used a third to 53 bits where the interpreter uses `f32`'s).
        let x = if ty == self.t.f32 { x as f32 as f64 } else { x };
        self.ctx.new_rvalue_from_double(ty, x)
    }

    pub(super) fn bool_to_float(&self, b: RValue<'c>, ty: Type<'c>) -> RValue<'c> {
        let i = self.ctx.new_cast(None, b, self.t.int);
        self.ctx.new_cast(None, i, ty)
    }

    /// `cond ? a : b` as a diamond of blocks writing a fresh local.
    ///
    /// Both values are computed before the branch, so the diamond only chooses between
    /// registers and no memory is read under a condition. GCC 12 if-converts a load under a
    /// condition into a masked load, and its loop vectorizer drops the permutation of grouped
    /// masked loads (GCC PR 114375, fixed in GCC 14): the mask of one group of cells was applied
    /// to the next ones, and `where` returned neither branch for some cells.
    pub(super) fn select(
        &mut self,
        cond: RValue<'c>,
        a: RValue<'c>,
        b: RValue<'c>,
        ty: Type<'c>,
    ) -> RValue<'c> {
        let a = self.temp(a, ty);
        let res = self.new_local(ty, "sel");
        self.block.add_assignment(None, res, b);
        let then = self.new_block("sel_then");
        let after = self.new_block("sel_end");
        self.block.end_with_conditional(None, cond, then, after);
        then.add_assignment(None, res, a);
        then.end_with_jump(None, after);
        self.block = after;
        res.to_rvalue()
    }

    /// Evaluates into a fresh local so the value can be used several times.
    pub(super) fn temp(&mut self, v: RValue<'c>, ty: Type<'c>) -> RValue<'c> {
        let l = self.new_local(ty, "e");
        self.block.add_assignment(None, l, v);
        l.to_rvalue()
    }

    pub(super) fn builtin(&self, name: &str, ty: Type<'c>, args: &[RValue<'c>]) -> RValue<'c> {
        let suffix = if ty == self.t.f32 { "f" } else { "" };
        let f = self.ctx.get_builtin_function(format!("__builtin_{name}{suffix}"));
        self.ctx.new_call(None, f, args)
    }

    /// A call of the C library's function (`name`, or `name` + `f` in f32) through a plain
    /// external declaration, which GCC does not know as a builtin: it cannot rewrite it. For
    /// `pow` that matters: GCC turns `__builtin_pow(x, 0.5)` into `sqrt(x)`, which differs at
    /// `-0` (`-0` instead of `+0`) and `-inf` (NaN instead of `+inf`).
    pub(super) fn libm_call(
        &mut self,
        name: &str,
        ty: Type<'c>,
        args: &[RValue<'c>],
    ) -> RValue<'c> {
        let suffix = if ty == self.t.f32 { "f" } else { "" };
        let full = format!("{name}{suffix}");
        let ctx = self.ctx;
        let f = *self.libm.entry(full.clone()).or_insert_with(|| {
            let params: Vec<_> =
                (0..args.len()).map(|i| ctx.new_parameter(None, ty, format!("a{i}"))).collect();
            ctx.new_function(None, FunctionType::Extern, ty, &params, &full, false)
        });
        self.ctx.new_call(None, f, args)
    }

    pub(super) fn cmp(&self, op: ComparisonOp, a: RValue<'c>, b: RValue<'c>) -> RValue<'c> {
        self.ctx.new_comparison(None, op, a, b)
    }

    pub(super) fn expr(&mut self, e: &Expr, ty: Type<'c>) -> RValue<'c> {
        match e {
            Expr::Const(c) => self.float(*c, ty),
            Expr::Get(n, idx) => {
                let prec = self.prog.nodes[n].prec;
                let cell = self.cell(*n, idx).to_rvalue();
                let v = match prec {
                    Prec::F16 => self.f16_to_f32(cell),
                    Prec::Bf16 => self.bf16_to_f32(cell),
                    _ => cell,
                };
                self.cast(v, ty)
            }
            Expr::Local(l) => {
                let x = self.local(*l).to_rvalue();
                self.cast(x, ty)
            }
            Expr::IndexValue(i) => {
                let v = self.index(i);
                self.ctx.new_cast(None, v, ty)
            }
            Expr::Uniform { seed, offset } => self.uniform(*seed, offset, ty),
            Expr::Unop(op, a) => {
                let args = [self.expr(a, ty)];
                self.lowered(op.facts().lowering, &args, ty)
            }
            Expr::Binop(op, a, b) => {
                let args = [self.expr(a, ty), self.expr(b, ty)];
                self.lowered(op.facts().lowering, &args, ty)
            }
            Expr::Ternop(op, a, b, c) => {
                let args = [self.expr(a, ty), self.expr(b, ty), self.expr(c, ty)];
                self.lowered(op.facts().lowering, &args, ty)
            }
        }
    }

    /// An operation of the table on `args`, computed in `ty`, as its [`Lowering`] says.
    pub(super) fn lowered(
        &mut self,
        lowering: Lowering,
        args: &[RValue<'c>],
        ty: Type<'c>,
    ) -> RValue<'c> {
        let a = args[0];
        match lowering {
            Lowering::Operand(k) => args[k],
            Lowering::Neg => self.ctx.new_unary_op(None, UnaryOp::Minus, ty, a),
            Lowering::Arith(o) => self.ctx.new_binary_op(None, arith(o), ty, a, args[1]),
            Lowering::Recip => {
                let one = self.float(1.0, ty);
                self.ctx.new_binary_op(None, BinaryOp::Divide, ty, one, a)
            }
            Lowering::Compare(o) => {
                let b = args.get(1).copied().unwrap_or_else(|| self.float(0.0, ty));
                self.bool_to_float(self.cmp(comparison(o), a, b), ty)
            }
            // The instruction where there is one: `-fno-math-errno` leaves no reason to call
            // the library.
            Lowering::Libm(Libm::Builtin(f)) => self.builtin(f, ty, args),
            Lowering::Libm(Libm::Extern(f)) => self.libm_call(f, ty, args),
            Lowering::Math(f) if ty == self.t.f32 => f.emit(&mut Inline(self), args),
            Lowering::Math(f) => self.lowered(Lowering::Libm(f.f64_libm()), args, ty),
            Lowering::Helper(h) => self.helper_op(h, args, ty),
            Lowering::Where => {
                let zero = self.float(0.0, ty);
                let cond = self.cmp(ComparisonOp::NotEquals, a, zero);
                self.select(cond, args[1], args[2], ty)
            }
        }
    }

    /// The code of a [`Helper`]: the C prelude's `rc_{name}` as libgccjit selections.
    fn helper_op(&mut self, h: Helper, args: &[RValue<'c>], ty: Type<'c>) -> RValue<'c> {
        let zero = self.float(0.0, ty);
        let one = self.float(1.0, ty);
        match h {
            Helper::Relu => {
                let a = self.temp(args[0], ty);
                let neg = self.cmp(ComparisonOp::LessThan, a, zero);
                self.select(neg, zero, a, ty)
            }
            Helper::Sat01 => {
                let a = self.temp(args[0], ty);
                let hi = self.cmp(ComparisonOp::GreaterThan, a, one);
                let top = self.select(hi, one, a, ty);
                let lo = self.cmp(ComparisonOp::LessThan, a, zero);
                self.select(lo, zero, top, ty)
            }
            Helper::Sigmoid => {
                let neg = self.ctx.new_unary_op(None, UnaryOp::Minus, ty, args[0]);
                let e = self.lowered(UnOp::Exp.facts().lowering, &[neg], ty);
                let den = self.ctx.new_binary_op(None, BinaryOp::Plus, ty, one, e);
                self.ctx.new_binary_op(None, BinaryOp::Divide, ty, one, den)
            }
            Helper::Max | Helper::Min => {
                let a = self.temp(args[0], ty);
                let b = self.temp(args[1], ty);
                let dir = if h == Helper::Max {
                    ComparisonOp::GreaterThan
                } else {
                    ComparisonOp::LessThan
                };
                // `(a ⊳ b || a != a) ? a : b` as two selections with one comparison each:
                // simple diamonds GCC if-converts, so loops of maxima (pooling, row maxima)
                // vectorize.
                let better = self.cmp(dir, a, b);
                let r = self.select(better, a, b, ty);
                let nan = self.cmp(ComparisonOp::NotEquals, a, a);
                self.select(nan, a, r, ty)
            }
        }
    }

    /// The call's seed number `k` ([`super::dedup`]): the `k`-th value of the `u64` array in
    /// the buffer table's slot after the nodes, loaded into a local at the function's entry.
    pub(super) fn seed(&mut self, k: u64) -> RValue<'c> {
        if let Some(l) = self.seeds.get(&k) {
            return l.to_rvalue();
        }
        let u = self.t.u64;
        let slot = self.long(self.slots.len() as i64);
        let raw = self.ctx.new_array_access(None, self.bufs, slot).to_rvalue();
        let table = self.ctx.new_cast(None, raw, u.make_pointer());
        let value = self.ctx.new_array_access(None, table, self.long(k as i64));
        let l = self.func.new_local(None, u, format!("seed{k}"));
        self.entry.add_assignment(None, l, value.to_rvalue());
        self.seeds.insert(k, l);
        l.to_rvalue()
    }

    /// `uniform(seed, offset)` for the call's seed number `seed`.
    pub(super) fn uniform(&mut self, seed: u64, offset: &Index, ty: Type<'c>) -> RValue<'c> {
        let u = self.t.u64;
        let k = |g: &Self, x: u64| g.ctx.new_rvalue_from_long(u, x as i64);
        let off = self.index(offset);
        let off = self.ctx.new_cast(None, off, u);
        let z = self.new_local(u, "rng");
        let plus1 = self.ctx.new_binary_op(None, BinaryOp::Plus, u, off, k(self, 1));
        let mixed = self.ctx.new_binary_op(None, BinaryOp::Mult, u, plus1, k(self, SPLITMIX_GAMMA));
        let seed = self.seed(seed);
        let start = self.ctx.new_binary_op(None, BinaryOp::Plus, u, seed, mixed);
        self.block.add_assignment(None, z, start);
        for (shift, mul) in [(30, Some(SPLITMIX_M1)), (27, Some(SPLITMIX_M2)), (31, None)] {
            let sh =
                self.ctx.new_binary_op(None, BinaryOp::RShift, u, z.to_rvalue(), k(self, shift));
            let x = self.ctx.new_binary_op(None, BinaryOp::BitwiseXor, u, z.to_rvalue(), sh);
            let x = match mul {
                Some(m) => self.ctx.new_binary_op(None, BinaryOp::Mult, u, x, k(self, m)),
                None => x,
            };
            self.block.add_assignment(None, z, x);
        }
        let top = self.ctx.new_binary_op(None, BinaryOp::RShift, u, z.to_rvalue(), k(self, 40));
        let top = self.ctx.new_cast(None, top, self.t.i64);
        let f = self.ctx.new_cast(None, top, ty);
        let scale = self.float(1.0 / 16_777_216.0, ty);
        self.ctx.new_binary_op(None, BinaryOp::Mult, ty, f, scale)
    }
}

/// libgccjit's operator for an [`Arith`].
fn arith(o: Arith) -> BinaryOp {
    match o {
        Arith::Add => BinaryOp::Plus,
        Arith::Sub => BinaryOp::Minus,
        Arith::Mul => BinaryOp::Mult,
        Arith::Div => BinaryOp::Divide,
    }
}

/// libgccjit's comparison for a [`Compare`].
fn comparison(o: Compare) -> ComparisonOp {
    match o {
        Compare::Lt => ComparisonOp::LessThan,
        Compare::Le => ComparisonOp::LessThanEquals,
        Compare::Gt => ComparisonOp::GreaterThan,
        Compare::Eq => ComparisonOp::Equals,
        Compare::Ne => ComparisonOp::NotEquals,
    }
}

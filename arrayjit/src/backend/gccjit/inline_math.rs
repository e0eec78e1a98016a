//! The `f32` special functions of [`crate::math`] emitted inline into a step's loops.

use gccjit::{BinaryOp, ComparisonOp, RValue};

use super::emit::Gen;
use crate::math;

/// The `f32` special functions emitted inline ([`crate::math`]): straight-line arithmetic that
/// the loop vectorizer turns into vector code, the interpreter's operations one for one.
pub(super) struct Inline<'g, 'c>(pub(super) &'g mut Gen<'c>);

impl<'c> math::Emit for Inline<'_, 'c> {
    type F = RValue<'c>;
    type U = RValue<'c>;
    type D = RValue<'c>;
    fn f(&mut self, c: f32) -> RValue<'c> {
        self.0.float(c as f64, self.0.t.f32)
    }
    fn u(&mut self, c: u32) -> RValue<'c> {
        self.0.ctx.new_rvalue_from_long(self.0.t.u32, c as i64)
    }
    fn d(&mut self, c: f64) -> RValue<'c> {
        self.0.float(c, self.0.t.f64)
    }
    fn add(&mut self, a: RValue<'c>, b: RValue<'c>) -> RValue<'c> {
        self.0.ctx.new_binary_op(None, BinaryOp::Plus, self.0.t.f32, a, b)
    }
    fn sub(&mut self, a: RValue<'c>, b: RValue<'c>) -> RValue<'c> {
        self.0.ctx.new_binary_op(None, BinaryOp::Minus, self.0.t.f32, a, b)
    }
    fn mul(&mut self, a: RValue<'c>, b: RValue<'c>) -> RValue<'c> {
        self.0.ctx.new_binary_op(None, BinaryOp::Mult, self.0.t.f32, a, b)
    }
    fn div(&mut self, a: RValue<'c>, b: RValue<'c>) -> RValue<'c> {
        self.0.ctx.new_binary_op(None, BinaryOp::Divide, self.0.t.f32, a, b)
    }
    fn fma(&mut self, a: RValue<'c>, b: RValue<'c>, c: RValue<'c>) -> RValue<'c> {
        self.0.builtin("fma", self.0.t.f32, &[a, b, c])
    }
    fn lt_select(
        &mut self,
        a: RValue<'c>,
        b: RValue<'c>,
        x: RValue<'c>,
        y: RValue<'c>,
    ) -> RValue<'c> {
        let cond = self.0.cmp(ComparisonOp::LessThan, a, b);
        let ty = self.0.t.f32;
        self.0.select(cond, x, y, ty)
    }
    fn to_bits(&mut self, a: RValue<'c>) -> RValue<'c> {
        self.0.ctx.new_bitcast(None, a, self.0.t.u32)
    }
    fn bits_to_f32(&mut self, a: RValue<'c>) -> RValue<'c> {
        self.0.ctx.new_bitcast(None, a, self.0.t.f32)
    }
    fn uadd(&mut self, a: RValue<'c>, b: RValue<'c>) -> RValue<'c> {
        self.0.ctx.new_binary_op(None, BinaryOp::Plus, self.0.t.u32, a, b)
    }
    fn usub(&mut self, a: RValue<'c>, b: RValue<'c>) -> RValue<'c> {
        self.0.ctx.new_binary_op(None, BinaryOp::Minus, self.0.t.u32, a, b)
    }
    fn and(&mut self, a: RValue<'c>, b: RValue<'c>) -> RValue<'c> {
        self.0.ctx.new_binary_op(None, BinaryOp::BitwiseAnd, self.0.t.u32, a, b)
    }
    fn or(&mut self, a: RValue<'c>, b: RValue<'c>) -> RValue<'c> {
        self.0.ctx.new_binary_op(None, BinaryOp::BitwiseOr, self.0.t.u32, a, b)
    }
    fn shl(&mut self, a: RValue<'c>, s: u32) -> RValue<'c> {
        let s = self.u(s);
        self.0.ctx.new_binary_op(None, BinaryOp::LShift, self.0.t.u32, a, s)
    }
    fn sar(&mut self, a: RValue<'c>, s: u32) -> RValue<'c> {
        let int = self.0.t.int;
        let signed = self.0.ctx.new_cast(None, a, int);
        let s = self.0.ctx.new_rvalue_from_int(int, s as i32);
        let shifted = self.0.ctx.new_binary_op(None, BinaryOp::RShift, int, signed, s);
        self.0.ctx.new_cast(None, shifted, self.0.t.u32)
    }
    fn widen(&mut self, a: RValue<'c>) -> RValue<'c> {
        self.0.ctx.new_cast(None, a, self.0.t.f64)
    }
    fn narrow(&mut self, a: RValue<'c>) -> RValue<'c> {
        self.0.ctx.new_cast(None, a, self.0.t.f32)
    }
    fn dadd(&mut self, a: RValue<'c>, b: RValue<'c>) -> RValue<'c> {
        self.0.ctx.new_binary_op(None, BinaryOp::Plus, self.0.t.f64, a, b)
    }
    fn dsub(&mut self, a: RValue<'c>, b: RValue<'c>) -> RValue<'c> {
        self.0.ctx.new_binary_op(None, BinaryOp::Minus, self.0.t.f64, a, b)
    }
    fn dmul(&mut self, a: RValue<'c>, b: RValue<'c>) -> RValue<'c> {
        self.0.ctx.new_binary_op(None, BinaryOp::Mult, self.0.t.f64, a, b)
    }
    fn ddiv(&mut self, a: RValue<'c>, b: RValue<'c>) -> RValue<'c> {
        self.0.ctx.new_binary_op(None, BinaryOp::Divide, self.0.t.f64, a, b)
    }
    fn dfma(&mut self, a: RValue<'c>, b: RValue<'c>, c: RValue<'c>) -> RValue<'c> {
        self.0.builtin("fma", self.0.t.f64, &[a, b, c])
    }
    fn dlt_select(
        &mut self,
        a: RValue<'c>,
        b: RValue<'c>,
        x: RValue<'c>,
        y: RValue<'c>,
    ) -> RValue<'c> {
        let cond = self.0.cmp(ComparisonOp::LessThan, a, b);
        let ty = self.0.t.f64;
        self.0.select(cond, x, y, ty)
    }
    fn keep(&mut self, a: RValue<'c>) -> RValue<'c> {
        let ty = self.0.t.f32;
        self.0.temp(a, ty)
    }
    fn keep_u(&mut self, a: RValue<'c>) -> RValue<'c> {
        let ty = self.0.t.u32;
        self.0.temp(a, ty)
    }
    fn keep_d(&mut self, a: RValue<'c>) -> RValue<'c> {
        let ty = self.0.t.f64;
        self.0.temp(a, ty)
    }
}

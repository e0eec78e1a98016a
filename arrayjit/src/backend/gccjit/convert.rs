//! Storage conversions of generated code: f16 and bf16 to and from `f32`, and computed values
//! to `u32` ids, all inline and branch-free so that loops over such tensors vectorize, and all
//! bit for bit as the `half` crate and Rust's `as` (and so the interpreter) convert.

use gccjit::{BinaryOp, ComparisonOp, RValue};

use super::emit::Gen;
use crate::ops::Prec;

impl<'c> Gen<'c> {
    /// bf16 bits to f32, inline: the bits are the top half of the f32's (no call, so loops
    /// over bf16 tensors vectorize).
    pub(super) fn bf16_to_f32(&self, bits: RValue<'c>) -> RValue<'c> {
        let wide = self.ctx.new_cast(None, bits, self.t.u32);
        let sixteen = self.ctx.new_rvalue_from_int(self.t.u32, 16);
        let shifted = self.ctx.new_binary_op(None, BinaryOp::LShift, self.t.u32, wide, sixteen);
        self.ctx.new_bitcast(None, shifted, self.t.f32)
    }

    /// f32 to bf16 bits, inline, rounding to nearest even and keeping NaN a (quiet) NaN,
    /// exactly as the `half` crate (and so the interpreter) does: `(x + 0x7fff + lsb) >> 16`
    /// with `lsb` the kept part's last bit (a carry out of the dropped half is the rounding,
    /// up to infinity), and `nan ? (x >> 16) | 0x40`. Four integer operations and a blend per
    /// value, all of which vectorize.
    pub(super) fn f32_to_bf16(&mut self, v: RValue<'c>) -> RValue<'c> {
        let u32t = self.t.u32;
        let k = |g: &Self, c: i64| g.ctx.new_rvalue_from_long(u32t, c);
        let bin = |g: &Self, op, a, b| g.ctx.new_binary_op(None, op, u32t, a, b);
        let x = self.ctx.new_bitcast(None, v, u32t);
        let x = self.temp(x, u32t);
        let hi = bin(self, BinaryOp::RShift, x, k(self, 16));
        let hi = self.temp(hi, u32t);
        let lsb = bin(self, BinaryOp::BitwiseAnd, hi, k(self, 1));
        let biased = bin(self, BinaryOp::Plus, bin(self, BinaryOp::Plus, x, k(self, 0x7fff)), lsb);
        let rounded = bin(self, BinaryOp::RShift, biased, k(self, 16));
        let magnitude = bin(self, BinaryOp::BitwiseAnd, x, k(self, 0x7fff_ffff));
        let nan = self.cmp(ComparisonOp::GreaterThan, magnitude, k(self, 0x7f80_0000));
        let quiet = bin(self, BinaryOp::BitwiseOr, hi, k(self, 0x40));
        let bits = self.select(nan, quiet, rounded, u32t);
        self.ctx.new_cast(None, bits, self.t.u16)
    }

    /// f16 bits to f32, inline and branch-free (so loops over f16 tensors vectorize), exactly
    /// as the `half` crate (and so the interpreter) converts: normal and subnormal values by
    /// moving the bits into an f32 and scaling by 2¹¹² (exact), infinities and NaN (made quiet,
    /// payload kept) selected.
    pub(super) fn f16_to_f32(&mut self, bits: RValue<'c>) -> RValue<'c> {
        let (u32t, f32t) = (self.t.u32, self.t.f32);
        let k = |g: &Self, c: i64| g.ctx.new_rvalue_from_long(u32t, c);
        let bin = |g: &Self, op, a, b| g.ctx.new_binary_op(None, op, u32t, a, b);
        let h = self.ctx.new_cast(None, bits, u32t);
        let h = self.temp(h, u32t);
        let magnitude = bin(self, BinaryOp::BitwiseAnd, h, k(self, 0x7fff));
        let magnitude = self.temp(magnitude, u32t);
        let moved = bin(self, BinaryOp::LShift, magnitude, k(self, 13));
        let moved = self.ctx.new_bitcast(None, moved, f32t);
        let scaled = self.ctx.new_binary_op(
            None,
            BinaryOp::Mult,
            f32t,
            moved,
            self.float(2f64.powi(112), f32t),
        );
        let finite = self.ctx.new_bitcast(None, scaled, u32t);
        let payload = bin(
            self,
            BinaryOp::LShift,
            bin(self, BinaryOp::BitwiseAnd, magnitude, k(self, 0x3ff)),
            k(self, 13),
        );
        let quiet = self.cmp(ComparisonOp::GreaterThan, magnitude, k(self, 0x7c00));
        let quiet = self.select(quiet, k(self, 0x40_0000), k(self, 0), u32t);
        let special = bin(
            self,
            BinaryOp::BitwiseOr,
            bin(self, BinaryOp::BitwiseOr, k(self, 0x7f80_0000), payload),
            quiet,
        );
        let is_special = self.cmp(ComparisonOp::GreaterThanEquals, magnitude, k(self, 0x7c00));
        let body = self.select(is_special, special, finite, u32t);
        let sign = bin(
            self,
            BinaryOp::LShift,
            bin(self, BinaryOp::BitwiseAnd, h, k(self, 0x8000)),
            k(self, 16),
        );
        let out = bin(self, BinaryOp::BitwiseOr, body, sign);
        self.ctx.new_bitcast(None, out, f32t)
    }

    /// f32 to f16 bits, inline and branch-free, rounding to nearest even exactly as the `half`
    /// crate does: normal results by integer rounding of the rebiased bits, subnormal ones by
    /// one float addition of 0.5 (whose last place is f16's smallest subnormal), overflow to
    /// infinity, NaN quiet with its payload's top bits.
    pub(super) fn f32_to_f16(&mut self, v: RValue<'c>) -> RValue<'c> {
        let (u32t, f32t) = (self.t.u32, self.t.f32);
        let k = |g: &Self, c: i64| g.ctx.new_rvalue_from_long(u32t, c);
        let bin = |g: &Self, op, a, b| g.ctx.new_binary_op(None, op, u32t, a, b);
        let x = self.ctx.new_bitcast(None, v, u32t);
        let x = self.temp(x, u32t);
        let a = bin(self, BinaryOp::BitwiseAnd, x, k(self, 0x7fff_ffff));
        let a = self.temp(a, u32t);
        // Subnormal or zero: a < 2^-14.
        let as_float = self.ctx.new_bitcast(None, a, f32t);
        let sum =
            self.ctx.new_binary_op(None, BinaryOp::Plus, f32t, as_float, self.float(0.5, f32t));
        let sub =
            bin(self, BinaryOp::Minus, self.ctx.new_bitcast(None, sum, u32t), k(self, 0x3f00_0000));
        // Normal: rebias, add 0xfff plus the kept mantissa's last bit, shift (a carry into
        // the exponent is the correct rounding, up to infinity).
        let odd = bin(
            self,
            BinaryOp::BitwiseAnd,
            bin(self, BinaryOp::RShift, a, k(self, 13)),
            k(self, 1),
        );
        let rebased = bin(self, BinaryOp::Plus, a, k(self, 0xc800_0fff));
        let normal =
            bin(self, BinaryOp::RShift, bin(self, BinaryOp::Plus, rebased, odd), k(self, 13));
        let small = self.cmp(ComparisonOp::LessThan, a, k(self, 0x3880_0000));
        let o = self.select(small, sub, normal, u32t);
        let huge = self.cmp(ComparisonOp::GreaterThanEquals, a, k(self, 0x4780_0000));
        let o = self.select(huge, k(self, 0x7c00), o, u32t);
        let nan = self.cmp(ComparisonOp::GreaterThan, a, k(self, 0x7f80_0000));
        let payload = bin(
            self,
            BinaryOp::RShift,
            bin(self, BinaryOp::BitwiseAnd, a, k(self, 0x7f_ffff)),
            k(self, 13),
        );
        let quiet_nan = bin(self, BinaryOp::BitwiseOr, k(self, 0x7e00), payload);
        let o = self.select(nan, quiet_nan, o, u32t);
        let sign = bin(
            self,
            BinaryOp::RShift,
            bin(self, BinaryOp::BitwiseAnd, x, k(self, 0x8000_0000)),
            k(self, 16),
        );
        let out = bin(self, BinaryOp::BitwiseOr, o, sign);
        self.ctx.new_cast(None, out, self.t.u16)
    }

    pub(super) fn storage_value(&mut self, v: RValue<'c>, prec: Prec) -> RValue<'c> {
        let t = &self.t;
        let as_f32 = if v.get_type() == t.f32 { v } else { self.ctx.new_cast(None, v, t.f32) };
        match prec {
            Prec::F16 => self.f32_to_f16(as_f32),
            Prec::Bf16 => self.f32_to_bf16(as_f32),
            Prec::F32 => as_f32,
            Prec::F64 => {
                if v.get_type() == t.f64 {
                    v
                } else {
                    self.ctx.new_cast(None, v, t.f64)
                }
            }
            Prec::U32 => self.id_value(v),
        }
    }

    /// A computed value stored as an id, as Rust's `as u32` (and so the interpreter) converts:
    /// toward zero, saturating, `nan` to 0 (a C conversion out of range would be undefined).
    pub(super) fn id_value(&mut self, v: RValue<'c>) -> RValue<'c> {
        let f64t = self.t.f64;
        let x = self.cast(v, f64t);
        let x = self.temp(x, f64t);
        let max = self.float(4_294_967_295.0, f64t);
        let zero = self.float(0.0, f64t);
        let big = self.cmp(ComparisonOp::GreaterThanEquals, x, max);
        let clamped = self.select(big, max, x, f64t);
        let low = self.cmp(ComparisonOp::LessThanEquals, x, zero);
        let clamped = self.select(low, zero, clamped, f64t);
        let nan = self.cmp(ComparisonOp::NotEquals, x, x);
        let clamped = self.select(nan, zero, clamped, f64t);
        self.ctx.new_cast(None, clamped, self.t.u32)
    }
}

//! The evaluation of a map's postfix program over a chunk of lanes, one operation at a time
//! across every lane: each operation's loop is monomorphized for it (the `each!` lists), so
//! the op table's one definition ([`crate::ops`]) compiles to straight vector code.

use super::cells::{Chunk, get};
use super::{CHUNK, MAX_STACK, MapCode, MapDesc, MapElem, Offs};
use crate::ops::{BinOp, TernOp, UnOp};

/// The evaluation stack: one chunk of lanes per level.
pub(super) struct Eval<T> {
    pub(super) stack: [[T; CHUNK]; MAX_STACK],
}

impl<T: MapElem> Eval<T> {
    /// Evaluates the program for the chunk's lanes, each input read at its lane's offset moved
    /// by the point's `delta`; the result is left in `stack[0]`.
    #[inline(always)]
    pub(super) unsafe fn eval(&mut self, d: &MapDesc, ptrs: &[*mut T], c: &Chunk, delta: &Offs) {
        let w = c.w;
        let mut sp = 0usize;
        for code in &d.code {
            match *code {
                MapCode::Input(i) => {
                    // SAFETY: the caller's contract.
                    unsafe {
                        get(
                            ptrs[1 + i],
                            c.lanes[1 + i],
                            &c.offs[1 + i],
                            delta[1 + i],
                            &mut self.stack[sp],
                            w,
                        )
                    };
                    sp += 1;
                }
                MapCode::Const(x) => {
                    self.stack[sp][..w].fill(T::of(x));
                    sp += 1;
                }
                MapCode::Un(op) => unary(op, &mut self.stack[sp - 1], w),
                MapCode::Bin(op) => {
                    let (lo, hi) = self.stack.split_at_mut(sp - 1);
                    binary(op, &mut lo[sp - 2], &hi[0], w);
                    sp -= 1;
                }
                MapCode::Tern(op) => {
                    let (lo, hi) = self.stack.split_at_mut(sp - 2);
                    let (b, c) = hi.split_at(1);
                    ternary(op, &mut lo[sp - 3], &b[0], &c[0], w);
                    sp -= 2;
                }
            }
        }
    }
}

#[inline(always)]
pub(super) fn unary<T: MapElem>(op: UnOp, a: &mut [T; CHUNK], w: usize) {
    macro_rules! each {
        ($($op:ident),*) => {
            match op {
                $(UnOp::$op => {
                    for x in &mut a[..w] {
                        *x = UnOp::$op.compute(*x);
                    }
                })*
            }
        };
    }
    each!(
        Identity, Neg, Relu, Sat01, Exp, Log, Exp2, Log2, Sqrt, Recip, Sin, Cos, Tanh, Erf,
        Sigmoid, Abs, Not
    )
}

#[inline(always)]
pub(super) fn binary<T: MapElem>(op: BinOp, a: &mut [T; CHUNK], b: &[T; CHUNK], w: usize) {
    macro_rules! each {
        ($($op:ident),*) => {
            match op {
                $(BinOp::$op => {
                    for (x, y) in a[..w].iter_mut().zip(&b[..w]) {
                        *x = BinOp::$op.compute(*x, *y);
                    }
                })*
            }
        };
    }
    each!(Add, Sub, Mul, Div, Pow, Max, Min, Lt, Le, Gt, Eq, Ne, Second)
}

#[inline(always)]
pub(super) fn ternary<T: MapElem>(
    op: TernOp,
    a: &mut [T; CHUNK],
    b: &[T; CHUNK],
    c: &[T; CHUNK],
    w: usize,
) {
    macro_rules! each {
        ($($op:ident),*) => {
            match op {
                $(TernOp::$op => {
                    for ((x, y), z) in a[..w].iter_mut().zip(&b[..w]).zip(&c[..w]) {
                        *x = TernOp::$op.compute(*x, *y, *z);
                    }
                })*
            }
        };
    }
    each!(Where, Fma)
}

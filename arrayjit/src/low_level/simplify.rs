//! Simplification: constant folding, algebraic identities and fused multiply-add.
//!
//! Lowering produces naive expressions (`add(t0, mul(a, b))`, `mul(x, 1)` after constant
//! arguments, `id(x)`); this pass rewrites every expression bottom-up:
//! - operations on constants are folded with the reference semantics of [`crate::ops`];
//! - `id(x)`, `neg(neg(x))`, `x + 0`, `0 + x`, `x - 0`, `x * 1`, `1 * x`, `x / 1` become `x`,
//!   `x * -1` becomes `neg(x)`, and `where` on a constant condition picks its branch;
//! - `a * b + c` (either operand order) becomes `fma(a, b, c)`: one rounding, one instruction.

use super::{Expr, Program, Stmt};
use crate::ops::{BinOp, TernOp, UnOp};

/// Simplifies every expression of the program.
pub fn simplify_exprs(prog: &mut Program) {
    for s in &mut prog.body {
        simplify_stmt(s);
    }
}

fn simplify_stmt(s: &mut Stmt) {
    match s {
        Stmt::For { body, .. } | Stmt::If { body, .. } => body.iter_mut().for_each(simplify_stmt),
        Stmt::Set { value, .. } | Stmt::SetLocal { value, .. } => {
            let v = std::mem::replace(value, Expr::Const(0.0));
            *value = simplify(v);
        }
        Stmt::Comment(_) | Stmt::Gemm(_) | Stmt::Map(_) | Stmt::Call(_) => {}
    }
}

/// Simplifies one expression.
///
/// ```
/// use rocannl_arrayjit::low_level::{Expr, simplify::simplify};
/// use rocannl_arrayjit::ops::BinOp;
/// let e = Expr::bin(BinOp::Add, Expr::bin(BinOp::Mul, Expr::Const(2.0), Expr::Const(3.0)),
///                   Expr::Const(1.0));
/// assert_eq!(simplify(e), Expr::Const(7.0));
/// ```
pub fn simplify(e: Expr) -> Expr {
    e.rewrite(&mut step)
}

fn is_const(e: &Expr, c: f64) -> bool {
    matches!(e, Expr::Const(x) if *x == c)
}

fn step(e: Expr) -> Expr {
    match e {
        Expr::Unop(op, a) => match (op, *a) {
            (op, Expr::Const(c)) => Expr::Const(op.apply(c)),
            (UnOp::Identity, a) => a,
            (UnOp::Neg, Expr::Unop(UnOp::Neg, x)) => *x,
            (op, a) => Expr::Unop(op, Box::new(a)),
        },
        Expr::Binop(op, a, b) => {
            let (a, b) = (*a, *b);
            if let (Expr::Const(x), Expr::Const(y)) = (&a, &b) {
                return Expr::Const(op.apply(*x, *y));
            }
            match op {
                BinOp::Add if is_const(&b, 0.0) => a,
                BinOp::Add if is_const(&a, 0.0) => b,
                BinOp::Sub if is_const(&b, 0.0) => a,
                BinOp::Mul | BinOp::Div if is_const(&b, 1.0) => a,
                BinOp::Mul if is_const(&a, 1.0) => b,
                BinOp::Mul if is_const(&b, -1.0) => Expr::Unop(UnOp::Neg, Box::new(a)),
                BinOp::Second => b,
                BinOp::Add => match (a, b) {
                    (Expr::Binop(BinOp::Mul, x, y), c) | (c, Expr::Binop(BinOp::Mul, x, y)) => {
                        Expr::Ternop(TernOp::Fma, x, y, Box::new(c))
                    }
                    (a, b) => Expr::bin(BinOp::Add, a, b),
                },
                op => Expr::bin(op, a, b),
            }
        }
        Expr::Ternop(op, a, b, c) => match (op, *a, *b, *c) {
            (op, Expr::Const(x), Expr::Const(y), Expr::Const(z)) => Expr::Const(op.apply(x, y, z)),
            (TernOp::Where, Expr::Const(x), b, c) => {
                if x != 0.0 {
                    b
                } else {
                    c
                }
            }
            (op, a, b, c) => Expr::Ternop(op, Box::new(a), Box::new(b), Box::new(c)),
        },
        e => e,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::low_level::Index;
    use crate::tnode::NodeId;

    fn x() -> Expr {
        Expr::Get(NodeId(0), vec![Index::fixed(0)])
    }

    #[test]
    fn identities_and_fma() {
        let e =
            Expr::bin(BinOp::Add, Expr::Const(0.0), Expr::bin(BinOp::Mul, x(), Expr::Const(1.0)));
        assert_eq!(simplify(e), x());
        let e = Expr::bin(BinOp::Add, x(), Expr::bin(BinOp::Mul, x(), Expr::Const(3.0)));
        expect_test::expect!["fma(n0[0], 3, n0[0])"].assert_eq(&simplify(e).to_string());
        let e = Expr::Unop(UnOp::Neg, Box::new(Expr::Unop(UnOp::Neg, Box::new(x()))));
        assert_eq!(simplify(e), x());
    }

    #[test]
    fn folds_constants_with_reference_semantics() {
        let e = Expr::bin(BinOp::Max, Expr::Const(f64::NAN), Expr::Const(1.0));
        assert!(matches!(simplify(e), Expr::Const(c) if c.is_nan()));
        let e = Expr::Unop(UnOp::Exp, Box::new(Expr::Const(0.0)));
        assert_eq!(simplify(e), Expr::Const(1.0));
    }
}

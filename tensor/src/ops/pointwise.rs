//! Pointwise operations: unary, binary and `where`, with NumPy-style broadcasting per row.
//!
//! Each operation's derivative sits next to its forward definition. Broadcasting needs no
//! special care in the gradient: an argument read at index 0 along a broadcast axis gets the
//! gradient of every position summed into that one cell, because the gradient assignment runs
//! over the forward product space with the argument's index on the left.

use std::rc::Rc;

use rocannl_arrayjit::assignments::{Asgn, FetchOp, ScalarExpr};
use rocannl_arrayjit::indexing::Symbol;
use rocannl_arrayjit::ops::{BinOp, TernOp, UnOp};
use rocannl_shape::logic::Logic;
use rocannl_shape::var::ShapeId;

use crate::graph::Tensor;
use crate::op::{G, Op, OpCtx, Y, bin, c, mul, x};

/// A unary pointwise operation.
#[derive(Debug)]
pub(crate) struct Unary(pub UnOp);

fn un(op: UnOp, a: ScalarExpr) -> ScalarExpr {
    ScalarExpr::un(op, a)
}

impl Unary {
    /// `dy/dx` as an expression of `x` (argument 0) and `y` (the result).
    fn derivative(&self) -> Option<ScalarExpr> {
        let ln2 = std::f64::consts::LN_2;
        Some(match self.0 {
            UnOp::Identity => c(1.0),
            UnOp::Neg => c(-1.0),
            UnOp::Relu => bin(BinOp::Lt, c(0.0), x(0)),
            UnOp::Sat01 => mul(bin(BinOp::Lt, c(0.0), x(0)), bin(BinOp::Lt, x(0), c(1.0))),
            UnOp::Exp => Y,
            UnOp::Log => un(UnOp::Recip, x(0)),
            UnOp::Exp2 => mul(Y, c(ln2)),
            UnOp::Log2 => un(UnOp::Recip, mul(x(0), c(ln2))),
            UnOp::Sqrt => bin(BinOp::Div, c(0.5), Y),
            UnOp::Recip => un(UnOp::Neg, mul(Y, Y)),
            UnOp::Sin => un(UnOp::Cos, x(0)),
            UnOp::Cos => un(UnOp::Neg, un(UnOp::Sin, x(0))),
            UnOp::Tanh => bin(BinOp::Sub, c(1.0), mul(Y, Y)),
            UnOp::Erf => mul(
                c(std::f64::consts::FRAC_2_SQRT_PI),
                un(UnOp::Exp, un(UnOp::Neg, mul(x(0), x(0)))),
            ),
            UnOp::Sigmoid => mul(Y, bin(BinOp::Sub, c(1.0), Y)),
            UnOp::Abs => {
                bin(BinOp::Sub, bin(BinOp::Lt, c(0.0), x(0)), bin(BinOp::Lt, x(0), c(0.0)))
            }
            UnOp::Not => return None,
        })
    }
}

impl Op for Unary {
    fn name(&self) -> String {
        self.0.name().to_string()
    }
    fn logic(&self, args: &[ShapeId]) -> Logic {
        Logic::Pointwise(args.to_vec())
    }
    fn differentiable(&self) -> bool {
        self.derivative().is_some()
    }
    fn forward(&self, cx: &OpCtx) -> Asgn {
        cx.out(None, &un(self.0, x(0)), false)
    }
    fn backward(&self, cx: &OpCtx) -> Vec<Asgn> {
        let Some(d) = self.derivative() else { return vec![] };
        let expr = match d {
            ScalarExpr::Const(1.0) => G,
            d => mul(G, d),
        };
        cx.grad(0, &expr).into_iter().collect()
    }
}

/// A binary pointwise operation.
#[derive(Debug)]
pub(crate) struct Binary(pub BinOp);

impl Binary {
    /// `(d/da, d/db)` as expressions of `a`, `b` and the result.
    fn derivatives(&self) -> Option<(ScalarExpr, ScalarExpr)> {
        let (a, b) = (x(0), x(1));
        let half_tie = || mul(c(0.5), bin(BinOp::Eq, x(0), x(1)));
        Some(match self.0 {
            BinOp::Add => (c(1.0), c(1.0)),
            BinOp::Sub => (c(1.0), c(-1.0)),
            BinOp::Mul => (b, a),
            BinOp::Div => (un(UnOp::Recip, b.clone()), un(UnOp::Neg, bin(BinOp::Div, Y, b))),
            // As PyTorch: `x^0` is constant in `x` (no `0·x^-1 = 0·inf` at `x = 0`), and
            // `0^y` for `y >= 0` is constant in `y` (no `0·log 0 = 0·-inf`).
            BinOp::Pow => (
                ScalarExpr::tern(
                    TernOp::Where,
                    bin(BinOp::Eq, b.clone(), c(0.0)),
                    c(0.0),
                    mul(b.clone(), bin(BinOp::Pow, a.clone(), bin(BinOp::Sub, b.clone(), c(1.0)))),
                ),
                ScalarExpr::tern(
                    TernOp::Where,
                    mul(bin(BinOp::Eq, a.clone(), c(0.0)), bin(BinOp::Le, c(0.0), b)),
                    c(0.0),
                    mul(Y, un(UnOp::Log, a)),
                ),
            ),
            // Ties split the gradient evenly between the arguments.
            BinOp::Max => (
                bin(BinOp::Add, bin(BinOp::Lt, x(1), x(0)), half_tie()),
                bin(BinOp::Add, bin(BinOp::Lt, x(0), x(1)), half_tie()),
            ),
            BinOp::Min => (
                bin(BinOp::Add, bin(BinOp::Lt, x(0), x(1)), half_tie()),
                bin(BinOp::Add, bin(BinOp::Lt, x(1), x(0)), half_tie()),
            ),
            _ => return None,
        })
    }
}

impl Op for Binary {
    fn name(&self) -> String {
        self.0.name().to_string()
    }
    fn pointwise(&self) -> bool {
        true
    }
    fn logic(&self, args: &[ShapeId]) -> Logic {
        Logic::Pointwise(args.to_vec())
    }
    fn differentiable(&self) -> bool {
        self.derivatives().is_some()
    }
    fn forward(&self, cx: &OpCtx) -> Asgn {
        cx.out(None, &bin(self.0, x(0), x(1)), false)
    }
    fn backward(&self, cx: &OpCtx) -> Vec<Asgn> {
        let Some((da, db)) = self.derivatives() else { return vec![] };
        let term = |d: ScalarExpr| match d {
            ScalarExpr::Const(1.0) => G,
            ScalarExpr::Const(-1.0) => un(UnOp::Neg, G),
            d => mul(G, d),
        };
        [cx.grad(0, &term(da)), cx.grad(1, &term(db))].into_iter().flatten().collect()
    }
}

/// The identity that stops gradients (the result is treated as a constant).
#[derive(Debug)]
pub(crate) struct Detach;

impl Op for Detach {
    fn name(&self) -> String {
        "detach".into()
    }
    fn logic(&self, args: &[ShapeId]) -> Logic {
        Logic::Pointwise(args.to_vec())
    }
    fn differentiable(&self) -> bool {
        false
    }
    fn forward(&self, cx: &OpCtx) -> Asgn {
        cx.out(None, &x(0), false)
    }
    fn backward(&self, _cx: &OpCtx) -> Vec<Asgn> {
        vec![]
    }
}

/// Uniform random numbers in `[0, 1)` with the shape of the argument (whose values are not
/// read): counter-based, salted by a runtime symbol when given.
#[derive(Debug)]
pub(crate) struct UniformLike {
    /// The generator's seed.
    pub seed: u64,
    /// A runtime symbol drawing a fresh block of numbers per value (e.g. the step counter).
    pub salt: Option<Symbol>,
}

impl Op for UniformLike {
    fn name(&self) -> String {
        "uniform".into()
    }
    fn logic(&self, args: &[ShapeId]) -> Logic {
        Logic::Pointwise(args.to_vec())
    }
    fn differentiable(&self) -> bool {
        false
    }
    fn forward(&self, cx: &OpCtx) -> Asgn {
        Asgn::Fetch { lhs: cx.out, fetch: FetchOp::Uniform { seed: self.seed, salt: self.salt } }
    }
    fn backward(&self, _cx: &OpCtx) -> Vec<Asgn> {
        vec![]
    }
}

/// `where(cond, a, b)`: `a` where `cond != 0`, else `b`.
#[derive(Debug)]
pub(crate) struct Where;

impl Op for Where {
    fn name(&self) -> String {
        "where".into()
    }
    fn logic(&self, args: &[ShapeId]) -> Logic {
        Logic::Pointwise(args.to_vec())
    }
    fn forward(&self, cx: &OpCtx) -> Asgn {
        cx.out(None, &ScalarExpr::tern(TernOp::Where, x(0), x(1), x(2)), false)
    }
    fn backward(&self, cx: &OpCtx) -> Vec<Asgn> {
        let when = |yes: ScalarExpr, no: ScalarExpr| ScalarExpr::tern(TernOp::Where, x(0), yes, no);
        [cx.grad(1, &when(G, c(0.0))), cx.grad(2, &when(c(0.0), G))].into_iter().flatten().collect()
    }
}

/// The first argument's values, with every argument of exactly the result's shape (no
/// broadcasting): ties a loss's predictions to its targets, so that a leftover axis of size 1
/// on one side is a shape error naming both tensors instead of a batch × batch table.
#[derive(Debug)]
pub(crate) struct SameShape;

impl Op for SameShape {
    fn name(&self) -> String {
        "same_shape".into()
    }
    fn logic(&self, args: &[ShapeId]) -> Logic {
        Logic::Same(args.to_vec())
    }
    fn forward(&self, cx: &OpCtx) -> Asgn {
        cx.out(None, &x(0), false)
    }
    fn backward(&self, cx: &OpCtx) -> Vec<Asgn> {
        cx.grad(0, &G).into_iter().collect()
    }
}

impl Tensor {
    /// `self`, with its shape tied to `other`'s: both must have exactly the same rows, with no
    /// broadcasting either way (gradients flow to `self` only). Losses use it to pair
    /// predictions with targets cell for cell.
    ///
    /// ```
    /// use rocannl_tensor::{Axes, Graph};
    /// let g = Graph::new();
    /// let pred = g.data("pred", Axes::new().batch(&[4, 1]));
    /// let target = g.data("target", Axes::new().batch(&[4]));
    /// let _ = (&pred.same_shape_as(&target) - &target);
    /// let err = g.finish().unwrap_err().to_string();
    /// assert!(err.contains("pred") && err.contains("target"), "{err}");
    /// ```
    pub fn same_shape_as(&self, other: &Tensor) -> Tensor {
        self.graph.add_op(Rc::new(SameShape), &[self, other])
    }

    fn unary(&self, op: UnOp) -> Tensor {
        self.graph.add_op(Rc::new(Unary(op)), &[self])
    }

    fn binary(&self, op: BinOp, other: &Tensor) -> Tensor {
        self.graph.add_op(Rc::new(Binary(op)), &[self, other])
    }

    /// Uniform random numbers in `[0, 1)` shaped like `self`; with `per_step`, fresh on every
    /// training step and every run (salted by the graph's step counter, which the session
    /// binds), otherwise the same on every run. The seed derives from the graph's seed.
    ///
    /// ```
    /// use rocannl_tensor::{Graph, Session};
    /// let g = Graph::with_seed(3);
    /// let x = g.vector("x", &[0.0; 4]);
    /// let u = x.uniform_like(false);
    /// let mut s = Session::new(&g).unwrap();
    /// let r = s.forward(&[&u]).unwrap();
    /// s.run(&r).unwrap();
    /// assert!(s.read(&u).unwrap().iter().all(|v| (0.0..1.0).contains(v)));
    /// ```
    pub fn uniform_like(&self, per_step: bool) -> Tensor {
        let salt = per_step.then(|| self.graph.step_symbol());
        let seed = crate::init::derive_seed(self.graph.seed() ^ 0xD0, self.graph.len() as u32);
        self.graph.add_op(Rc::new(UniformLike { seed, salt }), &[self])
    }

    /// The same values, through which no gradient flows.
    pub fn detach(&self) -> Tensor {
        self.graph.add_op(Rc::new(Detach), &[self])
    }

    /// `max(0, x)`.
    pub fn relu(&self) -> Tensor {
        self.unary(UnOp::Relu)
    }
    /// `x` clamped to `[0, 1]`.
    pub fn sat01(&self) -> Tensor {
        self.unary(UnOp::Sat01)
    }
    /// `e^x`.
    pub fn exp(&self) -> Tensor {
        self.unary(UnOp::Exp)
    }
    /// Natural logarithm.
    pub fn log(&self) -> Tensor {
        self.unary(UnOp::Log)
    }
    /// `2^x`.
    pub fn exp2(&self) -> Tensor {
        self.unary(UnOp::Exp2)
    }
    /// Base-2 logarithm.
    pub fn log2(&self) -> Tensor {
        self.unary(UnOp::Log2)
    }
    /// Square root.
    pub fn sqrt(&self) -> Tensor {
        self.unary(UnOp::Sqrt)
    }
    /// `1/x`.
    pub fn recip(&self) -> Tensor {
        self.unary(UnOp::Recip)
    }
    /// Sine.
    pub fn sin(&self) -> Tensor {
        self.unary(UnOp::Sin)
    }
    /// Cosine.
    pub fn cos(&self) -> Tensor {
        self.unary(UnOp::Cos)
    }
    /// Hyperbolic tangent.
    pub fn tanh(&self) -> Tensor {
        self.unary(UnOp::Tanh)
    }
    /// `1/(1+e^-x)`.
    pub fn sigmoid(&self) -> Tensor {
        self.unary(UnOp::Sigmoid)
    }
    /// The error function.
    pub fn erf(&self) -> Tensor {
        self.unary(UnOp::Erf)
    }
    /// GELU, exact: `x·(1 + erf(x/√2))/2` (PyTorch's `gelu`).
    ///
    /// ```
    /// use rocannl_tensor::{Axes, Graph, Session};
    /// let g = Graph::new();
    /// let x = g.ndarray("x", Axes::new().output(&[3]), &[-1.0, 0.0, 1.0]);
    /// let y = x.gelu();
    /// let mut s = Session::new(&g).unwrap();
    /// let r = s.forward(&[&y]).unwrap();
    /// s.run(&r).unwrap();
    /// let v = s.read(&y).unwrap();
    /// assert!((v[2] - 0.841_344_7).abs() < 1e-6 && (v[0] + 0.158_655_3).abs() < 1e-6);
    /// ```
    pub fn gelu(&self) -> Tensor {
        // The factors (and so their gradients, `G·x/2` past f16's range for large `x`) in f32
        // in a half-precision session.
        let half_x = self.scale(0.5).kept_in_f32();
        let erf = self.scale(std::f64::consts::FRAC_1_SQRT_2).kept_in_f32().erf().kept_in_f32();
        let cdf = (&erf + 1.0).kept_in_f32();
        half_x.pointmul(&cdf)
    }
    /// GELU, tanh approximation: `x·(1 + tanh(√(2/π)·(x + 0.044715·x³)))/2` (PyTorch's
    /// `gelu(approximate="tanh")`, GPT-2's).
    pub fn gelu_tanh(&self) -> Tensor {
        // The cube in f32 in a half-precision session: 256³ is past f16's largest number.
        let cube = self.pointmul(self).kept_in_f32().pointmul(self).kept_in_f32();
        let inner = (self + &cube.scale(0.044715).kept_in_f32())
            .kept_in_f32()
            .scale((2.0 / std::f64::consts::PI).sqrt())
            .kept_in_f32();
        let one_plus_tanh = (&inner.tanh().kept_in_f32() + 1.0).kept_in_f32();
        self.scale(0.5).kept_in_f32().pointmul(&one_plus_tanh)
    }
    /// SiLU (swish): `x·sigmoid(x)`.
    pub fn silu(&self) -> Tensor {
        // The sigmoid (and so its gradient, `G·x`) in f32 in a half-precision session.
        self.pointmul(&self.sigmoid().kept_in_f32())
    }
    /// Absolute value.
    pub fn abs(&self) -> Tensor {
        self.unary(UnOp::Abs)
    }
    /// 1 where `x = 0`, else 0 (not differentiable).
    pub fn not(&self) -> Tensor {
        self.unary(UnOp::Not)
    }
    /// Pointwise product (OCANNL's `*.`); `*` is compose (matmul).
    pub fn pointmul(&self, other: &Tensor) -> Tensor {
        self.binary(BinOp::Mul, other)
    }
    /// `x^y`.
    pub fn pow(&self, other: &Tensor) -> Tensor {
        self.binary(BinOp::Pow, other)
    }
    /// `x^p` for a number `p`.
    pub fn powf(&self, p: f64) -> Tensor {
        let p = self.graph.number(p);
        self.pow(&p)
    }
    /// Pointwise maximum (NaN-propagating).
    pub fn max(&self, other: &Tensor) -> Tensor {
        self.binary(BinOp::Max, other)
    }
    /// Pointwise minimum (NaN-propagating).
    pub fn min(&self, other: &Tensor) -> Tensor {
        self.binary(BinOp::Min, other)
    }
    /// 1 where `x < y`, else 0 (not differentiable).
    pub fn lt(&self, other: &Tensor) -> Tensor {
        self.binary(BinOp::Lt, other)
    }
    /// 1 where `x = y`, else 0 (not differentiable).
    pub fn eq(&self, other: &Tensor) -> Tensor {
        self.binary(BinOp::Eq, other)
    }
    /// 1 where `x ≠ y`, else 0 (not differentiable).
    pub fn ne(&self, other: &Tensor) -> Tensor {
        self.binary(BinOp::Ne, other)
    }
    /// `self` where `cond ≠ 0`, else `other`.
    pub fn where_(cond: &Tensor, then: &Tensor, otherwise: &Tensor) -> Tensor {
        cond.graph.add_op(Rc::new(Where), &[cond, then, otherwise])
    }
    /// `x * s` for a number `s` (pointwise).
    pub fn scale(&self, s: f64) -> Tensor {
        let s = self.graph.number(s);
        self.pointmul(&s)
    }
}

macro_rules! binop_impls {
    ($trait:ident, $method:ident, $op:expr) => {
        impl std::ops::$trait<&Tensor> for &Tensor {
            type Output = Tensor;
            fn $method(self, rhs: &Tensor) -> Tensor {
                self.binary($op, rhs)
            }
        }
        impl std::ops::$trait<Tensor> for Tensor {
            type Output = Tensor;
            fn $method(self, rhs: Tensor) -> Tensor {
                self.binary($op, &rhs)
            }
        }
        impl std::ops::$trait<&Tensor> for Tensor {
            type Output = Tensor;
            fn $method(self, rhs: &Tensor) -> Tensor {
                self.binary($op, rhs)
            }
        }
        impl std::ops::$trait<f64> for &Tensor {
            type Output = Tensor;
            fn $method(self, rhs: f64) -> Tensor {
                let n = self.graph.number(rhs);
                self.binary($op, &n)
            }
        }
        impl std::ops::$trait<f64> for Tensor {
            type Output = Tensor;
            fn $method(self, rhs: f64) -> Tensor {
                let n = self.graph.number(rhs);
                self.binary($op, &n)
            }
        }
        impl std::ops::$trait<&Tensor> for f64 {
            type Output = Tensor;
            fn $method(self, rhs: &Tensor) -> Tensor {
                let n = rhs.graph.number(self);
                n.binary($op, rhs)
            }
        }
    };
}

binop_impls!(Add, add, BinOp::Add);
binop_impls!(Sub, sub, BinOp::Sub);
binop_impls!(Div, div, BinOp::Div);

impl std::ops::Neg for &Tensor {
    type Output = Tensor;
    fn neg(self) -> Tensor {
        self.unary(UnOp::Neg)
    }
}

impl std::ops::Neg for Tensor {
    type Output = Tensor;
    fn neg(self) -> Tensor {
        self.unary(UnOp::Neg)
    }
}

impl std::ops::Mul<f64> for &Tensor {
    type Output = Tensor;
    /// Scaling by a number (pointwise).
    fn mul(self, rhs: f64) -> Tensor {
        self.scale(rhs)
    }
}

impl std::ops::Mul<f64> for Tensor {
    type Output = Tensor;
    fn mul(self, rhs: f64) -> Tensor {
        self.scale(rhs)
    }
}

impl std::ops::Mul<&Tensor> for f64 {
    type Output = Tensor;
    fn mul(self, rhs: &Tensor) -> Tensor {
        rhs.scale(self)
    }
}

//! Contractions: compose (`*`, matmul), fused multiply-add, and the einsum family.
//!
//! All of them accumulate over a product space that includes the contracted (reduced) axes,
//! so their forward assignment starts from the accumulation's neutral element. Their gradients
//! run over the same space: for a sum of products each factor's gradient is the result's
//! gradient times the other factors; for a maximum (`amax`, `tropical`) the gradient flows
//! to every argument position that attains the maximum.

use std::rc::Rc;
use std::sync::Arc;

use rocannl_arrayjit::assignments::{Asgn, ScalarExpr};
use rocannl_arrayjit::ops::{BinOp, UnOp};
use rocannl_shape::logic::Logic;
use rocannl_shape::spec::EinsumSpec;
use rocannl_shape::var::ShapeId;

use crate::error::Error;
use crate::graph::Tensor;
use crate::op::{G, Op, OpCtx, Side, Y, bin, c, mul, x};

/// `a * b`: the input axes of `a` contract with the output axes of `b` (OCANNL's `*`).
#[derive(Debug)]
pub(crate) struct Compose;

impl Op for Compose {
    fn name(&self) -> String {
        "matmul".into()
    }
    fn logic(&self, args: &[ShapeId]) -> Logic {
        Logic::Compose(args[0], args[1])
    }
    fn is_factor(&self, i: usize) -> bool {
        i < 2
    }
    fn forward(&self, cx: &OpCtx) -> Asgn {
        cx.out(Some(BinOp::Add), &mul(x(0), x(1)), true)
    }
    fn backward(&self, cx: &OpCtx) -> Vec<Asgn> {
        [cx.grad(0, &mul(G, x(1))), cx.grad(1, &mul(G, x(0)))].into_iter().flatten().collect()
    }
}

/// `a * b + c` with compose semantics for `a * b`.
#[derive(Debug)]
pub(crate) struct Fma;

impl Op for Fma {
    fn name(&self) -> String {
        "fma".into()
    }
    fn logic(&self, args: &[ShapeId]) -> Logic {
        Logic::ComposeAccumulate(args[0], args[1], args[2])
    }
    fn is_factor(&self, i: usize) -> bool {
        i < 2
    }
    fn forward(&self, cx: &OpCtx) -> Asgn {
        // c first (over its own axes only), then the contraction accumulates onto it.
        Asgn::Seq(vec![
            cx.assign(cx.out, Side::Out, None, &x(2), 0, false),
            cx.out(Some(BinOp::Add), &mul(x(0), x(1)), false),
        ])
    }
    fn backward(&self, cx: &OpCtx) -> Vec<Asgn> {
        [cx.grad(0, &mul(G, x(1))), cx.grad(1, &mul(G, x(0))), cx.grad(2, &G)]
            .into_iter()
            .flatten()
            .collect()
    }
}

/// How an einsum combines its arguments and reduces.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub(crate) enum Reduce {
    /// Multiply, then sum over the labels absent from the result (`einsum`).
    Sum,
    /// Multiply, then average over the labels absent from the result (the count comes from
    /// the projection's product space, so it is exact whatever the inferred sizes).
    Mean,
    /// Maximum over the labels absent from the result (`amax`).
    Max,
    /// Add, then take the maximum (`tropical`, the max-plus semiring).
    Tropical,
}

/// An einsum over one to three arguments.
#[derive(Debug)]
pub(crate) struct Einsum {
    /// The spec.
    pub spec: Arc<EinsumSpec>,
    /// The semiring.
    pub reduce: Reduce,
}

impl Einsum {
    fn combined(&self, n: usize) -> rocannl_arrayjit::ScalarExpr {
        let op = match self.reduce {
            Reduce::Sum | Reduce::Mean | Reduce::Max => BinOp::Mul,
            Reduce::Tropical => BinOp::Add,
        };
        (1..n).fold(x(0), |acc, i| bin(op, acc, x(i)))
    }
}

impl Op for Einsum {
    fn name(&self) -> String {
        let kind = match self.reduce {
            Reduce::Sum => "einsum",
            Reduce::Mean => "mean",
            Reduce::Max => "einmax",
            Reduce::Tropical => "tropical",
        };
        format!("{kind} {}", self.spec.text)
    }
    fn logic(&self, args: &[ShapeId]) -> Logic {
        Logic::Einsum(self.spec.clone(), args.to_vec())
    }
    fn is_factor(&self, _i: usize) -> bool {
        matches!(self.reduce, Reduce::Sum | Reduce::Mean)
    }
    fn forward(&self, cx: &OpCtx) -> Asgn {
        let acc = match self.reduce {
            Reduce::Sum | Reduce::Mean => BinOp::Add,
            Reduce::Max | Reduce::Tropical => BinOp::Max,
        };
        let mut expr = self.combined(cx.args.len());
        if self.reduce == Reduce::Mean {
            expr = mul(expr, mean_scale(cx));
        }
        cx.out(Some(acc), &expr, true)
    }
    fn backward(&self, cx: &OpCtx) -> Vec<Asgn> {
        let n = cx.args.len();
        (0..n)
            .filter_map(|i| {
                let expr = match self.reduce {
                    Reduce::Sum => (0..n).filter(|j| *j != i).fold(G, |acc, j| mul(acc, x(j))),
                    Reduce::Mean => (0..n)
                        .filter(|j| *j != i)
                        .fold(mul(G, mean_scale(cx)), |acc, j| mul(acc, x(j))),
                    // The gradient reaches the positions that attain the maximum.
                    Reduce::Max | Reduce::Tropical => mul(G, bin(BinOp::Eq, self.combined(n), Y)),
                };
                cx.grad(i, &expr)
            })
            .collect()
    }
}

/// One over the number of product-space points that map to each result cell: the product of
/// the sizes of the iterators the result's index does not use. A reduced dynamic iterator
/// counts with its size when running, so a mean over a dynamic batch divides by the rows
/// there are (`1 / (fixed · n)`, rounded once as the constant is).
fn mean_scale(cx: &OpCtx) -> ScalarExpr {
    let p = &cx.proj[0];
    let used: Vec<_> = p.project_lhs.iter().flat_map(|i| i.symbols()).collect();
    let mut fixed = 1usize;
    let mut sizes = Vec::new();
    for (s, d) in p.product_iterators.iter().zip(&p.product_space) {
        if used.contains(s) {
            continue;
        }
        match p.dynamic.iter().find(|(it, _)| it == s) {
            Some((_, size)) => sizes.push(ScalarExpr::Symbol(*size)),
            None => fixed *= *d,
        }
    }
    if sizes.is_empty() {
        return c(1.0 / fixed.max(1) as f64);
    }
    let count = sizes.into_iter().fold(c(fixed as f64), mul);
    ScalarExpr::un(UnOp::Recip, count)
}

/// The tensors after `self` that an einsum takes: one (`&b`), several (`[&b, &c]`) or none
/// (`[]`).
pub trait Operands<'a> {
    /// The tensors, in order.
    fn operands(self) -> Vec<&'a Tensor>;
}

impl<'a> Operands<'a> for &'a Tensor {
    fn operands(self) -> Vec<&'a Tensor> {
        vec![self]
    }
}

impl<'a, const N: usize> Operands<'a> for [&'a Tensor; N] {
    fn operands(self) -> Vec<&'a Tensor> {
        self.to_vec()
    }
}

impl<'a> Operands<'a> for &[&'a Tensor] {
    fn operands(self) -> Vec<&'a Tensor> {
        self.to_vec()
    }
}

fn parse(t: &Tensor, spec: &str, n: usize) -> Option<Arc<EinsumSpec>> {
    match t.graph.spec(spec, false) {
        Ok(s) if s.operands.len() == n => Some(s),
        Ok(s) => {
            t.graph.record(Error::usage(format!(
                "spec \"{spec}\" has {} operand(s) but is applied to {n} tensor(s)",
                s.operands.len()
            )));
            None
        }
        Err(e) => {
            t.graph.record(Error::Shape(e.into()));
            None
        }
    }
}

impl Tensor {
    fn einsum_n(&self, spec: &str, others: &[&Tensor], reduce: Reduce) -> Tensor {
        let mut args = vec![self];
        args.extend_from_slice(others);
        let spec = parse(self, spec, args.len()).unwrap_or_else(|| {
            // The error is recorded; keep building with a harmless spec of the right arity.
            let text = vec!["..."; args.len()].join(";") + "=>...";
            Arc::new(EinsumSpec::parse(&text).expect("a valid fallback spec"))
        });
        self.graph.add_op(Rc::new(Einsum { spec, reduce }), &args)
    }

    /// `a * b`: compose — the input axes of `self` contract with the output axes of `other`.
    pub fn matmul(&self, other: &Tensor) -> Tensor {
        self.graph.add_op(Rc::new(Compose), &[self, other])
    }

    /// `self * b + c` (compose, then add).
    pub fn fma(&self, b: &Tensor, c: &Tensor) -> Tensor {
        self.graph.add_op(Rc::new(Fma), &[self, b, c])
    }

    /// Einsum (OCANNL's `+*` for two tensors, `++` for one): multiply `self` and `others`
    /// cell by cell over the labels of `spec`, then sum over the labels absent from the
    /// result. The spec's operands (`;`-separated) say how many tensors it takes: `self`
    /// first, then `others` — one tensor (`&b`), several (`[&b, &c]`) or none (`[]`, which
    /// permutes, sums, takes diagonals, selects or places).
    ///
    /// ```
    /// use rocannl_tensor::{Axes, Graph};
    /// let g = Graph::new();
    /// let a = g.data("a", Axes::new().output(&[2, 3]));
    /// let b = g.data("b", Axes::new().output(&[3, 4]));
    /// let v = g.data("v", Axes::new().output(&[3]));
    /// let ab = a.einsum("ij; jk => ik", &b);
    /// let avb = a.einsum("ij; j; jk => ik", [&v, &b]);
    /// let sums = a.einsum("ij => i", []);
    /// g.finish().unwrap();
    /// assert_eq!(ab.dims().unwrap(), vec![2, 4]);
    /// assert_eq!(avb.dims().unwrap(), vec![2, 4]);
    /// assert_eq!(sums.dims().unwrap(), vec![2]);
    /// ```
    pub fn einsum<'a>(&'a self, spec: &str, others: impl Operands<'a>) -> Tensor {
        self.einsum_n(spec, &others.operands(), Reduce::Sum)
    }

    /// The mean over the labels `spec` drops (one tensor's einsum, averaging instead of
    /// summing: OCANNL's `++` divided by the count).
    ///
    /// ```
    /// use rocannl_tensor::{Axes, Graph, Session};
    /// let g = Graph::new();
    /// let x = g.ndarray("x", Axes::new().batch(&[2]).output(&[2]), &[1.0, 3.0, 2.0, 6.0]);
    /// let m = x.mean("b|i => b|0");
    /// let mut s = Session::new(&g).unwrap();
    /// let r = s.forward(&[&m]).unwrap();
    /// s.run(&r).unwrap();
    /// assert_eq!(s.read(&m).unwrap(), vec![2.0, 4.0]);
    /// ```
    pub fn mean(&self, spec: &str) -> Tensor {
        self.einsum_n(spec, &[], Reduce::Mean)
    }

    /// The variance over the axes `spec` reduces, which must map them to one position (as
    /// [`Tensor::softmax`]'s spec: `"... | t -> h => ... | 0 -> h"`): the mean of the squared
    /// deviations from [`Tensor::mean`] (`unbiased: false`, PyTorch's `correction=0`), or
    /// their sum over `n - 1` (`unbiased: true`, `correction=1`, `torch.var`'s default). The
    /// statistics are kept in f32 in half-precision sessions; a dynamic batch counts its
    /// current rows.
    ///
    /// ```
    /// use rocannl_tensor::{Axes, Graph, Session};
    /// let g = Graph::new();
    /// let x = g.ndarray("x", Axes::new().batch(&[2]).output(&[4]), &[1.0, 2.0, 3.0, 4.0, 0.0, 0.0, 0.0, 8.0]);
    /// let biased = x.var("b|i => b|0", false);
    /// let unbiased = x.var("b|i => b|0", true);
    /// let mut s = Session::new(&g).unwrap();
    /// let r = s.forward(&[&biased, &unbiased]).unwrap();
    /// s.run(&r).unwrap();
    /// assert_eq!(s.read(&biased).unwrap(), vec![1.25, 12.0]);
    /// assert_eq!(s.read(&unbiased).unwrap(), vec![(5.0f32 / 3.0) as f64, 16.0]);
    /// ```
    pub fn var(&self, spec: &str, unbiased: bool) -> Tensor {
        let centered = (self - &self.mean(spec).kept_in_f32()).kept_in_f32();
        let squares = centered.pointmul(&centered).kept_in_f32();
        if !unbiased {
            return squares.mean(spec).kept_in_f32();
        }
        // The number of cells each result cell reduces: a sum of ones shaped like `self`
        // (`x < x` is 0 for every x, NaN and infinities included).
        let ones = &self.detach().lt(&self.detach()) + 1.0;
        let count = ones.einsum(spec, []).kept_in_f32();
        (&squares.einsum(spec, []).kept_in_f32() / &(&count - 1.0)).kept_in_f32()
    }

    /// The maximum over the labels `spec` drops (OCANNL's `@^^`, PyTorch's `amax`); the
    /// gradient reaches every position that attains it.
    pub fn amax(&self, spec: &str) -> Tensor {
        self.einsum_n(spec, &[], Reduce::Max)
    }

    /// Max-plus einsum (OCANNL's `@^+`): add, then take the maximum.
    pub fn tropical(&self, spec: &str, other: &Tensor) -> Tensor {
        self.einsum_n(spec, &[other], Reduce::Tropical)
    }

    /// An einsum whose convolution axes are padded to preserve dimensions.
    pub fn einsum_padded(&self, spec: &str, other: &Tensor) -> Tensor {
        let spec = match self.graph.spec(spec, true) {
            Ok(s) => s,
            Err(e) => {
                self.graph.record(Error::Shape(e.into()));
                return self.einsum_n("...;...=>...", &[other], Reduce::Sum);
            }
        };
        self.graph.add_op(Rc::new(Einsum { spec, reduce: Reduce::Sum }), &[self, other])
    }

    /// A max-plus einsum whose convolution axes are padded to preserve dimensions.
    pub fn tropical_padded(&self, spec: &str, other: &Tensor) -> Tensor {
        let spec = match self.graph.spec(spec, true) {
            Ok(s) => s,
            Err(e) => {
                self.graph.record(Error::Shape(e.into()));
                return self.einsum_n("...;...=>...", &[other], Reduce::Tropical);
            }
        };
        self.graph.add_op(Rc::new(Einsum { spec, reduce: Reduce::Tropical }), &[self, other])
    }
}

impl std::ops::Mul<&Tensor> for &Tensor {
    type Output = Tensor;
    /// Compose (matmul), as OCANNL's `*`.
    fn mul(self, rhs: &Tensor) -> Tensor {
        self.matmul(rhs)
    }
}

impl std::ops::Mul<Tensor> for Tensor {
    type Output = Tensor;
    fn mul(self, rhs: Tensor) -> Tensor {
        self.matmul(&rhs)
    }
}

impl std::ops::Mul<&Tensor> for Tensor {
    type Output = Tensor;
    fn mul(self, rhs: &Tensor) -> Tensor {
        self.matmul(rhs)
    }
}

//! Scaled dot-product attention as one operation.
//!
//! Written as its parts — a product for the scores, a mask, a softmax, a product with the
//! values — attention stores `batch × heads × queries × keys` scores and reads them back in
//! every step of both passes. As one operation its shapes are those of the three-argument
//! einsum `... s | h d; ... t | h d; ... t | h e => ... s | h e` (queries, keys and values
//! with positions in the batch row, heads and widths in the output row), and the compiler
//! runs it as a fused kernel on the native backend, as ordinary nests elsewhere
//! ([`rocannl_arrayjit::assignments::AttentionAsgn`]). The operation keeps each row's
//! log-sum-exp ([`Op::aux_dims`]), so that its gradient recomputes the probabilities without
//! the forward pass's scores.

use std::rc::Rc;
use std::sync::Arc;

use rocannl_arrayjit::assignments::{Asgn, AttentionAsgn, AttentionGrads};
use rocannl_shape::logic::Logic;
use rocannl_shape::spec::EinsumSpec;
use rocannl_shape::var::ShapeId;

use super::batch_limit;
use crate::error::Error;
use crate::graph::Tensor;
use crate::op::{Op, OpCtx};

/// The shapes of an attention, as an einsum.
const SPEC: &str = "... s | h d; ... t | h d; ... t | h e => ... s | h e";

/// `softmax(scale · q·kᵀ)·v` per (batch, head), the softmax over the keys each query sees.
#[derive(Debug)]
pub(crate) struct ScaledDotProduct {
    spec: Arc<EinsumSpec>,
    causal: bool,
    scale: f64,
}

impl Op for ScaledDotProduct {
    fn name(&self) -> String {
        let causal = if self.causal { "causal " } else { "" };
        format!("{causal}attention")
    }
    fn logic(&self, args: &[ShapeId]) -> Logic {
        Logic::Einsum(self.spec.clone(), args.to_vec())
    }
    /// The log-sum-exp of each row: the result's cells without the value width.
    fn aux_dims(&self, out_dims: &[usize]) -> Vec<Vec<usize>> {
        vec![out_dims[..out_dims.len().saturating_sub(1)].to_vec()]
    }
    fn forward(&self, cx: &OpCtx) -> Asgn {
        Asgn::Attention(Box::new(self.asgn(cx, None)))
    }
    fn backward(&self, cx: &OpCtx) -> Vec<Asgn> {
        let Some(d_out) = cx.out_grad else { return vec![] };
        let g = |i: usize| cx.arg_grads.get(i).copied().flatten();
        let grads = AttentionGrads { d_out, d_q: g(0), d_k: g(1), d_v: g(2) };
        if grads.d_q.is_none() && grads.d_k.is_none() && grads.d_v.is_none() {
            return vec![];
        }
        vec![Asgn::Attention(Box::new(self.asgn(cx, Some(grads))))]
    }
}

impl ScaledDotProduct {
    fn asgn(&self, cx: &OpCtx, grads: Option<AttentionGrads>) -> AttentionAsgn {
        AttentionAsgn {
            q: cx.args[0],
            k: cx.args[1],
            v: cx.args[2],
            out: cx.out,
            lse: cx.aux[0],
            causal: self.causal,
            scale: self.scale,
            grads,
            batch_limit: batch_limit(cx),
        }
    }
}

impl Tensor {
    /// Scaled dot-product attention of queries `self` (`... s | h d`: positions in the batch
    /// row, heads and depth in the output row) to keys `k` (`... t | h d`) and values `v`
    /// (`... t | h e`): per batch cell and head, `softmax(scale · q·kᵀ)·v` over the keys, a
    /// result of `... s | h e`. `causal`: query `s` sees the keys `t ≤ s` only (PyTorch's
    /// `is_causal`, aligned at the first position). The usual scale is `1/√d`. The same
    /// function as the scores' einsum, a mask, [`Tensor::softmax`] and the values' einsum,
    /// computed without storing the scores on the native backend (to rounding, not bit for
    /// bit: the sums run in another order); the batch axes of the three must be equal.
    ///
    /// ```
    /// use rocannl_tensor::{Axes, Graph, Session};
    /// let g = Graph::new();
    /// let axes = Axes::new().batch(&[2]).output(&[1, 2]); // 2 positions, 1 head of width 2
    /// let q = g.ndarray("q", axes.clone(), &[1.0, 0.0, 0.0, 1.0]);
    /// let k = g.ndarray("k", axes.clone(), &[1.0, 0.0, 0.0, 1.0]);
    /// let v = g.ndarray("v", axes, &[1.0, 2.0, 3.0, 4.0]);
    /// let out = q.attention(&k, &v, true, 1.0);
    /// let mut s = Session::new(&g).unwrap();
    /// let r = s.forward(&[&out]).unwrap();
    /// s.run(&r).unwrap();
    /// let o = s.read(&out).unwrap();
    /// // Position 0 sees only itself; position 1 weighs both values by e⁰ and e¹.
    /// let w = 1.0 / (1.0 + 1f64.exp());
    /// let want = [1.0, 2.0, w * 1.0 + (1.0 - w) * 3.0, w * 2.0 + (1.0 - w) * 4.0];
    /// assert!(o.iter().zip(want).all(|(a, b)| (a - b).abs() < 1e-6), "{o:?}");
    /// ```
    pub fn attention(&self, k: &Tensor, v: &Tensor, causal: bool, scale: f64) -> Tensor {
        let spec = match self.graph.spec(SPEC, false) {
            Ok(s) => s,
            Err(e) => {
                self.graph.record(Error::Shape(e.into()));
                Arc::new(EinsumSpec::parse("...;...;...=>...").expect("a valid fallback spec"))
            }
        };
        self.graph.add_op(Rc::new(ScaledDotProduct { spec, causal, scale }), &[self, k, v])
    }
}

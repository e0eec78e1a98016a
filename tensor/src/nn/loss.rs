//! Softmax and losses.
//!
//! Softmax subtracts the maximum first (detached: the result does not depend on it) so `exp`
//! never overflows; cross-entropy uses the log-softmax `x - max - log Σ exp(x - max)` directly
//! instead of taking the log of a softmax, which would lose precision for small probabilities.

use crate::graph::Tensor;

use super::OUTPUT_AXES;

impl Tensor {
    /// Softmax along the axes `spec` reduces (e.g. `"... | t -> h => ... | 0 -> h"` for the
    /// input axis `t`); the spec must map the reduced axes to one position.
    pub fn softmax(&self, spec: &str) -> Tensor {
        let shifted = self - &self.einmax1(spec).detach();
        let e = shifted.exp();
        &e / &e.einsum1(spec)
    }

    /// Log-softmax along the axes `spec` reduces.
    pub fn log_softmax(&self, spec: &str) -> Tensor {
        let shifted = self - &self.einmax1(spec).detach();
        let log_sum = shifted.exp().einsum1(spec).log();
        &shifted - &log_sum
    }

    /// Softmax over all output axes (the classes of a classifier).
    pub fn softmax_classes(&self) -> Tensor {
        self.softmax(OUTPUT_AXES)
    }
}

/// Cross-entropy of `logits` against `targets` (one-hot or probabilities over the output axes),
/// per example: `-Σ targets · log_softmax(logits)`, with one output position left.
///
/// ```
/// use rocannl_tensor::{Graph, Session, nn};
/// let g = Graph::new();
/// let logits = g.ndarray("logits", &[1], &[], &[2], &[0.0, 0.0]);
/// let target = g.ndarray("t", &[1], &[], &[2], &[1.0, 0.0]);
/// let loss = nn::loss::cross_entropy(&logits, &target);
/// let mut s = Session::new(&g).unwrap();
/// let r = s.forward(&[&loss]).unwrap();
/// s.run(&r).unwrap();
/// assert!((s.read(&loss).unwrap()[0] - 2f64.ln()).abs() < 1e-6);
/// ```
pub fn cross_entropy(logits: &Tensor, targets: &Tensor) -> Tensor {
    -(targets.pointmul(&logits.log_softmax(OUTPUT_AXES))).einsum1(OUTPUT_AXES)
}

/// Mean squared error over all cells.
pub fn mse(pred: &Tensor, target: &Tensor) -> Tensor {
    let d = pred - target;
    d.pointmul(&d).mean_all()
}

/// Hinge loss `mean(max(0, 1 - y·f))` for labels `y = ±1`.
pub fn hinge(scores: &Tensor, labels: &Tensor) -> Tensor {
    (1.0 - &labels.pointmul(scores)).relu().mean_all()
}

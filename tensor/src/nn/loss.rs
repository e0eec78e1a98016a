//! Softmax and losses.
//!
//! Softmax subtracts the maximum first (detached: the result does not depend on it) so `exp`
//! never overflows; cross-entropy uses the log-softmax `x - max - log Σ exp(x - max)` directly
//! instead of taking the log of a softmax, which would lose precision for small probabilities.

use crate::graph::{IdCount, Leaf, Source, Tensor};

use super::OUTPUT_AXES;

impl Tensor {
    /// Softmax along the axes `spec` reduces (e.g. `"... | t -> h => ... | 0 -> h"` for the
    /// input axis `t`); the spec must map the reduced axes to one position.
    pub fn softmax(&self, spec: &str) -> Tensor {
        let shifted = self - &self.amax(spec).detach();
        let e = shifted.exp();
        // The sum in f32 in a half-precision session (as PyTorch's autocast).
        &e / &e.einsum(spec, []).kept_in_f32()
    }

    /// Log-softmax along the axes `spec` reduces.
    pub fn log_softmax(&self, spec: &str) -> Tensor {
        let shifted = self - &self.amax(spec).detach();
        let log_sum = shifted.exp().einsum(spec, []).kept_in_f32().log().kept_in_f32();
        &shifted - &log_sum
    }

    /// Softmax over all output axes (the classes of a classifier).
    pub fn softmax_classes(&self) -> Tensor {
        self.softmax(OUTPUT_AXES)
    }
}

/// `pred` tied to `target`'s shape ([`Tensor::same_shape_as`]), unless the target is a number
/// ([`crate::Graph::number`]): one value for every cell, which has no axes to mispair.
fn paired(pred: &Tensor, target: &Tensor) -> Tensor {
    match target.info().source {
        Source::Leaf(Leaf::Constant(_)) => pred.clone(),
        _ => pred.same_shape_as(target),
    }
}

/// How a loss combines its per-position values into what is returned.
#[derive(Copy, Clone, Debug, Default, PartialEq, Eq)]
pub enum Reduction {
    /// The mean over every position (every example, every cell): the default, so that
    /// gradients do not grow with the batch or the sequence length.
    #[default]
    Mean,
    /// The sum over every position.
    Sum,
    /// No reduction: one value per position.
    None,
}

impl Reduction {
    /// Applies the reduction to per-position values.
    pub fn apply(self, per_position: Tensor) -> Tensor {
        match self {
            Reduction::Mean => per_position.kept_in_f32().mean_all(),
            Reduction::Sum => per_position.kept_in_f32().sum_all(),
            Reduction::None => per_position,
        }
    }
}

/// Cross-entropy of `logits` against `targets` (one-hot or probabilities over the output axes),
/// `-Σ targets · log_softmax(logits)` per position, combined over every position (example and
/// sequence position alike) as `reduction` says — PyTorch's `reduction=`; with
/// [`Reduction::None`], one value per position.
///
/// ```
/// use rocannl_tensor::{Axes, Graph, Session, nn};
/// let g = Graph::new();
/// let logits = g.ndarray("logits", Axes::new().batch(&[2]).output(&[2]), &[0.0, 0.0, 0.0, 1e9]);
/// let target = g.ndarray("t", Axes::new().batch(&[2]).output(&[2]), &[1.0, 0.0, 0.0, 1.0]);
/// let loss = nn::loss::cross_entropy(&logits, &target, nn::loss::Reduction::Mean);
/// let mut s = Session::new(&g).unwrap();
/// let r = s.forward(&[&loss]).unwrap();
/// s.run(&r).unwrap();
/// // ln 2 for the first example, 0 for the second: their mean.
/// assert!((s.read(&loss).unwrap()[0] - 2f64.ln() / 2.0).abs() < 1e-6);
/// ```
#[track_caller]
pub fn cross_entropy(logits: &Tensor, targets: &Tensor, reduction: Reduction) -> Tensor {
    let _within = logits.graph().within("loss::cross_entropy");
    if targets.graph().holds_ids(targets) {
        targets.graph().record(crate::Error::usage(format!(
            "cross_entropy's targets '{}' hold ids: dense targets are probabilities over the \
             classes; for integer labels use loss::sparse_cross_entropy",
            targets.label()
        )));
    }
    // Targets pair with the logits cell for cell: no broadcasting (a leftover axis of size 1
    // would otherwise score every example against every target).
    let tied = logits.same_shape_as(targets);
    let log_p = tied.log_softmax(OUTPUT_AXES).named(&format!("log_softmax({})", logits.label()));
    let per = -(targets.pointmul(&log_p).kept_in_f32()).einsum(OUTPUT_AXES, []).kept_in_f32();
    reduction.apply(per)
}

/// Cross-entropy of `logits` against integer class labels (`labels` has no output axes and
/// holds ids as values; write them with [`crate::Session::write_ids`], which checks their
/// range), combined as `reduction` says: the one-hot targets are built in the graph, their
/// size inferred from the logits.
///
/// ```
/// use rocannl_tensor::{Axes, Graph, Session, nn::loss};
/// let g = Graph::new();
/// let logits = g.ndarray("logits", Axes::new().batch(&[2]).output(&[3]), &[0.0, 0.0, 0.0, 5.0, 0.0, 0.0]);
/// let labels = g.data("labels", Axes::new().batch(&[2]));
/// let l = loss::sparse_cross_entropy(&logits, &labels, loss::Reduction::None);
/// let mut s = Session::new(&g).unwrap();
/// s.write_ids(&labels, &[1, 0], 3).unwrap();
/// let r = s.forward(&[&l]).unwrap();
/// s.run(&r).unwrap();
/// let v = s.read(&l).unwrap();
/// assert!((v[0] - 3f64.ln()).abs() < 1e-6 && v[1] < 0.02);
/// ```
#[track_caller]
pub fn sparse_cross_entropy(logits: &Tensor, labels: &Tensor, reduction: Reduction) -> Tensor {
    let _within = logits.graph().within("loss::sparse_cross_entropy");
    logits.graph().reads_ids(
        labels,
        IdCount::LastOutputOf(logits.id),
        format!("the classes of '{}'", logits.label()),
    );
    let one_hot = labels
        .eq(&logits.graph().positions(crate::RowKind::Output))
        .named(&format!("one_hot({})", labels.label()));
    cross_entropy(logits, &one_hot, reduction)
}

/// Squared error of every cell, combined as `reduction` says (PyTorch's `mse_loss`).
#[track_caller]
pub fn mse(pred: &Tensor, target: &Tensor, reduction: Reduction) -> Tensor {
    let _within = pred.graph().within("loss::mse");
    let d = (&paired(pred, target) - target).kept_in_f32().named(&format!(
        "{} - {}",
        pred.label(),
        target.label()
    ));
    reduction.apply(d.pointmul(&d).kept_in_f32())
}

/// Hinge loss `max(0, 1 - y·f)` for labels `y = ±1`, combined as `reduction` says.
#[track_caller]
pub fn hinge(scores: &Tensor, labels: &Tensor, reduction: Reduction) -> Tensor {
    let _within = scores.graph().within("loss::hinge");
    reduction.apply((1.0 - &labels.pointmul(&paired(scores, labels))).relu())
}

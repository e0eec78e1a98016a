//! Modules: blocks that own their params.
//!
//! A module creates its params once, when it is built, under hierarchical names (`h0.att.wq`);
//! `apply` may then be called any number of times — on the training batch, on the evaluation
//! windows, in generation — and every use shares the same params, so the routines of one
//! session (a training step, an evaluation forward) train and read the same weights. Names
//! identify params in checkpoints; a name used twice is an error naming both call sites.
//!
//! Blocks that behave differently in training and evaluation (dropout, batch norm) record both
//! behaviours ([`crate::Mode`]); one `apply` serves the training step and the evaluation
//! routines, which compile in their own modes.

use crate::graph::Tensor;

use super::attention::{MultiHeadAttention, TransformerBlock};
use super::batchnorm::BatchNorm;
use super::conv::Conv2d;
use super::embed::Embedding;
use super::gpt::Gpt;
use super::linear::{Linear, Mlp};
use super::norm::{LayerNorm, RmsNorm};

/// A block that owns its params: built once, applied any number of times.
///
/// ```
/// use rocannl_tensor::{Axes, Graph};
/// use rocannl_tensor::nn::{Mlp, MlpConfig, Module};
/// let g = Graph::new();
/// let mlp = Mlp::new(&g, "mlp", MlpConfig::new(&[8, 2]));
/// let train = g.data("train", Axes::new().batch(&[32]).output(&[5]));
/// let eval = g.data("eval", Axes::new().batch(&[7]).output(&[5]));
/// let (a, b) = (Module::apply(&mlp, &train), Module::apply(&mlp, &eval)); // the same weights
/// g.finish().unwrap();
/// assert_eq!((a.dims().unwrap(), b.dims().unwrap()), (vec![32, 2], vec![7, 2]));
/// let names: Vec<String> = mlp.params().iter().map(|p| p.label()).collect();
/// assert_eq!(names, ["mlp.0.w", "mlp.0.b", "mlp.1.w", "mlp.1.b"]);
/// ```
pub trait Module {
    /// The params, in creation order; their labels are their hierarchical names.
    fn params(&self) -> Vec<Tensor>;
    /// The buffers ([`crate::buffer`]: state updated by train-mode routines, such as batch
    /// norm's running statistics), in creation order; none unless the block keeps some.
    fn buffers(&self) -> Vec<Tensor> {
        vec![]
    }
    /// The block applied to `x`.
    fn apply(&self, x: &Tensor) -> Tensor;
}

impl Module for Linear {
    fn params(&self) -> Vec<Tensor> {
        std::iter::once(self.w.clone()).chain(self.b.clone()).collect()
    }
    fn apply(&self, x: &Tensor) -> Tensor {
        Linear::apply(self, x)
    }
}

impl Module for Mlp {
    fn params(&self) -> Vec<Tensor> {
        self.layers.iter().flat_map(Module::params).collect()
    }
    fn apply(&self, x: &Tensor) -> Tensor {
        Mlp::apply(self, x)
    }
}

impl Module for Embedding {
    fn params(&self) -> Vec<Tensor> {
        vec![self.table.clone()]
    }
    fn apply(&self, ids: &Tensor) -> Tensor {
        Embedding::apply(self, ids)
    }
}

impl Module for Conv2d {
    fn params(&self) -> Vec<Tensor> {
        std::iter::once(self.kernel.clone()).chain(self.bias.clone()).collect()
    }
    fn apply(&self, x: &Tensor) -> Tensor {
        Conv2d::apply(self, x)
    }
}

impl Module for LayerNorm {
    fn params(&self) -> Vec<Tensor> {
        self.gain.iter().chain(&self.bias).cloned().collect()
    }
    fn apply(&self, x: &Tensor) -> Tensor {
        LayerNorm::apply(self, x)
    }
}

impl Module for RmsNorm {
    fn params(&self) -> Vec<Tensor> {
        self.gain.iter().cloned().collect()
    }
    fn apply(&self, x: &Tensor) -> Tensor {
        RmsNorm::apply(self, x)
    }
}

impl Module for MultiHeadAttention {
    fn params(&self) -> Vec<Tensor> {
        let weights = [&self.wq, &self.wk, &self.wv, &self.wo];
        let biases = [&self.bq, &self.bk, &self.bv, &self.bo].into_iter().flatten();
        weights.into_iter().chain(biases).cloned().collect()
    }
    fn apply(&self, x: &Tensor) -> Tensor {
        MultiHeadAttention::apply(self, x)
    }
}

impl Module for TransformerBlock {
    fn params(&self) -> Vec<Tensor> {
        let mut p = self.ln1.params();
        p.extend(self.att.params());
        p.extend(self.ln2.params());
        p.extend(self.ff1.params());
        p.extend(self.ff2.params());
        p
    }
    fn apply(&self, x: &Tensor) -> Tensor {
        TransformerBlock::apply(self, x)
    }
}

impl Module for Gpt {
    fn params(&self) -> Vec<Tensor> {
        let mut p = self.tok.params();
        p.push(self.pos.clone());
        p.extend(self.blocks.iter().flat_map(Module::params));
        p.extend(self.ln_f.params());
        p.extend(self.head.iter().flat_map(Module::params));
        p
    }
    fn apply(&self, ids: &Tensor) -> Tensor {
        Gpt::apply(self, ids)
    }
}

impl Module for BatchNorm {
    fn params(&self) -> Vec<Tensor> {
        self.weight.iter().chain(&self.bias).cloned().collect()
    }
    fn buffers(&self) -> Vec<Tensor> {
        let stats = self.running.iter().flat_map(|r| [&r.mean, &r.var, &r.batches]);
        stats.cloned().collect()
    }
    fn apply(&self, x: &Tensor) -> Tensor {
        BatchNorm::apply(self, x)
    }
}

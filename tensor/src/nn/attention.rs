//! Multi-head attention and a pre-norm transformer block.
//!
//! Sequences keep positions in the batch row (`... s | d`): queries, keys and values are
//! `... s | h e` (heads and head width in the output row). Scores use OCANNL's spec
//! `... s | h d; ... t | h d => ... s | t -> h`, putting key positions `t` on the input row so
//! that softmax and the weighted sum reduce over it. The output projection's width is inferred
//! from the residual connection.

use crate::graph::{Graph, ParamSpec, Tensor};
use crate::init::Init;

use super::Dense;
use super::{Activation, norm::LayerNorm};

/// Multi-head attention configuration.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub struct AttentionConfig {
    /// Number of heads.
    pub heads: usize,
    /// Width of each head.
    pub head_dim: usize,
    /// Causal: position `s` attends to positions `t ≤ s` only (a language model's decoder).
    pub causal: bool,
}

impl AttentionConfig {
    /// `heads` heads of width `head_dim`, attending to every position.
    pub fn new(heads: usize, head_dim: usize) -> AttentionConfig {
        AttentionConfig { heads, head_dim, causal: false }
    }

    /// The same, causal.
    pub fn causal(self) -> AttentionConfig {
        AttentionConfig { causal: true, ..self }
    }
}

/// Self-attention over positions in the batch row: `x` is `... s | d`.
///
/// ```
/// use rocannl_tensor::{Graph, nn::attention::{self, AttentionConfig}};
/// let g = Graph::new();
/// let x = g.data("x", &[2, 5], &[], &[8]);
/// let y = attention::self_attention(&g, "att", &x, AttentionConfig::new(2, 4));
/// let out = &x + &y; // the residual fixes the output projection's width
/// g.finish().unwrap();
/// assert_eq!(out.dims().unwrap(), vec![2, 5, 8]);
/// ```
#[track_caller]
pub fn self_attention(g: &Graph, name: &str, x: &Tensor, cfg: AttentionConfig) -> Tensor {
    let _within = x.graph().within("nn::self_attention");
    MultiHeadAttention::new(g, name, cfg).apply(x)
}

/// Multi-head self-attention with its projections (`name.wq`, `wk`, `wv`, `wo`, no biases):
/// `x` is `... s | d` (positions in the batch row); the output projection's width is inferred
/// from use (a residual connection fixes it).
#[derive(Clone, Debug)]
pub struct MultiHeadAttention {
    /// Query, key and value projections, `d -> h e` each.
    pub wq: Tensor,
    /// Key projection.
    pub wk: Tensor,
    /// Value projection.
    pub wv: Tensor,
    /// Output projection, `h e -> d`.
    pub wo: Tensor,
    /// Heads, head width, causality.
    pub cfg: AttentionConfig,
}

impl MultiHeadAttention {
    /// The projections of an attention layer named `name`; `cfg` has at least one head, at
    /// least 1 wide (else a usage error naming the layer, returned by [`Graph::finish`]).
    #[track_caller]
    pub fn new(g: &Graph, name: &str, cfg: AttentionConfig) -> MultiHeadAttention {
        if cfg.heads == 0 || cfg.head_dim == 0 {
            g.record(crate::Error::usage(format!(
                "attention '{name}': {} heads of width {}; both must be at least 1",
                cfg.heads, cfg.head_dim
            )));
        }
        let proj = ParamSpec::output(&[cfg.heads, cfg.head_dim]).init(Init::XavierUniform);
        // Each param made here (not in a closure), so that a duplicate name is reported at
        // the caller's line.
        let wq = g.param_with(&format!("{name}.wq"), proj.clone());
        let wk = g.param_with(&format!("{name}.wk"), proj.clone());
        let wv = g.param_with(&format!("{name}.wv"), proj);
        let wo =
            g.param_with(&format!("{name}.wo"), ParamSpec::default().init(Init::XavierUniform));
        MultiHeadAttention { wq, wk, wv, wo, cfg }
    }

    /// Attention of `x`'s positions to each other (only to earlier ones when causal).
    #[track_caller]
    pub fn apply(&self, x: &Tensor) -> Tensor {
        let _within = x.graph().within("MultiHeadAttention::apply");
        let (q, k, v) = (self.wq.matmul(x), self.wk.matmul(x), self.wv.matmul(x));
        let scores = q.einsum(" ... s | h d; ... t | h d => ... s | t -> h", &k);
        let scores = scores.scale(1.0 / (self.cfg.head_dim as f64).sqrt());
        let scores = if self.cfg.causal { causal_mask(x.graph(), &scores) } else { scores };
        let probs = scores.softmax("... s | t -> h => ... s | 0 -> h");
        let ctx = probs.einsum(" ... s | t -> h; ... t | h e => ... s | h e", &v);
        self.wo.matmul(&ctx)
    }
}

/// Attention scores `... s | t -> h` with the cells where the key comes after the query
/// (`t > s`) set to −∞, so that softmax gives them no weight. The positions are numbered by
/// leaves whose sizes are inferred from the scores ([`Graph::positions`]): nothing about the
/// sequence length is given.
///
/// ```
/// use rocannl_tensor::{Graph, Session, nn::attention::causal_mask};
/// let g = Graph::new();
/// let scores = g.ndarray("scores", &[3], &[3], &[1], &[0.0; 9]);
/// let probs = causal_mask(&g, &scores).softmax("... s | t -> h => ... s | 0 -> h");
/// let mut s = Session::new(&g).unwrap();
/// let r = s.forward(&[&probs]).unwrap();
/// s.run(&r).unwrap();
/// let p = s.read(&probs).unwrap(); // row s: uniform over t ≤ s
/// let want = [1.0, 0.0, 0.0, 0.5, 0.5, 0.0, 1.0 / 3.0, 1.0 / 3.0, 1.0 / 3.0];
/// assert!(p.iter().zip(want).all(|(a, b)| (a - b).abs() < 1e-6), "{p:?}");
/// ```
pub fn causal_mask(g: &Graph, scores: &Tensor) -> Tensor {
    let query = g.positions('b');
    let key = g.positions('i');
    let allowed = query.lt(&key).not();
    Tensor::where_(&allowed, scores, &g.fill(f64::NEG_INFINITY))
}

/// A pre-norm transformer block: `x + attention(ln(x))`, then `+ mlp(ln(·))` with a hidden width
/// of `ff` and a ReLU ([`transformer_block_with`] chooses the activation).
#[track_caller]
pub fn transformer_block(
    g: &Graph,
    name: &str,
    x: &Tensor,
    cfg: AttentionConfig,
    ff: usize,
) -> Tensor {
    transformer_block_with(g, name, x, cfg, ff, Activation::Relu)
}

/// [`transformer_block`] with the MLP's activation chosen (GPT-2 uses
/// [`Activation::GeluTanh`]).
#[track_caller]
pub fn transformer_block_with(
    g: &Graph,
    name: &str,
    x: &Tensor,
    cfg: AttentionConfig,
    ff: usize,
    act: Activation,
) -> Tensor {
    TransformerBlock::new(g, name, cfg, ff, act).apply(x)
}

/// A pre-norm transformer block with its params: `x + attention(ln1(x))`, then
/// `+ ff2(act(ff1(ln2(·))))`. Names: `name.ln1`, `name.att`, `name.ln2`, `name.ff1`,
/// `name.ff2`. The width is inferred from the first input.
#[derive(Clone, Debug)]
pub struct TransformerBlock {
    /// Before attention.
    pub ln1: LayerNorm,
    /// The attention layer.
    pub att: MultiHeadAttention,
    /// Before the MLP.
    pub ln2: LayerNorm,
    /// The MLP's hidden layer.
    pub ff1: Dense,
    /// The MLP's output layer (its width inferred from the residual).
    pub ff2: Dense,
    /// The MLP's activation.
    pub act: Activation,
    /// Dropout on the attention's and the MLP's outputs, before each residual sum, in train
    /// mode ([`crate::Mode`]); 0 by default.
    pub dropout: f64,
}

impl TransformerBlock {
    /// A block named `name` with an MLP of hidden width `ff`.
    #[track_caller]
    pub fn new(
        g: &Graph,
        name: &str,
        cfg: AttentionConfig,
        ff: usize,
        act: Activation,
    ) -> TransformerBlock {
        TransformerBlock {
            ln1: LayerNorm::new(g, &format!("{name}.ln1"), 1e-5),
            att: MultiHeadAttention::new(g, &format!("{name}.att"), cfg),
            ln2: LayerNorm::new(g, &format!("{name}.ln2"), 1e-5),
            ff1: Dense::new(g, &format!("{name}.ff1"), ff),
            ff2: Dense::inferred(g, &format!("{name}.ff2")),
            act,
            dropout: 0.0,
        }
    }

    /// The same block with dropout `p` on its residual branches in train mode.
    pub fn with_dropout(self, p: f64) -> TransformerBlock {
        TransformerBlock { dropout: p, ..self }
    }

    /// The block applied to `x` (`... s | d`), with dropout on both residual branches in train
    /// mode (a fresh mask every step, see [`super::dropout`]) and none in eval mode.
    ///
    /// ```
    /// use rocannl_tensor::Graph;
    /// use rocannl_tensor::nn::{Activation, attention::{AttentionConfig, TransformerBlock}};
    /// let g = Graph::new();
    /// let x = g.data("x", &[2, 5], &[], &[8]);
    /// let block = TransformerBlock::new(&g, "blk", AttentionConfig::new(2, 4), 16, Activation::Relu)
    ///     .with_dropout(0.1);
    /// let y = block.apply(&x); // dropout in training steps, none in `Session::forward`
    /// g.finish().unwrap();
    /// assert_eq!(y.dims().unwrap(), vec![2, 5, 8]);
    /// ```
    #[track_caller]
    pub fn apply(&self, x: &Tensor) -> Tensor {
        let _within = x.graph().within("TransformerBlock::apply");
        let a = self.att.apply(&self.ln1.apply(x));
        let x1 = x + &super::dropout(&a, self.dropout);
        let h = self.act.apply(&self.ff1.apply(&self.ln2.apply(&x1)));
        &x1 + &super::dropout(&self.ff2.apply(&h), self.dropout)
    }
}

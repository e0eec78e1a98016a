//! Multi-head attention and a pre-norm transformer block.
//!
//! Sequences keep positions in the batch row (`... s | d`): queries, keys and values are
//! `... s | h e` (heads and head width in the output row). Scores use OCANNL's spec
//! `... s | h d; ... t | h d => ... s | t -> h`, putting key positions `t` on the input row so
//! that softmax and the weighted sum reduce over it. The output projection's width is inferred
//! from the residual connection.

use crate::graph::{Graph, ParamSpec, Tensor};
use crate::init::Init;

use super::{Activation, dense, dense_inferred, norm::layer_norm};

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
    // Each param made here (not in a closure), so that a duplicate name is reported at the
    // caller's line.
    let mut qkv = Vec::with_capacity(3);
    for which in ["wq", "wk", "wv"] {
        let w = g.param_with(
            &format!("{name}.{which}"),
            ParamSpec::output(&[cfg.heads, cfg.head_dim]).init(Init::XavierUniform),
        );
        qkv.push(w.matmul(x));
    }
    let (q, k, v) = (&qkv[0], &qkv[1], &qkv[2]);
    let scores = q.einsum(" ... s | h d; ... t | h d => ... s | t -> h", k);
    let scores = scores.scale(1.0 / (cfg.head_dim as f64).sqrt());
    let scores = if cfg.causal { causal_mask(g, &scores) } else { scores };
    let probs = scores.softmax("... s | t -> h => ... s | 0 -> h");
    let ctx = probs.einsum(" ... s | t -> h; ... t | h e => ... s | h e", v);
    let wo = g.param_with(&format!("{name}.wo"), ParamSpec::default().init(Init::XavierUniform));
    wo.matmul(&ctx)
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
    let a = self_attention(
        g,
        &format!("{name}.att"),
        &layer_norm(g, &format!("{name}.ln1"), x, 1e-5),
        cfg,
    );
    let x1 = x + &a;
    let h = dense(g, &format!("{name}.ff1"), &layer_norm(g, &format!("{name}.ln2"), &x1, 1e-5), ff);
    let h = act.apply(&h);
    &x1 + &dense_inferred(g, &format!("{name}.ff2"), &h)
}

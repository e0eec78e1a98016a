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
}

/// Self-attention over positions in the batch row: `x` is `... s | d`.
///
/// ```
/// use rocannl_tensor::{Graph, nn::attention::{self, AttentionConfig}};
/// let g = Graph::new();
/// let x = g.data("x", &[2, 5], &[], &[8]);
/// let y = attention::self_attention(&g, "att", &x, AttentionConfig { heads: 2, head_dim: 4 });
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
    let probs = scores.softmax("... s | t -> h => ... s | 0 -> h");
    let ctx = probs.einsum(" ... s | t -> h; ... t | h e => ... s | h e", v);
    let wo = g.param_with(&format!("{name}.wo"), ParamSpec::default().init(Init::XavierUniform));
    wo.matmul(&ctx)
}

/// A pre-norm transformer block: `x + attention(ln(x))`, then `+ mlp(ln(·))` with a hidden width
/// of `ff`.
#[track_caller]
pub fn transformer_block(
    g: &Graph,
    name: &str,
    x: &Tensor,
    cfg: AttentionConfig,
    ff: usize,
) -> Tensor {
    let a = self_attention(
        g,
        &format!("{name}.att"),
        &layer_norm(g, &format!("{name}.ln1"), x, 1e-5),
        cfg,
    );
    let x1 = x + &a;
    let h = dense(g, &format!("{name}.ff1"), &layer_norm(g, &format!("{name}.ln2"), &x1, 1e-5), ff);
    let h = Activation::Relu.apply(&h);
    &x1 + &dense_inferred(g, &format!("{name}.ff2"), &h)
}

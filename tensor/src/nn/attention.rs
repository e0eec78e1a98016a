//! Multi-head attention and a pre-norm transformer block.
//!
//! Sequences keep positions in the batch row (`... s | d`): queries, keys and values are
//! `... s | h e` (heads and head width in the output row). The scores, their softmax over the
//! keys and the weighted sum of the values are one operation, [`Tensor::attention`], which the
//! native backend runs without storing the scores; written as parts, the scores would be the
//! einsum `... s | h d; ... t | h d => ... s | t -> h` (key positions `t` on the input row),
//! masked by [`causal_mask`]. The output projection's width is inferred from the residual
//! connection.

use crate::Axes;
use crate::graph::{Graph, ParamSpec, Tensor};
use crate::init::Init;

use super::config::setters;
use super::linear::{Linear, LinearConfig};
use super::{
    Activation,
    norm::{LayerNorm, LayerNormConfig},
};

/// The options of a [`MultiHeadAttention`]: heads, causality, biases, and the inits and decay
/// of its projections. `AttentionConfig::new(heads, head_dim)` attends to every position, with
/// no biases and Xavier-uniform projections.
#[derive(Clone, Debug, PartialEq)]
pub struct AttentionConfig {
    /// Number of heads.
    pub heads: usize,
    /// Width of each head.
    pub head_dim: usize,
    /// Causal: position `s` attends to positions `t ≤ s` only (a language model's decoder;
    /// default: no).
    pub causal: bool,
    /// Whether each projection adds a bias (`bq`, `bk`, `bv`, `bo`; default: no).
    pub bias: bool,
    /// The init of the query, key and value projections (default: [`Init::XavierUniform`]).
    pub w_init: Init,
    /// The init of the output projection `wo` (default: [`Init::XavierUniform`]); GPT-2 scales
    /// it for the residual stream ([`Init::residual_scaled`]).
    pub wo_init: Init,
    /// The biases' init (default: 0).
    pub b_init: Init,
    /// Whether the four projections decay under [`crate::DecayPolicy::PerParam`] (default: yes).
    pub w_decay: bool,
    /// Whether the biases decay (default: no).
    pub b_decay: bool,
}

impl AttentionConfig {
    /// `heads` heads of width `head_dim` and the defaults.
    pub fn new(heads: usize, head_dim: usize) -> AttentionConfig {
        AttentionConfig {
            heads,
            head_dim,
            causal: false,
            bias: false,
            w_init: Init::XavierUniform,
            wo_init: Init::XavierUniform,
            b_init: Init::Constant(0.0),
            w_decay: true,
            b_decay: false,
        }
    }
}

setters!(AttentionConfig {
    with_heads => heads: usize,
    with_head_dim => head_dim: usize,
    with_causal => causal: bool,
    with_bias => bias: bool,
    with_w_init => w_init: Init,
    with_wo_init => wo_init: Init,
    with_b_init => b_init: Init,
    with_w_decay => w_decay: bool,
    with_b_decay => b_decay: bool,
});

/// Multi-head self-attention with its projections (`name.wq`, `wk`, `wv`, `wo`, and `bq`, `bk`,
/// `bv`, `bo` when the config asks for biases): `x` is `... s | d` (positions in the batch
/// row); the output projection's width is inferred from use (a residual connection fixes it).
///
/// ```
/// use rocannl_tensor::{Axes, Graph, Init, nn::attention::{AttentionConfig, MultiHeadAttention}};
/// let g = Graph::new();
/// let x = g.data("x", Axes::new().batch(&[2, 5]).output(&[8]));
/// let cfg = AttentionConfig::new(2, 4)
///     .with_causal(true)
///     .with_bias(true)
///     .with_wo_init(Init::Normal { mean: 0.0, std: 0.02 }.residual_scaled(6));
/// let att = MultiHeadAttention::new(&g, "att", cfg);
/// let out = &x + &att.apply(&x); // the residual fixes the output projection's width
/// g.finish().unwrap();
/// assert_eq!(out.dims().unwrap(), vec![2, 5, 8]);
/// assert_eq!(att.bo.unwrap().dims().unwrap(), vec![8]);
/// ```
#[derive(Clone, Debug)]
pub struct MultiHeadAttention {
    /// Query projection, `d -> h e`.
    pub wq: Tensor,
    /// Key projection.
    pub wk: Tensor,
    /// Value projection.
    pub wv: Tensor,
    /// Output projection, `h e -> d`.
    pub wo: Tensor,
    /// Query bias, `h e` (with [`AttentionConfig::bias`]).
    pub bq: Option<Tensor>,
    /// Key bias.
    pub bk: Option<Tensor>,
    /// Value bias.
    pub bv: Option<Tensor>,
    /// Output bias, `d`.
    pub bo: Option<Tensor>,
    /// Heads, head width, causality, biases, inits.
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
        let heads = [cfg.heads, cfg.head_dim];
        let decays = |spec: ParamSpec, decay: bool| ParamSpec { weight_decay: decay, ..spec };
        let proj = decays(
            ParamSpec::new(Axes::new().output(&heads)).init(cfg.w_init.clone()),
            cfg.w_decay,
        );
        // Each param made here (not in a closure), so that a duplicate name is reported at
        // the caller's line.
        let wq = g.param(&format!("{name}.wq"), proj.clone());
        let wk = g.param(&format!("{name}.wk"), proj.clone());
        let wv = g.param(&format!("{name}.wv"), proj);
        let out = decays(ParamSpec::default().init(cfg.wo_init.clone()), cfg.w_decay);
        let wo = g.param(&format!("{name}.wo"), out);
        let (mut bq, mut bk, mut bv, mut bo) = (None, None, None, None);
        if cfg.bias {
            let b = decays(
                ParamSpec::new(Axes::new().input(&[]).output(&heads)).init(cfg.b_init.clone()),
                cfg.b_decay,
            );
            bq = Some(g.param(&format!("{name}.bq"), b.clone()));
            bk = Some(g.param(&format!("{name}.bk"), b.clone()));
            bv = Some(g.param(&format!("{name}.bv"), b));
            let b = ParamSpec::new(Axes::new().input(&[])).init(cfg.b_init.clone());
            bo = Some(g.param(&format!("{name}.bo"), decays(b, cfg.b_decay)));
        }
        MultiHeadAttention { wq, wk, wv, wo, bq, bk, bv, bo, cfg }
    }

    /// Attention of `x`'s positions to each other (only to earlier ones when causal).
    #[track_caller]
    pub fn apply(&self, x: &Tensor) -> Tensor {
        let _within = x.graph().within("MultiHeadAttention::apply");
        let (q, k, v) = (
            with_bias(self.wq.matmul(x), &self.bq),
            with_bias(self.wk.matmul(x), &self.bk),
            with_bias(self.wv.matmul(x), &self.bv),
        );
        let scale = 1.0 / (self.cfg.head_dim as f64).sqrt();
        let ctx = q.attention(&k, &v, self.cfg.causal, scale);
        with_bias(self.wo.matmul(&ctx), &self.bo)
    }
}

/// `y + b` when there is a bias.
fn with_bias(y: Tensor, b: &Option<Tensor>) -> Tensor {
    match b {
        Some(b) => &y + b,
        None => y,
    }
}

/// Attention scores `... s | t -> h` with the cells where the key comes after the query
/// (`t > s`) set to −∞, so that softmax gives them no weight. The positions are numbered by
/// leaves whose sizes are inferred from the scores ([`Graph::positions`]): nothing about the
/// sequence length is given.
///
/// ```
/// use rocannl_tensor::{Axes, Graph, Session, nn::attention::causal_mask};
/// let g = Graph::new();
/// let scores = g.ndarray("scores", Axes::new().batch(&[3]).input(&[3]).output(&[1]), &[0.0; 9]);
/// let probs = causal_mask(&scores).softmax("... s | t -> h => ... s | 0 -> h");
/// let mut s = Session::new(&g).unwrap();
/// let r = s.forward(&[&probs]).unwrap();
/// s.run(&r).unwrap();
/// let p = s.read(&probs).unwrap(); // row s: uniform over t ≤ s
/// let want = [1.0, 0.0, 0.0, 0.5, 0.5, 0.0, 1.0 / 3.0, 1.0 / 3.0, 1.0 / 3.0];
/// assert!(p.iter().zip(want).all(|(a, b)| (a - b).abs() < 1e-6), "{p:?}");
/// ```
pub fn causal_mask(scores: &Tensor) -> Tensor {
    let g = scores.graph();
    let query = g.positions(crate::RowKind::Batch);
    let key = g.positions(crate::RowKind::Input);
    let allowed = query.lt(&key).not();
    Tensor::where_(&allowed, scores, &g.fill(f64::NEG_INFINITY))
}

/// The options of a [`TransformerBlock`]: its attention, its norms, its MLP's two layers, the
/// MLP's activation and the dropout on both residual branches.
#[derive(Clone, Debug, PartialEq)]
pub struct TransformerBlockConfig {
    /// The attention layer.
    pub att: AttentionConfig,
    /// Both norms (default: [`LayerNormConfig::default`]).
    pub ln: LayerNormConfig,
    /// The MLP's hidden layer (`new` gives it the hidden width).
    pub ff1: LinearConfig,
    /// The MLP's output layer (default: its width inferred from the residual); GPT-2 scales its
    /// init for the residual stream ([`Init::residual_scaled`]).
    pub ff2: LinearConfig,
    /// The MLP's activation (default: ReLU; GPT-2 uses [`Activation::GeluTanh`]).
    pub act: Activation,
    /// Dropout on the attention's and the MLP's outputs, before each residual sum, when applied
    /// in train mode ([`crate::Mode`]); default 0.
    pub dropout: f64,
}

impl TransformerBlockConfig {
    /// A block with this attention and an MLP of hidden width `ff`, with the defaults.
    pub fn new(att: AttentionConfig, ff: usize) -> TransformerBlockConfig {
        TransformerBlockConfig {
            att,
            ln: LayerNormConfig::default(),
            ff1: LinearConfig::new(ff),
            ff2: LinearConfig::default(),
            act: Activation::Relu,
            dropout: 0.0,
        }
    }
}

setters!(TransformerBlockConfig {
    with_att => att: AttentionConfig,
    with_ln => ln: LayerNormConfig,
    with_ff1 => ff1: LinearConfig,
    with_ff2 => ff2: LinearConfig,
    with_act => act: Activation,
    with_dropout => dropout: f64,
});

/// A pre-norm transformer block with its params: `x + attention(ln1(x))`, then
/// `+ ff2(act(ff1(ln2(·))))`. Names: `name.ln1`, `name.att`, `name.ln2`, `name.ff1`,
/// `name.ff2`. The width is inferred from the first input.
///
/// ```
/// use rocannl_tensor::{Axes, Graph};
/// use rocannl_tensor::nn::Activation;
/// use rocannl_tensor::nn::attention::{AttentionConfig, TransformerBlock, TransformerBlockConfig};
/// let g = Graph::new();
/// let x = g.data("x", Axes::new().batch(&[2, 5]).output(&[8]));
/// let cfg = TransformerBlockConfig::new(AttentionConfig::new(2, 4).with_causal(true), 32)
///     .with_act(Activation::Gelu);
/// let block = TransformerBlock::new(&g, "blk", cfg);
/// let y = block.apply(&x);
/// g.finish().unwrap();
/// assert_eq!(y.dims().unwrap(), vec![2, 5, 8]);
/// ```
#[derive(Clone, Debug)]
pub struct TransformerBlock {
    /// Before attention.
    pub ln1: LayerNorm,
    /// The attention layer.
    pub att: MultiHeadAttention,
    /// Before the MLP.
    pub ln2: LayerNorm,
    /// The MLP's hidden layer.
    pub ff1: Linear,
    /// The MLP's output layer (its width inferred from the residual by default).
    pub ff2: Linear,
    /// The MLP's activation.
    pub act: Activation,
    /// Dropout on the attention's and the MLP's outputs, before each residual sum, in train
    /// mode ([`crate::Mode`]); 0 by default.
    pub dropout: f64,
}

impl TransformerBlock {
    /// A block named `name`.
    #[track_caller]
    pub fn new(g: &Graph, name: &str, cfg: TransformerBlockConfig) -> TransformerBlock {
        TransformerBlock {
            ln1: LayerNorm::new(g, &format!("{name}.ln1"), cfg.ln.clone()),
            att: MultiHeadAttention::new(g, &format!("{name}.att"), cfg.att),
            ln2: LayerNorm::new(g, &format!("{name}.ln2"), cfg.ln),
            ff1: Linear::new(g, &format!("{name}.ff1"), cfg.ff1),
            ff2: Linear::new(g, &format!("{name}.ff2"), cfg.ff2),
            act: cfg.act,
            dropout: cfg.dropout,
        }
    }

    /// The block applied to `x` (`... s | d`), with dropout on both residual branches in train
    /// mode (a fresh mask every step, see [`super::dropout`]) and none in eval mode.
    ///
    /// ```
    /// use rocannl_tensor::{Axes, Graph};
    /// use rocannl_tensor::nn::attention::{
    ///     AttentionConfig, TransformerBlock, TransformerBlockConfig,
    /// };
    /// let g = Graph::new();
    /// let x = g.data("x", Axes::new().batch(&[2, 5]).output(&[8]));
    /// let cfg = TransformerBlockConfig::new(AttentionConfig::new(2, 4), 16).with_dropout(0.1);
    /// let block = TransformerBlock::new(&g, "blk", cfg);
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

//! A GPT built from the modules: token embedding plus learned positions, pre-LayerNorm causal
//! transformer blocks, a final LayerNorm and a linear head.
//!
//! One [`GptConfig`] covers the styles people port: the default is this crate's character-level
//! model (attention without bias, MLPs and head with bias, PyTorch's default inits), and a few
//! switches give GPT-2's and nanoGPT's (no biases, a head tied to the token table, every weight
//! drawn from N(0, 0.02) with the residual projections scaled by `1/√(2·layers)`).

use crate::Axes;
use crate::graph::{Graph, ParamSpec, Tensor};
use crate::init::Init;

use super::Activation;
use super::attention::{AttentionConfig, TransformerBlock, TransformerBlockConfig};
use super::config::setters;
use super::embed::{Embedding, EmbeddingConfig};
use super::linear::{Linear, LinearConfig};
use super::norm::{LayerNorm, LayerNormConfig};

/// The sizes and options of a [`Gpt`]; `GptConfig::new(vocab, context, width, heads, layers)`
/// gives the defaults.
#[derive(Clone, Debug, PartialEq)]
pub struct GptConfig {
    /// Token ids `0..vocab`.
    pub vocab: usize,
    /// Positions (the sequence length the position table covers).
    pub context: usize,
    /// The model's width.
    pub width: usize,
    /// Attention heads per block (each `width / heads` wide).
    pub heads: usize,
    /// Blocks.
    pub layers: usize,
    /// The MLP's hidden width (`new` sets `4 · width`).
    pub ff: usize,
    /// The MLP's activation (default: [`Activation::GeluTanh`], GPT-2's; nanoGPT's is the exact
    /// [`Activation::Gelu`]).
    pub act: Activation,
    /// Dropout on the blocks' residual branches in train mode ([`crate::Mode`]; default 0).
    pub dropout: f64,
    /// Whether the MLPs, the norms and an untied head have biases (default: yes; nanoGPT's
    /// `bias=False` is `false`).
    pub bias: bool,
    /// Whether the attention projections have biases (default: no; GPT-2's have).
    pub attention_bias: bool,
    /// Whether the head reads the token table ([`Embedding::attend`], weight tying, as GPT-2's
    /// and nanoGPT's) instead of having weights of its own (default: no). A tied head has no
    /// bias.
    pub tied_head: bool,
    /// The init of every weight matrix and table: the token and position tables, the attention
    /// projections, the MLPs and an untied head (nanoGPT's `N(0, 0.02)`). `None` (the default):
    /// each module's own (tables N(0, 1), attention Xavier-uniform, linear layers
    /// [`Init::FanInUniform`]). Biases start at 0 and norm gains at 1 either way.
    pub init: Option<Init>,
    /// Whether the projections into the residual stream (each block's `att.wo` and `ff2.w`)
    /// have their init scaled by `1/√(2·layers)` ([`Init::residual_scaled`], GPT-2's rule;
    /// default: no).
    pub residual_scaling: bool,
    /// The norms' `eps` (default: 1e-5).
    pub eps: f64,
}

impl GptConfig {
    /// A GPT of these sizes with an MLP of `4 · width` and the defaults.
    pub fn new(vocab: usize, context: usize, width: usize, heads: usize, layers: usize) -> Self {
        GptConfig {
            vocab,
            context,
            width,
            heads,
            layers,
            ff: 4 * width,
            act: Activation::GeluTanh,
            dropout: 0.0,
            bias: true,
            attention_bias: false,
            tied_head: false,
            init: None,
            residual_scaling: false,
            eps: 1e-5,
        }
    }

    /// A weight's init: the config's `init`, else the module's `default`.
    fn weight_init(&self, default: Init) -> Init {
        self.init.clone().unwrap_or(default)
    }

    /// A residual projection's init: `init`, scaled when the config asks for it.
    fn residual_init(&self, init: Init) -> Init {
        if self.residual_scaling { init.residual_scaled(self.layers) } else { init }
    }

    /// The config of every block.
    fn block(&self) -> TransformerBlockConfig {
        let att = AttentionConfig::new(self.heads, self.width / self.heads.max(1))
            .with_causal(true)
            .with_bias(self.attention_bias)
            .with_w_init(self.weight_init(Init::XavierUniform))
            .with_wo_init(self.residual_init(self.weight_init(Init::XavierUniform)));
        let ff2_init = self.residual_init(self.weight_init(Init::FanInUniform));
        TransformerBlockConfig::new(att, self.ff)
            .with_ln(self.norm())
            .with_ff1(self.linear(LinearConfig::new(self.ff)))
            .with_ff2(self.linear(LinearConfig::default()).with_w_init(ff2_init))
            .with_act(self.act)
            .with_dropout(self.dropout)
    }

    /// A linear layer's config with the bias switch and init of this one.
    fn linear(&self, cfg: LinearConfig) -> LinearConfig {
        cfg.with_bias(self.bias).with_w_init(self.weight_init(Init::FanInUniform))
    }

    /// A norm's config.
    fn norm(&self) -> LayerNormConfig {
        LayerNormConfig::default().with_eps(self.eps).with_bias(self.bias)
    }
}

setters!(GptConfig {
    with_vocab => vocab: usize,
    with_context => context: usize,
    with_width => width: usize,
    with_heads => heads: usize,
    with_layers => layers: usize,
    with_ff => ff: usize,
    with_act => act: Activation,
    with_dropout => dropout: f64,
    with_bias => bias: bool,
    with_attention_bias => attention_bias: bool,
    with_tied_head => tied_head: bool,
    with_init => init: Option<Init>,
    with_residual_scaling => residual_scaling: bool,
    with_eps => eps: f64,
});

/// A decoder-only transformer over token ids: `ids` is `... s` (positions in the last batch
/// axis, ids as values), the result `... s | vocab` logits.
///
/// ```
/// use rocannl_tensor::nn::{Module, gpt::{Gpt, GptConfig}};
/// use rocannl_tensor::{Axes, Graph};
/// let g = Graph::new();
/// let gpt = Gpt::new(&g, "gpt", GptConfig::new(27, 16, 64, 4, 2));
/// let ids = g.data("ids", Axes::new().batch(&[32, 16]));
/// let logits = gpt.apply(&ids);
/// g.finish().unwrap();
/// assert_eq!(logits.dims().unwrap(), vec![32, 16, 27]);
/// let count: usize =
///     gpt.params().iter().map(|p| p.dims().unwrap().iter().product::<usize>()).sum();
/// assert_eq!(count, 104_091);
/// ```
///
/// nanoGPT's model (`bias=False`, exact GELU, tied head, N(0, 0.02) with the residual
/// projections scaled) and its AdamW groups (every param with two or more axes decays):
///
/// ```
/// use rocannl_tensor::nn::{Activation, Module, gpt::{Gpt, GptConfig}};
/// use rocannl_tensor::{Axes, DecayPolicy, Graph, Init};
/// let g = Graph::new();
/// let cfg = GptConfig::new(65, 32, 48, 4, 3)
///     .with_act(Activation::Gelu)
///     .with_bias(false)
///     .with_tied_head(true)
///     .with_init(Some(Init::Normal { mean: 0.0, std: 0.02 }))
///     .with_residual_scaling(true);
/// let gpt = Gpt::new(&g, "gpt", cfg);
/// g.set_decay_policy(DecayPolicy::AllMatricesAndTables);
/// let logits = gpt.apply(&g.data("ids", Axes::new().batch(&[8, 32])));
/// g.finish().unwrap();
/// assert_eq!(logits.dims().unwrap(), vec![8, 32, 65]);
/// assert!(gpt.head.is_none()); // the logits read gpt.tok.table
/// let labels: Vec<String> = gpt.params().iter().map(|p| p.label()).collect();
/// assert!(labels.iter().all(|l| !l.ends_with(".b") && !l.ends_with(".bias")), "{labels:?}");
/// ```
#[derive(Clone, Debug)]
pub struct Gpt {
    /// Token embedding, `vocab -> width`.
    pub tok: Embedding,
    /// Learned positions, `context | -> width` (exempt from weight decay under
    /// [`crate::DecayPolicy::PerParam`]).
    pub pos: Tensor,
    /// The blocks, causal.
    pub blocks: Vec<TransformerBlock>,
    /// The final normalization.
    pub ln_f: LayerNorm,
    /// The head, `width -> vocab`; `None` when it is tied to the token table
    /// ([`GptConfig::tied_head`]).
    pub head: Option<Linear>,
    /// The sizes and options.
    pub cfg: GptConfig,
}

impl Gpt {
    /// A GPT named `name` (params `name.tok.table`, `name.pos`, `name.h0.att.wq`, …, and
    /// `name.head.w` unless the head is tied). The width must be a positive multiple of the heads and the dropout a
    /// probability (else a usage error naming the model or the tensor, returned by
    /// [`Graph::finish`]).
    #[track_caller]
    pub fn new(g: &Graph, name: &str, cfg: GptConfig) -> Gpt {
        if cfg.heads == 0 || !cfg.width.is_multiple_of(cfg.heads) {
            g.record(crate::Error::usage(format!(
                "GPT '{name}': its width {} must be a positive multiple of its {} heads",
                cfg.width, cfg.heads
            )));
        }
        let table_init = cfg.weight_init(Init::Normal { mean: 0.0, std: 1.0 });
        let tok = EmbeddingConfig::new(cfg.vocab, cfg.width).with_table_init(table_init.clone());
        let tok = Embedding::new(g, &format!("{name}.tok"), tok);
        let pos = g.param(
            &format!("{name}.pos"),
            ParamSpec::new(Axes::new().batch(&[cfg.context]).input(&[]).output(&[cfg.width]))
                .init(table_init)
                .no_decay(),
        );
        let block = cfg.block();
        let mut blocks = Vec::with_capacity(cfg.layers);
        for l in 0..cfg.layers {
            blocks.push(TransformerBlock::new(g, &format!("{name}.h{l}"), block.clone()));
        }
        let ln_f = LayerNorm::new(g, &format!("{name}.ln_f"), cfg.norm());
        let head = if cfg.tied_head {
            None
        } else {
            let head = cfg.linear(LinearConfig::new(cfg.vocab));
            Some(Linear::new(g, &format!("{name}.head"), head))
        };
        Gpt { tok, pos, blocks, ln_f, head, cfg }
    }

    /// The logits for token ids `ids`, with the blocks' dropout in train mode.
    #[track_caller]
    pub fn apply(&self, ids: &Tensor) -> Tensor {
        let _within = ids.graph().within("Gpt::apply");
        let mut x = &self.tok.apply(ids) + &self.pos;
        for b in &self.blocks {
            x = b.apply(&x);
        }
        let h = self.ln_f.apply(&x);
        match &self.head {
            Some(head) => head.apply(&h),
            None => self.tok.attend(&h),
        }
    }
}

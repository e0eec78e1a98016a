//! A GPT built from the modules: token embedding plus learned positions, pre-LayerNorm causal
//! transformer blocks, a final LayerNorm and a linear head.

use crate::graph::{Graph, ParamSpec, Tensor};
use crate::init::Init;

use super::attention::{AttentionConfig, TransformerBlock};
use super::embed::Embedding;
use super::norm::LayerNorm;
use super::{Activation, Dense};

/// The sizes of a [`Gpt`].
#[derive(Copy, Clone, Debug, PartialEq)]
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
    /// The MLP's hidden width.
    pub ff: usize,
    /// The MLP's activation.
    pub act: Activation,
    /// Dropout on the blocks' residual branches in train mode ([`crate::Mode`]).
    pub dropout: f64,
}

/// A decoder-only transformer over token ids: `ids` is `... s` (positions in the last batch
/// axis, ids as values), the result `... s | vocab` logits.
///
/// ```
/// use rocannl_tensor::nn::{Activation, Module, gpt::{Gpt, GptConfig}};
/// use rocannl_tensor::Graph;
/// let g = Graph::new();
/// let cfg = GptConfig {
///     vocab: 27, context: 16, width: 64, heads: 4, layers: 2, ff: 256,
///     act: Activation::GeluTanh, dropout: 0.0,
/// };
/// let gpt = Gpt::new(&g, "gpt", cfg);
/// let ids = g.data("ids", &[32, 16], &[], &[]);
/// let logits = gpt.apply(&ids);
/// g.finish().unwrap();
/// assert_eq!(logits.dims().unwrap(), vec![32, 16, 27]);
/// let count: usize = gpt.params().iter().map(|p| p.dims().unwrap().iter().product::<usize>()).sum();
/// assert_eq!(count, 104_091);
/// ```
#[derive(Clone, Debug)]
pub struct Gpt {
    /// Token embedding, `vocab -> width`.
    pub tok: Embedding,
    /// Learned positions, `context | -> width` (exempt from weight decay).
    pub pos: Tensor,
    /// The blocks, causal.
    pub blocks: Vec<TransformerBlock>,
    /// The final normalization.
    pub ln_f: LayerNorm,
    /// The head, `width -> vocab`, with bias.
    pub head: Dense,
    /// The sizes.
    pub cfg: GptConfig,
}

impl Gpt {
    /// A GPT named `name` (params `name.tok.table`, `name.pos`, `name.h0.att.wq`, …,
    /// `name.head.w`). The width must be a positive multiple of the heads and the dropout a
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
        let tok = Embedding::new(g, &format!("{name}.tok"), cfg.vocab, cfg.width);
        let pos = g.param_with(
            &format!("{name}.pos"),
            ParamSpec::output(&[cfg.width])
                .with_batch(&[cfg.context])
                .with_input(&[])
                .init(Init::Normal { mean: 0.0, std: 1.0 })
                .no_decay(),
        );
        let att = AttentionConfig::new(cfg.heads, cfg.width / cfg.heads.max(1)).causal();
        let mut blocks = Vec::with_capacity(cfg.layers);
        for l in 0..cfg.layers {
            let block = TransformerBlock::new(g, &format!("{name}.h{l}"), att, cfg.ff, cfg.act);
            blocks.push(block.with_dropout(cfg.dropout));
        }
        let ln_f = LayerNorm::new(g, &format!("{name}.ln_f"), 1e-5);
        let head = Dense::new(g, &format!("{name}.head"), cfg.vocab);
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
        self.head.apply(&self.ln_f.apply(&x))
    }
}

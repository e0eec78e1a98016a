//! Embeddings: a table looked up by ids ([`Tensor::lookup`], a row copied per id and each
//! row's gradient added back, not a one-hot product, which would cost a factor of the
//! vocabulary more); the same table read the other way is a tied output layer.

use crate::Axes;
use crate::graph::{Graph, IdCount, ParamSpec, Tensor};
use crate::init::Init;

use super::config::setters;

/// The options of an [`Embedding`]: its sizes, its table's init and whether the table decays.
#[derive(Clone, Debug, PartialEq)]
pub struct EmbeddingConfig {
    /// The number of ids.
    pub vocab: usize,
    /// The width of each row.
    pub dim: usize,
    /// The table's init (default: normal(0, 1), PyTorch's).
    pub table_init: Init,
    /// Whether the table decays under [`crate::DecayPolicy::PerParam`] (default: no).
    pub table_decay: bool,
}

impl EmbeddingConfig {
    /// A `vocab × dim` table with the defaults.
    pub fn new(vocab: usize, dim: usize) -> EmbeddingConfig {
        EmbeddingConfig {
            vocab,
            dim,
            table_init: Init::Normal { mean: 0.0, std: 1.0 },
            table_decay: false,
        }
    }
}

setters!(EmbeddingConfig {
    with_vocab => vocab: usize,
    with_dim => dim: usize,
    with_table_init => table_init: Init,
    with_table_decay => table_decay: bool,
});

/// A `vocab × dim` table looked up by integer ids ([`Embedding::apply`]), which can also serve
/// as a language model's output layer ([`Embedding::attend`], weight tying).
///
/// ```
/// use rocannl_tensor::{Axes, Graph, Init, nn::embed::{Embedding, EmbeddingConfig}};
/// let g = Graph::new();
/// let ids = g.ndarray("ids", Axes::new().batch(&[3]), &[0.0, 2.0, 1.0]);
/// let cfg = EmbeddingConfig::new(5, 4).with_table_init(Init::Normal { mean: 0.0, std: 0.02 });
/// let emb = Embedding::new(&g, "emb", cfg);
/// let e = emb.apply(&ids);
/// g.finish().unwrap();
/// assert_eq!(e.dims().unwrap(), vec![3, 4]);
/// assert_eq!(emb.table.shape_string(), "|5->4");
/// ```
#[derive(Clone, Debug)]
pub struct Embedding {
    /// `input: vocab -> output: dim`.
    pub table: Tensor,
    /// The number of ids.
    pub vocab: usize,
}

impl Embedding {
    /// A table named `name.table`.
    #[track_caller]
    pub fn new(g: &Graph, name: &str, cfg: EmbeddingConfig) -> Embedding {
        let table = g.param(
            &format!("{name}.table"),
            ParamSpec {
                weight_decay: cfg.table_decay,
                ..ParamSpec::new(Axes::new().input(&[cfg.vocab]).output(&[cfg.dim]))
                    .init(cfg.table_init)
            },
        );
        Embedding { table, vocab: cfg.vocab }
    }

    /// The rows for `ids` (a tensor without output axes holding ids as values):
    /// [`Tensor::lookup`] of the table.
    #[track_caller]
    pub fn apply(&self, ids: &Tensor) -> Tensor {
        let _within = ids.graph().within("Embedding::apply");
        ids.graph().reads_ids(
            ids,
            IdCount::Fixed(self.vocab),
            format!("the embedding '{}'", self.table.label()),
        );
        // Labelled after the table and the ids, so that messages name the lookup.
        self.table.lookup(ids).named(&format!("{}[{}]", self.table.label(), ids.label()))
    }

    /// The table used as a linear layer back to the ids (weight tying, as GPT-2's head):
    /// `tableᵀ * h`, one score per id for each position of `h` (`... | dim` → `... | vocab`),
    /// with no param of its own. The table's gradient accumulates from both uses, the lookup
    /// and this one.
    ///
    /// ```
    /// use rocannl_tensor::{Axes, Graph, nn::{Module, embed::{Embedding, EmbeddingConfig}}};
    /// let g = Graph::new();
    /// let wte = Embedding::new(&g, "wte", EmbeddingConfig::new(10, 4));
    /// let ids = g.data("ids", Axes::new().batch(&[2, 3]));
    /// let h = wte.apply(&ids).tanh(); // … the model's blocks …
    /// let logits = wte.attend(&h); // the head reads the same table
    /// g.finish().unwrap();
    /// assert_eq!(logits.dims().unwrap(), vec![2, 3, 10]);
    /// assert_eq!(g.params().len(), 1);
    /// # let _ = Module::params(&wte);
    /// ```
    #[track_caller]
    pub fn attend(&self, h: &Tensor) -> Tensor {
        let _within = h.graph().within("Embedding::attend");
        // `table` is `vocab -> dim`; its transpose `dim -> vocab` contracts `h`'s features.
        let tied = self.table.transpose().named(&format!("{}.T", self.table.label()));
        tied.matmul(h).named(&format!("{}.T*{}", self.table.label(), h.label()))
    }
}

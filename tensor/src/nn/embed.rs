//! Embeddings: a table lookup written as a one-hot product, so its gradient is the usual
//! compose gradient.

use crate::graph::{Graph, IdCount, ParamSpec, Tensor};
use crate::init::Init;

/// A `vocab × dim` table looked up by integer ids.
#[derive(Clone, Debug)]
pub struct Embedding {
    /// `input: vocab -> output: dim`.
    pub table: Tensor,
    /// The number of ids.
    pub vocab: usize,
}

impl Embedding {
    /// A table with normal(0, 1) entries.
    #[track_caller]
    pub fn new(g: &Graph, name: &str, vocab: usize, dim: usize) -> Embedding {
        let table = g.param_with(
            &format!("{name}.table"),
            ParamSpec::matrix(&[vocab], &[dim])
                .init(Init::Normal { mean: 0.0, std: 1.0 })
                .no_decay(),
        );
        Embedding { table, vocab }
    }

    /// The rows for `ids` (a tensor without output axes holding ids as values):
    /// `table * onehot(ids)`.
    #[track_caller]
    pub fn apply(&self, ids: &Tensor) -> Tensor {
        let _within = ids.graph().within("Embedding::apply");
        ids.graph().reads_ids(
            ids,
            IdCount::Fixed(self.vocab),
            format!("the embedding '{}'", self.table.label()),
        );
        let onehot =
            ids.eq(&ids.graph().range(self.vocab)).named(&format!("one_hot({})", ids.label()));
        // Labelled after the table and the ids, so that messages name the lookup.
        self.table.matmul(&onehot).named(&format!("{}[{}]", self.table.label(), ids.label()))
    }
}

/// An embedding applied once.
///
/// ```
/// use rocannl_tensor::{Graph, nn};
/// let g = Graph::new();
/// let ids = g.ndarray("ids", &[3], &[], &[], &[0.0, 2.0, 1.0]);
/// let e = nn::embed::embedding(&g, "emb", &ids, 5, 4);
/// g.finish().unwrap();
/// assert_eq!(e.dims().unwrap(), vec![3, 4]);
/// ```
#[track_caller]
pub fn embedding(g: &Graph, name: &str, ids: &Tensor, vocab: usize, dim: usize) -> Tensor {
    let _within = ids.graph().within("nn::embedding");
    Embedding::new(g, name, vocab, dim).apply(ids)
}

//! Embeddings: a table lookup written as a one-hot product, so its gradient is the usual
//! compose gradient.

use crate::graph::{Graph, ParamSpec, Tensor};
use crate::init::Init;

/// Looks up rows of a `vocab × dim` table for integer ids (a tensor without output axes, ids as
/// values): `table * onehot(ids)`.
///
/// ```
/// use rocannl_tensor::{Graph, nn};
/// let g = Graph::new();
/// let ids = g.ndarray("ids", &[3], &[], &[], &[0.0, 2.0, 1.0]);
/// let e = nn::embed::embedding(&g, "emb", &ids, 5, 4);
/// g.finish().unwrap();
/// assert_eq!(e.dims().unwrap(), vec![3, 4]);
/// ```
pub fn embedding(g: &Graph, name: &str, ids: &Tensor, vocab: usize, dim: usize) -> Tensor {
    let onehot = ids.eq(&g.range(vocab));
    let table = g.param_with(
        &format!("{name}.table"),
        ParamSpec::matrix(&[vocab], &[dim]).init(Init::Normal { mean: 0.0, std: 1.0 }),
    );
    table.matmul(&onehot)
}

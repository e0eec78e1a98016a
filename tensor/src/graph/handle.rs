//! The [`Tensor`] handle: what a user holds of a tensor, and what it can ask — its label, its
//! inferred [`Rows`], its operation and arguments.
//!
//! A handle is a graph and an index, so it is cheap to clone; every question goes to the graph's
//! node storage ([`super::GraphInner`]) and to shape inference. The graph's side (how nodes are
//! stored, leaves made, operations added) lives in the files beside this one.

use std::fmt;

use crate::error::{Error, Result};

use super::{Graph, Leaf, NodeInfo, Source, TensorId};

/// A tensor's inferred sizes, row by row. The rows are named, not ordered: the one order of
/// axes in the API is memory order — batch, then output, then input — the order of
/// [`Tensor::dims`], of the values [`crate::Session::read`] returns and
/// [`crate::Session::write`] takes, and of saved checkpoints ([`Rows::dims`]). The shape
/// notation `batch|input->output` ([`Tensor::shape_string`]) labels its rows.
///
/// ```
/// use rocannl_tensor::{Axes, Graph};
/// let g = Graph::new();
/// let x = g.data("x", Axes::new().batch(&[4]).input(&[2]).output(&[3])); // batch 4, input 2, output 3
/// let _ = x.scale(1.0);
/// g.finish().unwrap();
/// let r = x.rows().unwrap();
/// assert_eq!((r.batch.clone(), r.input.clone(), r.output.clone()), (vec![4], vec![2], vec![3]));
/// assert_eq!(x.dims().unwrap(), vec![4, 3, 2]); // memory order: batch, output, input
/// assert_eq!(x.shape_string(), "4|2->3");
/// ```
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Rows {
    /// The batch axes.
    pub batch: Vec<usize>,
    /// The input axes.
    pub input: Vec<usize>,
    /// The output axes.
    pub output: Vec<usize>,
}

impl Rows {
    /// Every axis in memory order: batch, output, input.
    pub fn dims(&self) -> Vec<usize> {
        [self.batch.as_slice(), &self.output, &self.input].concat()
    }

    /// The number of cells.
    pub fn cells(&self) -> usize {
        self.dims().iter().product()
    }
}

/// A handle to a tensor of a [`Graph`].
#[derive(Clone)]
pub struct Tensor {
    pub(crate) graph: Graph,
    pub(crate) id: TensorId,
}

impl fmt::Debug for Tensor {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Tensor({} #{})", self.label(), self.id.0)
    }
}

impl Tensor {
    /// The graph this tensor belongs to.
    pub fn graph(&self) -> &Graph {
        &self.graph
    }

    /// The tensor's id in its graph.
    pub fn id(&self) -> TensorId {
        self.id
    }

    /// The tensor's label.
    pub fn label(&self) -> String {
        self.graph.borrow().nodes[self.id.0 as usize].label.clone()
    }

    /// The same tensor, stored (value and gradient) in f32 when the session computes in f16 or
    /// bf16, as PyTorch's autocast runs norms, softmax sums and losses in f32: a mean of
    /// squares of activations of 300 is 90,000, past f16's largest number.
    pub(crate) fn kept_in_f32(self) -> Tensor {
        self.graph.borrow_mut().f32_stats.insert(self.id);
        self
    }

    /// Renames the tensor (for messages and persistence); returns it for chaining.
    pub fn named(self, label: &str) -> Tensor {
        let mut g = self.graph.borrow_mut();
        g.nodes[self.id.0 as usize].label = label.to_string();
        let shape = g.nodes[self.id.0 as usize].shape;
        g.inf.set_debug_name(shape, label);
        drop(g);
        self
    }

    pub(crate) fn info(&self) -> NodeInfo {
        self.graph.borrow().nodes[self.id.0 as usize].clone()
    }

    /// Whether this is a learnable parameter.
    pub fn is_param(&self) -> bool {
        matches!(self.info().source, Source::Leaf(Leaf::Param(_)))
    }

    /// The shape as `batch|input->output` (partially inferred before [`Graph::finish`]).
    pub fn shape_string(&self) -> String {
        let g = self.graph.borrow();
        g.inf.shape(g.nodes[self.id.0 as usize].shape).to_string()
    }

    /// The closed shape as `[batch, input, output]` size lists (after [`Graph::finish`]).
    pub fn rows(&self) -> Result<Rows> {
        let g = self.graph.borrow();
        let [batch, input, output] =
            g.inf.shape(g.nodes[self.id.0 as usize].shape).rows_sizes().ok_or_else(|| {
                Error::usage(format!(
                    "the shape of '{}' is not inferred yet: call finish first",
                    self.label()
                ))
            })?;
        Ok(Rows { batch, input, output })
    }

    /// The closed dimensions in memory order (batch, output, input).
    pub fn dims(&self) -> Result<Vec<usize>> {
        Ok(self.rows()?.dims())
    }

    /// The number of cells (after [`Graph::finish`]).
    pub fn num_elements(&self) -> Result<usize> {
        Ok(self.dims()?.iter().product())
    }

    /// The operation computing this tensor (`None` for leaves).
    pub fn op_name(&self) -> Option<String> {
        match self.info().source {
            Source::Op { op, .. } => Some(op.name()),
            Source::Leaf(_) => None,
        }
    }

    /// The arguments of this tensor's operation.
    pub fn args(&self) -> Vec<Tensor> {
        match self.info().source {
            Source::Op { args, .. } => args.into_iter().map(|a| self.graph.tensor(a)).collect(),
            Source::Leaf(_) => vec![],
        }
    }

    /// The size an einsum label of this tensor's operation was solved to (a captured dimension),
    /// after [`Graph::finish`].
    ///
    /// ```
    /// use rocannl_tensor::{Axes, Graph};
    /// let g = Graph::new();
    /// let x = g.data("x", Axes::new().output(&[7]));
    /// let k = g.data("k", Axes::new().output(&[3]));
    /// let y = x.einsum("o+k; k => o", &k);
    /// g.finish().unwrap();
    /// assert_eq!(y.captured("o"), Some(5));
    /// ```
    pub fn captured(&self, label: &str) -> Option<usize> {
        let g = self.graph.borrow();
        let step = g.nodes[self.id.0 as usize].step?;
        g.inf.label_size(step, label)
    }
}

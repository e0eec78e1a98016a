//! The graph: an explicit session of tensors, and cheap [`Tensor`] handles into it.
//!
//! There is no global state: every tensor belongs to one [`Graph`], which owns the shape
//! inference problem, the operations and the leaves. A [`Tensor`] is a reference-counted handle
//! (`Clone` is cheap) plus an index. Creating a tensor adds its operation to shape inference
//! right away (stage 1); a shape error is recorded and surfaces, as one `Result`, when the graph
//! is finalized — building expressions stays infallible and ergonomic.
//!
//! This file is the graph's node storage: what it knows of each tensor ([`NodeInfo`]), adding
//! operations, and finishing shape inference. The leaves and [`ParamSpec`] are in `leaves.rs`,
//! the [`Tensor`] handle and its [`Rows`] in `handle.rs`.

use std::cell::{Ref, RefCell, RefMut};
use std::fmt;
use std::rc::Rc;
use std::sync::Arc;

use rocannl_arrayjit::indexing::{Symbol, SymbolGen};
use rocannl_shape::inference::{Inference, ShapeDecl};
use rocannl_shape::spec::{EinsumSpec, SpecError};
use rocannl_shape::var::{ShapeId, StepId};
use rustc_hash::FxHashMap;

use crate::dynamic::DynDim;
use crate::error::{Error, Result};
use crate::init::Init;
use crate::op::Op;

mod handle;
mod leaves;
mod state;

pub use handle::{Rows, Tensor};
pub use leaves::ParamSpec;
pub use state::{DecayPolicy, Warnings};
pub(crate) use state::{Update, WarningState};

/// A tensor's index in its graph.
#[derive(Copy, Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct TensorId(pub u32);

/// What a leaf holds.
#[derive(Clone, Debug)]
pub enum Leaf {
    /// Written by the host (inputs, labels, datasets); optionally with initial values.
    Data(Option<Vec<f64>>),
    /// A learnable parameter.
    Param(Init),
    /// State that routines compiled in train mode update in place ([`crate::buffer`]): never
    /// trained, saved in checkpoints beside the params.
    Buffer(Init),
    /// Every cell holds this number.
    Constant(f64),
    /// Every cell holds its row-major offset (`range`, `range_of_shape`).
    Iota,
}

/// How a tensor is computed.
#[derive(Clone, Debug)]
pub enum Source {
    /// A leaf.
    Leaf(Leaf),
    /// An operation on other tensors.
    Op {
        /// The operation.
        op: Rc<dyn Op>,
        /// Its arguments.
        args: Vec<TensorId>,
    },
}

/// What the graph knows about one tensor.
#[derive(Clone, Debug)]
pub struct NodeInfo {
    /// Its name (for messages, dumps and persistence).
    pub label: String,
    /// Its shape in the inference problem.
    pub shape: ShapeId,
    /// How it is computed.
    pub source: Source,
    /// Its update step in the inference problem.
    pub step: Option<StepId>,
    /// Whether gradients reach it (params, and ops on such tensors).
    pub differentiable: bool,
}

/// A lookup that reads a tensor's values as ids: they must be integers in `0..count`.
#[derive(Clone, Debug)]
pub(crate) struct IdUse {
    /// What reads them, for messages (`embedding 'wte.table'`).
    pub reader: String,
    /// How many ids there are: a fixed count, or the size of a tensor's last output axis
    /// (known once shapes are inferred).
    pub count: IdCount,
}

/// How many ids a lookup has.
#[derive(Clone, Debug)]
pub(crate) enum IdCount {
    /// A fixed number (an embedding's vocabulary).
    Fixed(usize),
    /// The last output axis of this tensor (a classifier's logits).
    LastOutputOf(TensorId),
    /// The first input axis of this tensor (a table looked up, [`Tensor::lookup`]).
    FirstInputOf(TensorId),
}

pub(crate) struct GraphInner {
    pub inf: Inference,
    pub nodes: Vec<NodeInfo>,
    pub error: Option<Error>,
    pub seed: u64,
    pub symbols: SymbolGen,
    pub step_symbol: Option<Symbol>,
    /// Parsed einsum specs by text and padding, so a spec used by many operations (every
    /// convolution of a network) is parsed once.
    pub specs: FxHashMap<(String, bool), Arc<EinsumSpec>>,
    /// Where each param was created (the user's call site): a second param of one name is an
    /// error naming both places.
    pub param_sites: FxHashMap<String, &'static std::panic::Location<'static>>,
    /// Params exempt from weight decay ([`ParamSpec::no_decay`]).
    pub no_decay: rustc_hash::FxHashSet<TensorId>,
    /// Which params the optimizer's weight decay applies to ([`Graph::set_decay_policy`]).
    pub decay_policy: DecayPolicy,
    /// Per-param decay set after construction ([`Graph::set_decay`]); wins over the policy.
    pub decay_set: FxHashMap<TensorId, bool>,
    /// Data tensors whose first axis has a dynamic size ([`crate::Axes::dynamic_batch`]).
    pub dynamic: FxHashMap<TensorId, DynDim>,
    /// Data tensors holding ids, stored as unsigned 32-bit integers ([`Graph::ids`]).
    pub ids: rustc_hash::FxHashSet<TensorId>,
    /// Tensors read as ids by a lookup (an embedding's rows, a sparse loss's classes): what
    /// reads them and how many ids it has. Writes into them are checked against each.
    pub id_uses: FxHashMap<TensorId, Vec<IdUse>>,
    /// Statistics kept in f32 in a half-precision session (a norm's mean of squares, a
    /// softmax's sum, a loss), whose values or gradients would overflow or lose all precision
    /// in f16 or bf16 ([`Tensor::kept_in_f32`]).
    pub f32_stats: rustc_hash::FxHashSet<TensorId>,
    /// Every dynamic size made by [`Graph::dynamic`].
    pub dyn_dims: Vec<DynDim>,
    /// How many library calls ([`Graph::within`]) are open; the outermost names the steps.
    pub within_depth: usize,
    /// The updates of buffers, in the order they were recorded ([`crate::buffer`]).
    pub updates: Vec<Update>,
    /// What [`Graph::finish`] does with warnings, and those it has printed.
    pub warnings: WarningState,
}

/// A graph of tensors: the unit of shape inference and compilation.
///
/// ```
/// use rocannl_tensor::{Axes, Graph, ParamSpec};
/// let g = Graph::new();
/// let x = g.data("x", Axes::new().batch(&[4]).output(&[3])); // batch 4, output 3
/// let w = g.param("w", ParamSpec::default()); // both rows inferred from use
/// let b = g.param("b", ParamSpec::new(Axes::new().output(&[16])));
/// let y = (w.matmul(&x) + &b).relu();
/// g.finish().unwrap();
/// let r = w.rows().unwrap(); // no batch, 3 -> 16
/// assert_eq!((r.batch, r.input, r.output), (vec![], vec![3], vec![16]));
/// assert_eq!(y.dims().unwrap(), vec![4, 16]);
/// ```
#[derive(Clone)]
pub struct Graph {
    pub(crate) inner: Rc<RefCell<GraphInner>>,
}

/// An open library call ([`Graph::within`]); closes when dropped.
pub(crate) struct Within {
    graph: Graph,
}

impl Drop for Within {
    fn drop(&mut self) {
        let mut g = self.graph.borrow_mut();
        g.within_depth = g.within_depth.saturating_sub(1);
        if g.within_depth == 0 {
            g.inf.set_within(None);
        }
    }
}

impl fmt::Debug for Graph {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Graph({} tensors)", self.inner.borrow().nodes.len())
    }
}

impl Default for Graph {
    fn default() -> Self {
        Graph::new()
    }
}

impl Graph {
    /// An empty graph with seed 0.
    pub fn new() -> Graph {
        Graph::with_seed(0)
    }

    /// An empty graph whose random initializations derive from `seed`.
    pub fn with_seed(seed: u64) -> Graph {
        Graph {
            inner: Rc::new(RefCell::new(GraphInner {
                inf: Inference::new(),
                nodes: Vec::new(),
                error: None,
                seed,
                symbols: SymbolGen::default(),
                step_symbol: None,
                specs: FxHashMap::default(),
                param_sites: FxHashMap::default(),
                no_decay: Default::default(),
                decay_policy: Default::default(),
                decay_set: FxHashMap::default(),
                dynamic: FxHashMap::default(),
                ids: rustc_hash::FxHashSet::default(),
                id_uses: FxHashMap::default(),
                f32_stats: rustc_hash::FxHashSet::default(),
                dyn_dims: Vec::new(),
                within_depth: 0,
                updates: Vec::new(),
                warnings: Default::default(),
            })),
        }
    }

    /// The parsed spec of an einsum-like operation (`padded`: convolution axes preserve
    /// dimensions), parsed once per graph. A concatenated axis is an error here: only a
    /// concatenation fills the parts of one.
    pub(crate) fn spec(
        &self,
        text: &str,
        padded: bool,
    ) -> std::result::Result<Arc<EinsumSpec>, SpecError> {
        let key = (text.to_string(), padded);
        if let Some(s) = self.borrow().specs.get(&key) {
            return Ok(s.clone());
        }
        let parsed = if padded { EinsumSpec::parse_padded(text) } else { EinsumSpec::parse(text) };
        let spec = Arc::new(parsed?);
        spec.check_no_concat()?;
        self.borrow_mut().specs.insert(key, spec.clone());
        Ok(spec)
    }

    pub(crate) fn borrow(&self) -> Ref<'_, GraphInner> {
        self.inner.borrow()
    }

    pub(crate) fn borrow_mut(&self) -> RefMut<'_, GraphInner> {
        self.inner.borrow_mut()
    }

    /// Whether two handles refer to the same graph.
    pub fn same(&self, other: &Graph) -> bool {
        Rc::ptr_eq(&self.inner, &other.inner)
    }

    /// A fresh runtime symbol: bound to a value each time a routine runs (e.g. the batch
    /// number of [`Tensor::batch_slice_at`]).
    pub(crate) fn runtime_symbol(&self) -> Symbol {
        self.borrow_mut().symbols.fresh()
    }

    /// The graph's step counter: a runtime symbol that [`crate::Session::step`] binds to the
    /// number of the step being run (1, 2, …), for randomness that changes every step.
    pub(crate) fn step_symbol(&self) -> Symbol {
        let mut g = self.borrow_mut();
        if let Some(s) = g.step_symbol {
            return s;
        }
        let s = g.symbols.fresh();
        g.step_symbol = Some(s);
        s
    }

    /// The step counter, if anything uses it.
    pub(crate) fn existing_step_symbol(&self) -> Option<Symbol> {
        self.borrow().step_symbol
    }

    /// The graph's seed.
    pub fn seed(&self) -> u64 {
        self.borrow().seed
    }

    /// In strict mode, finishing fails instead of warning when a parameter's size is guessed.
    pub fn set_strict(&self, strict: bool) {
        self.borrow_mut().inf.set_strict(strict);
    }

    /// The tensor with this id.
    pub fn tensor(&self, id: TensorId) -> Tensor {
        Tensor { graph: self.clone(), id }
    }

    /// The number of tensors.
    pub fn len(&self) -> usize {
        self.borrow().nodes.len()
    }

    /// Whether the graph has no tensors.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Marks the operations built until the returned guard is dropped as part of the user's
    /// call of the library function `name` (a loss, a block's `apply`), with the user's source
    /// location: shape errors inside it then say `(inside loss::mse at src/main.rs:9:5)` rather
    /// than leaving an operation the user never wrote unexplained. Nested calls keep the
    /// outermost, the one in the user's code.
    #[track_caller]
    pub(crate) fn within(&self, name: &str) -> Within {
        let at = std::panic::Location::caller();
        let mut g = self.borrow_mut();
        if g.within_depth == 0 {
            let note = format!("{name} at {}:{}:{}", at.file(), at.line(), at.column());
            g.inf.set_within(Some(&note));
        }
        g.within_depth += 1;
        drop(g);
        Within { graph: self.clone() }
    }

    /// Adds an operation; a shape error is recorded for [`Graph::finish`].
    pub(crate) fn add_op(&self, op: Rc<dyn Op>, args: &[&Tensor]) -> Tensor {
        self.add_op_shaped(op, args, &ShapeDecl::inferred())
    }

    /// Adds an operation whose result has some rows declared (a reshape's target).
    pub(crate) fn add_op_shaped(
        &self,
        op: Rc<dyn Op>,
        args: &[&Tensor],
        decl: &ShapeDecl,
    ) -> Tensor {
        if let Some(other) = args.iter().find(|a| !a.graph.same(self)) {
            self.record(Error::usage(format!(
                "operation {} mixes tensors of different graphs ('{}')",
                op.name(),
                other.label()
            )));
        }
        let label = op.name();
        let mut g = self.borrow_mut();
        let arg_ids: Vec<TensorId> = args.iter().map(|a| a.id).collect();
        let arg_shapes: Vec<ShapeId> = arg_ids
            .iter()
            .map(|a| g.nodes.get(a.0 as usize).map_or(ShapeId(0), |n| n.shape))
            .collect();
        let shape = g.inf.new_shape(&label, decl);
        g.inf.name_next_op(&label);
        let step = match g.inf.add_step(shape, op.logic(&arg_shapes)) {
            Ok(s) => Some(s),
            Err(e) => {
                g.error.get_or_insert(Error::Shape(e));
                None
            }
        };
        let differentiable =
            op.differentiable() && arg_ids.iter().any(|a| g.nodes[a.0 as usize].differentiable);
        let id = TensorId(g.nodes.len() as u32);
        g.nodes.push(NodeInfo {
            label,
            shape,
            source: Source::Op { op, args: arg_ids },
            step,
            differentiable,
        });
        drop(g);
        self.tensor(id)
    }

    pub(crate) fn record(&self, e: Error) {
        self.borrow_mut().error.get_or_insert(e);
    }

    /// Finishes shape inference: every shape is closed. Returns the first error met while
    /// building or closing. Safe to call again after adding more tensors. Then reports the
    /// [`Graph::warnings`] as [`Graph::set_warnings`] says (printed once each by default).
    pub fn finish(&self) -> Result<()> {
        let mut g = self.borrow_mut();
        if let Some(e) = g.error.take() {
            let e = match e {
                Error::Shape(se) => Error::Shape(g.inf.refresh_error(se)),
                other => other,
            };
            g.error = Some(Error::Usage(e.to_string()));
            return Err(e);
        }
        g.inf.finish()?;
        drop(g);
        self.report_warnings()
    }

    /// Records every constraint shape inference processes, for debugging ([`Graph::shape_trace`]).
    pub fn enable_shape_trace(&self) {
        self.borrow_mut().inf.enable_trace();
    }

    /// The constraints shape inference processed, one per line, when tracing is enabled.
    pub fn shape_trace(&self) -> Vec<String> {
        self.borrow().inf.trace().to_vec()
    }

    /// What [`Graph::finish`] found suspicious without being an error: the guesses closing
    /// made about parameter shapes, and pointwise operations that give a result an axis only a
    /// param has (a position table declared like a token table, say).
    pub fn warnings(&self) -> Vec<String> {
        let mut out: Vec<String> =
            self.borrow().inf.warnings().iter().map(|w| w.message.clone()).collect();
        out.extend(self.pointwise_param_axes());
        out
    }

    /// All parameters, in creation order.
    pub fn params(&self) -> Vec<Tensor> {
        let ids: Vec<TensorId> = self
            .borrow()
            .nodes
            .iter()
            .enumerate()
            .filter(|(_, n)| matches!(n.source, Source::Leaf(Leaf::Param(_))))
            .map(|(i, _)| TensorId(i as u32))
            .collect();
        ids.into_iter().map(|i| self.tensor(i)).collect()
    }
}

//! The graph: an explicit session of tensors, and cheap [`Tensor`] handles into it.
//!
//! There is no global state: every tensor belongs to one [`Graph`], which owns the shape
//! inference problem, the operations and the leaves. A [`Tensor`] is a reference-counted handle
//! (`Clone` is cheap) plus an index. Creating a tensor adds its operation to shape inference
//! right away (stage 1); a shape error is recorded and surfaces, as one `Result`, when the graph
//! is finalized — building expressions stays infallible and ergonomic.

use std::cell::{Ref, RefCell, RefMut};
use std::fmt;
use std::rc::Rc;
use std::sync::Arc;

use rocannl_arrayjit::indexing::{Symbol, SymbolGen};
use rocannl_shape::inference::{Inference, RowDecl, ShapeDecl};
use rocannl_shape::logic::{Logic, Terminal, TerminalData};
use rocannl_shape::spec::{EinsumSpec, SpecError};
use rocannl_shape::var::{ShapeId, StepId};
use rustc_hash::FxHashMap;

use crate::dynamic::DynDim;
use crate::error::{Error, Result};
use crate::init::Init;
use crate::op::Op;

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
    pub decay_policy: crate::decay::DecayPolicy,
    /// Per-param decay set after construction ([`Graph::set_decay`]); wins over the policy.
    pub decay_set: FxHashMap<TensorId, bool>,
    /// Data tensors whose first axis has a dynamic size ([`Graph::data_dyn`]).
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
    pub updates: Vec<crate::buffer::Update>,
    /// What [`Graph::finish`] does with warnings, and those it has printed.
    pub warnings: crate::lints::WarningState,
}

/// A graph of tensors: the unit of shape inference and compilation.
///
/// ```
/// use rocannl_tensor::{Graph, ParamSpec};
/// let g = Graph::new();
/// let x = g.data("x", &[4], &[], &[3]); // batch 4, output 3
/// let w = g.param("w", ParamSpec::default()); // both rows inferred from use
/// let b = g.param("b", ParamSpec::output(&[16]));
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

/// A tensor's inferred sizes, row by row. The rows are named, not ordered: the one order of
/// axes in the API is memory order — batch, then output, then input — the order of
/// [`Tensor::dims`], of the values [`crate::Session::read`] returns and
/// [`crate::Session::write`] takes, and of saved checkpoints ([`Rows::dims`]). The shape
/// notation `batch|input->output` ([`Tensor::shape_string`]) labels its rows.
///
/// ```
/// use rocannl_tensor::Graph;
/// let g = Graph::new();
/// let x = g.data("x", &[4], &[2], &[3]); // batch 4, input 2, output 3
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

    fn add_leaf(&self, label: &str, decl: ShapeDecl, leaf: Leaf, data: TerminalData) -> Tensor {
        let param = matches!(leaf, Leaf::Param(_));
        // A buffer's sizes are inferred from use as a param's are (and guesses warned about).
        let inferred = param || matches!(leaf, Leaf::Buffer(_));
        let mut g = self.borrow_mut();
        let shape = g.inf.new_shape(label, &decl);
        let terminal = Terminal { param: inferred, data, input_equals_output: false };
        let step = match g.inf.add_step(shape, Logic::Terminal(terminal)) {
            Ok(s) => Some(s),
            Err(e) => {
                g.error.get_or_insert(Error::Shape(e));
                None
            }
        };
        let id = TensorId(g.nodes.len() as u32);
        g.nodes.push(NodeInfo {
            label: label.to_string(),
            shape,
            source: Source::Leaf(leaf),
            step,
            differentiable: param,
        });
        drop(g);
        self.tensor(id)
    }

    /// Host-written data of known shape: `batch|input->output` sizes.
    pub fn data(&self, label: &str, batch: &[usize], input: &[usize], output: &[usize]) -> Tensor {
        self.add_leaf(
            label,
            ShapeDecl::given(batch, input, output),
            Leaf::Data(None),
            TerminalData::Rows,
        )
    }

    /// A size chosen each time a routine runs, from 1 to `max`: the batch size of
    /// [`Graph::data_dyn`] tensors. Routines compiled once serve every size; the
    /// [`crate::Session`] holds the current one ([`crate::Session::set_size`], initially
    /// `max`). `max` must be at least 2.
    ///
    /// ```
    /// use rocannl_tensor::Graph;
    /// let g = Graph::new();
    /// let batch = g.dynamic("batch", 64);
    /// assert_eq!((batch.name(), batch.max()), ("batch", 64));
    /// ```
    pub fn dynamic(&self, name: &str, max: usize) -> DynDim {
        let symbol = self.runtime_symbol();
        if max < 2 {
            self.record(Error::usage(format!(
                "the dynamic size `{name}` has maximum {max}; it must be at least 2 (a size that \
                 is always 1 is a fixed axis of size 1)"
            )));
        }
        let d = DynDim { name: std::sync::Arc::from(name), max: max.max(2), symbol };
        self.borrow_mut().dyn_dims.push(d.clone());
        d
    }

    /// Host-written data whose first batch axis has the dynamic size `batch`, followed by
    /// the fixed `more_batch`, `input` and `output` sizes. Shapes are inferred with the axis at
    /// its maximum; writing and reading it take as many rows as the current size.
    ///
    /// ```
    /// use rocannl_tensor::{Graph, ParamSpec, Session};
    /// let g = Graph::new();
    /// let batch = g.dynamic("batch", 32);
    /// let x = g.data_dyn("x", &batch, &[], &[], &[3]);
    /// let w = g.param("w", ParamSpec::output(&[2]));
    /// let y = w.matmul(&x);
    /// let mut s = Session::new(&g).unwrap();
    /// let r = s.forward(&[&y]).unwrap();
    /// for n in [32, 7, 1] {
    ///     s.set_size(&batch, n).unwrap();
    ///     s.write(&x, &vec![1.0; n * 3]).unwrap();
    ///     s.run(&r).unwrap(); // one routine for every size
    ///     assert_eq!(s.read(&y).unwrap().len(), n * 2);
    /// }
    /// ```
    pub fn data_dyn(
        &self,
        label: &str,
        batch: &DynDim,
        more_batch: &[usize],
        input: &[usize],
        output: &[usize],
    ) -> Tensor {
        let rows: Vec<usize> =
            std::iter::once(batch.max).chain(more_batch.iter().copied()).collect();
        let t = self.data(label, &rows, input, output);
        self.borrow_mut().dynamic.insert(t.id, batch.clone());
        t
    }

    /// Host-written ids (token ids, class labels) of known shape, stored as unsigned 32-bit
    /// integers whatever the session's precision: exact up to 2²⁴ (2³² in an f64 session),
    /// and written with [`crate::Session::write_ids`], which checks each id against its
    /// range. Operations read them as numbers (an embedding's one-hot comparison, a sparse
    /// loss's targets); they have no gradient.
    ///
    /// ```
    /// use rocannl_tensor::{Graph, Prec, Session, SessionOptions};
    /// let g = Graph::new();
    /// let ids = g.ids("ids", &[3], &[], &[]);
    /// let doubled = ids.scale(2.0);
    /// // Even in bf16, whose integers are exact only up to 256, ids stay exact.
    /// let opts = SessionOptions { prec: Prec::Bf16, ..Default::default() };
    /// let mut s = Session::with_options(&g, opts).unwrap();
    /// s.write_ids(&ids, &[1000, 4, 70_000], 100_000).unwrap();
    /// let r = s.forward(&[&doubled]).unwrap();
    /// s.run(&r).unwrap();
    /// assert_eq!(s.read(&ids).unwrap(), vec![1000.0, 4.0, 70_000.0]);
    /// ```
    pub fn ids(&self, label: &str, batch: &[usize], input: &[usize], output: &[usize]) -> Tensor {
        let t = self.data(label, batch, input, output);
        self.borrow_mut().ids.insert(t.id);
        t
    }

    /// [`Graph::ids`] with a dynamic leading batch axis, as [`Graph::data_dyn`].
    pub fn ids_dyn(
        &self,
        label: &str,
        batch: &DynDim,
        more_batch: &[usize],
        input: &[usize],
        output: &[usize],
    ) -> Tensor {
        let t = self.data_dyn(label, batch, more_batch, input, output);
        self.borrow_mut().ids.insert(t.id);
        t
    }

    /// Records that a lookup reads `t`'s values as ids in `0..count`: every write into `t`,
    /// and constant values of `t`, are checked against it.
    pub(crate) fn reads_ids(&self, t: &Tensor, count: IdCount, reader: String) {
        let mut g = self.borrow_mut();
        let mut at = t.id;
        loop {
            g.id_uses
                .entry(at)
                .or_default()
                .push(IdUse { reader: reader.clone(), count: count.clone() });
            // A batch slice's values are its argument's: that is what gets written.
            match &g.nodes[at.0 as usize].source {
                Source::Op { op, args } if op.selects_cells() && args.len() == 1 => at = args[0],
                _ => break,
            }
        }
    }

    /// The tightest range the lookups reading `t` as ids allow: the number of ids and the
    /// reader that sets it. `None` when nothing reads `t` as ids (or shapes are not known yet).
    pub(crate) fn id_range(&self, t: TensorId) -> Option<(usize, String)> {
        let uses = self.borrow().id_uses.get(&t).cloned()?;
        uses.into_iter()
            .filter_map(|u| {
                let n = match u.count {
                    IdCount::Fixed(n) => n,
                    IdCount::LastOutputOf(logits) => {
                        *self.tensor(logits).rows().ok()?.output.last()?
                    }
                };
                Some((n, u.reader))
            })
            .min_by_key(|(n, _)| *n)
    }

    /// Whether a tensor holds ids ([`Graph::ids`]).
    pub fn holds_ids(&self, t: &Tensor) -> bool {
        self.borrow().ids.contains(&t.id)
    }

    /// Constant data with explicit values in memory order (batch, output, input).
    pub fn ndarray(
        &self,
        label: &str,
        batch: &[usize],
        input: &[usize],
        output: &[usize],
        values: &[f64],
    ) -> Tensor {
        let n: usize = batch.iter().chain(input).chain(output).product();
        let t = self.add_leaf(
            label,
            ShapeDecl::given(batch, input, output),
            Leaf::Data(Some(values.to_vec())),
            TerminalData::Rows,
        );
        if n != values.len() {
            self.record(Error::usage(format!(
                "ndarray '{label}' has {} values but its shape holds {n}",
                values.len()
            )));
        }
        t
    }

    /// A vector (one output axis) with these values.
    pub fn vector(&self, label: &str, values: &[f64]) -> Tensor {
        self.ndarray(label, &[], &[], &[values.len()], values)
    }

    /// A scalar constant: no axes, broadcasts anywhere.
    pub fn number(&self, x: f64) -> Tensor {
        self.add_leaf(
            &fmt_num(x),
            ShapeDecl::given(&[], &[], &[]),
            Leaf::Constant(x),
            TerminalData::Rows,
        )
    }

    /// A constant fill of a given shape.
    pub fn constant(&self, x: f64, batch: &[usize], input: &[usize], output: &[usize]) -> Tensor {
        self.add_leaf(
            &fmt_num(x),
            ShapeDecl::given(batch, input, output),
            Leaf::Constant(x),
            TerminalData::Rows,
        )
    }

    /// A constant fill whose shape is inferred from use (like a leaf that broadcasts to its
    /// least upper bound), e.g. the ones counting the cells of a reduction.
    pub fn fill(&self, x: f64) -> Tensor {
        self.add_leaf(&fmt_num(x), ShapeDecl::inferred(), Leaf::Constant(x), TerminalData::Rows)
    }

    /// `0, 1, …, n-1` along one output axis.
    pub fn range(&self, n: usize) -> Tensor {
        self.add_leaf(
            &format!("range{n}"),
            ShapeDecl::given(&[], &[], &[n]),
            Leaf::Iota,
            TerminalData::Rows,
        )
    }

    /// The positions `0, 1, …, n-1` along one axis — the last of the batch, input or output row
    /// as `row` says ([`crate::RowKind`]), the other rows empty — whose size `n` is inferred
    /// from use, like a parameter's. Combined with a tensor by broadcasting (rows align at their
    /// last axes), it numbers that tensor's positions along the axis: a causal mask is
    /// `keys.lt(&queries).not()` for the positions of the query and key axes.
    ///
    /// ```
    /// use rocannl_tensor::{Graph, RowKind};
    /// let g = Graph::new();
    /// let x = g.data("x", &[5], &[], &[3]);
    /// let pos = g.positions(RowKind::Batch);
    /// let _y = &x + &pos;
    /// g.finish().unwrap();
    /// assert_eq!(pos.dims().unwrap(), vec![5]);
    /// ```
    pub fn positions(&self, row: crate::RowKind) -> Tensor {
        use crate::RowKind;
        let one = || RowDecl::Partial(vec![None]);
        let none = || RowDecl::Given(vec![]);
        let decl = match row {
            RowKind::Batch => ShapeDecl { batch: one(), input: none(), output: none() },
            RowKind::Input => ShapeDecl { batch: none(), input: one(), output: none() },
            RowKind::Output => ShapeDecl { batch: none(), input: none(), output: one() },
        };
        self.add_leaf("positions", decl, Leaf::Iota, TerminalData::Rows)
    }

    /// Each cell holds its row-major offset.
    pub fn range_of_shape(&self, batch: &[usize], input: &[usize], output: &[usize]) -> Tensor {
        self.add_leaf(
            "range_of_shape",
            ShapeDecl::given(batch, input, output),
            Leaf::Iota,
            TerminalData::Rows,
        )
    }

    /// A learnable parameter: the rows `spec` gives, the others inferred from use, and its
    /// initialization (`ParamSpec::default()`: input and output rows inferred, no batch axes,
    /// [`Init::default`]).
    ///
    /// ```
    /// use rocannl_tensor::{Graph, Init, ParamSpec};
    /// let g = Graph::new();
    /// let b = g.param("b", ParamSpec::output(&[16]).init(Init::Constant(0.0)));
    /// let w = g.param("w", ParamSpec::default()); // both rows inferred
    /// assert_eq!(b.label(), "b");
    /// ```
    ///
    /// Names identify params (in checkpoints, in [`Graph::params`]): a second param of a name
    /// already taken is an error, reported by [`Graph::finish`] with both call sites.
    #[track_caller]
    pub fn param(&self, label: &str, spec: ParamSpec) -> Tensor {
        self.claim_name(label, "params", std::panic::Location::caller());
        let decl = ShapeDecl { batch: spec.batch, input: spec.input, output: spec.output };
        let t = self.add_leaf(label, decl, Leaf::Param(spec.init), TerminalData::Rows);
        if !spec.weight_decay {
            self.borrow_mut().no_decay.insert(t.id);
        }
        t
    }

    /// Records that a param or buffer (`what`) named `label` is created at `here`: names
    /// identify both in checkpoints, so a name taken twice is an error naming both places.
    pub(crate) fn claim_name(
        &self,
        label: &str,
        what: &str,
        here: &'static std::panic::Location<'static>,
    ) {
        let earlier = self.borrow_mut().param_sites.insert(label.to_string(), here);
        if let Some(first) = earlier {
            self.borrow_mut().param_sites.insert(label.to_string(), first);
            self.record(Error::usage(format!(
                "two {what} are named '{label}': created at {first} and at {here}; give each its \
                 own name"
            )));
        }
    }

    /// A leaf added by another module of the crate (a buffer).
    pub(crate) fn add_leaf_given(&self, label: &str, spec: &ParamSpec, leaf: Leaf) -> Tensor {
        let decl = ShapeDecl {
            batch: spec.batch.clone(),
            input: spec.input.clone(),
            output: spec.output.clone(),
        };
        self.add_leaf(label, decl, leaf, TerminalData::Rows)
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

/// Which rows of a parameter are given (the others are inferred) and how it is initialized.
#[derive(Clone, Debug)]
pub struct ParamSpec {
    /// Batch axes (default: none).
    pub batch: RowDecl,
    /// Input axes (default: inferred).
    pub input: RowDecl,
    /// Output axes (default: inferred).
    pub output: RowDecl,
    /// Initialization.
    pub init: Init,
    /// Whether the optimizer's weight decay applies (default: yes) under the default
    /// [`DecayPolicy::PerParam`](crate::decay::DecayPolicy::PerParam). The blocks of
    /// [`crate::nn`] turn it off for biases, norm gains and embedding tables unless their
    /// config says otherwise; [`Graph::set_decay`] changes it after construction.
    pub weight_decay: bool,
}

impl Default for ParamSpec {
    fn default() -> Self {
        ParamSpec {
            batch: RowDecl::Given(vec![]),
            input: RowDecl::Inferred,
            output: RowDecl::Inferred,
            init: Init::default(),
            weight_decay: true,
        }
    }
}

impl ParamSpec {
    /// Only the output row given.
    pub fn output(dims: &[usize]) -> ParamSpec {
        ParamSpec { output: RowDecl::Given(dims.to_vec()), ..ParamSpec::default() }
    }

    /// A vector: no input axes, these output axes (biases, gains).
    ///
    /// ```
    /// use rocannl_tensor::{Graph, ParamSpec};
    /// let g = Graph::new();
    /// let x = g.data("x", &[4], &[], &[3]);
    /// let b = g.param("b", ParamSpec::vector(&[3]));
    /// let _y = &x + &b;
    /// g.finish().unwrap();
    /// assert_eq!(b.shape_string(), "|->3");
    /// assert!(g.warnings().is_empty());
    /// ```
    pub fn vector(dims: &[usize]) -> ParamSpec {
        ParamSpec::output(dims).with_input(&[])
    }

    /// Input and output rows given.
    pub fn matrix(input: &[usize], output: &[usize]) -> ParamSpec {
        ParamSpec {
            input: RowDecl::Given(input.to_vec()),
            output: RowDecl::Given(output.to_vec()),
            ..ParamSpec::default()
        }
    }

    /// Exempts the param from the optimizer's weight decay (biases, norm gains, embeddings).
    pub fn no_decay(mut self) -> ParamSpec {
        self.weight_decay = false;
        self
    }

    /// Sets the input row.
    pub fn with_input(mut self, dims: &[usize]) -> ParamSpec {
        self.input = RowDecl::Given(dims.to_vec());
        self
    }

    /// Sets the input row's number of axes, with some sizes inferred (`None`).
    pub fn with_input_partial(mut self, dims: &[Option<usize>]) -> ParamSpec {
        self.input = RowDecl::Partial(dims.to_vec());
        self
    }

    /// Sets the batch row.
    pub fn with_batch(mut self, dims: &[usize]) -> ParamSpec {
        self.batch = RowDecl::Given(dims.to_vec());
        self
    }

    /// Sets the initialization.
    pub fn init(mut self, init: Init) -> ParamSpec {
        self.init = init;
        self
    }
}

fn fmt_num(x: f64) -> String {
    rocannl_arrayjit::assignments::fmt_f64(x)
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
    /// use rocannl_tensor::Graph;
    /// let g = Graph::new();
    /// let x = g.data("x", &[], &[], &[7]);
    /// let k = g.data("k", &[], &[], &[3]);
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

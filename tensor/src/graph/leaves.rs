//! The leaves of a graph: the constructors of data, ids, constants, ranges, positions and
//! parameters, and [`ParamSpec`], which declares a parameter's rows and initialization.
//!
//! Every leaf is a terminal of shape inference: its declared rows are given, partly given or
//! inferred from use, and a param's (or buffer's) guessed sizes are warned about when the graph
//! is finished. Operations on tensors are added by the node storage in `graph.rs`.

use rocannl_shape::inference::{RowDecl, ShapeDecl};
use rocannl_shape::logic::{Logic, Terminal, TerminalData};

use crate::axes::Axes;
use crate::dynamic::DynDim;
use crate::error::Error;
use crate::init::Init;

use super::{Graph, IdCount, IdUse, Leaf, NodeInfo, Rows, Source, Tensor, TensorId};

impl Graph {
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

    /// Host-written data of known shape ([`Axes`]: a row not set has no axes; a leading
    /// dynamic batch axis by [`Axes::dynamic_batch`]).
    ///
    /// ```
    /// use rocannl_tensor::{Axes, Graph};
    /// let g = Graph::new();
    /// let x = g.data("x", Axes::new().batch(&[4]).input(&[2]).output(&[3]));
    /// g.finish().unwrap();
    /// assert_eq!(x.shape_string(), "4|2->3");
    /// ```
    pub fn data(&self, label: &str, axes: Axes) -> Tensor {
        let decl = given(&self.known_axes(&axes, &format!("data '{label}'"), true));
        let t = self.add_leaf(label, decl, Leaf::Data(None), TerminalData::Rows);
        if let Some(d) = axes.dynamic() {
            self.borrow_mut().dynamic.insert(t.id, d.clone());
        }
        t
    }

    /// The rows of a leaf whose sizes are all known (`what` names it in errors, recorded for
    /// [`Graph::finish`]); a dynamic batch axis only where `dynamic` allows one.
    fn known_axes(&self, axes: &Axes, what: &str, dynamic: bool) -> Rows {
        if !dynamic && axes.dynamic().is_some() {
            self.record(Error::usage(format!(
                "{what}: only data and ids take a dynamic batch axis (Axes::dynamic_batch)"
            )));
        }
        axes.known(what).unwrap_or_else(|message| {
            self.record(Error::usage(message));
            Rows { batch: vec![], input: vec![], output: vec![] }
        })
    }

    /// A size chosen each time a routine runs, from 1 to `max`: the first batch axis of data
    /// and ids declared with [`Axes::dynamic_batch`], its size inferred at `max`. Routines
    /// compiled once serve every size; the [`crate::Session`] holds the current one
    /// ([`crate::Session::set_size`], initially `max`), and writing and reading such a tensor
    /// take as many rows as the current size. `max` must be at least 2.
    ///
    /// ```
    /// use rocannl_tensor::{Axes, Graph, ParamSpec, Session};
    /// let g = Graph::new();
    /// let batch = g.dynamic("batch", 32);
    /// assert_eq!((batch.name(), batch.max()), ("batch", 32));
    /// let x = g.data("x", Axes::new().dynamic_batch(&batch).output(&[3]));
    /// let w = g.param("w", ParamSpec::new(Axes::new().output(&[2])));
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

    /// Host-written ids (token ids, class labels) of known shape, stored as unsigned 32-bit
    /// integers whatever the session's precision: exact up to 2²⁴ (2³² in an f64 session),
    /// and written with [`crate::Session::write_ids`], which checks each id against its
    /// range. Operations read them as numbers (an embedding's one-hot comparison, a sparse
    /// loss's targets); they have no gradient.
    ///
    /// ```
    /// use rocannl_tensor::{Axes, Graph, Prec, Session, SessionOptions};
    /// let g = Graph::new();
    /// let ids = g.ids("ids", Axes::new().batch(&[3]));
    /// let doubled = ids.scale(2.0);
    /// // Even in bf16, whose integers are exact only up to 256, ids stay exact.
    /// let opts = SessionOptions { prec: Prec::Bf16, ..Default::default() };
    /// let mut s = Session::with_options(&g, opts).unwrap();
    /// s.write_ids(&ids, &[1000, 4, 70_000], 100_000).unwrap();
    /// let r = s.forward(&[&doubled]).unwrap();
    /// s.run(&r).unwrap();
    /// assert_eq!(s.read(&ids).unwrap(), vec![1000.0, 4.0, 70_000.0]);
    /// ```
    pub fn ids(&self, label: &str, axes: Axes) -> Tensor {
        let t = self.data(label, axes);
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
                    IdCount::FirstInputOf(table) => {
                        *self.tensor(table).rows().ok()?.input.first()?
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
    ///
    /// ```
    /// use rocannl_tensor::{Axes, Graph};
    /// let g = Graph::new();
    /// let m = g.ndarray("m", Axes::new().input(&[2]).output(&[3]), &[1.0; 6]);
    /// g.finish().unwrap();
    /// assert_eq!(m.shape_string(), "|2->3");
    /// ```
    pub fn ndarray(&self, label: &str, axes: Axes, values: &[f64]) -> Tensor {
        let what = format!("ndarray '{label}'");
        let rows = self.known_axes(&axes, &what, false);
        let n = rows.cells();
        let t = self.add_leaf(
            label,
            given(&rows),
            Leaf::Data(Some(values.to_vec())),
            TerminalData::Rows,
        );
        if n != values.len() {
            self.record(Error::usage(format!(
                "{what} has {} values but its shape holds {n}",
                values.len()
            )));
        }
        t
    }

    /// A vector (one output axis) with these values.
    pub fn vector(&self, label: &str, values: &[f64]) -> Tensor {
        self.ndarray(label, Axes::new().output(&[values.len()]), values)
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
    pub fn constant(&self, x: f64, axes: Axes) -> Tensor {
        let decl = given(&self.known_axes(&axes, &format!("constant {}", fmt_num(x)), false));
        self.add_leaf(&fmt_num(x), decl, Leaf::Constant(x), TerminalData::Rows)
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
    /// use rocannl_tensor::{Axes, Graph, RowKind};
    /// let g = Graph::new();
    /// let x = g.data("x", Axes::new().batch(&[5]).output(&[3]));
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
    pub fn range_of_shape(&self, axes: Axes) -> Tensor {
        let decl = given(&self.known_axes(&axes, "range_of_shape", false));
        self.add_leaf("range_of_shape", decl, Leaf::Iota, TerminalData::Rows)
    }

    /// A learnable parameter: the rows `spec` gives, the others inferred from use, and its
    /// initialization (`ParamSpec::default()`: input and output rows inferred, no batch axes,
    /// [`Init::default`]).
    ///
    /// ```
    /// use rocannl_tensor::{Axes, Graph, Init, ParamSpec};
    /// let g = Graph::new();
    /// let b = g.param("b", ParamSpec::new(Axes::new().output(&[16])).init(Init::Constant(0.0)));
    /// let w = g.param("w", ParamSpec::default()); // both rows inferred
    /// assert_eq!(b.label(), "b");
    /// ```
    ///
    /// Names identify params (in checkpoints, in [`Graph::params`]): a second param of a name
    /// already taken is an error, reported by [`Graph::finish`] with both call sites.
    #[track_caller]
    pub fn param(&self, label: &str, spec: ParamSpec) -> Tensor {
        self.claim_name(label, "params", std::panic::Location::caller());
        let decl = self.param_axes(&spec, &format!("param '{label}'"));
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
        let decl = self.param_axes(spec, &format!("buffer '{label}'"));
        self.add_leaf(label, decl, leaf, TerminalData::Rows)
    }

    /// A param's (or buffer's) rows: a batch row not set is empty, the other rows inferred.
    fn param_axes(&self, spec: &ParamSpec, what: &str) -> ShapeDecl {
        if spec.axes.dynamic().is_some() {
            self.record(Error::usage(format!(
                "{what}: only data and ids take a dynamic batch axis (Axes::dynamic_batch)"
            )));
        }
        spec.axes.declared([RowDecl::Given(vec![]), RowDecl::Inferred, RowDecl::Inferred])
    }
}

/// A parameter's rows ([`Axes`]: a batch row not set is empty, the other rows not set are
/// inferred from use), its initialization and whether weight decay applies.
#[derive(Clone, Debug)]
pub struct ParamSpec {
    /// The rows given (default: none, so input and output are inferred).
    pub axes: Axes,
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
        ParamSpec { axes: Axes::new(), init: Init::default(), weight_decay: true }
    }
}

impl ParamSpec {
    /// A param of these rows (a batch row not set is empty, the other rows not set are
    /// inferred from use), [`Init::default`] and weight decay on.
    ///
    /// ```
    /// use rocannl_tensor::{Axes, Graph, ParamSpec};
    /// let g = Graph::new();
    /// let x = g.data("x", Axes::new().batch(&[4]).output(&[3]));
    /// let b = g.param("b", ParamSpec::new(Axes::new().input(&[]).output(&[3]))); // a bias
    /// let _y = &x + &b;
    /// g.finish().unwrap();
    /// assert_eq!(b.shape_string(), "|->3");
    /// assert!(g.warnings().is_empty());
    /// ```
    pub fn new(axes: Axes) -> ParamSpec {
        ParamSpec { axes, ..ParamSpec::default() }
    }

    /// Exempts the param from the optimizer's weight decay (biases, norm gains, embeddings).
    pub fn no_decay(mut self) -> ParamSpec {
        self.weight_decay = false;
        self
    }

    /// Sets the initialization.
    pub fn init(mut self, init: Init) -> ParamSpec {
        self.init = init;
        self
    }
}

/// The declaration of rows whose sizes are all known.
fn given(rows: &Rows) -> ShapeDecl {
    ShapeDecl::given(&rows.batch, &rows.input, &rows.output)
}

fn fmt_num(x: f64) -> String {
    rocannl_arrayjit::assignments::fmt_f64(x)
}

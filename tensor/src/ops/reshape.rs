//! Reshape, flatten and unflatten: the same cells, grouped into other axes.
//!
//! A tensor's cells lie in memory row-major over its axes in the order batch, output, input
//! ([`crate::Rows::dims`], [`Tensor::dims`]). A reshape keeps that order of cells and regroups
//! the axes, like PyTorch's `view`/`reshape` of a contiguous tensor whose dimensions are listed
//! in that order: cell `k` of the argument (counting in memory order) is cell `k` of the
//! result. Since shapes here have three rows, the target is given per row ([`View`]); a row
//! the view does not mention is kept. [`Tensor::flatten`] merges consecutive axes of one row
//! and [`Tensor::unflatten`] splits one, without the rest of the row being known.
//!
//! Sizes left to inference are solved from the number of elements (the seed's `Total_elems`
//! row constraint, see [`rocannl_shape::reshape`]), the way PyTorch solves a `-1`. The
//! gradient of a reshape is the reshape back: the gradient cell `k` of the argument is the
//! result's gradient cell `k`. A dynamic batch axis ([`crate::Graph::data_dyn`]) may be kept
//! as the first axis; merging it with other axes is an error naming the reshape.
//!
//! Reshapes are indexed by loops over the common refinement of both shapes, so they merge and
//! split consecutive axes (in memory order); a regrouping across axis boundaries (`6, 4` as
//! `4, 6`) is an error when the session is built, and two reshapes through one flat axis do it.

use std::rc::Rc;

use rocannl_arrayjit::assignments::Asgn;
use rocannl_shape::inference::{RowDecl, ShapeDecl};
use rocannl_shape::logic::Logic;
use rocannl_shape::reshape::{ReshapeRows, RowReshape};
use rocannl_shape::row::Kind;
use rocannl_shape::var::ShapeId;

use crate::error::Error;
use crate::graph::Tensor;
use crate::op::{G, Op, OpCtx, x};

/// The same cells in memory order, in other axes.
#[derive(Debug)]
pub(crate) struct Reshape(pub ReshapeRows);

impl Op for Reshape {
    fn name(&self) -> String {
        "reshape".into()
    }
    fn logic(&self, args: &[ShapeId]) -> Logic {
        Logic::Reshape(args[0], self.0.clone())
    }
    fn forward(&self, cx: &OpCtx) -> Asgn {
        cx.out(None, &x(0), false)
    }
    fn backward(&self, cx: &OpCtx) -> Vec<Asgn> {
        // Each cell of the result is one cell of the argument: the gradient goes back the same
        // way (the reshape back).
        cx.grad(0, &G).into_iter().collect()
    }
}

/// The target of [`Tensor::reshape`]: the result's rows, each given or kept. One size given as
/// `None` is inferred from the number of elements (PyTorch's `-1`); the rows given hold as many
/// elements together as the same rows of the argument.
///
/// ```
/// use rocannl_tensor::{Graph, View};
/// let g = Graph::new();
/// let x = g.data("x", &[2], &[], &[3, 4]); // batch 2, output 3, 4
/// let y = x.reshape(&View::new().output(&[12]));
/// let z = x.reshape(&View::new().output_partial(&[Some(6), None]));
/// g.finish().unwrap();
/// assert_eq!(y.shape_string(), "2|->12");
/// assert_eq!(z.shape_string(), "2|->6,2");
/// ```
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct View {
    rows: [Option<Vec<Option<usize>>>; 3],
}

impl View {
    /// Every row kept (the identity).
    pub fn new() -> View {
        View::default()
    }

    fn set(mut self, kind: Kind, dims: Vec<Option<usize>>) -> View {
        self.rows[kind_index(kind)] = Some(dims);
        self
    }

    /// The result's batch row.
    pub fn batch(self, dims: &[usize]) -> View {
        self.set(Kind::Batch, dims.iter().copied().map(Some).collect())
    }

    /// The result's batch row, with `None` sizes inferred.
    pub fn batch_partial(self, dims: &[Option<usize>]) -> View {
        self.set(Kind::Batch, dims.to_vec())
    }

    /// The result's input row.
    pub fn input(self, dims: &[usize]) -> View {
        self.set(Kind::Input, dims.iter().copied().map(Some).collect())
    }

    /// The result's input row, with `None` sizes inferred.
    pub fn input_partial(self, dims: &[Option<usize>]) -> View {
        self.set(Kind::Input, dims.to_vec())
    }

    /// The result's output row.
    pub fn output(self, dims: &[usize]) -> View {
        self.set(Kind::Output, dims.iter().copied().map(Some).collect())
    }

    /// The result's output row, with `None` sizes inferred.
    pub fn output_partial(self, dims: &[Option<usize>]) -> View {
        self.set(Kind::Output, dims.to_vec())
    }
}

fn kind_index(kind: Kind) -> usize {
    match kind {
        Kind::Batch => 0,
        Kind::Input => 1,
        Kind::Output => 2,
    }
}

/// The declared result rows and the reshape's rows for one changed row (`at` in `kind`).
fn one_row(kind: Kind, change: RowReshape) -> (ShapeDecl, ReshapeRows) {
    let mut rows = [RowReshape::Keep, RowReshape::Keep, RowReshape::Keep];
    rows[kind_index(kind)] = change;
    (ShapeDecl::inferred(), rows)
}

impl Tensor {
    /// The same cells in memory order (batch, output, input; row-major) in the rows of `view`;
    /// the rows it does not give are kept. Like PyTorch's `x.view(...)` of a contiguous tensor.
    ///
    /// The FlattenConsecutive(2) of a WaveNet, batch `B, T`, channels `C` as `B, T/2` and
    /// `2*C` (`x.view(B, T // 2, C * 2)`), with the batch size inferred:
    ///
    /// ```
    /// use rocannl_tensor::{Graph, Session, View};
    /// let g = Graph::new();
    /// let x = g.data("x", &[1, 4], &[], &[2]); // batch 1, 4 positions; 2 channels
    /// let y = x.reshape(&View::new().batch_partial(&[None, Some(2)]).output(&[4]));
    /// let mut s = Session::new(&g).unwrap();
    /// let fwd = s.forward(&[&y]).unwrap();
    /// s.write(&x, &[0.0, 1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0]).unwrap();
    /// s.run(&fwd).unwrap();
    /// assert_eq!(y.shape_string(), "1,2|->4");
    /// assert_eq!(s.read(&y).unwrap(), vec![0.0, 1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0]);
    /// ```
    pub fn reshape(&self, view: &View) -> Tensor {
        let open = view.rows.iter().flatten().flatten().filter(|d| d.is_none()).count();
        if open > 1 {
            return self.refuse(format!(
                "reshape: {open} sizes are left to inference (None); at most one can be solved \
                 from the number of elements"
            ));
        }
        let decl_of = |r: &Option<Vec<Option<usize>>>| match r {
            None => RowDecl::Inferred,
            Some(d) if d.iter().all(Option::is_some) => {
                RowDecl::Given(d.iter().map(|x| x.unwrap_or(0)).collect())
            }
            Some(d) => RowDecl::Partial(d.clone()),
        };
        let decl = ShapeDecl {
            batch: decl_of(&view.rows[0]),
            input: decl_of(&view.rows[1]),
            output: decl_of(&view.rows[2]),
        };
        let change = |r: &Option<Vec<Option<usize>>>| match r {
            None => RowReshape::Keep,
            Some(_) => RowReshape::Free,
        };
        let rows = [change(&view.rows[0]), change(&view.rows[1]), change(&view.rows[2])];
        self.graph.add_op_shaped(Rc::new(Reshape(rows)), &[self], &decl)
    }

    /// Records a usage error for [`crate::Graph::finish`]; the tensor stands in for the result.
    fn refuse(&self, message: String) -> Tensor {
        self.graph.record(Error::usage(message));
        self.clone()
    }

    /// Merges `count` consecutive axes of row `row`, starting at axis `at` (negative: from the
    /// end, `-1` the last axis), into one; the other axes and rows are kept. Like PyTorch's
    /// `x.flatten(start, end)` within one row; the rest of the row need not be known.
    ///
    /// ```
    /// use rocannl_tensor::{Graph, RowKind};
    /// let g = Graph::new();
    /// let x = g.data("x", &[2], &[], &[3, 4, 5]);
    /// let last_two = x.flatten(RowKind::Output, -2, 2);
    /// let first_two = x.flatten(RowKind::Output, 0, 2);
    /// g.finish().unwrap();
    /// assert_eq!(last_two.shape_string(), "2|->3,20");
    /// assert_eq!(first_two.shape_string(), "2|->12,5");
    /// ```
    pub fn flatten(&self, row: Kind, at: isize, count: usize) -> Tensor {
        let (decl, rows) = one_row(row, RowReshape::Merge { at, count });
        self.graph.add_op_shaped(Rc::new(Reshape(rows)), &[self], &decl)
    }

    /// Splits axis `at` of row `row` (negative: from the end) into axes of `sizes`, at most one
    /// of them `None` (inferred); the other axes and rows are kept. Like PyTorch's
    /// `x.unflatten(dim, sizes)` (e.g. a model dimension into heads and head size).
    ///
    /// ```
    /// use rocannl_tensor::{Graph, RowKind};
    /// let g = Graph::new();
    /// let x = g.data("x", &[2], &[], &[12]);
    /// let heads = x.unflatten(RowKind::Output, -1, &[Some(4), None]);
    /// g.finish().unwrap();
    /// assert_eq!(heads.shape_string(), "2|->4,3");
    /// ```
    pub fn unflatten(&self, row: Kind, at: isize, sizes: &[Option<usize>]) -> Tensor {
        let open = sizes.iter().filter(|d| d.is_none()).count();
        if open > 1 {
            return self.refuse(format!(
                "unflatten: {open} sizes are left to inference (None); at most one can be \
                 solved from the size of the split axis"
            ));
        }
        let (decl, rows) = one_row(row, RowReshape::Split { at, sizes: sizes.to_vec() });
        self.graph.add_op_shaped(Rc::new(Reshape(rows)), &[self], &decl)
    }
}

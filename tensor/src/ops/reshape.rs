//! Reshape, flatten and unflatten: the same cells, grouped into other axes.
//!
//! A tensor's cells lie in memory row-major over its axes in the order batch, output, input
//! ([`crate::Rows::dims`], [`Tensor::dims`]). A reshape keeps that order of cells and regroups
//! the axes, like PyTorch's `view`/`reshape` of a contiguous tensor whose dimensions are listed
//! in that order: cell `k` of the argument (counting in memory order) is cell `k` of the
//! result. Since shapes here have three rows, the target is given per row ([`Axes`]); a row
//! the view does not mention is kept. [`Tensor::flatten`] merges consecutive axes of one row
//! and [`Tensor::unflatten`] splits one, without the rest of the row being known.
//!
//! Sizes left to inference are solved from the number of elements (the seed's `Total_elems`
//! row constraint, see [`rocannl_shape::reshape`]), the way PyTorch solves a `-1`. The
//! gradient of a reshape is the reshape back: the gradient cell `k` of the argument is the
//! result's gradient cell `k`. A dynamic batch axis ([`crate::Axes::dynamic_batch`]) may be kept
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

use crate::axes::Axes;
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
    /// use rocannl_tensor::{Axes, Graph, Session};
    /// let g = Graph::new();
    /// let x = g.data("x", Axes::new().batch(&[1, 4]).output(&[2])); // batch 1, 4 positions; 2 channels
    /// let y = x.reshape(&Axes::new().batch_partial(&[None, Some(2)]).output(&[4]));
    /// let mut s = Session::new(&g).unwrap();
    /// let fwd = s.forward(&[&y]).unwrap();
    /// s.write(&x, &[0.0, 1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0]).unwrap();
    /// s.run(&fwd).unwrap();
    /// assert_eq!(y.shape_string(), "1,2|->4");
    /// assert_eq!(s.read(&y).unwrap(), vec![0.0, 1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0]);
    /// ```
    pub fn reshape(&self, view: &Axes) -> Tensor {
        if view.dynamic().is_some() {
            return self.refuse("reshape: a dynamic batch axis is for data and ids".to_string());
        }
        let open = view.open_sizes();
        if open > 1 {
            return self.refuse(format!(
                "reshape: {open} sizes are left to inference (None); at most one can be solved \
                 from the number of elements"
            ));
        }
        let decl = view.declared([RowDecl::Inferred, RowDecl::Inferred, RowDecl::Inferred]);
        let rows = view.is_set().map(|set| if set { RowReshape::Free } else { RowReshape::Keep });
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
    /// use rocannl_tensor::{Axes, Graph, RowKind};
    /// let g = Graph::new();
    /// let x = g.data("x", Axes::new().batch(&[2]).output(&[3, 4, 5]));
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
    /// use rocannl_tensor::{Axes, Graph, RowKind};
    /// let g = Graph::new();
    /// let x = g.data("x", Axes::new().batch(&[2]).output(&[12]));
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

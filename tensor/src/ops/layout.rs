//! Operations that move cells without arithmetic: transpose, batch slicing, concatenation.
//!
//! Their gradients are the same moves backwards. A concatenation writes its result in parts,
//! one assignment per argument at that part's offset; its gradient reads each part back.

use std::rc::Rc;
use std::sync::Arc;

use rocannl_arrayjit::assignments::Asgn;
use rocannl_arrayjit::indexing::Symbol;
use rocannl_shape::logic::{Logic, SliceIndex};
use rocannl_shape::spec::EinsumSpec;
use rocannl_shape::var::ShapeId;

use crate::error::Error;
use crate::graph::Tensor;
use crate::op::{G, Op, OpCtx, Side, x};

/// Swaps the input and output rows, keeping the batch row.
#[derive(Debug)]
pub(crate) struct Transpose;

impl Op for Transpose {
    fn name(&self) -> String {
        "transpose".into()
    }
    fn logic(&self, args: &[ShapeId]) -> Logic {
        Logic::Transpose(args[0])
    }
    fn forward(&self, cx: &OpCtx) -> Asgn {
        cx.out(None, &x(0), false)
    }
    fn backward(&self, cx: &OpCtx) -> Vec<Asgn> {
        cx.grad(0, &G).into_iter().collect()
    }
}

/// Removes the leftmost batch axis, taking one position of it.
#[derive(Debug)]
pub(crate) struct BatchSlice(pub SliceIndex);

impl Op for BatchSlice {
    fn selects_cells(&self) -> bool {
        true
    }
    fn name(&self) -> String {
        match &self.0 {
            SliceIndex::Fixed(i) => format!("batch_slice {i}"),
            SliceIndex::Runtime(s) => format!("batch_slice {s}"),
        }
    }
    fn logic(&self, args: &[ShapeId]) -> Logic {
        Logic::BatchSlice(args[0], self.0.clone())
    }
    fn forward(&self, cx: &OpCtx) -> Asgn {
        cx.out(None, &x(0), false)
    }
    fn backward(&self, cx: &OpCtx) -> Vec<Asgn> {
        cx.grad(0, &G).into_iter().collect()
    }
}

/// The argument, with the first axis of the result given a dynamic size: only its first `n`
/// rows count from here on (a batch sliced out of a resident dataset whose last batch is
/// partial).
#[derive(Debug)]
pub(crate) struct DynamicRows(pub crate::DynDim);

impl Op for DynamicRows {
    fn selects_cells(&self) -> bool {
        true
    }
    fn name(&self) -> String {
        format!("dynamic_rows {}", self.0)
    }
    fn logic(&self, args: &[ShapeId]) -> Logic {
        Logic::Pointwise(args.to_vec())
    }
    fn dynamic_rows(&self) -> Option<crate::DynDim> {
        Some(self.0.clone())
    }
    fn forward(&self, cx: &OpCtx) -> Asgn {
        cx.out(None, &x(0), false)
    }
    fn backward(&self, cx: &OpCtx) -> Vec<Asgn> {
        cx.grad(0, &G).into_iter().collect()
    }
}

/// Concatenation along the axes a spec joins with `^` (e.g. `a; b => a^b`).
#[derive(Debug)]
pub(crate) struct Concat(pub Arc<EinsumSpec>);

impl Op for Concat {
    fn name(&self) -> String {
        format!("concat {}", self.0.text)
    }
    fn logic(&self, args: &[ShapeId]) -> Logic {
        Logic::Einsum(self.0.clone(), args.to_vec())
    }
    fn per_argument_projections(&self) -> bool {
        true
    }
    fn forward(&self, cx: &OpCtx) -> Asgn {
        // Part i is written by projection i, whose only argument is argument i.
        Asgn::Seq(
            (0..cx.args.len())
                .map(|i| {
                    let part = OpCtx { args: vec![cx.args[i]], ..cx.clone() };
                    part.assign(cx.out, Side::Out, None, &x(0), i, i == 0)
                })
                .collect(),
        )
    }
    fn backward(&self, cx: &OpCtx) -> Vec<Asgn> {
        (0..cx.args.len())
            .filter_map(|i| {
                let part = OpCtx {
                    args: vec![cx.args[i]],
                    arg_grads: vec![cx.arg_grads.get(i).copied().flatten()],
                    ..cx.clone()
                };
                part.grad_over(0, &G, i)
            })
            .collect()
    }
}

impl Tensor {
    /// Swaps input and output axes.
    pub fn transpose(&self) -> Tensor {
        self.graph.add_op(Rc::new(Transpose), &[self])
    }

    /// Removes the leftmost batch axis, taking position `index`.
    pub fn batch_slice(&self, index: usize) -> Tensor {
        self.graph.add_op(Rc::new(BatchSlice(SliceIndex::Fixed(index))), &[self])
    }

    /// Removes the leftmost batch axis, taking the position bound to `symbol` when a routine
    /// runs (e.g. the batch number in a training loop).
    pub(crate) fn batch_slice_at(&self, symbol: Symbol) -> Tensor {
        self.graph.add_op(Rc::new(BatchSlice(SliceIndex::Runtime(symbol))), &[self])
    }

    /// The same values, with the first axis given the dynamic size `d` (its size must be
    /// `d`'s maximum): from here on only its first `n` rows count, `n` the size when running —
    /// a mean over them divides by `n`. For a batch taken out of a resident dataset whose last
    /// batch is partial ([`crate::train::Loader`]).
    pub fn dynamic_rows(&self, d: &crate::DynDim) -> Tensor {
        self.graph.add_op(Rc::new(DynamicRows(d.clone())), &[self])
    }

    /// Concatenates `self` and `others` along the axes the spec joins with `^`.
    ///
    /// ```
    /// use rocannl_tensor::{Axes, Graph};
    /// let g = Graph::new();
    /// let a = g.data("a", Axes::new().output(&[2, 3]));
    /// let b = g.data("b", Axes::new().output(&[2, 4]));
    /// let c = a.concat("i, p; i, q => i, p^q", &[&b]);
    /// g.finish().unwrap();
    /// assert_eq!(c.dims().unwrap(), vec![2, 7]);
    /// ```
    pub fn concat(&self, spec: &str, others: &[&Tensor]) -> Tensor {
        let mut parts = vec![self];
        parts.extend_from_slice(others);
        let g = self.graph.clone();
        let spec = match EinsumSpec::parse(spec) {
            // Each argument must fill one part of each concatenated axis (a spec error, found
            // from the spec alone).
            Ok(s) if s.operands.len() == parts.len() => match s.concat_fills() {
                Ok(_) => Arc::new(s),
                Err(e) => {
                    g.record(Error::Shape(e.into()));
                    return self.clone();
                }
            },
            Ok(s) => {
                g.record(Error::usage(format!(
                    "concat spec \"{spec}\" has {} operand(s) but joins {} tensor(s)",
                    s.operands.len(),
                    parts.len()
                )));
                return self.clone();
            }
            Err(e) => {
                g.record(Error::Shape(e.into()));
                return self.clone();
            }
        };
        g.add_op(Rc::new(Concat(spec)), &parts)
    }
}

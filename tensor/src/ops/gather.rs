//! A table looked up by integer ids: the embedding's operation.
//!
//! Written as a product with a one-hot tensor, a lookup costs tokens × cells × vocabulary
//! multiply-adds forward and again for the table's gradient (and a tokens × vocabulary tensor):
//! for GPT-2's 50 257 ids at width 768, 79 GFLOP per 1024 tokens. As one operation it copies a
//! row per id and adds each row's gradient back ([`rocannl_arrayjit::assignments::GatherAsgn`]):
//! a kernel on the native backend, ordinary nests elsewhere. Its shapes are those of the einsum
//! `| v -> ..d..; ..b.. | => ..b.. | ..d..`: the table's one input axis is the vocabulary, its
//! output axes the cells of a row; the ids' batch axes are the result's batch axes.
//!
//! The values are the one-hot product's: each cell of the result is its id's cell of the table,
//! and each cell of the table's gradient sums its ids' gradient cells in token order. Where the
//! two differ, the lookup is what the user meant: a NaN or infinity in another id's row does not
//! reach the result (`0 · ∞` is NaN in a product), and a `−0` in the table stays `−0`. An id
//! outside `0..vocab` (refused when written: [`crate::Session::write_ids`]) selects nothing: its
//! cells are `−0` and it adds nothing to the gradient.

use std::rc::Rc;
use std::sync::Arc;

use rocannl_arrayjit::assignments::{Asgn, GatherAsgn};
use rocannl_shape::logic::Logic;
use rocannl_shape::spec::EinsumSpec;
use rocannl_shape::var::ShapeId;

use super::batch_limit;
use crate::error::Error;
use crate::graph::{IdCount, Tensor};
use crate::op::{Op, OpCtx};

/// The shapes of a lookup, as an einsum.
const SPEC: &str = "|v->..d..; ..b..| => ..b..|..d..";

/// `out[b…, d…] = table[d…, ids[b…]]`.
#[derive(Debug)]
pub(crate) struct Lookup {
    spec: Arc<EinsumSpec>,
}

impl Op for Lookup {
    fn name(&self) -> String {
        "lookup".into()
    }
    fn logic(&self, args: &[ShapeId]) -> Logic {
        Logic::Einsum(self.spec.clone(), args.to_vec())
    }
    fn forward(&self, cx: &OpCtx) -> Asgn {
        Asgn::Gather(Box::new(GatherAsgn {
            table: cx.args[0],
            ids: cx.args[1],
            out: cx.out,
            // Memory order is batch, output, input: the vocabulary (the input axis) is last.
            vocab_first: false,
            backward: false,
            batch_limit: batch_limit(cx),
        }))
    }
    /// The table's gradient; the ids have none.
    fn backward(&self, cx: &OpCtx) -> Vec<Asgn> {
        let (Some(d_out), Some(Some(d_table))) = (cx.out_grad, cx.arg_grads.first()) else {
            return vec![];
        };
        vec![Asgn::Gather(Box::new(GatherAsgn {
            table: *d_table,
            ids: cx.args[1],
            out: d_out,
            vocab_first: false,
            backward: true,
            batch_limit: batch_limit(cx),
        }))]
    }
}

impl Tensor {
    /// The rows of table `self` (`| vocab -> ..d..`: one input axis, the ids, and any output
    /// axes, a row's cells) for the ids held as values by `ids` (batch axes only): a result of
    /// the ids' batch axes and the table's output axes, `result[b…, d…] = self[ids[b…]][d…]`
    /// (PyTorch's `embedding`, `index_select` on the first axis of a table stored `[vocab,
    /// d]`). Its gradient adds each id's result gradient into that id's row. Ids are read as
    /// integers in `0..vocab`; declare them with [`crate::Graph::ids`] so that writes are
    /// checked (an id outside the range selects nothing: a row of zeros). [`crate::nn::embed`]
    /// is the module around it.
    ///
    /// ```
    /// use rocannl_tensor::{Axes, Graph, Session};
    /// let g = Graph::new();
    /// // Three ids, rows of two cells; the table is stored row of cells by row of cells:
    /// // cell 0 of ids 0, 1, 2, then cell 1 of ids 0, 1, 2.
    /// let table = g.ndarray("table", Axes::new().input(&[3]).output(&[2]), &[1., 2., 3., 4., 5., 6.]);
    /// let ids = g.ids("ids", Axes::new().batch(&[4]));
    /// let rows = table.lookup(&ids);
    /// let mut s = Session::new(&g).unwrap();
    /// s.write_ids(&ids, &[2, 0, 0, 1], 3).unwrap();
    /// let r = s.forward(&[&rows]).unwrap();
    /// s.run(&r).unwrap();
    /// assert_eq!(s.read(&rows).unwrap(), vec![3., 6., 1., 4., 1., 4., 2., 5.]);
    /// ```
    pub fn lookup(&self, ids: &Tensor) -> Tensor {
        let spec = match self.graph.spec(SPEC, false) {
            Ok(s) => s,
            Err(e) => {
                self.graph.record(Error::Shape(e.into()));
                Arc::new(EinsumSpec::parse("...;...=>...").expect("a valid fallback spec"))
            }
        };
        self.graph.reads_ids(
            ids,
            IdCount::FirstInputOf(self.id),
            format!("the lookup of '{}'", self.label()),
        );
        self.graph.add_op(Rc::new(Lookup { spec }), &[self, ids])
    }
}

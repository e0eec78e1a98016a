//! The compiler's side of a graph, kept apart from the rest of the API on purpose.
//!
//! A model is built, compiled, run and trained without anything here: the rest of the crate
//! names no compiler type (a test of the workspace checks it). This module is for the two
//! kinds of code that do need the compiler's vocabulary:
//!
//! - tools that show how a graph is compiled (the command line's `explain` and `bench`):
//!   [`projections`] gives the loop nest of an operation's assignment, [`compile_report`] what
//!   compiling a routine did;
//! - new operations: [`op`] is the interface every operation implements — its shape logic,
//!   forward assignment and gradient assignments, written in the compiler's assignments IR.
//!
//! Its types may change with the compiler; code outside these two uses should not need it.

#[path = "advanced_op.rs"]
pub mod op;

use rocannl_arrayjit::context::CompileReport;
use rocannl_arrayjit::indexing::{Projections, SymbolGen};

use crate::error::{Error, Result};
use crate::graph::{Source, Tensor};
use crate::routine::Routine;

/// The projections of a tensor's operation (after [`crate::Graph::finish`]): the loop nest of
/// its assignment; one per argument for concatenations, none for leaves.
///
/// ```
/// use rocannl_tensor::{Axes, Graph, advanced};
/// let g = Graph::new();
/// let a = g.data("a", Axes::new().input(&[3]).output(&[2]));
/// let x = g.data("x", Axes::new().output(&[3]));
/// let y = a.matmul(&x);
/// g.finish().unwrap();
/// let p = advanced::projections(&y).unwrap();
/// assert_eq!(p.len(), 1);
/// assert_eq!(p[0].product_space, vec![2, 3]); // the output axis, then the contracted one
/// ```
pub fn projections(t: &Tensor) -> Result<Vec<Projections>> {
    let info = t.info();
    let Source::Op { op, .. } = &info.source else { return Ok(vec![]) };
    let step =
        info.step.ok_or_else(|| Error::usage(format!("'{}' has no shape step", info.label)))?;
    let g = t.graph.borrow();
    let mut symbols = SymbolGen::default();
    Ok(if op.per_argument_projections() {
        g.inf.derive_concat_projections(step, &mut symbols)?
    } else {
        vec![g.inf.derive_projections(step, &mut symbols)?]
    })
}

/// How a routine was compiled, in the compiler's terms: the time per phase, what the compile
/// cache did, the floating-point operations of one run (for tools that benchmark compiles).
///
/// ```
/// use rocannl_tensor::{Graph, Session, advanced};
/// let g = Graph::new();
/// let y = g.vector("x", &[1.0, 2.0]).exp();
/// let mut s = Session::new(&g).unwrap();
/// let r = s.forward(&[&y]).unwrap();
/// assert!(!advanced::compile_report(&r).phases.is_empty());
/// ```
pub fn compile_report(r: &Routine) -> &CompileReport {
    r.inner.report()
}

//! `rocannl-arrayjit`: the compiler half of rocannl.
//!
//! It takes whole sequences of n-dimensional array assignments — typically a complete training
//! step: forward pass, backpropagation and parameter update — and compiles them into a single
//! routine. Assignments carry [`indexing::Projections`] computed by shape inference; this crate
//! knows nothing about shapes, only about loops over product spaces and the cells they touch.
//!
//! The pipeline, top to bottom ([`compile_program`], then a backend):
//!
//! ```text
//! assignments::Asgn ──lower──► low_level::Program ──optimize──► backend.render / compile / run
//! ```
//!
//! - [`ops`]: precisions and the one table of per-operation facts;
//! - [`tnode`], [`ndarray`]: tensor nodes with memory requirements, host arrays;
//! - [`indexing`], [`assignments`]: the input IR;
//! - [`lower`], [`low_level`]: loop nests and the optimization passes;
//! - [`backend`]: `interp` (the oracle), `gccjit` (native), `cuda` (NVRTC + driver);
//! - [`context`]: buffers, routines, host transfers.

pub mod assignments;
pub mod backend;
pub mod cache;
pub mod context;
pub mod env;
pub mod error;
pub mod indexing;
pub mod kernels;
pub mod low_level;
pub mod lower;
pub mod math;
pub mod ndarray;
pub mod ops;
pub mod tnode;

pub use assignments::{Asgn, FetchOp, ScalarExpr};
pub use backend::{Backend, BackendKind, CompileOptions};
pub use cache::{CacheMode, CacheOutcome};
pub use context::{Context, Routine};
pub use error::Error;
pub use ndarray::NdArray;
pub use ops::{BinOp, Prec, TernOp, UnOp};
pub use tnode::{MemoryMode, NodeId, NodeTable, TensorNode};

use low_level::Program;
use low_level::optimize::{OptimizeOptions, optimize};

/// The backend-independent part of compilation: lowering, then the optimization pipeline
/// ([`Context`] runs the same phases, [`front_end`], and goes on to the backend).
pub fn compile_program(
    name: &str,
    asgn: &Asgn,
    nodes: &NodeTable,
    opts: &CompileOptions,
) -> Result<Program, Error> {
    front_end(name, asgn, nodes, opts).map(|(prog, _)| prog)
}

/// Seconds of the front end's phases, `lowering` and `optimization`, by name.
pub type FrontEndTimes = [(&'static str, f64); 2];

/// [`compile_program`] with the seconds of each of its two phases (`lowering`,
/// `optimization`), for compile reports.
pub fn front_end(
    name: &str,
    asgn: &Asgn,
    nodes: &NodeTable,
    opts: &CompileOptions,
) -> Result<(Program, FrontEndTimes), Error> {
    let started = std::time::Instant::now();
    // Loop nests from projections (zero-fill, guards, local accumulators).
    let mut prog = lower::lower(name, asgn, nodes)?;
    let lowered = std::time::Instant::now();
    // Virtualize, simplify, CSE, dead stores; verified between passes in debug builds.
    let opt = OptimizeOptions { virtualize: opts.virtualize, ..OptimizeOptions::default() };
    optimize(&mut prog, &opt)?;
    let phases = [
        ("lowering", (lowered - started).as_secs_f64()),
        ("optimization", lowered.elapsed().as_secs_f64()),
    ];
    Ok((prog, phases))
}

//! `rocannl-tensor`: differentiable tensors built on inferred shapes and compiled assignments.
//!
//! The pipeline, top-down:
//!
//! 1. Build a [`Graph`]: leaves ([`Graph::data`], [`Graph::param`], numbers, ranges) and
//!    operations on [`Tensor`] handles. Each operation ([`advanced::op::Op`]) adds its shape
//!    logic to inference right away; shapes are inferred, never declared.
//! 2. Create a [`Session`]: shape inference is finished (errors surface here), and the session
//!    turns operations into compiler assignments — forward code, gradient code from
//!    [`advanced::op::Op::backward`], and an optimizer's update ([`optim`]) — compiled into one
//!    [`Routine`] per task by `rocannl-arrayjit`.
//! 3. Run routines, write inputs and read values; train with [`train`]; save and load
//!    parameters and buffers with [`persist`]. Routines compute in a [`Mode`] (train or eval),
//!    and train-mode routines update the graph's [`buffer`]s (batch norm's running statistics).
//!
//! Nothing of this crate's API names a compiler type except [`advanced`], which is for tools
//! and for defining new operations: a model is built, run and trained with the types here (and
//! [`Prec`], [`BackendKind`], [`NdArray`] and the compile settings, re-exported below).

pub mod advanced;
mod axes;
pub mod buffer;
mod checks;
pub mod decay;
pub mod dynamic;
pub mod error;
pub mod graph;
pub mod init;
mod lints;
pub mod mode;
pub mod nn;
pub(crate) use advanced::op;
mod ops;
pub mod optim;
pub mod parallel;
pub mod persist;
mod routine;
pub mod session;
mod sizes;
pub mod train;

pub use axes::Axes;
pub use decay::DecayPolicy;
pub use dynamic::DynDim;
pub use error::{Error, Result};
pub use graph::Warnings;
pub use graph::{Graph, ParamSpec, Rows, Tensor, TensorId};
pub use init::Init;
pub use mode::Mode;
pub use ops::contract::Operands;
pub use optim::{Adam, AdamW, LossScale, Optimizer, Sgd, StepOptions, TrainStep};
/// Why compiling or running a routine failed ([`Error::Compile`]): a missing backend or
/// device, a routine over a limit, an index out of range.
pub use rocannl_arrayjit::Error as CompileError;
/// The settings inside [`CompileOptions`]: a routine's limits and which loops call the
/// library's vectorized math.
pub use rocannl_arrayjit::low_level::{
    estimate::{Limits, WorkLimit},
    schedule::MapCalls,
};
/// Compiler settings ([`SessionOptions::compile`]) and the compile cache's mode, re-exported so
/// that a session can be configured from this crate alone.
pub use rocannl_arrayjit::{BackendKind, CacheMode, CompileOptions, NdArray, Prec};
/// The three rows of a shape (batch, input, output), naming the row a [`Tensor::flatten`],
/// [`Tensor::unflatten`] or [`Graph::positions`] works in.
pub use rocannl_shape::row::Kind as RowKind;
pub use routine::Routine;
pub use session::{Plan, Session, SessionOptions};

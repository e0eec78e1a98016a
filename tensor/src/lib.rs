//! `rocannl-tensor`: differentiable tensors built on inferred shapes and compiled assignments.
//!
//! The pipeline, top-down:
//!
//! 1. Build a [`Graph`]: leaves ([`Graph::data`], [`Graph::param`], numbers, ranges) and
//!    operations on [`Tensor`] handles. Each operation ([`op::Op`]) adds its shape logic to
//!    inference right away; shapes are inferred, never declared.
//! 2. Create a [`Session`]: shape inference is finished (errors surface here), and the session
//!    turns operations into compiler assignments — forward code, gradient code from
//!    [`op::Op::backward`], and an optimizer's update ([`optim`]) — compiled into one routine
//!    per task by `rocannl-arrayjit`.
//! 3. Run routines, write inputs and read values; train with [`train`]; save and load
//!    parameters and buffers with [`persist`]. Routines compute in a [`Mode`] (train or eval),
//!    and train-mode routines update the graph's [`buffer`]s (batch norm's running statistics).

pub mod buffer;
mod checks;
pub mod decay;
pub mod dynamic;
pub mod error;
pub mod graph;
pub mod init;
pub mod mode;
pub mod nn;
pub mod op;
pub mod ops;
pub mod optim;
pub mod parallel;
pub mod persist;
pub mod session;
mod sizes;
pub mod train;

pub use decay::DecayPolicy;
pub use dynamic::DynDim;
pub use error::{Error, Result};
pub use graph::{Graph, ParamSpec, Rows, Tensor, TensorId};
pub use init::Init;
pub use mode::Mode;
pub use ops::reshape::View;
pub use optim::{LossScale, Optimizer, StepOptions, TrainStep};
/// Compiler settings ([`SessionOptions::compile`]) and the compile cache's mode, re-exported so
/// that a session can be configured from this crate alone.
pub use rocannl_arrayjit::{BackendKind, CacheMode, CompileOptions, Prec};
pub use rocannl_shape::RowDecl;
/// The three rows of a shape (batch, input, output), naming the row a [`Tensor::flatten`] or
/// [`Tensor::unflatten`] works in.
pub use rocannl_shape::row::Kind as RowKind;
pub use session::{Plan, Session, SessionOptions};

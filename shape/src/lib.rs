//! `rocannl-shape`: shape inference, the extended einsum notation and projection inference.
//!
//! A tensor shape is three rows of axes, `batch|input->output`. Shapes are never declared: each
//! operation contributes equations and inequalities between rows and dimensions (broadcasting
//! makes dimension 1 smaller than every dimension), the solver closes them in stages, and
//! projection inference turns the solved shapes into the indexing of every assignment.
//!
//! The pipeline, top-down (see [`inference::Inference`]):
//!
//! 1. [`inference::Inference::new_shape`] declares a shape; rows are given or inferred.
//! 2. [`inference::Inference::add_step`] — `propagate_shapes`: [`logic::get_inequalities`]
//!    derives the step's constraints and [`solve::Solver::solve`] simplifies them at stage 1
//!    ([`unify`], [`ineq`], [`row_constraint`]).
//! 3. [`inference::Inference::finish`] — `finish_inference`: a second pass over all steps in
//!    reverse order, then the closing stages 2–7 ([`stage`], [`close`]).
//! 4. [`inference::Inference::derive_projections`] — per step, fresh projection ids, a local
//!    re-solve and union-find ([`proj`]) give the `Projections` of its assignment.
//!
//! The einsum notation is parsed by [`spec::EinsumSpec::parse`].

pub mod close;
pub mod constraint;
mod conv_report;
pub mod dim;
pub mod env;
pub mod error;
pub mod ineq;
pub mod inference;
pub mod logic;
pub mod proj;
pub mod reshape;
pub mod row;
pub mod row_constraint;
pub mod solve;
pub mod spec;
pub mod stage;
pub mod unify;
pub mod var;

pub use error::ShapeError;
pub use inference::{Inference, RowDecl, ShapeDecl, Warning};
pub use logic::{Logic, Shape, SliceIndex, Terminal, TerminalData};
pub use spec::{EinsumSpec, SpecError};

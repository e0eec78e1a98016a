//! `rocannl-shape`: shape inference, the extended einsum notation and projection inference.
//!
//! A tensor shape is three rows of axes, `batch|input->output`. Shapes are never declared: each
//! operation contributes equations and inequalities between rows and dimensions (broadcasting
//! makes dimension 1 smaller than every dimension), the solver closes them in stages, and
//! projection inference turns the solved shapes into the indexing of every assignment.

//! `rocannl-arrayjit`: the compiler half of rocannl.
//!
//! It takes whole sequences of n-dimensional array assignments — typically a complete training
//! step: forward pass, backpropagation and parameter update — and compiles them into a single
//! routine. Assignments carry [`indexing::Projections`] computed by shape inference; this crate
//! knows nothing about shapes, only about loops over product spaces and the cells they touch.

pub mod indexing;

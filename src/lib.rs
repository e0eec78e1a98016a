//! rocannl: deep learning in Rust where shapes are inferred, never declared.
//!
//! This facade re-exports the three crates of the workspace:
//! - [`arrayjit`]: the assignments IR, lowering, optimization and backends;
//! - [`shape`]: shape inference, the extended einsum notation and projection inference;
//! - [`tensor`]: differentiable tensors, operations, optimizers and nn blocks;
//!
//! and [`datasets`], the small datasets of the examples.

pub mod datasets;

pub use rocannl_arrayjit as arrayjit;
pub use rocannl_shape as shape;
pub use rocannl_tensor as tensor;

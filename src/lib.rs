//! rocannl: deep learning in Rust where shapes are inferred, never declared.
//!
//! This facade re-exports the three crates of the workspace:
//! - [`tensor`]: differentiable tensors, operations, optimizers and nn blocks — the API a model
//!   is written in, which names no compiler type (its one exception is
//!   [`tensor::advanced`], for tools and new operations);
//! - [`shape`]: shape inference, the extended einsum notation and projection inference;
//! - [`arrayjit`]: the compiler itself (the assignments IR, lowering, optimization and
//!   backends), for tools such as the command line and the benchmarks; models, examples and
//!   the user guides never need it (`tests/public_api.rs` checks that they do not use it);
//!
//! and [`datasets`], the small datasets of the examples, and [`document`], the tensor-expression
//! JSON documents of the command line.
//!
//! A parameter's shape comes from how it is used; the whole training step compiles into one
//! routine:
//!
//! ```
//! use rocannl::tensor::nn::loss;
//! use rocannl::tensor::{Axes, Graph, Optimizer, ParamSpec, Session, Sgd};
//!
//! let g = Graph::with_seed(0);
//! let x = g.data("x", Axes::new().batch(&[4]).output(&[2])); // a batch of 4 points with 2 features
//! let y = g.data("y", Axes::new().batch(&[4]).output(&[1]));
//! let w = g.param("w", ParamSpec::default()); // both rows inferred
//! let b = g.param("b", ParamSpec::new(Axes::new().input(&[]).output(&[1])));
//! let loss = loss::mse(&(&w.matmul(&x) + &b), &y, loss::Reduction::Mean);
//!
//! let mut s = Session::new(&g)?; // shapes are inferred here
//! assert_eq!(w.shape_string(), "|2->1");
//! let mut step = s.train_step(&loss, &Optimizer::Sgd(Sgd::default()), &[], &Default::default())?;
//! s.write(&x, &[0.0, 0.0, 0.0, 1.0, 1.0, 0.0, 1.0, 1.0])?;
//! s.write(&y, &[1.0, 2.0, 3.0, 4.0])?; // y = 1 + 2·x0 + x1
//! for _ in 0..300 {
//!     s.step(&mut step, 0.1)?;
//! }
//! let w_learned = s.read(&w)?;
//! assert!((w_learned[0] - 2.0).abs() < 0.05 && (w_learned[1] - 1.0).abs() < 0.05);
//! # Ok::<(), rocannl::tensor::Error>(())
//! ```

pub mod datasets;
pub mod document;

pub use rocannl_arrayjit as arrayjit;
pub use rocannl_shape as shape;
pub use rocannl_tensor as tensor;

/// The snippets of `docs/porting.md`, compiled and run as doctests so that the guide stays
/// true.
#[cfg(doctest)]
#[doc = include_str!("../docs/porting.md")]
pub struct PortingGuide;

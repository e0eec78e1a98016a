//! A compiled routine as a user holds it: made by a [`Session`](crate::Session) (`forward`,
//! `forward_in`, `backprop`, `compile`), run by the same session, inspected as text.
//!
//! The compiler's own routine type carries the compiler's vocabulary (the node ids of its
//! buffers, the runtime symbols it expects bound); a session binds those itself — dynamic sizes
//! from [`Session::set_size`](crate::Session::set_size), the graph's step counter, a loader's
//! batch — so this handle keeps them private and shows only what a user reads: the name, the
//! generated code and how long compiling took.

/// A compiled routine of a [`Session`](crate::Session): run it with
/// [`Session::run`](crate::Session::run).
///
/// ```
/// use rocannl_tensor::{Graph, Session};
/// let g = Graph::new();
/// let x = g.vector("x", &[1.0, -2.0]);
/// let y = x.relu();
/// let mut s = Session::new(&g).unwrap();
/// let r = s.forward(&[&y]).unwrap();
/// assert_eq!(r.name(), "forward");
/// assert!(!r.code().is_empty()); // the optimized loops, as text
/// s.run(&r).unwrap();
/// assert_eq!(s.read(&y).unwrap(), vec![1.0, 0.0]);
/// ```
#[derive(Clone, Debug)]
pub struct Routine {
    pub(crate) inner: rocannl_arrayjit::Routine,
}

impl Routine {
    pub(crate) fn new(inner: rocannl_arrayjit::Routine) -> Routine {
        Routine { inner }
    }

    /// The routine's name (`forward`, `backprop`, `train_step`, or the name given to
    /// [`Session::compile`](crate::Session::compile)).
    pub fn name(&self) -> &str {
        self.inner.name()
    }

    /// The routine's optimized loops, in the compiler's stable text form (for reading what a
    /// model computes and how; the format is documented in docs/lowering.md).
    pub fn code(&self) -> &str {
        self.inner.low_level_text()
    }

    /// The source the backend compiled: C for the native backend, CUDA C for CUDA, the loops
    /// again for the interpreter.
    pub fn source(&self) -> &str {
        self.inner.source_text()
    }

    /// Seconds spent per compile phase, in order (`lowering`, `optimization`, then the
    /// backend's own).
    pub fn compile_phases(&self) -> &[(&'static str, f64)] {
        &self.inner.report().phases
    }

    /// Floating-point operations of one run.
    pub fn flops(&self) -> u64 {
        self.inner.report().flops
    }
}

//! A compiled routine as a user holds it: made by a [`Session`](crate::Session) (`forward`,
//! `forward_in`, `backprop`, `compile`), run by the same session, inspected as text.
//!
//! The compiler's own routine type carries the compiler's vocabulary (the node ids of its
//! buffers, the runtime symbols it expects bound); a session binds those itself — dynamic sizes
//! from [`Session::set_size`](crate::Session::set_size), the graph's step counter, a loader's
//! batch — so this handle keeps them private and shows only what a user reads: the name, the
//! generated code and how long compiling took.

use rocannl_arrayjit::indexing::Symbol;

use crate::error::Result;
use crate::session::Session;

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

impl Session {
    /// Runs a routine. The session binds what the routine leaves open: each dynamic size to
    /// its current value ([`Session::set_size`]), a [`crate::train::Loader`]'s batch to the one
    /// last chosen with [`crate::train::Loader::set_batch`], and the graph's step counter (which
    /// salts dropout's masks) to a fresh number on every run of a routine that reads it.
    pub fn run(&mut self, r: &Routine) -> Result<()> {
        self.run_compiled(&r.inner, None)
    }

    /// Runs a compiler routine with everything bound ([`Session::run`]); `step` is the step
    /// counter's value, a fresh one when `None`.
    pub(crate) fn run_compiled(
        &mut self,
        r: &rocannl_arrayjit::Routine,
        step: Option<i64>,
    ) -> Result<()> {
        self.check_written(r)?;
        let mut all: Vec<(Symbol, i64)> = self.bound.iter().map(|(s, v)| (*s, *v)).collect();
        if let Some(sym) = self.graph().existing_step_symbol()
            && r.runtime_symbols().contains(&sym)
        {
            let n = step.unwrap_or_else(|| {
                self.runs += 1;
                self.runs as i64
            });
            all.push((sym, n));
        }
        let all = self.with_sizes(&all);
        self.ctx.run(r, &all)?;
        Ok(())
    }
}

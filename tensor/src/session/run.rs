//! Running routines: binding what a compiled routine leaves open (dynamic sizes, a loader's
//! batch, the step counter) and compiling a forward pass in a chosen mode.

use rocannl_arrayjit::indexing::Symbol;

use crate::error::Result;
use crate::graph::Tensor;
use crate::mode::Mode;
use crate::routine::Routine;

use super::{Plan, Session};

impl Session {
    /// Compiles the forward pass computing `outputs` in `mode`. In [`Mode::Train`] it computes
    /// what a training step's forward pass computes (dropout's masks, batch statistics) and
    /// updates the buffers as a training step does.
    ///
    /// ```
    /// use rocannl_tensor::{Graph, Mode, Session, nn};
    /// let g = Graph::new();
    /// let x = g.vector("x", &[1.0; 1000]);
    /// let y = nn::dropout(&x, 0.5);
    /// let mut s = Session::new(&g).unwrap();
    /// let eval = s.forward(&[&y]).unwrap();
    /// s.run(&eval).unwrap();
    /// assert!(s.read(&y).unwrap().iter().all(|v| *v == 1.0)); // the identity
    /// let train = s.forward_in(Mode::Train, &[&y]).unwrap();
    /// s.run(&train).unwrap(); // a fresh mask on every run
    /// let kept = s.read(&y).unwrap().iter().filter(|v| **v == 2.0).count();
    /// assert!(400 < kept && kept < 600, "{kept}"); // the others are 0
    /// ```
    pub fn forward_in(&mut self, mode: Mode, outputs: &[&Tensor]) -> Result<Routine> {
        let outputs = outputs.iter().map(|t| (*t).clone()).collect();
        self.compile("forward", &Plan { outputs, mode, ..Plan::default() })
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

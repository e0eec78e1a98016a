//! Which params the optimizer's weight decay applies to.
//!
//! Frameworks disagree on the rule, and a script ported from one of them needs that rule back:
//! PyTorch's AdamW decays whatever it is handed, and the parameter groups of nanoGPT decay every
//! param with two or more axes (weight matrices and both embedding tables) and no vector (biases,
//! norm gains). One place decides, in this order:
//!
//! 1. a decision for one param made after construction ([`Graph::set_decay`]);
//! 2. the graph's [`DecayPolicy`] ([`Graph::set_decay_policy`]): by default each param's own flag,
//!    set when it was built ([`crate::ParamSpec::weight_decay`], or the `*_decay` fields of the
//!    [`crate::nn`] configs).

use crate::error::{Error, Result};
use crate::graph::{Graph, Tensor};

pub use crate::graph::DecayPolicy;

impl Graph {
    /// Sets the rule for the params without a decision of their own ([`Graph::set_decay`]).
    /// It is read when a training step is compiled ([`crate::Session::train_step`]).
    pub fn set_decay_policy(&self, policy: DecayPolicy) {
        self.borrow_mut().decay_policy = policy;
    }

    /// The rule set by [`Graph::set_decay_policy`] ([`DecayPolicy::PerParam`] by default).
    pub fn decay_policy(&self) -> DecayPolicy {
        self.borrow().decay_policy
    }

    /// Decides whether the optimizer's weight decay applies to `param`, whatever the policy and
    /// its construction said. A tensor that is not a param of this graph is a usage error naming
    /// it, returned by [`Graph::finish`].
    ///
    /// ```
    /// use rocannl_tensor::{Axes, Graph, nn::{Linear, LinearConfig}};
    /// let g = Graph::new();
    /// let fc = Linear::new(&g, "fc", LinearConfig::new(2));
    /// let b = fc.b.clone().unwrap();
    /// g.set_decay(&b, true); // decay the bias too
    /// g.set_decay(&fc.w, false); // and not the weight
    /// let _ = fc.apply(&g.data("x", Axes::new().batch(&[4]).output(&[3])));
    /// g.finish().unwrap();
    /// assert!(g.decays(&b).unwrap() && !g.decays(&fc.w).unwrap());
    /// ```
    pub fn set_decay(&self, param: &Tensor, decays: bool) {
        if !param.graph().same(self) || !param.is_param() {
            self.record(not_a_param("set_decay", param));
            return;
        }
        self.borrow_mut().decay_set.insert(param.id(), decays);
    }

    /// Whether the optimizer's weight decay applies to `param`: its own decision
    /// ([`Graph::set_decay`]), else the [`DecayPolicy`]. Under
    /// [`DecayPolicy::AllMatricesAndTables`] it needs the param's shape: before
    /// [`Graph::finish`] that is an error naming the param, as is a tensor that is not a param
    /// of this graph.
    pub fn decays(&self, param: &Tensor) -> Result<bool> {
        if !param.graph().same(self) || !param.is_param() {
            return Err(not_a_param("decays", param));
        }
        let (set, policy, flag) = {
            let g = self.borrow();
            (
                g.decay_set.get(&param.id()).copied(),
                g.decay_policy,
                !g.no_decay.contains(&param.id()),
            )
        };
        match (set, policy) {
            (Some(d), _) => Ok(d),
            (None, DecayPolicy::PerParam) => Ok(flag),
            (None, DecayPolicy::AllMatricesAndTables) => Ok(param.dims()?.len() >= 2),
        }
    }
}

/// The usage error of asking `what` about a tensor that is not a param of the graph asked.
fn not_a_param(what: &str, t: &Tensor) -> Error {
    Error::usage(format!(
        "{what} of '{}': it is not a param of this graph; only params are updated by the optimizer",
        t.label()
    ))
}

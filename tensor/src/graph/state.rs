//! The state that features built on the graph keep in it: the updates of buffers
//! ([`crate::buffer`]), the weight-decay rule ([`crate::decay`]) and the warning policy
//! ([`crate::Graph::set_warnings`]). Their types live here, below the graph, so that the graph
//! stores them without importing the modules that act on them (which import the graph).

use rustc_hash::FxHashSet;

use super::TensorId;

/// An update recorded by [`crate::Tensor::update_with`]: `buffer := value` at the end of train-mode
/// routines.
#[derive(Clone, Debug)]
pub(crate) struct Update {
    /// The buffer written.
    pub buffer: TensorId,
    /// Its new value.
    pub value: TensorId,
}

/// The rule that picks the params the optimizer's weight decay applies to.
///
/// ```
/// use rocannl_tensor::{Axes, DecayPolicy, Graph, nn::{Linear, LinearConfig}};
/// use rocannl_tensor::nn::embed::{Embedding, EmbeddingConfig};
/// let g = Graph::new();
/// let emb = Embedding::new(&g, "wte", EmbeddingConfig::new(10, 4));
/// let fc = Linear::new(&g, "fc", LinearConfig::new(3));
/// let _ = fc.apply(&emb.apply(&g.data("ids", Axes::new().batch(&[2]))));
/// g.finish().unwrap();
/// // By default, each param's flag: tables and biases are exempt.
/// assert!(!g.decays(&emb.table).unwrap() && g.decays(&fc.w).unwrap());
/// // nanoGPT's rule: every param with at least two axes, tables included; no vector.
/// g.set_decay_policy(DecayPolicy::AllMatricesAndTables);
/// assert!(g.decays(&emb.table).unwrap() && g.decays(&fc.w).unwrap());
/// assert!(!g.decays(fc.b.as_ref().unwrap()).unwrap());
/// // One param's decision, after construction, wins over the policy.
/// g.set_decay(&emb.table, false);
/// assert!(!g.decays(&emb.table).unwrap());
/// ```
#[derive(Copy, Clone, Debug, Default, PartialEq, Eq)]
pub enum DecayPolicy {
    /// Each param's own flag, set when it was built ([`crate::ParamSpec::weight_decay`]; the
    /// [`crate::nn`] blocks exempt biases, norm gains and embedding tables by default).
    #[default]
    PerParam,
    /// Every param with two or more axes decays (weight matrices, attention projections,
    /// convolution kernels, embedding and position tables), every other one does not (biases,
    /// norm gains, scalars): nanoGPT's `p.dim() >= 2` rule. The axes are counted once shapes
    /// are inferred, over the batch, input and output rows together.
    AllMatricesAndTables,
}

/// What [`crate::Graph::finish`] does with the graph's [`crate::Graph::warnings`] (set by
/// [`crate::Graph::set_warnings`]).
///
/// ```
/// use rocannl_tensor::{Axes, Graph, ParamSpec, Warnings};
/// let g = Graph::new();
/// g.set_warnings(Warnings::Deny);
/// let x = g.data("x", Axes::new().batch(&[2, 5]).output(&[3]));
/// // A position table declared like a token table: an input axis of 5 the data lacks.
/// let pos = g.param("pos", ParamSpec::new(Axes::new().input(&[5]).output(&[3])));
/// let _y = &x + &pos;
/// let e = g.finish().unwrap_err().to_string();
/// assert!(e.contains("'pos'"), "{e}");
/// ```
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Warnings {
    /// Print each warning to standard error the first time `finish` meets it (the default).
    #[default]
    Print,
    /// Print nothing: [`crate::Graph::warnings`] returns them.
    Collect,
    /// `finish` fails with [`crate::Error::Warnings`] while there is any.
    Deny,
}

/// A graph's warning policy and the warnings already printed.
#[derive(Debug, Default)]
pub(crate) struct WarningState {
    pub policy: Warnings,
    pub printed: FxHashSet<String>,
}

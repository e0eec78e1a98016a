//! Linear layers and multi-layer perceptrons.
//!
//! One layer type, [`Linear`], covers PyTorch's `nn.Linear` with and without bias (and flax's
//! `Dense`): the bias is a switch of its [`LinearConfig`], as are the inits and the weight-decay
//! flags of both params. The weight's input axes are inferred from the first input (all of the
//! input's output axes contract); its output width is given, or inferred from use (a residual
//! connection fixes it).

use crate::Axes;
use crate::graph::{Graph, ParamSpec, Tensor};
use crate::init::Init;

use super::Activation;
use super::config::setters;

/// The options of a [`Linear`] layer; `LinearConfig::new(out)` has PyTorch's defaults (a bias,
/// weights uniform on `±1/√fan_in`) except that the bias starts at 0.
#[derive(Clone, Debug, PartialEq)]
pub struct LinearConfig {
    /// The output width; `None` (the default): inferred from use.
    pub out: Option<usize>,
    /// Whether the layer adds a bias `b` (default: yes).
    pub bias: bool,
    /// The weights' init (default: [`Init::FanInUniform`]).
    pub w_init: Init,
    /// The bias' init (default: 0).
    pub b_init: Init,
    /// Whether the weights decay (default: yes), under [`crate::DecayPolicy::PerParam`].
    pub w_decay: bool,
    /// Whether the bias decays (default: no).
    pub b_decay: bool,
}

impl Default for LinearConfig {
    /// A layer with a bias whose output width is inferred from use.
    fn default() -> LinearConfig {
        LinearConfig {
            out: None,
            bias: true,
            w_init: Init::FanInUniform,
            b_init: Init::Constant(0.0),
            w_decay: true,
            b_decay: false,
        }
    }
}

impl LinearConfig {
    /// A layer with `out` output features and the defaults.
    pub fn new(out: usize) -> LinearConfig {
        LinearConfig { out: Some(out), ..LinearConfig::default() }
    }
}

setters!(LinearConfig {
    with_out => out: Option<usize>,
    with_bias => bias: bool,
    with_w_init => w_init: Init,
    with_b_init => b_init: Init,
    with_w_decay => w_decay: bool,
    with_b_decay => b_decay: bool,
});

/// A linear layer `w * x + b` (or `w * x` without bias); applying it again reuses the same
/// params.
///
/// ```
/// use rocannl_tensor::{Axes, Graph, Init, nn::{Linear, LinearConfig, Module}};
/// let g = Graph::new();
/// let x = g.data("x", Axes::new().batch(&[8]).output(&[5]));
/// let fc = Linear::new(&g, "fc", LinearConfig::new(3)); // PyTorch's nn.Linear(5, 3)
/// let proj = Linear::new(
///     &g,
///     "proj",
///     LinearConfig::new(3).with_bias(false).with_w_init(Init::Normal { mean: 0.0, std: 0.02 }),
/// );
/// let (y, z) = (fc.apply(&x), proj.apply(&x));
/// g.finish().unwrap();
/// assert_eq!((y.dims().unwrap(), z.dims().unwrap()), (vec![8, 3], vec![8, 3]));
/// let names = |m: &Linear| m.params().iter().map(|p| p.label()).collect::<Vec<_>>();
/// assert_eq!(names(&fc), ["fc.w", "fc.b"]);
/// assert_eq!(names(&proj), ["proj.w"]);
/// assert_eq!(proj.w.rows().unwrap().input, vec![5]);
/// ```
#[derive(Clone, Debug)]
pub struct Linear {
    /// The weights, `input -> out`.
    pub w: Tensor,
    /// The bias (`None` when the config turned it off).
    pub b: Option<Tensor>,
}

impl Linear {
    /// A layer named `name` (params `name.w`, `name.b`).
    #[track_caller]
    pub fn new(g: &Graph, name: &str, cfg: LinearConfig) -> Linear {
        let (w_spec, b_spec) = match cfg.out {
            Some(out) => (
                ParamSpec::new(Axes::new().output(&[out])),
                ParamSpec::new(Axes::new().input(&[]).output(&[out])),
            ),
            None => (ParamSpec::default(), ParamSpec::new(Axes::new().input(&[]))),
        };
        let w = g.param(
            &format!("{name}.w"),
            ParamSpec { weight_decay: cfg.w_decay, ..w_spec.init(cfg.w_init) },
        );
        // Made here, not in a closure, so that a duplicate name is reported at the caller's line.
        let b = if cfg.bias {
            let spec = ParamSpec { weight_decay: cfg.b_decay, ..b_spec.init(cfg.b_init) };
            Some(g.param(&format!("{name}.b"), spec))
        } else {
            None
        };
        Linear { w, b }
    }

    /// `w * x + b`.
    #[track_caller]
    pub fn apply(&self, x: &Tensor) -> Tensor {
        let _within = x.graph().within("Linear::apply");
        let y = self.w.matmul(x);
        let y = match &self.b {
            Some(b) => &y + b,
            None => y,
        };
        y.named(&layer_name(&self.w))
    }
}

/// A layer's name, from its weight's label (`mlp.1.w` → `mlp.1`): layers name their outputs
/// after themselves, so that messages about an output say which layer it is.
fn layer_name(w: &Tensor) -> String {
    let label = w.label();
    label.strip_suffix(".w").unwrap_or(&label).to_string()
}

/// The options of an [`Mlp`]: its widths, its activation and the options of every layer.
#[derive(Clone, Debug, PartialEq)]
pub struct MlpConfig {
    /// The layers' output widths, first to last.
    pub widths: Vec<usize>,
    /// The activation between layers (none after the last; default: ReLU).
    pub act: Activation,
    /// The options of every layer (bias, inits, decay); its `out` is ignored: each layer's
    /// width comes from `widths`.
    pub layer: LinearConfig,
}

impl MlpConfig {
    /// Layers of these widths with ReLU between them and [`LinearConfig`]'s defaults.
    pub fn new(widths: &[usize]) -> MlpConfig {
        MlpConfig { widths: widths.to_vec(), act: Activation::Relu, layer: LinearConfig::default() }
    }
}

setters!(MlpConfig {
    with_widths => widths: Vec<usize>,
    with_act => act: Activation,
    with_layer => layer: LinearConfig,
});

/// A multi-layer perceptron: linear layers `name.0`, `name.1`, … of the given widths with an
/// activation between them (none after the last).
///
/// ```
/// use rocannl_tensor::{Axes, Graph};
/// use rocannl_tensor::nn::{Activation, LinearConfig, Mlp, MlpConfig};
/// let g = Graph::new();
/// let x = g.data("x", Axes::new().batch(&[32]).output(&[2]));
/// let cfg = MlpConfig::new(&[16, 16, 1])
///     .with_act(Activation::Tanh)
///     .with_layer(LinearConfig::default().with_bias(false));
/// let mlp = Mlp::new(&g, "mlp", cfg);
/// let y = mlp.apply(&x);
/// g.finish().unwrap();
/// assert_eq!(y.dims().unwrap(), vec![32, 1]);
/// assert_eq!(g.params().len(), 3); // no biases
/// ```
#[derive(Clone, Debug)]
pub struct Mlp {
    /// The layers.
    pub layers: Vec<Linear>,
    /// The activation between layers.
    pub act: Activation,
}

impl Mlp {
    /// An MLP named `name`.
    #[track_caller]
    pub fn new(g: &Graph, name: &str, cfg: MlpConfig) -> Mlp {
        let mut layers = Vec::with_capacity(cfg.widths.len());
        for (i, w) in cfg.widths.iter().enumerate() {
            let layer = cfg.layer.clone().with_out(Some(*w));
            layers.push(Linear::new(g, &format!("{name}.{i}"), layer));
        }
        Mlp { layers, act: cfg.act }
    }

    /// The network applied to `x`.
    #[track_caller]
    pub fn apply(&self, x: &Tensor) -> Tensor {
        let _within = x.graph().within("Mlp::apply");
        let mut h = x.clone();
        for (i, l) in self.layers.iter().enumerate() {
            h = l.apply(&h);
            if i + 1 < self.layers.len() {
                h = self.act.apply(&h);
            }
        }
        h
    }
}

//! Layer normalization over the output (feature) axes.
//!
//! Mean and variance reduce the output row into one position that broadcasts back; the gain and
//! bias parameters take their shape from use (the features), so nothing needs the width. Their
//! presence (`bias`, `elementwise_affine`), inits and decay are options of the configs.

use crate::Axes;
use crate::graph::{Graph, ParamSpec, Tensor};
use crate::init::Init;

use super::OUTPUT_AXES;
use super::config::setters;

/// Records a usage error naming the layer when `eps` is negative, infinite or NaN.
fn check_eps(g: &Graph, name: &str, eps: f64) {
    if !(eps >= 0.0 && eps.is_finite()) {
        g.record(crate::Error::usage(format!(
            "normalization '{name}': eps = {eps} must be a finite number, at least 0"
        )));
    }
}

/// The options of a [`LayerNorm`] (PyTorch's defaults: `eps = 1e-5`, a gain and a bias).
#[derive(Clone, Debug, PartialEq)]
pub struct LayerNormConfig {
    /// Added to the variance (default: 1e-5); finite and at least 0.
    pub eps: f64,
    /// Whether the norm has learned params, a gain and (when `bias`) a bias (default: yes).
    pub elementwise_affine: bool,
    /// Whether the norm adds a bias after the gain (default: yes; needs `elementwise_affine`).
    pub bias: bool,
    /// The gain's init (default: 1).
    pub gain_init: Init,
    /// The bias' init (default: 0).
    pub bias_init: Init,
    /// Whether the gain decays under [`crate::DecayPolicy::PerParam`] (default: no).
    pub gain_decay: bool,
    /// Whether the bias decays (default: no).
    pub bias_decay: bool,
}

impl Default for LayerNormConfig {
    fn default() -> LayerNormConfig {
        LayerNormConfig {
            eps: 1e-5,
            elementwise_affine: true,
            bias: true,
            gain_init: Init::Constant(1.0),
            bias_init: Init::Constant(0.0),
            gain_decay: false,
            bias_decay: false,
        }
    }
}

setters!(LayerNormConfig {
    with_eps => eps: f64,
    with_elementwise_affine => elementwise_affine: bool,
    with_bias => bias: bool,
    with_gain_init => gain_init: Init,
    with_bias_init => bias_init: Init,
    with_gain_decay => gain_decay: bool,
    with_bias_decay => bias_decay: bool,
});

/// Layer normalization: `(x - mean) / sqrt(var + eps) * gain + bias` over `x`'s output axes.
/// The gain and bias take the features' shape from the first input; without bias the result is
/// `… * gain`, without `elementwise_affine` the bare normalization.
///
/// ```
/// use rocannl_tensor::{Axes, Graph, Session, nn::norm::{LayerNorm, LayerNormConfig}};
/// let g = Graph::new();
/// let x = g.ndarray("x", Axes::new().batch(&[1]).output(&[4]), &[1.0, 2.0, 3.0, 4.0]);
/// let ln = LayerNorm::new(&g, "ln", LayerNormConfig::default());
/// let bare = LayerNormConfig::default().with_elementwise_affine(false);
/// let bare = LayerNorm::new(&g, "bare", bare);
/// let (y, z) = (ln.apply(&x), bare.apply(&x));
/// let mut s = Session::new(&g).unwrap();
/// let r = s.forward(&[&y, &z]).unwrap();
/// s.run(&r).unwrap();
/// let v = s.read(&y).unwrap();
/// assert!(v.iter().sum::<f64>().abs() < 1e-5 && (v[3] - 1.3416).abs() < 1e-3);
/// assert!(bare.gain.is_none() && bare.bias.is_none());
/// ```
#[derive(Clone, Debug)]
pub struct LayerNorm {
    /// One gain per feature (`None` without `elementwise_affine`).
    pub gain: Option<Tensor>,
    /// One bias per feature (`None` without `bias` or `elementwise_affine`).
    pub bias: Option<Tensor>,
    /// Added to the variance.
    pub eps: f64,
}

impl LayerNorm {
    /// A layer norm named `name` (params `name.gain`, `name.bias`); `eps` is finite and at
    /// least 0 (else a usage error naming the layer, returned by [`Graph::finish`]).
    #[track_caller]
    pub fn new(g: &Graph, name: &str, cfg: LayerNormConfig) -> LayerNorm {
        check_eps(g, name, cfg.eps);
        let (affine, eps) = (cfg.elementwise_affine, cfg.eps);
        // One gain and one bias per normalized (output) position; no input axes. Each made
        // here, not in a closure, so that a duplicate name is reported at the caller's line.
        let gain = if affine {
            Some(g.param(&format!("{name}.gain"), vector(cfg.gain_init, cfg.gain_decay)))
        } else {
            None
        };
        let bias = if affine && cfg.bias {
            Some(g.param(&format!("{name}.bias"), vector(cfg.bias_init, cfg.bias_decay)))
        } else {
            None
        };
        LayerNorm { gain, bias, eps }
    }

    /// The normalization of `x`.
    #[track_caller]
    pub fn apply(&self, x: &Tensor) -> Tensor {
        let _within = x.graph().within("LayerNorm::apply");
        // The statistics in f32 in a half-precision session: squares of activations past 256
        // overflow f16.
        let centered = (x - &x.mean(OUTPUT_AXES).kept_in_f32()).kept_in_f32();
        let var = centered.pointmul(&centered).kept_in_f32().mean(OUTPUT_AXES).kept_in_f32();
        let std = (&var + self.eps).kept_in_f32().sqrt().kept_in_f32();
        let normed = &centered / &std;
        affine(normed, self.gain.as_ref(), self.bias.as_ref())
    }
}

/// A per-feature param (no input axes, the output axes inferred from use).
fn vector(init: Init, decays: bool) -> ParamSpec {
    ParamSpec { weight_decay: decays, ..ParamSpec::new(Axes::new().input(&[])).init(init) }
}

/// `normed * gain + bias`, each part when present.
fn affine(normed: Tensor, gain: Option<&Tensor>, bias: Option<&Tensor>) -> Tensor {
    let scaled = match gain {
        Some(gain) => normed.pointmul(gain),
        None => normed,
    };
    match bias {
        Some(bias) => &scaled + bias,
        None => scaled,
    }
}

/// The options of an [`RmsNorm`].
#[derive(Clone, Debug, PartialEq)]
pub struct RmsNormConfig {
    /// Added to the mean square (default: 1e-6); finite and at least 0.
    pub eps: f64,
    /// Whether the norm has a learned gain (default: yes).
    pub elementwise_affine: bool,
    /// The gain's init (default: 1).
    pub gain_init: Init,
    /// Whether the gain decays under [`crate::DecayPolicy::PerParam`] (default: no).
    pub gain_decay: bool,
}

impl Default for RmsNormConfig {
    fn default() -> RmsNormConfig {
        RmsNormConfig {
            eps: 1e-6,
            elementwise_affine: true,
            gain_init: Init::Constant(1.0),
            gain_decay: false,
        }
    }
}

setters!(RmsNormConfig {
    with_eps => eps: f64,
    with_elementwise_affine => elementwise_affine: bool,
    with_gain_init => gain_init: Init,
    with_gain_decay => gain_decay: bool,
});

/// RMS normalization: `x / sqrt(mean(x²) + eps) * gain` over the output axes (no centering,
/// no bias).
///
/// ```
/// use rocannl_tensor::{Axes, Graph, Session, nn::norm::{RmsNorm, RmsNormConfig}};
/// let g = Graph::new();
/// let x = g.ndarray("x", Axes::new().batch(&[1]).output(&[2]), &[3.0, 4.0]);
/// let y = RmsNorm::new(&g, "rms", RmsNormConfig::default().with_eps(0.0)).apply(&x);
/// let mut s = Session::new(&g).unwrap();
/// let r = s.forward(&[&y]).unwrap();
/// s.run(&r).unwrap();
/// let v = s.read(&y).unwrap(); // rms of (3, 4) is √12.5
/// assert!((v[0] - 3.0 / 12.5f64.sqrt()).abs() < 1e-6);
/// ```
#[derive(Clone, Debug)]
pub struct RmsNorm {
    /// One gain per feature (`None` without `elementwise_affine`).
    pub gain: Option<Tensor>,
    /// Added to the mean square.
    pub eps: f64,
}

impl RmsNorm {
    /// An RMS norm named `name` (param `name.gain`); `eps` as for [`LayerNorm::new`].
    #[track_caller]
    pub fn new(g: &Graph, name: &str, cfg: RmsNormConfig) -> RmsNorm {
        check_eps(g, name, cfg.eps);
        let gain = if cfg.elementwise_affine {
            Some(g.param(&format!("{name}.gain"), vector(cfg.gain_init, cfg.gain_decay)))
        } else {
            None
        };
        RmsNorm { gain, eps: cfg.eps }
    }

    /// The normalization of `x`.
    #[track_caller]
    pub fn apply(&self, x: &Tensor) -> Tensor {
        let _within = x.graph().within("RmsNorm::apply");
        // The statistics in f32 in a half-precision session (see `LayerNorm::apply`).
        let ms = x.pointmul(x).kept_in_f32().mean(OUTPUT_AXES).kept_in_f32();
        let rms = (&ms + self.eps).kept_in_f32().sqrt().kept_in_f32();
        affine(x / &rms, self.gain.as_ref(), None)
    }
}

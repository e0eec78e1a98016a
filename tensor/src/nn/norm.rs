//! Layer normalization over the output (feature) axes.
//!
//! Mean and variance reduce the output row into one position that broadcasts back; the gain and
//! bias parameters take their shape from use (the features), so nothing needs the width.

use crate::graph::{Graph, ParamSpec, Tensor};
use crate::init::Init;

use super::OUTPUT_AXES;

/// Records a usage error naming the layer when `eps` is negative, infinite or NaN.
fn check_eps(g: &Graph, name: &str, eps: f64) {
    if !(eps >= 0.0 && eps.is_finite()) {
        g.record(crate::Error::usage(format!(
            "normalization '{name}': eps = {eps} must be a finite number, at least 0"
        )));
    }
}

/// `(x - mean) / sqrt(var + eps) * gain + bias` over `x`'s output axes.
///
/// ```
/// use rocannl_tensor::{Graph, Session, nn};
/// let g = Graph::new();
/// let x = g.ndarray("x", &[1], &[], &[4], &[1.0, 2.0, 3.0, 4.0]);
/// let y = nn::norm::layer_norm(&g, "ln", &x, 1e-5);
/// let mut s = Session::new(&g).unwrap();
/// let r = s.forward(&[&y]).unwrap();
/// s.run(&r).unwrap();
/// let v = s.read(&y).unwrap();
/// assert!(v.iter().sum::<f64>().abs() < 1e-5 && (v[3] - 1.3416).abs() < 1e-3);
/// ```
#[track_caller]
pub fn layer_norm(g: &Graph, name: &str, x: &Tensor, eps: f64) -> Tensor {
    let _within = x.graph().within("nn::layer_norm");
    LayerNorm::new(g, name, eps).apply(x)
}

/// Layer normalization with its gain and bias: `(x - mean) / sqrt(var + eps) * gain + bias`
/// over the output axes. The gain and bias take the features' shape from the first input.
#[derive(Clone, Debug)]
pub struct LayerNorm {
    /// One gain per feature (initially 1).
    pub gain: Tensor,
    /// One bias per feature (initially 0).
    pub bias: Tensor,
    /// Added to the variance.
    pub eps: f64,
}

impl LayerNorm {
    /// A layer norm named `name` (params `name.gain`, `name.bias`, exempt from weight decay);
    /// `eps` is finite and at least 0 (else a usage error, returned by [`Graph::finish`]).
    #[track_caller]
    pub fn new(g: &Graph, name: &str, eps: f64) -> LayerNorm {
        // One gain and one bias per normalized (output) position; no input axes.
        check_eps(g, name, eps);
        let vector = || ParamSpec::default().with_input(&[]).no_decay();
        let gain = g.param_with(&format!("{name}.gain"), vector().init(Init::Constant(1.0)));
        let bias = g.param_with(&format!("{name}.bias"), vector().init(Init::Constant(0.0)));
        LayerNorm { gain, bias, eps }
    }

    /// The normalization of `x`.
    #[track_caller]
    pub fn apply(&self, x: &Tensor) -> Tensor {
        let _within = x.graph().within("LayerNorm::apply");
        // The statistics in f32 in a half-precision session: squares of activations past 256
        // overflow f16.
        let centered = (x - &x.mean1(OUTPUT_AXES).kept_in_f32()).kept_in_f32();
        let var = centered.pointmul(&centered).kept_in_f32().mean1(OUTPUT_AXES).kept_in_f32();
        let std = (&var + self.eps).kept_in_f32().sqrt().kept_in_f32();
        let normed = &centered / &std;
        &normed.pointmul(&self.gain) + &self.bias
    }
}

/// RMS normalization: `x / sqrt(mean(x²) + eps) * gain` over the output axes (no centering,
/// no bias).
///
/// ```
/// use rocannl_tensor::{Graph, Session, nn::norm::RmsNorm};
/// let g = Graph::new();
/// let x = g.ndarray("x", &[1], &[], &[2], &[3.0, 4.0]);
/// let y = RmsNorm::new(&g, "rms", 0.0).apply(&x);
/// let mut s = Session::new(&g).unwrap();
/// let r = s.forward(&[&y]).unwrap();
/// s.run(&r).unwrap();
/// let v = s.read(&y).unwrap(); // rms of (3, 4) is √12.5
/// assert!((v[0] - 3.0 / 12.5f64.sqrt()).abs() < 1e-6);
/// ```
#[derive(Clone, Debug)]
pub struct RmsNorm {
    /// One gain per feature (initially 1).
    pub gain: Tensor,
    /// Added to the mean square.
    pub eps: f64,
}

impl RmsNorm {
    /// An RMS norm named `name` (param `name.gain`, exempt from weight decay); `eps` as for
    /// [`LayerNorm::new`].
    #[track_caller]
    pub fn new(g: &Graph, name: &str, eps: f64) -> RmsNorm {
        check_eps(g, name, eps);
        let gain = g.param_with(
            &format!("{name}.gain"),
            ParamSpec::default().with_input(&[]).no_decay().init(Init::Constant(1.0)),
        );
        RmsNorm { gain, eps }
    }

    /// The normalization of `x`.
    #[track_caller]
    pub fn apply(&self, x: &Tensor) -> Tensor {
        let _within = x.graph().within("RmsNorm::apply");
        // The statistics in f32 in a half-precision session (see `LayerNorm::apply`).
        let ms = x.pointmul(x).kept_in_f32().mean1(OUTPUT_AXES).kept_in_f32();
        let rms = (&ms + self.eps).kept_in_f32().sqrt().kept_in_f32();
        (x / &rms).pointmul(&self.gain)
    }
}

//! Layer normalization over the output (feature) axes.
//!
//! Mean and variance reduce the output row into one position that broadcasts back; the gain and
//! bias parameters take their shape from use (the features), so nothing needs the width.

use crate::graph::{Graph, ParamSpec, Tensor};
use crate::init::Init;

use super::OUTPUT_AXES;

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
    let centered = x - &x.mean1(OUTPUT_AXES);
    let var = centered.pointmul(&centered).mean1(OUTPUT_AXES);
    let normed = &centered / &(&var + eps).sqrt();
    // One gain and one bias per normalized (output) position; no input axes.
    let vector = || ParamSpec::default().with_input(&[]).no_decay();
    let gain = g.param_with(&format!("{name}.gain"), vector().init(Init::Constant(1.0)));
    let bias = g.param_with(&format!("{name}.bias"), vector().init(Init::Constant(0.0)));
    &normed.pointmul(&gain) + &bias
}

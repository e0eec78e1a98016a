//! Neural-network building blocks, written with the tensor operations and the einsum notation.
//!
//! Blocks take a [`Graph`] (for their parameters), a name prefix and inputs, and
//! return tensors; parameter shapes are inferred from use wherever the block does not need a
//! size to be meaningful (hidden widths and output channels are given, input widths inferred).
//! Every block has a finite-difference gradient check (`tests/gradcheck_nn.rs`).

pub mod attention;
pub mod batchnorm;
pub mod conv;
pub mod embed;
pub mod gpt;
pub mod loss;
pub mod module;
pub mod norm;
pub mod sample;

pub use batchnorm::{BatchNorm, BatchNormAxes, BatchNormConfig};
pub use module::Module;

use crate::graph::{Graph, ParamSpec, Tensor};
use crate::init::Init;

/// The reduction of every output axis into one position (keeping batch and input axes): the
/// spec of softmax over classes, of layer norm over features.
pub const OUTPUT_AXES: &str = "..b..|..i..->..o.. => ..b..|..i..->0";

/// Every axis into a scalar.
pub const ALL_AXES: &str = "..b..|..i..->..o.. => ";

/// An activation function.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub enum Activation {
    /// `max(0, x)`.
    Relu,
    /// `tanh(x)`.
    Tanh,
    /// `1/(1+e^-x)`.
    Sigmoid,
    /// GELU, exact (with `erf`).
    Gelu,
    /// GELU, tanh approximation (GPT-2's).
    GeluTanh,
    /// SiLU: `x·sigmoid(x)`.
    Silu,
    /// No activation.
    Identity,
}

impl Activation {
    /// Applies the activation.
    pub fn apply(self, x: &Tensor) -> Tensor {
        match self {
            Activation::Relu => x.relu(),
            Activation::Tanh => x.tanh(),
            Activation::Sigmoid => x.sigmoid(),
            Activation::Gelu => x.gelu(),
            Activation::GeluTanh => x.gelu_tanh(),
            Activation::Silu => x.silu(),
            Activation::Identity => x.clone(),
        }
    }
}

/// A dense (affine) layer `w * x + b`; `w`'s input axes are inferred from the first input it is
/// applied to (all of the input's output axes contract). Applying it again reuses the same
/// parameters.
#[derive(Clone, Debug)]
pub struct Dense {
    /// The weights.
    pub w: Tensor,
    /// The bias.
    pub b: Tensor,
}

impl Dense {
    /// A layer with `out` output features.
    #[track_caller]
    pub fn new(g: &Graph, name: &str, out: usize) -> Dense {
        Dense {
            w: g.param_with(
                &format!("{name}.w"),
                ParamSpec::output(&[out]).init(Init::FanInUniform),
            ),
            b: g.param_with(
                &format!("{name}.b"),
                ParamSpec::vector(&[out]).init(Init::Constant(0.0)).no_decay(),
            ),
        }
    }

    /// A layer whose output width is inferred from use (e.g. by a residual connection).
    #[track_caller]
    pub fn inferred(g: &Graph, name: &str) -> Dense {
        Dense {
            w: g.param_with(&format!("{name}.w"), ParamSpec::default().init(Init::FanInUniform)),
            b: g.param_with(
                &format!("{name}.b"),
                ParamSpec::default().with_input(&[]).init(Init::Constant(0.0)).no_decay(),
            ),
        }
    }

    /// `w * x + b`.
    #[track_caller]
    pub fn apply(&self, x: &Tensor) -> Tensor {
        let _within = x.graph().within("Dense::apply");
        (&self.w.matmul(x) + &self.b).named(&layer_name(&self.w))
    }
}

/// A layer's name, from its weight's label (`mlp.1.w` → `mlp.1`): layers name their outputs
/// after themselves, so that messages about an output say which layer it is.
fn layer_name(w: &Tensor) -> String {
    let label = w.label();
    label.strip_suffix(".w").unwrap_or(&label).to_string()
}

/// A linear layer without bias, `w * x` (PyTorch's `nn.Linear(.., bias=False)`): `w`'s input
/// axes are inferred from the first input it is applied to. Its weight decays, as a `Dense`
/// layer's does.
///
/// ```
/// use rocannl_tensor::{Graph, nn::{Linear, Module}};
/// let g = Graph::new();
/// let x = g.data("x", &[8], &[], &[5]);
/// let proj = Linear::new(&g, "proj", 3);
/// let y = proj.apply(&x);
/// g.finish().unwrap();
/// assert_eq!(y.dims().unwrap(), vec![8, 3]);
/// let names: Vec<String> = proj.params().iter().map(|p| p.label()).collect();
/// assert_eq!(names, ["proj.w"]);
/// assert_eq!(proj.w.rows().unwrap().input, vec![5]);
/// ```
#[derive(Clone, Debug)]
pub struct Linear {
    /// The weights.
    pub w: Tensor,
}

impl Linear {
    /// A layer with `out` output features.
    #[track_caller]
    pub fn new(g: &Graph, name: &str, out: usize) -> Linear {
        Linear {
            w: g.param_with(
                &format!("{name}.w"),
                ParamSpec::output(&[out]).init(Init::FanInUniform),
            ),
        }
    }

    /// `w * x`.
    #[track_caller]
    pub fn apply(&self, x: &Tensor) -> Tensor {
        let _within = x.graph().within("Linear::apply");
        self.w.matmul(x).named(&layer_name(&self.w))
    }
}

/// A dense layer applied once: `w * x + b` with `out` output features.
///
/// ```
/// use rocannl_tensor::{Graph, nn};
/// let g = Graph::new();
/// let x = g.data("x", &[8], &[], &[5]);
/// let y = nn::dense(&g, "fc", &x, 3);
/// g.finish().unwrap();
/// assert_eq!(y.dims().unwrap(), vec![8, 3]);
/// ```
#[track_caller]
pub fn dense(g: &Graph, name: &str, x: &Tensor, out: usize) -> Tensor {
    let _within = x.graph().within("nn::dense");
    Dense::new(g, name, out).apply(x)
}

/// A dense layer with an inferred output width, applied once.
#[track_caller]
pub fn dense_inferred(g: &Graph, name: &str, x: &Tensor) -> Tensor {
    Dense::inferred(g, name).apply(x)
}

/// A multi-layer perceptron: dense layers of the given widths with an activation between them
/// (none after the last).
#[derive(Clone, Debug)]
pub struct Mlp {
    /// The layers.
    pub layers: Vec<Dense>,
    /// The activation between layers.
    pub act: Activation,
}

impl Mlp {
    /// Layers `name.0`, `name.1`, … of the given widths.
    #[track_caller]
    pub fn new(g: &Graph, name: &str, widths: &[usize], act: Activation) -> Mlp {
        let mut layers = Vec::with_capacity(widths.len());
        for (i, w) in widths.iter().enumerate() {
            layers.push(Dense::new(g, &format!("{name}.{i}"), *w));
        }
        Mlp { layers, act }
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

/// A multi-layer perceptron applied once.
///
/// ```
/// use rocannl_tensor::{Graph, nn};
/// let g = Graph::new();
/// let x = g.data("x", &[32], &[], &[2]);
/// let y = nn::mlp(&g, "mlp", &x, &[16, 16, 1], nn::Activation::Relu);
/// g.finish().unwrap();
/// assert_eq!(y.dims().unwrap(), vec![32, 1]);
/// ```
#[track_caller]
pub fn mlp(g: &Graph, name: &str, x: &Tensor, widths: &[usize], act: Activation) -> Tensor {
    let _within = x.graph().within("nn::mlp");
    Mlp::new(g, name, widths, act).apply(x)
}

/// Dropout, which depends on the routine's [`crate::Mode`]: in train mode (a training step), each
/// cell is zeroed with probability `p` and the others are scaled by `1/(1-p)`, with a fresh mask
/// every step (the mask's random numbers are salted with the graph's step counter); in eval
/// mode ([`crate::Session::forward`]), the identity.
///
/// `p` must be a probability in `[0, 1]`: anything else (a negative number, one above 1, NaN)
/// is a usage error naming `x`, returned by [`Graph::finish`]. At `p = 0` dropout is the
/// identity in both modes (`x` itself); at `p = 1` every cell is exactly 0 in train mode and
/// so is the gradient (no `0 · ∞`).
///
/// ```
/// use rocannl_tensor::{Graph, nn};
/// let g = Graph::new();
/// let x = g.data("x", &[4], &[], &[8]);
/// let y = nn::dropout(&x, 0.5);
/// g.finish().unwrap();
/// assert_eq!(y.dims().unwrap(), vec![4, 8]);
///
/// let bad = Graph::new();
/// let x = bad.data("x", &[4], &[], &[8]);
/// let _ = nn::dropout(&x, 1.5);
/// let e = bad.finish().unwrap_err().to_string();
/// assert!(e.contains("'x'") && e.contains("1.5"), "{e}");
/// ```
pub fn dropout(x: &Tensor, p: f64) -> Tensor {
    let g = x.graph();
    if !(0.0..=1.0).contains(&p) {
        g.record(crate::Error::usage(format!(
            "dropout of '{}': p = {p} is not a probability in [0, 1]",
            x.label()
        )));
        return x.clone();
    }
    if p == 0.0 {
        return x.clone();
    }
    let zero = g.number(0.0);
    let train = if p == 1.0 {
        // Every cell dropped: exact zeros, whatever `x` holds, and a zero gradient.
        Tensor::where_(&g.number(1.0), &zero, x)
    } else {
        let dropped = x.uniform_like(Some(g.step_symbol())).lt(&g.number(p));
        Tensor::where_(&dropped, &zero, &x.scale(1.0 / (1.0 - p)))
    };
    Tensor::by_mode(&train, x)
}

impl Tensor {
    /// The sum of all cells (a scalar).
    pub fn sum_all(&self) -> Tensor {
        self.einsum1(ALL_AXES).kept_in_f32()
    }

    /// The mean of all cells (a scalar).
    pub fn mean_all(&self) -> Tensor {
        self.mean1(ALL_AXES).kept_in_f32()
    }
}

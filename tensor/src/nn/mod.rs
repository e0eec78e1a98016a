//! Neural-network building blocks, written with the tensor operations and the einsum notation.
//!
//! Each block is a module ([`Module`]) built once by `X::new(g, name, XConfig)` — its params
//! created under the name prefix, with the inits, bias switches and weight-decay flags of its
//! config ([`config`]) — and applied any number of times. Parameter shapes are inferred from
//! use wherever the block does not need a size to be meaningful (hidden widths and output
//! channels are given, input widths inferred). Every block has a finite-difference gradient
//! check (`tests/gradcheck_nn.rs`).

pub mod attention;
pub mod batchnorm;
pub mod config;
pub mod conv;
pub mod embed;
pub mod gpt;
pub mod linear;
pub mod loss;
pub mod module;
pub mod norm;
pub mod sample;

pub use batchnorm::{BatchNorm, BatchNormAxes, BatchNormConfig};
pub use linear::{Linear, LinearConfig, Mlp, MlpConfig};
pub use module::Module;

use crate::graph::Tensor;

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

/// Dropout, which depends on the routine's [`crate::Mode`]: in train mode (a training step), each
/// cell is zeroed with probability `p` and the others are scaled by `1/(1-p)`, with a fresh mask
/// every step (the mask's random numbers are salted with the graph's step counter); in eval
/// mode ([`crate::Session::forward`]), the identity.
///
/// `p` must be a probability in `[0, 1]`: anything else (a negative number, one above 1, NaN)
/// is a usage error naming `x`, returned by [`crate::Graph::finish`]. At `p = 0` dropout is the
/// identity in both modes (`x` itself); at `p = 1` every cell is exactly 0 in train mode and
/// so is the gradient (no `0 · ∞`).
///
/// ```
/// use rocannl_tensor::{Axes, Graph, nn};
/// let g = Graph::new();
/// let x = g.data("x", Axes::new().batch(&[4]).output(&[8]));
/// let y = nn::dropout(&x, 0.5);
/// g.finish().unwrap();
/// assert_eq!(y.dims().unwrap(), vec![4, 8]);
///
/// let bad = Graph::new();
/// let x = bad.data("x", Axes::new().batch(&[4]).output(&[8]));
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
        let dropped = x.uniform_like(true).lt(&g.number(p));
        Tensor::where_(&dropped, &zero, &x.scale(1.0 / (1.0 - p)))
    };
    Tensor::by_mode(&train, x)
}

impl Tensor {
    /// The sum of all cells (a scalar).
    pub fn sum_all(&self) -> Tensor {
        self.einsum(ALL_AXES, []).kept_in_f32()
    }

    /// The mean of all cells (a scalar).
    pub fn mean_all(&self) -> Tensor {
        self.mean(ALL_AXES).kept_in_f32()
    }
}

//! Parameter initialization, generated as assignments so every backend computes the same values.
//!
//! Random initializations start from the counter-based generator of the compiler
//! (`FetchOp::Uniform`, SplitMix64 of the seed and the cell's offset): the same seed gives the
//! same numbers on the interpreter, native code and the GPU. Normal samples use the Box–Muller
//! transform of two independent uniform fields. Kaiming and Xavier scale by the fan-in (the
//! product of the parameter's input axes) and fan-out (its output axes), known once shapes are
//! inferred. Seeds not given explicitly derive from the graph's seed and the parameter's id.

use std::sync::Arc;

use rocannl_arrayjit::assignments::{Asgn, FetchOp, ScalarExpr};
use rocannl_arrayjit::indexing::{Projections, SymbolGen};
use rocannl_arrayjit::ops::{BinOp, UnOp};
use rocannl_arrayjit::tnode::NodeId;

/// How a parameter is initialized.
///
/// Two inits are equal when they describe the same initialization: numbers compare bit for
/// bit, except that every NaN equals every NaN (so an init equals itself, NaN or not), and 0
/// differs from -0.
///
/// ```
/// use rocannl_tensor::Init;
/// assert_eq!(Init::Constant(f64::NAN), Init::Constant(f64::NAN));
/// assert_eq!(Init::Values(vec![1.0, f64::NAN]), Init::Values(vec![1.0, f64::NAN]));
/// assert_ne!(Init::Constant(0.0), Init::Constant(-0.0));
/// assert_ne!(Init::Constant(1.0).seeded(1), Init::Constant(1.0).seeded(2));
/// ```
#[derive(Clone, Debug, Default)]
pub enum Init {
    /// Every cell holds this value.
    Constant(f64),
    /// Explicit values in memory order (batch, output, input).
    Values(Vec<f64>),
    /// Uniform on `[lo, hi)`.
    Uniform {
        /// Lower end.
        lo: f64,
        /// Upper end.
        hi: f64,
    },
    /// Normal with this mean and standard deviation (Box–Muller).
    Normal {
        /// Mean.
        mean: f64,
        /// Standard deviation.
        std: f64,
    },
    /// Uniform on `±1/√fan_in` (PyTorch's default for linear layers).
    #[default]
    FanInUniform,
    /// Kaiming (He) uniform for ReLU networks: `±√(6/fan_in)`.
    KaimingUniform,
    /// Kaiming (He) normal: standard deviation `√(2/fan_in)`.
    KaimingNormal,
    /// Xavier (Glorot) uniform: `±√(6/(fan_in+fan_out))`.
    XavierUniform,
    /// Xavier (Glorot) normal: standard deviation `√(2/(fan_in+fan_out))`.
    XavierNormal,
    /// LeCun uniform (variance `1/fan_in`, for SELU and unit-variance layers): `±√(3/fan_in)`.
    LecunUniform,
    /// LeCun normal: standard deviation `1/√fan_in` (flax's and JAX's default for dense layers).
    LecunNormal,
    /// Another initialization with an explicit seed.
    Seeded(Box<Init>, u64),
    /// Another initialization's values multiplied by a gain ([`Init::gain`]).
    Scaled(Box<Init>, f64),
}

/// The same number: bit for bit, or both NaN.
fn same(a: f64, b: f64) -> bool {
    a.to_bits() == b.to_bits() || (a.is_nan() && b.is_nan())
}

impl PartialEq for Init {
    fn eq(&self, other: &Init) -> bool {
        use Init::*;
        match (self, other) {
            (Constant(a), Constant(b)) => same(*a, *b),
            (Values(a), Values(b)) => {
                a.len() == b.len() && a.iter().zip(b).all(|(x, y)| same(*x, *y))
            }
            (Uniform { lo: a, hi: b }, Uniform { lo: c, hi: d })
            | (Normal { mean: a, std: b }, Normal { mean: c, std: d }) => {
                same(*a, *c) && same(*b, *d)
            }
            (Seeded(a, s), Seeded(b, t)) => s == t && a == b,
            (Scaled(a, g), Scaled(b, h)) => same(*g, *h) && a == b,
            (FanInUniform, FanInUniform)
            | (LecunUniform, LecunUniform)
            | (LecunNormal, LecunNormal)
            | (KaimingUniform, KaimingUniform)
            | (KaimingNormal, KaimingNormal)
            | (XavierUniform, XavierUniform)
            | (XavierNormal, XavierNormal) => true,
            _ => false,
        }
    }
}

impl Eq for Init {}

impl Init {
    /// The same initialization with an explicit seed.
    pub fn seeded(self, seed: u64) -> Init {
        Init::Seeded(Box::new(self), seed)
    }

    /// The same initialization with every value multiplied by `gain` (PyTorch's `gain`
    /// argument, for any scheme: `Init::KaimingNormal.gain(0.5)`, a residual projection's
    /// `Init::Normal { mean: 0.0, std: 0.02 }.gain(1.0 / (2.0 * layers as f64).sqrt())`).
    ///
    /// ```
    /// use rocannl_tensor::init::{Dist, Init};
    /// assert_eq!(Init::LecunNormal.gain(2.0).resolve(16, 1), Dist::Normal { mean: 0.0, std: 0.5 });
    /// assert_eq!(
    ///     Init::Uniform { lo: -1.0, hi: 3.0 }.gain(-0.5).resolve(1, 1),
    ///     Dist::Uniform { lo: -1.5, hi: 0.5 }
    /// );
    /// ```
    pub fn gain(self, gain: f64) -> Init {
        Init::Scaled(Box::new(self), gain)
    }

    /// The same initialization scaled for a projection that writes into a residual stream
    /// summed over `layers` blocks of two branches each: a gain of `1/√(2·layers)` (GPT-2's
    /// rule, which keeps the stream's variance from growing with depth). `layers = 0` counts
    /// as 1.
    ///
    /// ```
    /// use rocannl_tensor::init::{Dist, Init};
    /// let proj = Init::Normal { mean: 0.0, std: 0.02 }.residual_scaled(8);
    /// assert_eq!(proj.resolve(1, 1), Dist::Normal { mean: 0.0, std: 0.02 / 4.0 });
    /// ```
    pub fn residual_scaled(self, layers: usize) -> Init {
        self.gain(1.0 / (2.0 * layers.max(1) as f64).sqrt())
    }

    /// The distribution after resolving fan-based scales.
    pub fn resolve(&self, fan_in: usize, fan_out: usize) -> Dist {
        let (fi, fo) = (fan_in.max(1) as f64, fan_out.max(1) as f64);
        match self {
            Init::Constant(v) => Dist::Constant(*v),
            Init::Values(vs) => Dist::Values(vs.clone()),
            Init::Uniform { lo, hi } => Dist::Uniform { lo: *lo, hi: *hi },
            Init::Normal { mean, std } => Dist::Normal { mean: *mean, std: *std },
            Init::FanInUniform => Dist::Uniform { lo: -1.0 / fi.sqrt(), hi: 1.0 / fi.sqrt() },
            Init::KaimingUniform => {
                let b = (6.0 / fi).sqrt();
                Dist::Uniform { lo: -b, hi: b }
            }
            Init::KaimingNormal => Dist::Normal { mean: 0.0, std: (2.0 / fi).sqrt() },
            Init::XavierUniform => {
                let b = (6.0 / (fi + fo)).sqrt();
                Dist::Uniform { lo: -b, hi: b }
            }
            Init::XavierNormal => Dist::Normal { mean: 0.0, std: (2.0 / (fi + fo)).sqrt() },
            Init::LecunUniform => {
                let b = (3.0 / fi).sqrt();
                Dist::Uniform { lo: -b, hi: b }
            }
            Init::LecunNormal => Dist::Normal { mean: 0.0, std: 1.0 / fi.sqrt() },
            Init::Seeded(inner, _) => inner.resolve(fan_in, fan_out),
            Init::Scaled(inner, g) => inner.resolve(fan_in, fan_out).scaled(*g),
        }
    }

    /// The explicit seed, if any.
    pub fn explicit_seed(&self) -> Option<u64> {
        match self {
            Init::Seeded(_, s) => Some(*s),
            Init::Scaled(inner, _) => inner.explicit_seed(),
            _ => None,
        }
    }
}

/// A resolved initialization.
#[derive(Clone, Debug, PartialEq)]
pub enum Dist {
    /// Every cell holds this value.
    Constant(f64),
    /// Explicit values.
    Values(Vec<f64>),
    /// Uniform on `[lo, hi)`.
    Uniform {
        /// Lower end.
        lo: f64,
        /// Upper end.
        hi: f64,
    },
    /// Normal.
    Normal {
        /// Mean.
        mean: f64,
        /// Standard deviation.
        std: f64,
    },
}

impl Dist {
    /// Every value multiplied by `g`: `g·x` for `x` drawn from `self`.
    fn scaled(self, g: f64) -> Dist {
        match self {
            Dist::Constant(v) => Dist::Constant(v * g),
            Dist::Values(vs) => Dist::Values(vs.into_iter().map(|v| v * g).collect()),
            Dist::Uniform { lo, hi } if g < 0.0 => Dist::Uniform { lo: hi * g, hi: lo * g },
            Dist::Uniform { lo, hi } => Dist::Uniform { lo: lo * g, hi: hi * g },
            Dist::Normal { mean, std } => Dist::Normal { mean: mean * g, std: std * g.abs() },
        }
    }
}

/// Derives a parameter's seed from the graph's seed and its id (SplitMix64 of both).
pub fn derive_seed(graph_seed: u64, id: u32) -> u64 {
    let mut z = graph_seed ^ (u64::from(id).wrapping_add(1)).wrapping_mul(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// What initializing one parameter takes: assignments and, for explicit values, host data.
pub(crate) struct InitCode {
    pub asgn: Asgn,
    pub host_values: Option<Vec<f64>>,
}

/// The parameter an initialization is generated for.
pub(crate) struct InitTarget<'a> {
    /// Its node.
    pub node: NodeId,
    /// Its dims in memory order.
    pub dims: &'a [usize],
    /// The product of its input axes.
    pub fan_in: usize,
    /// The product of its output axes.
    pub fan_out: usize,
    /// The seed to use unless the initialization names one.
    pub seed: u64,
}

/// The code initializing a parameter. `temps` allocates scratch nodes of the same dims (for the
/// second uniform field of Box–Muller).
pub(crate) fn init_code(
    init: &Init,
    target: &InitTarget,
    temps: &mut dyn FnMut() -> NodeId,
    symbols: &mut SymbolGen,
) -> InitCode {
    let (node, dims, fan_in, fan_out) = (target.node, target.dims, target.fan_in, target.fan_out);
    let seed = target.seed;
    let seed = init.explicit_seed().unwrap_or(seed);
    let pointwise = |rhs: Vec<NodeId>, expr: ScalarExpr, symbols: &mut SymbolGen| Asgn::Accum {
        lhs: node,
        accum: None,
        rhs: rhs.clone(),
        expr,
        projections: Arc::new(Projections::identity(dims, rhs.len(), symbols)),
        initialize_neutral: false,
    };
    let c = ScalarExpr::Const;
    let (a0, a1) = (ScalarExpr::Arg(0), ScalarExpr::Arg(1));
    match init.resolve(fan_in, fan_out) {
        Dist::Constant(v) => InitCode {
            asgn: Asgn::Fetch { lhs: node, fetch: FetchOp::Constant(v) },
            host_values: None,
        },
        Dist::Values(vs) => InitCode { asgn: Asgn::Noop, host_values: Some(vs) },
        Dist::Uniform { lo, hi } => {
            let scale =
                ScalarExpr::bin(BinOp::Add, c(lo), ScalarExpr::bin(BinOp::Mul, c(hi - lo), a0));
            InitCode {
                asgn: Asgn::Seq(vec![
                    Asgn::Fetch { lhs: node, fetch: FetchOp::Uniform { seed, salt: None } },
                    pointwise(vec![node], scale, symbols),
                ]),
                host_values: None,
            }
        }
        Dist::Normal { mean, std } => {
            // z = √(-2 ln(1 - u1)) · cos(2π u2), with u1, u2 independent uniforms on [0, 1).
            // The uniforms are stored in the param's precision, where u1 can round up to 1
            // (bf16 keeps 8 bits): `1 - u1` is kept at least 2⁻²⁴, the generator's smallest
            // step, so the logarithm stays finite. In f32 and f64 `1 - u1` is never below it,
            // and nothing changes.
            let u2 = temps();
            let one_minus_u1 = ScalarExpr::bin(
                BinOp::Max,
                ScalarExpr::bin(BinOp::Sub, c(1.0), a0),
                c(1.0 / 16_777_216.0),
            );
            let radius = ScalarExpr::un(
                UnOp::Sqrt,
                ScalarExpr::bin(BinOp::Mul, c(-2.0), ScalarExpr::un(UnOp::Log, one_minus_u1)),
            );
            let angle = ScalarExpr::un(
                UnOp::Cos,
                ScalarExpr::bin(BinOp::Mul, c(std::f64::consts::TAU), a1),
            );
            let z = ScalarExpr::bin(BinOp::Mul, radius, angle);
            let value =
                ScalarExpr::bin(BinOp::Add, c(mean), ScalarExpr::bin(BinOp::Mul, c(std), z));
            InitCode {
                asgn: Asgn::Seq(vec![
                    Asgn::Fetch { lhs: node, fetch: FetchOp::Uniform { seed, salt: None } },
                    Asgn::Fetch {
                        lhs: u2,
                        fetch: FetchOp::Uniform { seed: derive_seed(seed, 1), salt: None },
                    },
                    pointwise(vec![node, u2], value, symbols),
                ]),
                host_values: None,
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fan_based_scales() {
        assert_eq!(Init::KaimingUniform.resolve(6, 1), Dist::Uniform { lo: -1.0, hi: 1.0 });
        assert_eq!(Init::XavierUniform.resolve(2, 4), Dist::Uniform { lo: -1.0, hi: 1.0 });
        assert_eq!(Init::FanInUniform.resolve(4, 3), Dist::Uniform { lo: -0.5, hi: 0.5 });
        assert_eq!(Init::KaimingNormal.resolve(8, 1), Dist::Normal { mean: 0.0, std: 0.5 });
        assert_eq!(Init::KaimingNormal.seeded(3).explicit_seed(), Some(3));
    }

    #[test]
    fn identical_nan_inits_are_equal_and_different_ones_are_not() {
        let nan = f64::NAN;
        let quiet_other = f64::from_bits(nan.to_bits() | 1); // another NaN payload
        assert_eq!(Init::Constant(nan), Init::Constant(quiet_other));
        assert_eq!(Init::Uniform { lo: nan, hi: 1.0 }, Init::Uniform { lo: nan, hi: 1.0 });
        assert_eq!(
            Init::Normal { mean: 0.0, std: nan }.seeded(4),
            Init::Normal { mean: 0.0, std: nan }.seeded(4)
        );
        assert_eq!(Init::KaimingUniform, Init::KaimingUniform);
        assert_ne!(Init::Constant(nan), Init::Constant(1.0));
        assert_ne!(Init::Values(vec![nan]), Init::Values(vec![nan, nan]));
        assert_ne!(Init::Uniform { lo: 0.0, hi: 1.0 }, Init::Normal { mean: 0.0, std: 1.0 });
        assert_ne!(Init::KaimingUniform, Init::XavierUniform);
    }

    #[test]
    fn derived_seeds_differ() {
        assert_ne!(derive_seed(0, 1), derive_seed(0, 2));
        assert_ne!(derive_seed(1, 1), derive_seed(0, 1));
        assert_eq!(derive_seed(7, 3), derive_seed(7, 3));
    }
}

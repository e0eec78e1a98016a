//! Batch normalization, with running statistics kept in buffers.
//!
//! Batch norm is the block whose training and evaluation differ the most: in training it
//! normalizes each feature with the mean and variance of the batch, and keeps running estimates
//! of both; in evaluation it normalizes with the estimates. Both behaviours are recorded in the
//! graph ([`crate::Tensor::by_mode`]), the estimates are buffers ([`crate::buffer`]) that every
//! training step updates in its compiled code, and the names follow PyTorch's state dict, so
//! one `apply` serves training and evaluation and a checkpoint loads into PyTorch's module.
//!
//! The statistics reduce every axis but the features: in rocannl's layout the features live in
//! the output row and positions in the batch row, so PyTorch's `BatchNorm1d` on `(N, C)` is a
//! batch norm of `N | -> C`, on `(N, C, L)` one of `N, L | -> C`
//! ([`BatchNormAxes::Features`]), and `BatchNorm2d` on images `... | h, w, c` keeps only the
//! channels ([`BatchNormAxes::Channels`]).

use crate::Axes;
use crate::Error;
use crate::graph::{Graph, ParamSpec, Tensor};
use crate::init::Init;

/// Which axes hold the features a [`BatchNorm`] normalizes separately (every other axis is
/// reduced by its statistics).
#[derive(Copy, Clone, Debug, Default, PartialEq, Eq)]
pub enum BatchNormAxes {
    /// Every output axis (PyTorch's `BatchNorm1d`): the statistics reduce the batch and input
    /// rows, so `N | -> C` and `N, L | -> C` (positions in the batch row) are normalized per
    /// feature `c`.
    #[default]
    Features,
    /// The last output axis (PyTorch's `BatchNorm2d`): the statistics reduce the batch and
    /// input rows and the other output axes, so images `N | -> h, w, c` are normalized per
    /// channel `c`.
    Channels,
}

impl BatchNormAxes {
    /// The einsum spec of the statistics: one value per feature.
    fn spec(self) -> &'static str {
        match self {
            BatchNormAxes::Features => "..b..|..i..->..o.. => ..o..",
            BatchNormAxes::Channels => "..b..|..i..->..s.., c => c",
        }
    }

    /// The rows of the params and buffers: no input axes, the features as the output row,
    /// their sizes inferred.
    fn axes(self) -> Axes {
        match self {
            BatchNormAxes::Features => Axes::new().input(&[]),
            BatchNormAxes::Channels => Axes::new().input(&[]).output_partial(&[None]),
        }
    }
}

/// The settings of a [`BatchNorm`], PyTorch's defaults by default.
///
/// ```
/// use rocannl_tensor::nn::{BatchNormAxes, BatchNormConfig};
/// let cfg = BatchNormConfig::default().with_momentum(Some(0.01)).with_affine(false);
/// assert_eq!((cfg.momentum, cfg.eps, cfg.affine), (Some(0.01), 1e-5, false));
/// assert_eq!(cfg.axes, BatchNormAxes::Features);
/// ```
#[derive(Clone, Debug, PartialEq)]
pub struct BatchNormConfig {
    /// Which axes are the features (default: every output axis, `BatchNorm1d`).
    pub axes: BatchNormAxes,
    /// The weight of the batch in the running estimates: `running = (1 - momentum) · running
    /// + momentum · batch` (PyTorch's convention; default 0.1). `None`: a cumulative average
    /// over every batch seen (`momentum = 1 / batches`), as PyTorch's `momentum=None`.
    pub momentum: Option<f64>,
    /// Added to the variance (default 1e-5).
    pub eps: f64,
    /// A learnable weight and bias per feature (default: yes).
    pub affine: bool,
    /// Keep running estimates for evaluation (default: yes). Without them, evaluation
    /// normalizes with the batch's statistics too, and the block has no buffers.
    pub track_running_stats: bool,
    /// The weight's initialization (default: 1).
    pub weight_init: Init,
    /// The bias's initialization (default: 0).
    pub bias_init: Init,
}

impl Default for BatchNormConfig {
    fn default() -> Self {
        BatchNormConfig {
            axes: BatchNormAxes::Features,
            momentum: Some(0.1),
            eps: 1e-5,
            affine: true,
            track_running_stats: true,
            weight_init: Init::Constant(1.0),
            bias_init: Init::Constant(0.0),
        }
    }
}

impl BatchNormConfig {
    /// Sets [`BatchNormConfig::axes`].
    pub fn with_axes(mut self, axes: BatchNormAxes) -> Self {
        self.axes = axes;
        self
    }
    /// Sets [`BatchNormConfig::momentum`].
    pub fn with_momentum(mut self, momentum: Option<f64>) -> Self {
        self.momentum = momentum;
        self
    }
    /// Sets [`BatchNormConfig::eps`].
    pub fn with_eps(mut self, eps: f64) -> Self {
        self.eps = eps;
        self
    }
    /// Sets [`BatchNormConfig::affine`].
    pub fn with_affine(mut self, affine: bool) -> Self {
        self.affine = affine;
        self
    }
    /// Sets [`BatchNormConfig::track_running_stats`].
    pub fn with_track_running_stats(mut self, track: bool) -> Self {
        self.track_running_stats = track;
        self
    }
    /// Sets [`BatchNormConfig::weight_init`].
    pub fn with_weight_init(mut self, init: Init) -> Self {
        self.weight_init = init;
        self
    }
    /// Sets [`BatchNormConfig::bias_init`].
    pub fn with_bias_init(mut self, init: Init) -> Self {
        self.bias_init = init;
        self
    }

    /// A usage message when a setting is out of range.
    fn check(&self, name: &str) -> Option<String> {
        let bad_eps = !(self.eps >= 0.0 && self.eps.is_finite());
        let bad_momentum = self.momentum.is_some_and(|m| !(0.0..=1.0).contains(&m));
        (bad_eps || bad_momentum).then(|| {
            format!(
                "batch norm '{name}': eps = {} must be a finite number, at least 0, and \
                 momentum = {:?} in [0, 1]",
                self.eps, self.momentum
            )
        })
    }
}

/// The running estimates of a [`BatchNorm`]: buffers, one value per feature but the count.
#[derive(Clone, Debug)]
pub struct RunningStats {
    /// The running mean (`name.running_mean`, initially 0).
    pub mean: Tensor,
    /// The running variance, of unbiased estimates (`name.running_var`, initially 1).
    pub var: Tensor,
    /// How many training batches were seen (`name.num_batches_tracked`, a scalar).
    pub batches: Tensor,
}

/// Batch normalization: `(x - mean) / sqrt(var + eps) · weight + bias` per feature, the
/// statistics over every other axis ([`BatchNormAxes`]).
///
/// - Train mode ([`crate::Mode::Train`], the training step): the batch's mean and biased
///   variance normalize; the running estimates are updated by the step's compiled code,
///   `running = (1 - momentum) · running + momentum · batch`, with the batch's *unbiased*
///   variance (`n / (n - 1)` times the biased one), as PyTorch does. A feature of a single
///   value per batch has no unbiased variance (its update is NaN).
/// - Eval mode ([`crate::Session::forward`]): the running estimates normalize (the batch's
///   statistics when [`BatchNormConfig::track_running_stats`] is off); nothing is updated.
///
/// Names are PyTorch's: params `name.weight` and `name.bias` (no weight decay), buffers
/// `name.running_mean`, `name.running_var` and `name.num_batches_tracked`. The number of
/// features is inferred from the first input.
///
/// ```
/// use rocannl_tensor::nn::{BatchNorm, BatchNormConfig, Module};
/// use rocannl_tensor::{Axes, Graph, Session, Sgd, optim::Optimizer};
/// let g = Graph::new();
/// let x = g.data("x", Axes::new().batch(&[4]).output(&[2])); // 4 examples, 2 features
/// let bn = BatchNorm::new(&g, "bn", BatchNormConfig::default());
/// let y = bn.apply(&x);
/// let loss = y.pointmul(&y).sum_all();
/// let mut s = Session::new(&g).unwrap();
/// let mut step = s.train_step(&loss, &Optimizer::Sgd(Sgd::default()), &[&y], &Default::default()).unwrap();
/// s.write(&x, &[1.0, 10.0, 2.0, 10.0, 3.0, 30.0, 4.0, 30.0]).unwrap();
/// s.step(&mut step, 0.0).unwrap();
/// let y_train = s.read(&y).unwrap(); // normalized by the batch's statistics
/// assert!((y_train[0] + 1.3416).abs() < 1e-3 && (y_train[1] + 1.0).abs() < 1e-3);
/// // The running estimates moved a tenth of the way: mean (2.5, 20), unbiased var (5/3, 400/3).
/// let mean = s.read(&bn.buffers()[0]).unwrap();
/// assert!((mean[0] - 0.25).abs() < 1e-6 && (mean[1] - 2.0).abs() < 1e-6);
/// let eval = s.forward(&[&y]).unwrap(); // normalized by the running estimates
/// s.run(&eval).unwrap();
/// let y_eval = s.read(&y).unwrap();
/// let var0 = 0.9 + 0.1 * 5.0 / 3.0;
/// assert!((y_eval[0] - (1.0 - 0.25) / (var0 + 1e-5f64).sqrt()).abs() < 1e-5);
/// ```
#[derive(Clone, Debug)]
pub struct BatchNorm {
    /// One weight per feature (`name.weight`), when affine.
    pub weight: Option<Tensor>,
    /// One bias per feature (`name.bias`), when affine.
    pub bias: Option<Tensor>,
    /// The running estimates, when tracked.
    pub running: Option<RunningStats>,
    /// The settings.
    pub cfg: BatchNormConfig,
    /// The block's name (its outputs are named after it).
    pub name: String,
}

impl BatchNorm {
    /// A batch norm named `name`; its params and buffers are created here (see [`BatchNorm`]
    /// for their names). An `eps` below 0 or not finite, or a momentum outside `[0, 1]`, is a
    /// usage error naming the block, returned by [`Graph::finish`].
    #[track_caller]
    pub fn new(g: &Graph, name: &str, cfg: BatchNormConfig) -> BatchNorm {
        if let Some(message) = cfg.check(name) {
            g.record(Error::usage(message));
        }
        let spec = |init: &Init| ParamSpec::new(cfg.axes.axes()).init(init.clone()).no_decay();
        let (weight, bias) = if cfg.affine {
            let weight = g.param(&format!("{name}.weight"), spec(&cfg.weight_init));
            let bias = g.param(&format!("{name}.bias"), spec(&cfg.bias_init));
            (Some(weight), Some(bias))
        } else {
            (None, None)
        };
        let running = cfg.track_running_stats.then(|| RunningStats {
            mean: g.buffer(&format!("{name}.running_mean"), spec(&Init::Constant(0.0))),
            var: g.buffer(&format!("{name}.running_var"), spec(&Init::Constant(1.0))),
            batches: g.buffer(
                &format!("{name}.num_batches_tracked"),
                ParamSpec::new(Axes::new().input(&[]).output(&[])).init(Init::Constant(0.0)),
            ),
        });
        BatchNorm { weight, bias, running, cfg, name: name.to_string() }
    }

    /// The normalization of `x`: by the batch's statistics in train mode (updating the running
    /// estimates), by the running estimates in eval mode.
    #[track_caller]
    pub fn apply(&self, x: &Tensor) -> Tensor {
        let _within = x.graph().within("BatchNorm::apply");
        let spec = self.cfg.axes.spec();
        // The statistics in f32 in a half-precision session (see `LayerNorm::apply`).
        let mean = x.mean(spec).kept_in_f32();
        let centered = (x - &mean).kept_in_f32();
        let squares = centered.pointmul(&centered).kept_in_f32();
        let var = squares.mean(spec).kept_in_f32();
        let by_batch = &centered / &(&var + self.cfg.eps).kept_in_f32().sqrt().kept_in_f32();
        let normed = match &self.running {
            None => by_batch,
            Some(r) => {
                self.update_running(r, x, &mean, &squares);
                let std = (&r.var + self.cfg.eps).sqrt();
                Tensor::by_mode(&by_batch, &(&(x - &r.mean) / &std))
            }
        };
        let out = match (&self.weight, &self.bias) {
            (Some(w), Some(b)) => &normed.pointmul(w) + b,
            _ => normed,
        };
        out.named(&self.name)
    }

    /// Records the updates of the running estimates from the batch's mean and squared
    /// deviations: the unbiased variance is their sum over `n - 1`, `n` the number of cells
    /// each feature has (counted at run time, so a dynamic batch counts its current rows).
    fn update_running(&self, r: &RunningStats, x: &Tensor, mean: &Tensor, squares: &Tensor) {
        let spec = self.cfg.axes.spec();
        // `x < x` is 0 for every x: a sum of ones shaped like `x`.
        let ones = &x.detach().lt(&x.detach()) + 1.0;
        let count = ones.einsum(spec, []).kept_in_f32();
        let unbiased = (&squares.einsum(spec, []).kept_in_f32() / &(&count - 1.0)).kept_in_f32();
        let batches = &r.batches + 1.0;
        // (1 - f) · running + f · batch, f the momentum or 1 / batches (a cumulative average).
        let moved = |running: &Tensor, batch: &Tensor| match self.cfg.momentum {
            Some(m) => &running.scale(1.0 - m) + &batch.scale(m),
            None => {
                let f = batches.recip();
                &running.pointmul(&(1.0 - &f)) + &batch.pointmul(&f)
            }
        };
        r.mean.update_with(&moved(&r.mean, mean));
        r.var.update_with(&moved(&r.var, &unbiased));
        r.batches.update_with(&batches);
    }
}

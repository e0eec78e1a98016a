//! Convolutions and pooling with the einsum notation's convolution axes.
//!
//! Images are `... | h, w, c` (channels last, in the output row). A 2-D convolution is the
//! einsum `... | s*h+i, s*w+j, c; i, j, c -> d => ... | h, w, d`: the kernel's input row holds the
//! window and the input channels (inferred), its output row the output channels. Valid
//! convolutions shrink the image; padded ones preserve it (stride 1). Max pooling is the
//! max-plus (tropical) einsum against a zero window; average pooling an einsum against a
//! constant window.

use crate::Axes;
use crate::graph::{Graph, ParamSpec, Tensor};
use crate::init::Init;

use super::config::setters;

/// How a convolution treats borders.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub enum Padding {
    /// No padding: the output has `stride*(out-1) + kernel = in`.
    Valid,
    /// Dimension-preserving padding (out = in / stride).
    Same,
}

/// The spec of a convolution: per spatial axis `s*h+i` when the kernel spans it, or just `h`
/// (`s*h` with a stride) when it is 1 wide, so that the kernel's input row holds only the spanned
/// axes and the channels.
fn window_spec(kernel: (usize, usize), stride: usize) -> String {
    let axis = |out: &str, k: usize, win: &str| match (stride, k) {
        (1, 1) => out.to_string(),
        (s, 1) => format!("{s}*{out}"),
        (1, _) => format!("{out}+{win}"),
        (s, _) => format!("{s}*{out}+{win}"),
    };
    let mut kernel_axes: Vec<&str> = Vec::new();
    if kernel.0 > 1 {
        kernel_axes.push("i");
    }
    if kernel.1 > 1 {
        kernel_axes.push("j");
    }
    kernel_axes.push("c");
    format!(
        "... | {}, {}, c; {} -> d => ... | h, w, d",
        axis("h", kernel.0, "i"),
        axis("w", kernel.1, "j"),
        kernel_axes.join(", ")
    )
}

/// The options of a [`Conv2d`]: `Conv2dConfig::new(window, out_channels)` has PyTorch's
/// defaults (stride 1, no padding, a bias) and a Kaiming-uniform kernel.
#[derive(Clone, Debug, PartialEq)]
pub struct Conv2dConfig {
    /// The window (`kh`, `kw`); each side at least 1.
    pub window: (usize, usize),
    /// The number of filters.
    pub out_channels: usize,
    /// The stride (default: 1); at least 1.
    pub stride: usize,
    /// The border handling (default: [`Padding::Valid`]).
    pub padding: Padding,
    /// Whether the layer adds one bias per output channel (default: yes).
    pub bias: bool,
    /// The kernel's init (default: [`Init::KaimingUniform`]).
    pub kernel_init: Init,
    /// The bias' init (default: 0).
    pub b_init: Init,
    /// Whether the kernel decays under [`crate::DecayPolicy::PerParam`] (default: yes).
    pub kernel_decay: bool,
    /// Whether the bias decays (default: no).
    pub b_decay: bool,
}

impl Conv2dConfig {
    /// `out_channels` filters of `window.0 × window.1`, with the defaults.
    pub fn new(window: (usize, usize), out_channels: usize) -> Conv2dConfig {
        Conv2dConfig {
            window,
            out_channels,
            stride: 1,
            padding: Padding::Valid,
            bias: true,
            kernel_init: Init::KaimingUniform,
            b_init: Init::Constant(0.0),
            kernel_decay: true,
            b_decay: false,
        }
    }
}

setters!(Conv2dConfig {
    with_window => window: (usize, usize),
    with_out_channels => out_channels: usize,
    with_stride => stride: usize,
    with_padding => padding: Padding,
    with_bias => bias: bool,
    with_kernel_init => kernel_init: Init,
    with_b_init => b_init: Init,
    with_kernel_decay => kernel_decay: bool,
    with_b_decay => b_decay: bool,
});

/// A 2-D convolution layer with `out_channels` filters of `kh × kw` and (by default) a bias;
/// the input channels are inferred from the first input. The kernel's input row is
/// `kh, kw, channels` (a 1-wide window axis is left out).
///
/// ```
/// use rocannl_tensor::{Axes, Graph, nn::conv::{Conv2d, Conv2dConfig, Padding}};
/// let g = Graph::new();
/// let x = g.data("x", Axes::new().batch(&[4]).output(&[8, 8, 3]));
/// let valid = Conv2d::new(&g, "c1", Conv2dConfig::new((3, 3), 6));
/// let same = Conv2dConfig::new((3, 3), 6).with_padding(Padding::Same).with_bias(false);
/// let same = Conv2d::new(&g, "c2", same);
/// let (y, z) = (valid.apply(&x), same.apply(&x));
/// g.finish().unwrap();
/// assert_eq!(y.dims().unwrap(), vec![4, 6, 6, 6]);
/// assert_eq!(z.dims().unwrap(), vec![4, 8, 8, 6]);
/// assert!(same.bias.is_none());
/// ```
#[derive(Clone, Debug)]
pub struct Conv2d {
    /// `input: kh, kw, channels -> output: out_channels`.
    pub kernel: Tensor,
    /// One bias per output channel (`None` when the config turned it off).
    pub bias: Option<Tensor>,
    /// The window (`kh`, `kw`).
    pub window: (usize, usize),
    /// The stride.
    pub stride: usize,
    /// The border handling.
    pub padding: Padding,
}

impl Conv2d {
    /// A convolution layer named `name` (params `name.kernel`, `name.b`); the window's sides
    /// and the stride are at least 1 (0 is a usage error naming the layer, returned by
    /// [`Graph::finish`]).
    #[track_caller]
    pub fn new(g: &Graph, name: &str, cfg: Conv2dConfig) -> Conv2d {
        let (kernel, stride) = (cfg.window, cfg.stride);
        if kernel.0 == 0 || kernel.1 == 0 || stride == 0 {
            g.record(crate::Error::usage(format!(
                "conv2d '{name}': the window {}×{} and the stride {stride} must be at least 1",
                kernel.0, kernel.1
            )));
        }
        let mut window: Vec<Option<usize>> =
            [kernel.0, kernel.1].into_iter().filter(|k| *k > 1).map(Some).collect();
        window.push(None);
        let k = g.param(
            &format!("{name}.kernel"),
            ParamSpec {
                weight_decay: cfg.kernel_decay,
                ..ParamSpec::new(Axes::new().input_partial(&window).output(&[cfg.out_channels]))
                    .init(cfg.kernel_init)
            },
        );
        let b = if cfg.bias {
            let spec =
                ParamSpec::new(Axes::new().input(&[]).output(&[cfg.out_channels])).init(cfg.b_init);
            let spec = ParamSpec { weight_decay: cfg.b_decay, ..spec };
            Some(g.param(&format!("{name}.b"), spec))
        } else {
            None
        };
        Conv2d { kernel: k, bias: b, window: kernel, stride, padding: cfg.padding }
    }

    /// The convolution of `x` (`... | h, w, c`).
    #[track_caller]
    pub fn apply(&self, x: &Tensor) -> Tensor {
        let _within = x.graph().within("Conv2d::apply");
        let spec = window_spec(self.window, self.stride);
        let y = match self.padding {
            Padding::Valid => x.einsum(&spec, &self.kernel),
            Padding::Same => x.einsum_padded(&spec, &self.kernel),
        };
        match &self.bias {
            Some(b) => &y + b,
            None => y,
        }
    }
}

fn pool_spec(stride: usize) -> String {
    format!("... | {stride}*oh+wh, {stride}*ow+ww, ..c..; wh, ww => ... | oh, ow, ..c..")
}

/// Records a usage error naming `x` when a pooling window or stride is 0.
fn check_pool(g: &Graph, what: &str, x: &Tensor, k: usize, stride: usize) {
    if k == 0 || stride == 0 {
        g.record(crate::Error::usage(format!(
            "{what} of '{}': the window {k} and the stride {stride} must be at least 1",
            x.label()
        )));
    }
}

/// Max pooling over `k × k` windows moving by `stride` (valid); `k` and `stride` are at least
/// 1 (0 is a usage error naming `x`, returned by [`Graph::finish`]).
pub fn max_pool2d(x: &Tensor, k: usize, stride: usize) -> Tensor {
    let g = x.graph();
    check_pool(g, "max_pool2d", x, k, stride);
    let window = g.constant(0.0, Axes::new().output(&[k, k]));
    x.tropical(&pool_spec(stride), &window)
}

/// Average pooling over `k × k` windows moving by `stride` (valid); `k` and `stride` are at
/// least 1, as for [`max_pool2d`].
pub fn avg_pool2d(x: &Tensor, k: usize, stride: usize) -> Tensor {
    let g = x.graph();
    check_pool(g, "avg_pool2d", x, k, stride);
    let window = g.constant(1.0 / (k * k).max(1) as f64, Axes::new().output(&[k, k]));
    x.einsum(&pool_spec(stride), &window)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn specs_leave_out_one_wide_windows() {
        assert_eq!(window_spec((3, 3), 1), "... | h+i, w+j, c; i, j, c -> d => ... | h, w, d");
        assert_eq!(window_spec((1, 1), 1), "... | h, w, c; c -> d => ... | h, w, d");
        assert_eq!(window_spec((1, 1), 2), "... | 2*h, 2*w, c; c -> d => ... | h, w, d");
        assert_eq!(window_spec((1, 5), 2), "... | 2*h, 2*w+j, c; j, c -> d => ... | h, w, d");
    }
}

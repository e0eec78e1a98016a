//! Dimensions: the size of one axis, known or not.
//!
//! A [`Dim`] is a variable, a solved size (with an optional label and, during projection
//! inference, a projection id), the input side of a convolution or strided iteration
//! (`stride*output + dilation*kernel`), or a concatenation `a^b^c`. The last two are *arithmetic*
//! dimensions: their size follows from their parts, and when the size is known a missing part is
//! solved for ([`ConvDim::solve_output`], [`ConvDim::solve_kernel`], concatenation by
//! subtraction). Sizes with no whole-number solution are errors, never rounded.
//!
//! Convolution sizes (the seed's `stride*output + dilation*kernel` over-counts; we use the exact
//! extent of a valid convolution):
//!
//! | form | input size |
//! |---|---|
//! | unpadded, `dilation > 0` | `stride*(output-1) + dilation*(kernel-1) + 1` |
//! | unpadded, kernel or output 0 | none: no window, the input is not sized by it ([`ConvDim::is_windowless`]) |
//! | pure stride (`dilation = 0`, any stride ≥ 1) | `stride*output` |
//! | padded (`use_padding`) | `stride*output` (padding is found by projection inference) |

use std::fmt;
use std::sync::Arc;

use crate::var::{DimVar, ProjId};

/// A solved dimension: its size, an optional label (`"rgb"`), and during projection inference
/// the projection id of the axis instance it belongs to.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct SolvedDim {
    /// The number of positions along the axis.
    pub d: usize,
    /// A semantic label; two axes that must agree on size must also agree on labels.
    pub label: Option<Arc<str>>,
    /// The axis instance, set only while deriving projections.
    pub proj_id: Option<ProjId>,
}

/// The input side of a convolution or strided iteration: `stride*output + dilation*kernel`.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct ConvDim {
    /// How far the window moves per output position (≥ 1).
    pub stride: usize,
    /// The output dimension.
    pub output: Dim,
    /// The spacing of kernel taps; `0` means pure strided iteration without a kernel.
    pub dilation: usize,
    /// The kernel dimension (ignored when `dilation == 0`).
    pub kernel: Dim,
    /// Dimension-preserving padding (`use_padding` of the seed): the input size is
    /// `stride*output` and the kernel does not contribute to sizes; the left padding is
    /// computed by projection inference.
    pub padded: bool,
}

/// The size of one axis.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum Dim {
    /// Not known yet.
    Var(DimVar),
    /// Known.
    Solved(SolvedDim),
    /// A convolution or strided-iteration input axis.
    Conv(Arc<ConvDim>),
    /// A concatenated axis `a^b^c`: the size is the sum of the parts.
    Concat(Vec<Dim>),
}

/// Why an arithmetic dimension has no solution.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NoSolution(pub String);

impl Dim {
    /// A solved dimension of size `d` without label.
    pub fn of(d: usize) -> Dim {
        Dim::Solved(SolvedDim { d, label: None, proj_id: None })
    }

    /// A solved dimension with a label.
    pub fn labeled(d: usize, label: &str) -> Dim {
        Dim::Solved(SolvedDim { d, label: Some(Arc::from(label)), proj_id: None })
    }

    /// The size, if known (arithmetic dimensions are known when all their parts are, and their
    /// size is representable: an arithmetic size that would overflow `usize` stays unknown, and
    /// closing reports the shape as not inferred instead of wrapping around).
    pub fn size(&self) -> Option<usize> {
        match self {
            Dim::Var(_) => None,
            Dim::Solved(s) => Some(s.d),
            Dim::Conv(c) => c.input_size(),
            Dim::Concat(parts) => sum_sizes(parts),
        }
    }

    /// Whether the dimension may still turn out to be 1: a variable, a size 1, a convolution
    /// whose parts may all be 1 (with stride 1 where the stride counts), but never a
    /// concatenation of two or more parts (each has at least one position).
    pub fn can_be_one(&self) -> bool {
        match self {
            Dim::Var(_) => true,
            Dim::Solved(s) => s.d == 1,
            Dim::Conv(c) if c.padded || c.dilation == 0 => c.stride == 1 && c.output.can_be_one(),
            Dim::Conv(c) => c.output.can_be_one() && c.kernel.can_be_one(),
            Dim::Concat(parts) => parts.len() < 2 && parts.iter().all(Dim::can_be_one),
        }
    }

    /// Whether this is a known dimension of size 1 (the bottom of the broadcasting order).
    pub fn is_one(&self) -> bool {
        matches!(self, Dim::Solved(SolvedDim { d: 1, .. }))
    }

    /// The label of a solved dimension.
    pub fn label(&self) -> Option<&Arc<str>> {
        match self {
            Dim::Solved(s) => s.label.as_ref(),
            _ => None,
        }
    }

    /// The variables this dimension mentions.
    pub fn vars(&self, out: &mut Vec<DimVar>) {
        match self {
            Dim::Var(v) => out.push(*v),
            Dim::Solved(_) => {}
            Dim::Conv(c) => {
                c.output.vars(out);
                if c.dilation > 0 && !c.padded {
                    c.kernel.vars(out);
                }
            }
            Dim::Concat(parts) => parts.iter().for_each(|p| p.vars(out)),
        }
    }

    /// Whether variable `v` occurs anywhere in this dimension, including the parts that do not
    /// count towards its size (the kernel of a padded or pure-stride convolution): the occurs
    /// check must see every variable substitution would follow.
    pub fn mentions(&self, v: DimVar) -> bool {
        match self {
            Dim::Var(w) => *w == v,
            Dim::Solved(_) => false,
            Dim::Conv(c) => c.output.mentions(v) || c.kernel.mentions(v),
            Dim::Concat(parts) => parts.iter().any(|p| p.mentions(v)),
        }
    }

    /// Replaces every variable by `f(var)` (if it returns `Some`) and simplifies arithmetic
    /// dimensions whose parts became known.
    pub fn map_vars(&self, f: &mut impl FnMut(DimVar) -> Option<Dim>) -> Dim {
        self.map_vars_with(f, true)
    }

    /// [`Dim::map_vars`], keeping padded stride-1 convolutions as such when `collapse_padded`
    /// is false (projection inference needs their structure).
    pub fn map_vars_with(
        &self,
        f: &mut impl FnMut(DimVar) -> Option<Dim>,
        collapse_padded: bool,
    ) -> Dim {
        match self {
            Dim::Var(v) => f(*v).unwrap_or(Dim::Var(*v)),
            Dim::Solved(_) => self.clone(),
            Dim::Conv(c) => Dim::Conv(Arc::new(ConvDim {
                stride: c.stride,
                output: c.output.map_vars_with(f, collapse_padded),
                dilation: c.dilation,
                kernel: c.kernel.map_vars_with(f, collapse_padded),
                padded: c.padded,
            }))
            .normalized_with(collapse_padded),
            Dim::Concat(parts) => {
                Dim::Concat(parts.iter().map(|p| p.map_vars_with(f, collapse_padded)).collect())
                    .normalized_with(collapse_padded)
            }
        }
    }

    /// Collapses an arithmetic dimension whose size is known into a solved dimension.
    ///
    /// ```
    /// use std::sync::Arc;
    /// use rocannl_shape::dim::{ConvDim, Dim};
    /// let conv = Dim::Conv(Arc::new(ConvDim {
    ///     stride: 2, output: Dim::of(3), dilation: 1, kernel: Dim::of(3), padded: false,
    /// }));
    /// assert_eq!(conv.normalized(), Dim::of(7)); // 2*(3-1) + 1*(3-1) + 1
    /// assert_eq!(Dim::Concat(vec![Dim::of(2), Dim::of(5)]).normalized(), Dim::of(7));
    /// ```
    pub fn normalized(self) -> Dim {
        self.normalized_with(true)
    }

    /// [`Dim::normalized`]; with `collapse_padded` false a padded stride-1 convolution keeps its
    /// structure until its size is known.
    pub fn normalized_with(self, collapse_padded: bool) -> Dim {
        match self {
            // A padded convolution with stride 1 preserves the dimension: for shape inference it
            // is its output (the kernel only matters for padding, which projection inference
            // derives from the spec's template).
            Dim::Conv(c) if collapse_padded && c.padded && c.stride == 1 => {
                Arc::unwrap_or_clone(c).output.normalized()
            }
            Dim::Conv(ref c) => match c.input_size() {
                Some(d) => Dim::of(d),
                None => self,
            },
            Dim::Concat(mut parts) => {
                if parts.len() == 1 {
                    return parts.pop().expect("one part");
                }
                match sum_sizes(&parts) {
                    Some(d) => Dim::of(d),
                    None => Dim::Concat(parts),
                }
            }
            other => other,
        }
    }
}

/// The total size of concatenated parts, when all are known and the sum is representable.
fn sum_sizes(parts: &[Dim]) -> Option<usize> {
    parts.iter().try_fold(0usize, |acc, p| acc.checked_add(p.size()?))
}

impl ConvDim {
    /// The input size when the parts it depends on are known (and it does not overflow).
    pub fn input_size(&self) -> Option<usize> {
        self.input_size_with(Dim::size)
    }

    /// [`ConvDim::input_size`], with the sizes of the parts given by `size`.
    pub fn input_size_with(&self, size: impl Fn(&Dim) -> Option<usize>) -> Option<usize> {
        let out = size(&self.output)?;
        if self.padded || self.dilation == 0 {
            return self.stride.checked_mul(out);
        }
        let k = size(&self.kernel)?;
        if out == 0 || k == 0 {
            // No window: the input is not determined by the convolution (see
            // `ConvDim::is_windowless`).
            return None;
        }
        self.stride
            .checked_mul(out - 1)?
            .checked_add(self.dilation.checked_mul(k - 1)?)?
            .checked_add(1)
    }

    /// Whether the kernel contributes to the input size.
    pub fn kernel_counts(&self) -> bool {
        self.dilation > 0 && !self.padded
    }

    /// Whether this valid convolution is known to have no window: a kernel of size 0 has no
    /// taps, so no window can be placed, and the output has size 0 (and an output of size 0 has
    /// a kernel of 0: a kernel that does not fit its input is an error, not an empty output).
    /// Such a convolution reads nothing, so it does not constrain its input axis: it has no
    /// input size of its own, and an input axis sized by nothing else is sized like any axis
    /// nothing bounds.
    pub fn is_windowless(&self) -> bool {
        self.kernel_counts() && (self.kernel.size() == Some(0) || self.output.size() == Some(0))
    }

    /// Solves the output size from the input size and the kernel size (ignored when the kernel
    /// does not count, see [`ConvDim::kernel_counts`]).
    ///
    /// ```
    /// use rocannl_shape::dim::{ConvDim, Dim};
    /// let c = ConvDim { stride: 2, output: Dim::of(0), dilation: 1, kernel: Dim::of(3), padded: false };
    /// assert_eq!(c.solve_output(7, 3), Ok(3));
    /// assert!(c.solve_output(8, 3).is_err()); // 2*(o-1) + 3 = 8 has no whole solution
    /// ```
    pub fn solve_output(&self, input: usize, kernel: usize) -> Result<usize, NoSolution> {
        let fail = |why: String| Err(NoSolution(why));
        if self.padded || self.dilation == 0 {
            if !input.is_multiple_of(self.stride) {
                return fail(format!(
                    "an axis of {input} is not a whole number of strides {}",
                    self.stride
                ));
            }
            return Ok(input / self.stride);
        }
        if kernel == 0 {
            // No taps, no window (whatever the input).
            return Ok(0);
        }
        let span = self.dilation.checked_mul(kernel - 1).and_then(|x| x.checked_add(1));
        let Some(span) = span.filter(|s| *s <= input) else {
            return fail(format!(
                "a kernel of {kernel} with dilation {} does not fit in an axis of {input}",
                self.dilation
            ));
        };
        let rest = input - span;
        if !rest.is_multiple_of(self.stride) {
            return fail(format!(
                "{input} = {}*(output-1) + {span} has no whole-number solution",
                self.stride
            ));
        }
        Ok(rest / self.stride + 1)
    }

    /// Solves the kernel size from the input and output sizes (unpadded, dilated convolutions).
    /// No window (an output of 0) means a kernel of 0: a kernel that does not fit is no solution.
    pub fn solve_kernel(&self, input: usize, output: usize) -> Result<usize, NoSolution> {
        if output == 0 {
            return Ok(0);
        }
        let covered = self.stride.checked_mul(output - 1).and_then(|x| x.checked_add(1));
        let fits = covered.filter(|c| *c <= input && (input - c).is_multiple_of(self.dilation));
        let Some(covered) = fits else {
            return Err(NoSolution(format!(
                "{input} = {}*({output}-1) + {}*(kernel-1) + 1 has no whole-number solution",
                self.stride, self.dilation
            )));
        };
        Ok((input - covered) / self.dilation + 1)
    }

    /// The left padding of a padded convolution: half of the dilated kernel's extent beyond one
    /// position, rounded down (the extra position of an even kernel goes to the right).
    pub fn left_padding(dilation: usize, kernel: usize) -> usize {
        dilation.saturating_mul(kernel.saturating_sub(1)) / 2
    }
}

impl fmt::Display for SolvedDim {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.label {
            Some(l) => write!(f, "{l}={}", self.d),
            None => write!(f, "{}", self.d),
        }
    }
}

impl fmt::Display for Dim {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Dim::Var(v) => write!(f, "{v}"),
            Dim::Solved(s) => write!(f, "{s}"),
            Dim::Conv(c) => {
                if c.stride != 1 || c.dilation == 0 {
                    write!(f, "{}*", c.stride)?;
                }
                write!(f, "{}", c.output)?;
                if c.dilation > 0 {
                    write!(f, "+")?;
                    if c.dilation != 1 {
                        write!(f, "{}*", c.dilation)?;
                    }
                    write!(f, "{}", c.kernel)?;
                }
                if c.padded { write!(f, "(padded)") } else { Ok(()) }
            }
            Dim::Concat(parts) => {
                for (n, p) in parts.iter().enumerate() {
                    if n > 0 {
                        write!(f, "^")?;
                    }
                    write!(f, "{p}")?;
                }
                Ok(())
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn conv(stride: usize, out: Dim, dilation: usize, k: Dim, padded: bool) -> ConvDim {
        ConvDim { stride, output: out, dilation, kernel: k, padded }
    }

    #[test]
    fn conv_sizes_follow_the_contract() {
        // Valid convolution: Axon's 1 + h - r for stride 1.
        assert_eq!(conv(1, Dim::of(1024), 1, Dim::of(8), false).input_size(), Some(1031));
        // Pure stride.
        assert_eq!(conv(2, Dim::of(9), 0, Dim::of(0), false).input_size(), Some(18));
        // Padded: dimension preserving.
        assert_eq!(conv(1, Dim::of(5), 1, Dim::of(3), true).input_size(), Some(5));
        // Dilation.
        assert_eq!(conv(1, Dim::of(4), 2, Dim::of(3), false).input_size(), Some(8));
    }

    #[test]
    fn conv_solving_rejects_non_integers() {
        let stride_only = conv(2, Dim::of(0), 0, Dim::of(0), false);
        assert_eq!(stride_only.solve_output(18, 0), Ok(9));
        assert!(stride_only.solve_output(7, 0).is_err());
        // An empty axis is a whole number (0) of strides.
        assert_eq!(stride_only.solve_output(0, 0), Ok(0));
        let c = conv(1, Dim::of(0), 1, Dim::of(0), false);
        assert_eq!(c.solve_output(5, 2), Ok(4));
        assert!(c.solve_output(3, 5).is_err());
        assert_eq!(c.solve_kernel(5, 4), Ok(2));
        let d = conv(2, Dim::of(0), 2, Dim::of(0), false);
        assert!(d.solve_kernel(8, 3).is_err()); // 8 - 5 = 3 is odd
    }

    #[test]
    fn a_kernel_of_zero_has_no_window() {
        let c = conv(2, Dim::of(0), 1, Dim::of(0), false);
        // Whatever the input: no taps, no window.
        assert_eq!(c.solve_output(5, 0), Ok(0));
        assert_eq!(c.solve_output(0, 0), Ok(0));
        // No window means no taps (a kernel that does not fit is an error, not an empty output).
        assert_eq!(c.solve_kernel(5, 0), Ok(0));
        assert!(c.solve_output(2, 3).is_err());
        // The convolution does not determine its input.
        let windowless = conv(2, Dim::of(0), 1, Dim::of(0), false);
        assert!(windowless.is_windowless());
        assert_eq!(windowless.input_size(), None);
        assert!(!conv(2, Dim::of(3), 1, Dim::of(1), false).is_windowless());
        // A kernel of 1 is one tap: the input has stride*(out-1) + 1 positions.
        assert_eq!(conv(2, Dim::of(3), 1, Dim::of(1), false).input_size(), Some(5));
    }

    #[test]
    fn display_is_stable() {
        let c = Dim::Conv(Arc::new(conv(2, Dim::Var(DimVar(3)), 1, Dim::Var(DimVar(4)), false)));
        assert_eq!(c.to_string(), "2*$d3+$d4");
        let cat = Dim::Concat(vec![Dim::of(2), Dim::Var(DimVar(1)), Dim::labeled(3, "rgb")]);
        assert_eq!(cat.to_string(), "2^$d1^rgb=3");
    }

    #[test]
    fn padding_is_half_the_extent() {
        assert_eq!(ConvDim::left_padding(1, 3), 1);
        assert_eq!(ConvDim::left_padding(1, 2), 0);
        assert_eq!(ConvDim::left_padding(2, 3), 2);
    }

    #[test]
    fn padded_stride_one_is_its_output() {
        let v = Dim::Var(DimVar(0));
        let c = Dim::Conv(Arc::new(conv(1, v.clone(), 1, Dim::Var(DimVar(1)), true)));
        assert_eq!(c.normalized(), v);
        let strided = Dim::Conv(Arc::new(conv(2, Dim::of(3), 1, Dim::Var(DimVar(1)), true)));
        assert_eq!(strided.normalized(), Dim::of(6));
    }
}

//! Dynamic sizes: a batch axis whose size is chosen each time a routine runs.
//!
//! A training loop's last partial batch, an evaluation with another batch size and generation
//! with batch 1 would each need their own compiled routine if every size were fixed. A
//! [`DynDim`] (made by [`crate::Graph::dynamic`]) is a size known only when running, up to a
//! maximum: the gradual `Dyn` dimension of Migeed et al. A data tensor declared with one
//! ([`crate::Axes::dynamic_batch`]) has it as its first batch axis.
//!
//! Shape inference sizes the axis at its maximum, so every other size is inferred as usual and
//! buffers hold the largest batch. Then this pass follows the dynamic axis through the solved
//! projections of each operation, in the order the code is generated:
//!
//! - a product iterator that indexes a dynamic axis of an argument is *dynamic*: its loop runs
//!   `0..n` for the size `n` bound when the routine runs ([`Projections::dynamic`]), so one
//!   compiled routine serves every size up to the maximum;
//! - a result axis indexed by a dynamic iterator is dynamic, with the same size (and so is the
//!   gradient's), and a dynamic iterator absent from the result is reduced over `0..n` (a mean
//!   divides by the runtime size);
//! - a constant may be read along a dynamic axis (its cells are all alike), and so may a range
//!   along its first axis (a cell's value does not depend on that axis' size);
//! - a dynamic iterator that also indexes a fixed axis (size > 1) of another argument, two
//!   dynamic sizes meeting in one iterator, and a dynamic axis addressed by a fixed position,
//!   a convolution, a concatenation or a reshape that merges it with other axes are errors naming the operation, the tensors and the
//!   sizes: at run time such a program would mix rows that exist with rows that do not.
//!
//! A parameter never has a dynamic axis: its gradient sums the batch away.

use std::fmt;
use std::sync::Arc;

use rocannl_arrayjit::indexing::{AxisIndex, Projections, Symbol};

use crate::error::{Error, Result};

/// A size chosen when a routine runs, at most `max` (a dynamic batch).
///
/// ```
/// use rocannl_tensor::{Axes, Graph, Session};
/// let g = Graph::new();
/// let batch = g.dynamic("batch", 8);
/// let x = g.data("x", Axes::new().dynamic_batch(&batch).output(&[2]));
/// let y = x.mean("b|o => 0|o"); // the mean over the rows there are
/// let mut s = Session::new(&g).unwrap();
/// let r = s.forward(&[&y]).unwrap();
/// s.set_size(&batch, 3).unwrap();
/// s.write(&x, &[1.0, 10.0, 2.0, 20.0, 3.0, 30.0]).unwrap();
/// s.run(&r).unwrap();
/// assert_eq!(s.read(&y).unwrap(), vec![2.0, 20.0]);
/// s.set_size(&batch, 1).unwrap(); // the same routine, one row
/// s.write(&x, &[5.0, 50.0]).unwrap();
/// s.run(&r).unwrap();
/// assert_eq!(s.read(&y).unwrap(), vec![5.0, 50.0]);
/// ```
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct DynDim {
    pub(crate) name: Arc<str>,
    pub(crate) max: usize,
    pub(crate) symbol: Symbol,
}

impl DynDim {
    /// The name given at creation (used in messages).
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The largest size.
    pub fn max(&self) -> usize {
        self.max
    }
}

impl fmt::Display for DynDim {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}<={}", self.name, self.max)
    }
}

/// The dynamic sizes of a tensor's axes (memory order), `None` for a fixed axis.
pub type DynAxes = Vec<Option<DynDim>>;

/// One argument of an operation, as the pass sees it.
pub(crate) struct ArgAxes {
    pub label: String,
    pub dims: Vec<usize>,
    pub axes: DynAxes,
    /// Axes whose cells do not depend on their size (every axis of a constant, the first
    /// axis of a range): a dynamic iterator may read them at its first `n` positions.
    pub flexible: Vec<bool>,
}

/// Marks the dynamic iterators of an operation's projections (one projection, or one per
/// argument for a concatenation) and returns the dynamic axes of its result.
pub(crate) fn mark(
    op: &str,
    result: &str,
    ps: &mut [Projections],
    args: &[ArgAxes],
    per_argument: bool,
    seed: Option<&DynDim>,
) -> Result<DynAxes> {
    let mut out: DynAxes = vec![None; ps.first().map_or(0, |p| p.lhs_dims.len())];
    let mut lhs_fixed = vec![false; out.len()];
    for (k, p) in ps.iter_mut().enumerate() {
        let rhs_args: Vec<&ArgAxes> =
            if per_argument { vec![&args[k]] } else { args.iter().collect() };
        // Which iterators are dynamic, from the arguments' dynamic axes (and the result's first
        // axis for an operation that gives it a dynamic size).
        let (mut dynamic, seeded) = match seed {
            Some(d) => seed_iterator(op, result, p, d)?,
            None => (Vec::new(), None),
        };
        arg_iterators(op, &rhs_args, p, &mut dynamic)?;
        // Every axis a dynamic iterator reaches must be dynamic too (or broadcast, size 1).
        for (a, idx) in rhs_args.iter().zip(&p.project_rhs) {
            for (axis, i) in idx.iter().enumerate() {
                let from_seed = seeded.is_some_and(|s| *i == AxisIndex::Iterator(s));
                if from_seed || a.flexible.get(axis).copied().unwrap_or(false) {
                    continue;
                }
                check_reach(op, &dynamic, i, a.axes.get(axis).and_then(|d| d.as_ref()), || {
                    format!("axis {axis} of '{}' (size {})", a.label, a.dims[axis])
                })?;
            }
        }
        let lhs = ResultAxes { op, result, out: &mut out, fixed: &mut lhs_fixed };
        lhs.mark(p, &dynamic)?;
        p.dynamic = dynamic.iter().map(|(s, d)| (*s, d.symbol)).collect();
    }
    Ok(out)
}

/// The dynamic iterators of a projection and their sizes.
type DynIters = Vec<(Symbol, DynDim)>;

/// The iterator of the result's first axis, dynamic of size `d` (an operation that gives its
/// result a dynamic size); an error unless that axis is an iterator of `d`'s maximum size.
fn seed_iterator(
    op: &str,
    result: &str,
    p: &Projections,
    d: &DynDim,
) -> Result<(DynIters, Option<Symbol>)> {
    match (p.project_lhs.first(), p.lhs_dims.first()) {
        (Some(AxisIndex::Iterator(s)), Some(&size)) if size == d.max => {
            Ok((vec![(*s, d.clone())], Some(*s)))
        }
        _ => {
            let first = p.lhs_dims.first().map_or("none".to_string(), |s| s.to_string());
            Err(conflict(
                d,
                op,
                format!("the first axis of '{result}' must have size {}, not {first}", d.max),
            ))
        }
    }
}

/// Adds the iterators of the arguments' dynamic axes to `dynamic`: each must be a plain
/// iterator, and one iterator takes one dynamic size.
fn arg_iterators(
    op: &str,
    rhs_args: &[&ArgAxes],
    p: &Projections,
    dynamic: &mut DynIters,
) -> Result<()> {
    for (a, idx) in rhs_args.iter().zip(&p.project_rhs) {
        for (axis, (d, i)) in a.axes.iter().zip(idx).enumerate() {
            let Some(d) = d else { continue };
            let AxisIndex::Iterator(s) = i else {
                return Err(conflict(
                    d,
                    op,
                    format!(
                        "axis {axis} of '{}' is addressed as `{i}` (a fixed position, a \
                         convolution or a concatenation), which needs its size when compiling",
                        a.label
                    ),
                ));
            };
            match dynamic.iter().find(|(t, _)| t == s) {
                Some((_, other)) if other != d => {
                    return Err(conflict(
                        d,
                        op,
                        format!(
                            "axis {axis} of '{}' is iterated together with the dynamic size \
                             `{other}`; two dynamic sizes must not meet",
                            a.label
                        ),
                    ));
                }
                Some(_) => {}
                None => dynamic.push((*s, d.clone())),
            }
        }
    }
    Ok(())
}

/// The dynamic axes of an operation's result as its projections are marked one by one, and
/// which axes a projection has already made fixed (larger than 1, not dynamic).
struct ResultAxes<'a> {
    op: &'a str,
    result: &'a str,
    out: &'a mut DynAxes,
    fixed: &'a mut [bool],
}

impl ResultAxes<'_> {
    /// Marks the result axes one projection's dynamic iterators reach; a fixed axis and a
    /// dynamic one (or two dynamic sizes) must not meet on one axis.
    fn mark(self, p: &Projections, dynamic: &[(Symbol, DynDim)]) -> Result<()> {
        let (op, result) = (self.op, self.result);
        for (axis, i) in p.project_lhs.iter().enumerate() {
            let reached =
                dynamic.iter().find(|(s, _)| matches!(i, AxisIndex::Iterator(t) if t == s));
            match reached {
                Some((_, d)) => {
                    if self.fixed[axis] {
                        return Err(fixed_meets(d, op, &format!("axis {axis} of '{result}'")));
                    }
                    // Parts of a concatenation fill one result axis: one dynamic size for all.
                    if let Some(prev) = self.out[axis].as_ref().filter(|prev| *prev != d) {
                        return Err(conflict(
                            d,
                            op,
                            format!(
                                "axis {axis} of '{result}' also has the dynamic size `{prev}`; two \
                                 dynamic sizes must not meet"
                            ),
                        ));
                    }
                    self.out[axis] = Some(d.clone());
                }
                None => {
                    check_reach(op, dynamic, i, None, || format!("axis {axis} of '{result}'"))?;
                    if let Some(d) = &self.out[axis]
                        && p.lhs_dims[axis] > 1
                    {
                        return Err(fixed_meets(d, op, &format!("axis {axis} of '{result}'")));
                    }
                    self.fixed[axis] = p.lhs_dims[axis] > 1;
                }
            }
        }
        Ok(())
    }
}

/// Checks one index against the dynamic iterators: an axis indexed by a dynamic iterator must
/// be dynamic itself (`own` is its dynamic size, if any), and no dynamic iterator may take part
/// in an affine index.
fn check_reach(
    op: &str,
    dynamic: &[(Symbol, DynDim)],
    i: &AxisIndex,
    own: Option<&DynDim>,
    what: impl Fn() -> String,
) -> Result<()> {
    for (s, d) in dynamic {
        match i {
            AxisIndex::Iterator(t) if t == s && own.is_none() => {
                return Err(fixed_meets(d, op, &what()));
            }
            AxisIndex::Affine { terms, .. } if terms.iter().any(|(_, t)| t == s) => {
                return Err(conflict(
                    d,
                    op,
                    format!(
                        "{} is addressed as `{i}` (a convolution, a concatenation, or a \
                         reshape merging it with other axes), which needs the size when \
                         compiling; a reshape may keep a dynamic axis first, as it is",
                        what()
                    ),
                ));
            }
            _ => {}
        }
    }
    Ok(())
}

fn fixed_meets(d: &DynDim, op: &str, what: &str) -> Error {
    conflict(
        d,
        op,
        format!(
            "it meets {what}, which has a fixed size: declare that tensor with the same dynamic \
             size, or give the axis size 1 to broadcast"
        ),
    )
}

fn conflict(d: &DynDim, op: &str, message: String) -> Error {
    Error::Dynamic { dim: d.to_string(), op: op.to_string(), message }
}

/// The number of cells of a tensor of `dims` at the current sizes of its dynamic axes.
pub(crate) fn current_dims(
    dims: &[usize],
    axes: &[Option<DynDim>],
    size: impl Fn(&DynDim) -> usize,
) -> Vec<usize> {
    dims.iter()
        .enumerate()
        .map(|(k, &d)| axes.get(k).and_then(|a| a.as_ref()).map_or(d, &size))
        .collect()
}

/// Copies the cells of a full buffer of `dims` that lie within `now` (each axis cut to its
/// current size), in row-major order.
pub(crate) fn trim(values: &[f64], dims: &[usize], now: &[usize]) -> Vec<f64> {
    let mut out = Vec::with_capacity(now.iter().product());
    each_cell(dims, now, &mut |full| out.push(values[full]));
    out
}

/// Spreads `values` (row-major over `now`) into a zeroed buffer of `dims`.
pub(crate) fn spread(values: &[f64], dims: &[usize], now: &[usize]) -> Vec<f64> {
    let mut out = vec![0.0; dims.iter().product()];
    let mut k = 0;
    each_cell(dims, now, &mut |full| {
        out[full] = values[k];
        k += 1;
    });
    out
}

/// Calls `f` with the offset in a buffer of `dims` of every cell within `now`, in row-major
/// order of `now`.
fn each_cell(dims: &[usize], now: &[usize], f: &mut impl FnMut(usize)) {
    if now.contains(&0) {
        return;
    }
    let strides = rocannl_arrayjit::tnode::row_major_strides(dims);
    let mut idx = vec![0usize; now.len()];
    loop {
        f(idx.iter().zip(&strides).map(|(i, s)| i * s).sum());
        let mut axis = now.len();
        loop {
            if axis == 0 {
                return;
            }
            axis -= 1;
            idx[axis] += 1;
            if idx[axis] < now[axis] {
                break;
            }
            idx[axis] = 0;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn trimming_and_spreading_are_inverse_on_the_kept_cells() {
        let dims = [4, 3];
        let full: Vec<f64> = (0..12).map(f64::from).collect();
        let kept = trim(&full, &dims, &[2, 3]);
        assert_eq!(kept, vec![0.0, 1.0, 2.0, 3.0, 4.0, 5.0]);
        let back = spread(&kept, &dims, &[2, 3]);
        assert_eq!(&back[..6], &full[..6]);
        assert!(back[6..].iter().all(|v| *v == 0.0));
        // A dynamic axis in the middle: [2, 4, 2] cut to [2, 1, 2].
        let full: Vec<f64> = (0..16).map(f64::from).collect();
        assert_eq!(trim(&full, &[2, 4, 2], &[2, 1, 2]), vec![0.0, 1.0, 8.0, 9.0]);
    }
}

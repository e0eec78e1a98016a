//! The session's side of dynamic sizes ([`crate::dynamic`]): the current size of each, the
//! dynamic axes of every tensor as its projections are derived, and reads and writes of the
//! current rows. Kept apart from `dynamic.rs`, which knows nothing of sessions, so that the
//! session can use its types without a circle of imports.

use rocannl_arrayjit::NdArray;
use rocannl_arrayjit::indexing::{Projections, Symbol};

use crate::dynamic::{ArgAxes, DynAxes, DynDim, current_dims, mark, spread, trim};
use crate::error::{Error, Result};
use crate::graph::{Leaf, Source, Tensor, TensorId};
use crate::session::Session;

impl Session {
    /// Sets the current value of a dynamic size (1 to its maximum); routines run afterwards
    /// use it, and tensors with that axis are written and read with that many rows.
    ///
    /// ```
    /// use rocannl_tensor::{Axes, Graph, Session};
    /// let g = Graph::new();
    /// let batch = g.dynamic("batch", 4);
    /// let x = g.data("x", Axes::new().dynamic_batch(&batch));
    /// let _ = x.scale(2.0);
    /// let mut s = Session::new(&g).unwrap();
    /// assert_eq!(s.size(&batch), 4);
    /// let err = s.set_size(&batch, 5).unwrap_err().to_string();
    /// assert!(err.contains("batch") && err.contains("5"), "{err}");
    /// ```
    pub fn set_size(&mut self, d: &DynDim, n: usize) -> Result<()> {
        if n == 0 || n > d.max {
            return Err(Error::usage(format!(
                "size {n} for the dynamic size `{}`: it takes 1 to {}",
                d.name, d.max
            )));
        }
        self.sizes.insert(d.symbol, n);
        Ok(())
    }

    /// The current value of a dynamic size (its maximum until set).
    pub fn size(&self, d: &DynDim) -> usize {
        self.sizes.get(&d.symbol).copied().unwrap_or(d.max)
    }

    /// `bindings` and the current value of every dynamic size of the graph.
    pub(crate) fn with_sizes(&self, bindings: &[(Symbol, i64)]) -> Vec<(Symbol, i64)> {
        let mut all = bindings.to_vec();
        for d in &self.graph().borrow().dyn_dims {
            if !all.iter().any(|(s, _)| *s == d.symbol) {
                all.push((d.symbol, self.size(d) as i64));
            }
        }
        all
    }

    /// The dynamic axes of a tensor: declared for data, derived with its projections for an
    /// operation's result.
    pub(crate) fn axes_of(&mut self, t: TensorId) -> Result<DynAxes> {
        if let Some(a) = self.dyn_axes.get(&t) {
            return Ok(a.clone());
        }
        let (declared, leaf) = {
            let g = self.graph().borrow();
            let info = &g.nodes[t.0 as usize];
            (g.dynamic.get(&t).cloned(), matches!(info.source, Source::Leaf(_)))
        };
        if leaf {
            let rank = self.graph().tensor(t).dims()?.len();
            let mut axes = vec![None; rank];
            if let (Some(d), Some(first)) = (declared, axes.first_mut()) {
                *first = Some(d);
            }
            self.dyn_axes.insert(t, axes.clone());
            return Ok(axes);
        }
        // An operation's axes come with its projections, derived after its arguments'.
        for u in self.topo(&[t]) {
            self.projections(u)?;
        }
        Ok(self.dyn_axes.get(&t).cloned().unwrap_or_default())
    }

    /// Marks the dynamic iterators of the projections of `t`'s operation and records the
    /// dynamic axes of `t`.
    pub(crate) fn mark_dynamic(
        &mut self,
        t: TensorId,
        ps: &mut [Projections],
        per_argument: bool,
    ) -> Result<()> {
        let (args, result, op) = match &self.graph().borrow().nodes[t.0 as usize].source {
            Source::Op { args, op } => (args.clone(), self.graph().tensor(t).label(), op.name()),
            Source::Leaf(_) => return Ok(()),
        };
        let mut arg_axes = Vec::with_capacity(args.len());
        for a in &args {
            let axes = match self.dyn_axes.get(a) {
                Some(axes) => axes.clone(),
                None => self.axes_of(*a)?,
            };
            let tensor = self.graph().tensor(*a);
            let dims = tensor.dims()?;
            let flexible: Vec<bool> = match tensor.info().source {
                Source::Leaf(Leaf::Constant(_)) => vec![true; dims.len()],
                Source::Leaf(Leaf::Iota) => (0..dims.len()).map(|k| k == 0).collect(),
                _ => vec![false; dims.len()],
            };
            arg_axes.push((tensor.label(), dims, axes, flexible));
        }
        let views: Vec<ArgAxes> = arg_axes
            .into_iter()
            .map(|(label, dims, axes, flexible)| ArgAxes { label, dims, axes, flexible })
            .collect();
        let what = format!("{op} '{result}'");
        let seed = match &self.graph().borrow().nodes[t.0 as usize].source {
            Source::Op { op, .. } => op.dynamic_rows(),
            Source::Leaf(_) => None,
        };
        let axes = mark(&what, &result, ps, &views, per_argument, seed.as_ref())?;
        self.dyn_axes.insert(t, axes);
        Ok(())
    }

    /// The current sizes of `t`'s axes, if it has a dynamic one.
    fn current(&self, t: TensorId, dims: &[usize]) -> Option<Vec<usize>> {
        let Some(axes) = self.dyn_axes.get(&t) else {
            // A dynamic data tensor read before anything derived its axes: its first axis.
            let d = self.graph().borrow().dynamic.get(&t).cloned()?;
            let mut now = dims.to_vec();
            *now.first_mut()? = self.size(&d);
            return Some(now);
        };
        axes.iter().any(Option::is_some).then(|| current_dims(dims, axes, |d| self.size(d)))
    }

    /// A dynamic tensor's values spread into its full buffer (`None` for a fixed tensor).
    pub(crate) fn spread_dynamic(
        &mut self,
        t: &Tensor,
        dims: &[usize],
        values: &[f64],
    ) -> Result<Option<Vec<f64>>> {
        if self.graph().borrow().dyn_dims.is_empty() {
            return Ok(None);
        }
        self.axes_of(t.id)?;
        let Some(now) = self.current(t.id, dims) else { return Ok(None) };
        let cells: usize = now.iter().product();
        if values.len() != cells {
            return Err(Error::usage(format!(
                "'{}' takes {cells} values at its current size {now:?} (dynamic axes at their \
                 current size), got {}",
                t.label(),
                values.len()
            )));
        }
        Ok(Some(spread(values, dims, &now)))
    }

    /// A buffer's values cut to the current size of the tensor's dynamic axes.
    pub(crate) fn trim_dynamic(&self, t: TensorId, values: Vec<f64>) -> Result<Vec<f64>> {
        let dims = self.graph().tensor(t).dims()?;
        Ok(match self.current(t, &dims) {
            Some(now) => trim(&values, &dims, &now),
            None => values,
        })
    }

    /// [`Session::trim_dynamic`] for an array in the session's precision (exact: every value
    /// is already representable in it).
    pub(crate) fn trim_dynamic_array(&self, t: TensorId, arr: NdArray) -> Result<NdArray> {
        let dims = self.graph().tensor(t).dims()?;
        match self.current(t, &dims) {
            Some(now) => {
                Ok(NdArray::from_f64(self.prec(), &now, &trim(&arr.to_f64_vec(), &dims, &now))?)
            }
            None => Ok(arr),
        }
    }
}

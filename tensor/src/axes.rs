//! [`Axes`]: the one way to declare a tensor's rows, used alike by data, ids, constants,
//! params ([`crate::ParamSpec`]) and reshapes ([`crate::Tensor::reshape`]).
//!
//! A shape has three rows, `batch|input->output`, and each leaf or reshape declares some of
//! them. Positional slice triples (`&[64], &[], &[3]`) read as three anonymous lists and differ
//! from the builders used elsewhere; a builder names every row it sets, and a row it does not
//! set takes the meaning of where it is used: no axes for host data and constants (their sizes
//! are all known), inferred for a param (except its batch row, which is empty), kept for a
//! reshape. A size given as `None` (the `_partial` forms) is left to inference, which params
//! and reshapes allow and data does not. A leading dynamic batch axis
//! ([`Axes::dynamic_batch`]) is for data and ids only.

use rocannl_shape::inference::{RowDecl, ShapeDecl};

use crate::dynamic::DynDim;
use crate::graph::Rows;

/// A declaration of a tensor's rows; see the module docs for what a row not set means.
///
/// ```
/// use rocannl_tensor::{Axes, Graph, ParamSpec};
/// let g = Graph::new();
/// let x = g.data("x", Axes::new().batch(&[4]).output(&[3])); // 4|->3
/// let w = g.param("w", ParamSpec::new(Axes::new().output(&[2]))); // input inferred: 3
/// let y = w.matmul(&x);
/// g.finish().unwrap();
/// assert_eq!((w.shape_string(), y.shape_string()), ("|3->2".into(), "4|->2".into()));
/// ```
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Axes {
    /// Batch, input, output: `None` when not set; a `None` size is left to inference.
    rows: [Option<Vec<Option<usize>>>; 3],
    /// A leading dynamic batch axis.
    dynamic: Option<DynDim>,
}

/// The index of each row in [`Axes::rows`].
const BATCH: usize = 0;
const INPUT: usize = 1;
const OUTPUT: usize = 2;
const NAMES: [&str; 3] = ["batch", "input", "output"];

impl Axes {
    /// No row set.
    pub fn new() -> Axes {
        Axes::default()
    }

    fn set(mut self, row: usize, dims: Vec<Option<usize>>) -> Axes {
        self.rows[row] = Some(dims);
        self
    }

    /// The batch row's sizes (after the dynamic axis, when there is one).
    pub fn batch(self, dims: &[usize]) -> Axes {
        self.set(BATCH, dims.iter().copied().map(Some).collect())
    }

    /// The batch row's number of axes, with the `None` sizes inferred.
    pub fn batch_partial(self, dims: &[Option<usize>]) -> Axes {
        self.set(BATCH, dims.to_vec())
    }

    /// The input row's sizes (`&[]`: no input axes).
    pub fn input(self, dims: &[usize]) -> Axes {
        self.set(INPUT, dims.iter().copied().map(Some).collect())
    }

    /// The input row's number of axes, with the `None` sizes inferred.
    pub fn input_partial(self, dims: &[Option<usize>]) -> Axes {
        self.set(INPUT, dims.to_vec())
    }

    /// The output row's sizes (`&[]`: no output axes).
    pub fn output(self, dims: &[usize]) -> Axes {
        self.set(OUTPUT, dims.iter().copied().map(Some).collect())
    }

    /// The output row's number of axes, with the `None` sizes inferred.
    pub fn output_partial(self, dims: &[Option<usize>]) -> Axes {
        self.set(OUTPUT, dims.to_vec())
    }

    /// A first batch axis of the size `dim` chosen when a routine runs, before the axes
    /// [`Axes::batch`] gives: for data and ids ([`crate::Graph::dynamic`]).
    pub fn dynamic_batch(mut self, dim: &DynDim) -> Axes {
        self.dynamic = Some(dim.clone());
        self
    }

    /// The dynamic batch axis, if any.
    pub(crate) fn dynamic(&self) -> Option<&DynDim> {
        self.dynamic.as_ref()
    }

    /// Whether each row is set (reshape keeps the rows that are not).
    pub(crate) fn is_set(&self) -> [bool; 3] {
        self.rows.each_ref().map(Option::is_some)
    }

    /// The number of sizes left to inference.
    pub(crate) fn open_sizes(&self) -> usize {
        self.rows.iter().flatten().flatten().filter(|d| d.is_none()).count()
    }

    /// The rows of data, ids or constants: a row not set has no axes, and every size must be
    /// given (else the message says which row of `what` lacks one).
    pub(crate) fn known(&self, what: &str) -> Result<Rows, String> {
        let mut rows: [Vec<usize>; 3] = Default::default();
        for (i, row) in self.rows.iter().enumerate() {
            let dims = row.as_deref().unwrap_or(&[]);
            rows[i] = dims.iter().copied().collect::<Option<Vec<usize>>>().ok_or_else(|| {
                format!("{what}: its {} row leaves a size to inference; give every size", NAMES[i])
            })?;
        }
        if let Some(d) = &self.dynamic {
            rows[BATCH].insert(0, d.max);
        }
        let [batch, input, output] = rows;
        Ok(Rows { batch, input, output })
    }

    /// The rows as a param or a reshape declares them: a row not set is `unset` (a param's
    /// batch row has no axes unless set).
    pub(crate) fn declared(&self, unset: [RowDecl; 3]) -> ShapeDecl {
        let [b, i, o] = unset;
        let decl = |row: usize, unset: RowDecl| match &self.rows[row] {
            None => unset,
            Some(d) => match d.iter().copied().collect::<Option<Vec<usize>>>() {
                Some(given) => RowDecl::Given(given),
                None => RowDecl::Partial(d.clone()),
            },
        };
        ShapeDecl { batch: decl(BATCH, b), input: decl(INPUT, i), output: decl(OUTPUT, o) }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rows_not_set_are_empty_for_known_shapes_and_as_asked_otherwise() {
        let a = Axes::new().batch(&[4]).output(&[3]);
        assert_eq!(a.known("x").unwrap(), Rows { batch: vec![4], input: vec![], output: vec![3] });
        let inferred = [RowDecl::Given(vec![]), RowDecl::Inferred, RowDecl::Inferred];
        let d = a.declared(inferred);
        assert_eq!(d.input, RowDecl::Inferred);
        assert_eq!(d.output, RowDecl::Given(vec![3]));
        let p = Axes::new().input_partial(&[Some(2), None]);
        assert!(p.known("data 'x'").unwrap_err().contains("data 'x': its input row"));
        assert_eq!(p.open_sizes(), 1);
        assert_eq!(p.is_set(), [false, true, false]);
    }

    /// What only data and ids take, and what data cannot leave open, are usage errors naming
    /// the tensor.
    #[test]
    fn misplaced_declarations_are_errors_naming_the_tensor() {
        use crate::{Graph, ParamSpec};
        let g = Graph::new();
        let batch = g.dynamic("batch", 8);
        let _ = g.param("w", ParamSpec::new(Axes::new().dynamic_batch(&batch)));
        let e = g.finish().unwrap_err().to_string();
        assert!(e.contains("param 'w'") && e.contains("dynamic batch axis"), "{e}");
        let g = Graph::new();
        let _ = g.data("x", Axes::new().output_partial(&[None]));
        let e = g.finish().unwrap_err().to_string();
        assert!(e.contains("data 'x'") && e.contains("output row"), "{e}");
        let g = Graph::new();
        let x = g.data("x", Axes::new().output(&[4]));
        let _ = x.reshape(&Axes::new().dynamic_batch(&g.dynamic("b", 4)));
        assert!(g.finish().unwrap_err().to_string().contains("reshape"));
    }
}

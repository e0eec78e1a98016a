//! Rows: the axes of one kind (batch, input or output) of a shape.
//!
//! A row is `beg_dims ++ <row variable> ++ dims` when it can still grow ([`Bcast::Var`]), or just
//! `dims` when it cannot ([`Bcast::Broadcastable`]). Substituting a row variable splices its
//! value between `beg_dims` and `dims`: broadcasting happens "in the middle", keeping both the
//! given leading and the given trailing axes fixed. Rows without leading axes broadcast like
//! NumPy (extra axes on the left).
//!
//! A [`Shape`] is three rows, one of each [`Kind`].

use std::fmt;
use std::sync::Arc;

use crate::dim::Dim;
use crate::var::{RowVar, ShapeId};

/// How many times inference may grow a row by expanding its row variable. Each expansion adds
/// at least one axis, so this bounds the rank of inferred rows (NumPy's limit on the rank of an
/// array is the same; 64 axes larger than 1 already exceed the addressable elements). Without
/// it, constraints that make a row contain itself and more axes, through a chain of variables,
/// would grow the row forever.
pub const MAX_ROW_AXES: usize = 64;

/// The three kinds of rows of a shape.
#[derive(Copy, Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Kind {
    /// Batch axes: outermost in memory.
    Batch,
    /// Input axes: innermost in memory; contracted by compose (`*`).
    Input,
    /// Output axes: between batch and input in memory.
    Output,
}

impl Kind {
    /// All kinds, in the order of the `batch|input->output` notation.
    pub const ALL: [Kind; 3] = [Kind::Batch, Kind::Input, Kind::Output];

    /// The kind's name as used in messages and JSON.
    pub fn name(self) -> &'static str {
        match self {
            Kind::Batch => "batch",
            Kind::Input => "input",
            Kind::Output => "output",
        }
    }
}

/// Which row of which shape a row is (for messages).
#[derive(Copy, Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct RowId {
    /// The shape the row belongs to.
    pub shape: ShapeId,
    /// The kind of the row.
    pub kind: Kind,
}

/// Whether a row can have more axes.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum Bcast {
    /// The row is `beg_dims ++ v ++ dims`: the row variable `v` stands for further axes.
    Var {
        /// The variable standing for the middle axes.
        v: RowVar,
        /// Axes fixed at the start of the row.
        beg_dims: Vec<Dim>,
    },
    /// The row has exactly its `dims`.
    Broadcastable,
}

/// A row of axes.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Row {
    /// The trailing axes (all axes when the row is [`Bcast::Broadcastable`]).
    pub dims: Vec<Dim>,
    /// Whether and how the row can grow.
    pub bcast: Bcast,
    /// Which row this is.
    pub id: RowId,
}

impl Row {
    /// A row of exactly these axes.
    pub fn fixed(dims: Vec<Dim>, id: RowId) -> Row {
        Row { dims, bcast: Bcast::Broadcastable, id }
    }

    /// A row that is just a row variable.
    pub fn of_var(v: RowVar, id: RowId) -> Row {
        Row { dims: vec![], bcast: Bcast::Var { v, beg_dims: vec![] }, id }
    }

    /// A row with no axes and no row variable.
    pub fn empty(id: RowId) -> Row {
        Row::fixed(vec![], id)
    }

    /// The row variable, if any.
    pub fn var(&self) -> Option<RowVar> {
        match &self.bcast {
            Bcast::Var { v, .. } => Some(*v),
            Bcast::Broadcastable => None,
        }
    }

    /// The leading fixed axes (empty for broadcastable rows).
    pub fn beg_dims(&self) -> &[Dim] {
        match &self.bcast {
            Bcast::Var { beg_dims, .. } => beg_dims,
            Bcast::Broadcastable => &[],
        }
    }

    /// The number of axes known to be in the row.
    pub fn num_fixed(&self) -> usize {
        self.beg_dims().len() + self.dims.len()
    }

    /// All fixed axes, leading then trailing.
    pub fn all_dims(&self) -> Vec<Dim> {
        let mut v = self.beg_dims().to_vec();
        v.extend(self.dims.iter().cloned());
        v
    }

    /// Whether the row is exactly `[]`.
    pub fn is_empty_fixed(&self) -> bool {
        self.dims.is_empty() && self.bcast == Bcast::Broadcastable
    }

    /// Whether all axes are known and there is no row variable.
    pub fn is_ground(&self) -> bool {
        self.bcast == Bcast::Broadcastable && self.dims.iter().all(|d| d.size().is_some())
    }

    /// The sizes of a ground row.
    pub fn sizes(&self) -> Option<Vec<usize>> {
        if self.bcast != Bcast::Broadcastable {
            return None;
        }
        self.dims.iter().map(Dim::size).collect()
    }

    /// Applies `f` to every dimension.
    pub fn map_dims(&self, f: &mut impl FnMut(&Dim) -> Dim) -> Row {
        let bcast = match &self.bcast {
            Bcast::Var { v, beg_dims } => {
                Bcast::Var { v: *v, beg_dims: beg_dims.iter().map(&mut *f).collect() }
            }
            Bcast::Broadcastable => Bcast::Broadcastable,
        };
        Row { dims: self.dims.iter().map(f).collect(), bcast, id: self.id }
    }

    /// Splices `value` in place of this row's variable `v` (a no-op if the variable differs).
    pub fn splice(&self, v: RowVar, value: &Row) -> Row {
        match &self.bcast {
            Bcast::Var { v: v2, beg_dims } if *v2 == v => {
                let mut dims = value.dims.clone();
                dims.extend(self.dims.iter().cloned());
                match &value.bcast {
                    Bcast::Broadcastable => {
                        let mut all = beg_dims.clone();
                        all.extend(dims);
                        Row { dims: all, bcast: Bcast::Broadcastable, id: self.id }
                    }
                    Bcast::Var { v: v3, beg_dims: more_beg } => {
                        let mut beg = beg_dims.clone();
                        beg.extend(more_beg.iter().cloned());
                        Row { dims, bcast: Bcast::Var { v: *v3, beg_dims: beg }, id: self.id }
                    }
                }
            }
            _ => self.clone(),
        }
    }
}

impl fmt::Display for Row {
    /// Axes separated by commas, the row variable as `..$rN..`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut parts: Vec<String> = self.beg_dims().iter().map(|d| d.to_string()).collect();
        if let Some(v) = self.var() {
            parts.push(format!("..{v}.."));
        }
        parts.extend(self.dims.iter().map(|d| d.to_string()));
        write!(f, "{}", parts.join(","))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::var::DimVar;

    fn id() -> RowId {
        RowId { shape: ShapeId(0), kind: Kind::Output }
    }

    #[test]
    fn splicing_keeps_leading_and_trailing_axes() {
        let r = Row {
            dims: vec![Dim::of(5)],
            bcast: Bcast::Var { v: RowVar(0), beg_dims: vec![Dim::of(2)] },
            id: id(),
        };
        assert_eq!(r.to_string(), "2,..$r0..,5");
        let value = Row {
            dims: vec![Dim::of(4)],
            bcast: Bcast::Var { v: RowVar(1), beg_dims: vec![Dim::of(3)] },
            id: id(),
        };
        assert_eq!(r.splice(RowVar(0), &value).to_string(), "2,3,..$r1..,4,5");
        let closed = Row::fixed(vec![Dim::Var(DimVar(7))], id());
        let spliced = r.splice(RowVar(0), &closed);
        assert_eq!(spliced.to_string(), "2,$d7,5");
        assert_eq!(spliced.num_fixed(), 3);
    }
}

/// A tensor shape: three rows, mutable so that partially inferred shapes can be observed. The
/// rows are shared with the constraints derived from the shape.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Shape {
    /// Batch axes.
    pub batch: Arc<Row>,
    /// Input axes.
    pub input: Arc<Row>,
    /// Output axes.
    pub output: Arc<Row>,
    /// The shape's id.
    pub id: ShapeId,
    /// The tensor's name, used in messages.
    pub debug_name: String,
}

impl Shape {
    /// The row of a kind.
    pub fn row(&self, kind: Kind) -> &Arc<Row> {
        match kind {
            Kind::Batch => &self.batch,
            Kind::Input => &self.input,
            Kind::Output => &self.output,
        }
    }

    /// The rows in memory order: batch, output, input.
    pub fn memory_rows(&self) -> [&Row; 3] {
        [self.batch.as_ref(), self.output.as_ref(), self.input.as_ref()]
    }

    /// The dimensions in memory order, when all are known.
    pub fn dims(&self) -> Option<Vec<usize>> {
        let mut out = Vec::new();
        for r in self.memory_rows() {
            out.extend(r.sizes()?);
        }
        Some(out)
    }
}

impl fmt::Display for Shape {
    /// `batch|input->output`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}|{}->{}", self.batch, self.input, self.output)
    }
}

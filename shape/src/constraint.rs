//! Constraints between rows and dimensions, as produced by the operations of a tensor graph.
//!
//! Equations come from einsum-like specs of permutations and batch slicing; inequalities
//! `cur ≥ subr` come from broadcasting, with `cur` on the side of the super-tensor (the result)
//! and `subr` on the side of a sub-tensor (an argument). For dimensions `n ≥ m` means `n = m` or
//! `m = 1`; for rows it means `cur` has at least the axes of `subr`, each axis `≥`.
//!
//! Every constraint carries its [`Origin`] — the operations that produced it — so an error can
//! say which operations disagree.
//!
//! The rows of row constraints are shared (`Arc<Row>`): deriving, re-queuing or
//! deferring such a constraint, and binding a row variable whose value several bounds re-check,
//! copies a pointer rather than the row's axes.

use std::fmt;
use std::sync::Arc;

use crate::dim::Dim;
use crate::row::Row;
use crate::var::{DimVar, StepId};

/// A constraint on a single dimension variable beyond equations and inequalities.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum DimConstraint {
    /// Nothing known.
    Unconstrained,
    /// The axis has at least this many positions (from a fixed index `i`: `i + 1`).
    AtLeast(usize),
}

impl DimConstraint {
    /// Both constraints at once.
    pub fn conjunction(&self, other: &DimConstraint) -> DimConstraint {
        match (self, other) {
            (DimConstraint::Unconstrained, c) | (c, DimConstraint::Unconstrained) => c.clone(),
            (DimConstraint::AtLeast(a), DimConstraint::AtLeast(b)) => {
                DimConstraint::AtLeast(*a.max(b))
            }
        }
    }

    /// The lower bound, if any (an `AtLeast(1)` bounds nothing).
    pub fn lower_bound(&self) -> Option<usize> {
        match self {
            DimConstraint::AtLeast(n) if *n > 1 => Some(*n),
            _ => None,
        }
    }
}

/// The numerator of a [`RowConstraint::TotalElems`] constraint.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum TotalElems {
    /// A known number of elements.
    NumElems(usize),
    /// `coeff * var / denom` elements, for a dimension variable `var` not known yet.
    StridedVar {
        /// The multiplier.
        coeff: usize,
        /// The variable.
        var: DimVar,
        /// The divisor.
        denom: usize,
    },
}

/// A constraint on whole rows.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum RowConstraint {
    /// Nothing known.
    Unconstrained,
    /// The rows together have `numerator / Π divided_by` elements.
    TotalElems {
        /// The number of elements before dividing.
        numerator: TotalElems,
        /// Dimension variables the numerator is divided by.
        divided_by: Vec<DimVar>,
    },
    /// The rows concatenated are exactly these axes.
    Exact(Vec<Dim>),
}

/// The operations a constraint came from.
///
/// Most constraints come from one operation, which is stored inline (copying an origin then
/// costs nothing); joined origins share their list.
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash)]
pub struct Origin(Steps);

/// The steps of an origin, in one canonical form per list (so that equal lists compare equal).
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash)]
enum Steps {
    #[default]
    None,
    One(StepId),
    Many(Arc<[StepId]>),
}

impl Origin {
    /// The constraint came from one operation.
    pub fn step(s: StepId) -> Origin {
        Origin(Steps::One(s))
    }

    /// The operations, in the order they joined.
    pub fn steps(&self) -> &[StepId] {
        match &self.0 {
            Steps::None => &[],
            Steps::One(s) => std::slice::from_ref(s),
            Steps::Many(v) => v,
        }
    }

    /// The operations of both origins.
    pub fn join(&self, other: &Origin) -> Origin {
        let (mine, theirs) = (self.steps(), other.steps());
        if theirs.iter().all(|s| mine.contains(s)) {
            return self.clone();
        }
        let mut v: Vec<StepId> = mine.to_vec();
        v.extend(theirs.iter().filter(|s| !mine.contains(s)));
        Origin::of_steps(v)
    }

    fn of_steps(v: Vec<StepId>) -> Origin {
        Origin(match v.as_slice() {
            [] => Steps::None,
            [s] => Steps::One(*s),
            _ => Steps::Many(Arc::from(v)),
        })
    }
}

/// A constraint to solve.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum Constraint {
    /// `d1 = d2`.
    DimEq {
        /// Left side.
        d1: Dim,
        /// Right side.
        d2: Dim,
    },
    /// `r1 = r2`, no broadcasting.
    RowEq {
        /// Left side.
        r1: Arc<Row>,
        /// Right side.
        r2: Arc<Row>,
    },
    /// `cur ≥ subr`: `subr` broadcasts to `cur`.
    DimIneq {
        /// The super-tensor's side.
        cur: Dim,
        /// The sub-tensor's side.
        subr: Dim,
    },
    /// `cur ≥ subr` for rows.
    RowIneq {
        /// The super-tensor's side.
        cur: Arc<Row>,
        /// The sub-tensor's side.
        subr: Arc<Row>,
    },
    /// A constraint on one dimension.
    DimConstr {
        /// The dimension.
        d: Dim,
        /// What is known about it.
        constr: DimConstraint,
    },
    /// A constraint on the concatenation of several rows.
    RowsConstr {
        /// The rows, in memory order.
        rows: Vec<Row>,
        /// What is known about them.
        constr: RowConstraint,
    },
    /// A batch slice: the argument's batch row is `slot` followed by the result's batch row.
    /// It waits while both rows can still grow (as the seed says, until the batch row
    /// variables are solved): written as an equation right away, the argument's row would get
    /// `slot` as a known first axis in front of a row variable, and rows with known first axes
    /// line up with others from the left, which disagrees with broadcasting once the variable
    /// turns out shorter.
    BatchSlice {
        /// The result's batch row.
        cur: Arc<Row>,
        /// The argument's batch row.
        arg: Arc<Row>,
        /// The removed axis (indexed at the slice position).
        slot: Dim,
    },
    /// A dimension of a leaf tensor: closed to its least upper bound.
    TerminalDim(Dim),
    /// A row of a leaf tensor: closed to its least upper bound.
    TerminalRow(Arc<Row>),
    /// A row of some tensor of the graph, injected at the closing stages so that its
    /// remaining variables get closed. `from` counts the leading axes (beginning axes first)
    /// already known to be closed: closing a long row one variable at a time resumes there
    /// instead of rescanning the row.
    ShapeRow { row: Arc<Row>, from: usize },
}

/// A constraint with its origin.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Constr {
    /// The constraint.
    pub c: Constraint,
    /// Which operations produced it.
    pub origin: Origin,
}

impl Constraint {
    /// Attaches an origin.
    pub fn at(self, origin: &Origin) -> Constr {
        Constr { c: self, origin: origin.clone() }
    }
}

impl fmt::Display for DimConstraint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            DimConstraint::Unconstrained => write!(f, "unconstrained"),
            DimConstraint::AtLeast(n) => write!(f, ">= {n} positions"),
        }
    }
}

impl fmt::Display for TotalElems {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            TotalElems::NumElems(n) => write!(f, "{n}"),
            TotalElems::StridedVar { coeff, var, denom: 1 } => write!(f, "{coeff}*{var}"),
            TotalElems::StridedVar { coeff, var, denom } => write!(f, "{coeff}*{var}/{denom}"),
        }
    }
}

impl fmt::Display for RowConstraint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            RowConstraint::Unconstrained => write!(f, "unconstrained"),
            RowConstraint::TotalElems { numerator, divided_by } => {
                write!(f, "elements = {numerator}")?;
                for v in divided_by {
                    write!(f, "/{v}")?;
                }
                Ok(())
            }
            RowConstraint::Exact(dims) => {
                let ds: Vec<String> = dims.iter().map(|d| d.to_string()).collect();
                write!(f, "exactly [{}]", ds.join(","))
            }
        }
    }
}

impl fmt::Display for Constraint {
    /// A stable rendering used in solver traces and snapshots.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Constraint::DimEq { d1, d2 } => write!(f, "{d1} = {d2}"),
            Constraint::RowEq { r1, r2 } => write!(f, "[{r1}] = [{r2}]"),
            Constraint::DimIneq { cur, subr } => write!(f, "{cur} >= {subr}"),
            Constraint::RowIneq { cur, subr } => write!(f, "[{cur}] >= [{subr}]"),
            Constraint::DimConstr { d, constr } => write!(f, "{d} {constr}"),
            Constraint::RowsConstr { rows, constr } => {
                let rs: Vec<String> = rows.iter().map(|r| format!("[{r}]")).collect();
                write!(f, "{}: {constr}", rs.join(" "))
            }
            Constraint::BatchSlice { cur, arg, slot } => write!(f, "[{arg}] = {slot}, [{cur}]"),
            Constraint::TerminalDim(d) => write!(f, "terminal {d}"),
            Constraint::TerminalRow(r) => write!(f, "terminal [{r}]"),
            Constraint::ShapeRow { row, .. } => write!(f, "shape row [{row}]"),
        }
    }
}

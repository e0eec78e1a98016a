//! Inference variables: dimension variables, row variables and projection ids.
//!
//! All three are `u32` newtypes indexing the solver's tables, handed out by one [`VarGen`] per
//! inference problem, so there is no global counter and two problems never interfere. They
//! print with a sigil: `$d3` (a dimension), `$r2` (a row), `p7` (a projection id).

use std::fmt;

/// A dimension variable: the unknown size of one axis.
#[derive(Copy, Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct DimVar(pub u32);

/// A row variable: an unknown number of further axes of one row (rank polymorphism).
#[derive(Copy, Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct RowVar(pub u32);

/// A projection id: identifies one axis of one tensor access inside one assignment, so that
/// projection inference can tell apart two uses of the same tensor.
#[derive(Copy, Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct ProjId(pub u32);

/// The id of a shape (one per tensor node).
#[derive(Copy, Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct ShapeId(pub u32);

/// The id of an update step (one per operation instance).
#[derive(Copy, Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct StepId(pub u32);

impl From<DimVar> for usize {
    fn from(v: DimVar) -> usize {
        v.0 as usize
    }
}

impl From<RowVar> for usize {
    fn from(v: RowVar) -> usize {
        v.0 as usize
    }
}

impl fmt::Display for DimVar {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "$d{}", self.0)
    }
}

impl fmt::Display for RowVar {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "$r{}", self.0)
    }
}

impl fmt::Display for ProjId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "p{}", self.0)
    }
}

/// Hands out fresh variables of each kind.
///
/// ```
/// use rocannl_shape::var::VarGen;
/// let mut vars = VarGen::default();
/// assert_eq!(vars.dim().to_string(), "$d0");
/// assert_eq!(vars.dim().to_string(), "$d1");
/// assert_eq!(vars.row().to_string(), "$r0");
/// ```
#[derive(Clone, Debug, Default)]
pub struct VarGen {
    dims: u32,
    rows: u32,
    projs: u32,
}

impl VarGen {
    /// How many variables (dimension and row) were made so far: a measure of the graph's size.
    pub fn count(&self) -> u64 {
        u64::from(self.dims) + u64::from(self.rows)
    }

    /// A fresh dimension variable.
    pub fn dim(&mut self) -> DimVar {
        self.dims += 1;
        DimVar(self.dims - 1)
    }

    /// A fresh row variable.
    pub fn row(&mut self) -> RowVar {
        self.rows += 1;
        RowVar(self.rows - 1)
    }

    /// A fresh projection id.
    pub fn proj(&mut self) -> ProjId {
        self.projs += 1;
        ProjId(self.projs - 1)
    }

    /// How many dimension variables exist.
    pub fn num_dims(&self) -> usize {
        self.dims as usize
    }

    /// How many projection ids exist.
    pub fn num_projs(&self) -> usize {
        self.projs as usize
    }

    /// How many row variables exist.
    pub fn num_rows(&self) -> usize {
        self.rows as usize
    }
}

//! The environment: what is known about every variable.
//!
//! Each variable is either solved, or has *bounds*: the variables known to be `≥` it (`cur`),
//! the variables known to be `≤` it (`subr`), a least upper bound `lub` derived from the `cur`
//! sides of inequalities with the variable on the `subr` side, and a constraint (`constr`).
//! The `cur`/`subr` lists are kept symmetric (if `a` lists `b` in `subr`, `b` lists `a` in
//! `cur`), which gives the transitive closure of variable inequalities by graph reachability
//! and lets a solved variable visit just its neighbours.
//!
//! Rows (solved values and least upper bounds) are shared with the constraints that mention
//! them. Solved values are substituted lazily: [`Environment::subst_dim`] and
//! [`Environment::subst_row`] follow chains of solved variables, so solving a variable is
//! cheap and never rewrites the whole environment.

use std::borrow::Cow;
use std::fmt;
use std::sync::Arc;

use crate::constraint::{DimConstraint, Origin, RowConstraint};
use crate::dim::Dim;
use crate::row::{Bcast, Row};
use crate::var::{DimVar, RowVar};

/// The bounds of an unsolved variable of kind `V` (dimension or row variable) whose values
/// are `T` (dimensions or rows) and whose extra constraint is `C`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Bounds<V, T, C> {
    /// Variables known to be `≥` this one.
    pub cur: Vec<V>,
    /// Variables known to be `≤` this one.
    pub subr: Vec<V>,
    /// The least upper bound, with the operations it came from: for a dimension a solved size
    /// `> 1` every value must broadcast to; for a row a row that may itself hold variables.
    pub lub: Option<(T, Origin)>,
    /// Other knowledge: a lower bound from fixed indexing (dimensions), a constraint on the
    /// number of elements or the exact axes (rows).
    pub constr: Option<(C, Origin)>,
}

impl<V, T, C> Bounds<V, T, C> {
    /// Nothing known.
    pub const NONE: Self = Bounds { cur: Vec::new(), subr: Vec::new(), lub: None, constr: None };
}

impl<V, T, C> Default for Bounds<V, T, C> {
    fn default() -> Self {
        Self::NONE
    }
}

/// What is known about a variable: solved to a value (which may mention other variables), or
/// not known yet.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Entry<V, T, C> {
    /// The variable equals this value.
    Solved(T, Origin),
    /// The variable is not known yet.
    Bounds(Bounds<V, T, C>),
}

/// The bounds of an unsolved dimension variable.
pub type DimBounds = Bounds<DimVar, Dim, DimConstraint>;
/// What is known about a dimension variable.
pub type DimEntry = Entry<DimVar, Dim, DimConstraint>;
/// The bounds of an unsolved row variable.
pub type RowBounds = Bounds<RowVar, Arc<Row>, RowConstraint>;
/// What is known about a row variable.
pub type RowEntry = Entry<RowVar, Arc<Row>, RowConstraint>;

static NO_DIM_BOUNDS: DimBounds = Bounds::NONE;
static NO_ROW_BOUNDS: RowBounds = Bounds::NONE;

/// One kind of variable's entries, indexed by the variable's number.
#[derive(Clone, Debug)]
struct Table<V, T, C> {
    entries: Vec<Option<Entry<V, T, C>>>,
}

impl<V, T, C> Default for Table<V, T, C> {
    fn default() -> Self {
        Table { entries: Vec::new() }
    }
}

impl<V: Copy + PartialEq + Into<usize>, T: Clone, C: Clone> Table<V, T, C> {
    fn get(&self, v: V) -> Option<&Entry<V, T, C>> {
        self.entries.get(v.into()).and_then(Option::as_ref)
    }

    fn bounds(&self, v: V) -> Option<&Bounds<V, T, C>> {
        match self.get(v) {
            Some(Entry::Bounds(b)) => Some(b),
            _ => None,
        }
    }

    /// A variable's neighbours in the inequality graph: its `cur` (upward) or `subr` (downward)
    /// variables; none once it is solved.
    fn edges(&self, v: V, up: bool) -> &[V] {
        match self.bounds(v) {
            Some(b) if up => &b.cur,
            Some(b) => &b.subr,
            None => &[],
        }
    }

    fn slot(&mut self, v: V) -> &mut Option<Entry<V, T, C>> {
        let i = v.into();
        if self.entries.len() <= i {
            self.entries.resize_with(i + 1, || None);
        }
        &mut self.entries[i]
    }

    fn bounds_mut(&mut self, v: V) -> Option<&mut Bounds<V, T, C>> {
        match self.slot(v).get_or_insert_with(|| Entry::Bounds(Bounds::NONE)) {
            Entry::Bounds(b) => Some(b),
            Entry::Solved(..) => None,
        }
    }

    /// Records `v = value` and returns its former bounds, after removing `v` from its
    /// neighbours' lists.
    fn solve(&mut self, v: V, value: T, origin: Origin) -> Bounds<V, T, C> {
        let old = self.bounds_mut(v).map(std::mem::take).unwrap_or_default();
        for c in &old.cur {
            if let Some(b) = self.bounds_mut(*c) {
                b.subr.retain(|x| x != &v);
            }
        }
        for s in &old.subr {
            if let Some(b) = self.bounds_mut(*s) {
                b.cur.retain(|x| x != &v);
            }
        }
        *self.slot(v) = Some(Entry::Solved(value, origin));
        old
    }
}

/// All knowledge about the variables of one inference problem.
#[derive(Clone, Debug, Default)]
pub struct Environment {
    dims: Table<DimVar, Dim, DimConstraint>,
    rows: Table<RowVar, Arc<Row>, RowConstraint>,
    /// Incremented on every change; the solver uses it to detect progress.
    pub version: u64,
    /// Keep padded stride-1 convolutions as convolutions when substituting (projection
    /// inference, where they must not be identified with their output's index).
    pub keep_padded_conv: bool,
    /// Reused buffers of the reachability searches.
    dim_reach: Reach<DimVar>,
    /// The same for row variables.
    row_reach: Reach<RowVar>,
}

impl Environment {
    /// What is known about a dimension variable (`None`: nothing).
    pub fn dim_entry(&self, v: DimVar) -> Option<&DimEntry> {
        self.dims.get(v)
    }

    /// What is known about a row variable (`None`: nothing).
    pub fn row_entry(&self, v: RowVar) -> Option<&RowEntry> {
        self.rows.get(v)
    }

    /// The bounds of an unsolved dimension variable (empty bounds if nothing is known).
    pub fn dim_bounds(&self, v: DimVar) -> &DimBounds {
        self.dims.bounds(v).unwrap_or(&NO_DIM_BOUNDS)
    }

    /// The bounds of an unsolved row variable (empty bounds if nothing is known).
    pub fn row_bounds(&self, v: RowVar) -> &RowBounds {
        self.rows.bounds(v).unwrap_or(&NO_ROW_BOUNDS)
    }

    /// The bounds of an unsolved dimension variable, for updating in place (created empty if
    /// nothing was known; `None` if the variable is solved).
    pub fn dim_bounds_mut(&mut self, v: DimVar) -> Option<&mut DimBounds> {
        self.version += 1;
        self.dims.bounds_mut(v)
    }

    /// The bounds of an unsolved row variable, for updating in place.
    pub fn row_bounds_mut(&mut self, v: RowVar) -> Option<&mut RowBounds> {
        self.version += 1;
        self.rows.bounds_mut(v)
    }

    /// Replaces the bounds of an unsolved dimension variable.
    pub fn set_dim_bounds(&mut self, v: DimVar, b: DimBounds) {
        self.version += 1;
        *self.dims.slot(v) = Some(Entry::Bounds(b));
    }

    /// Records `v = value`, returning the bounds it had (so the caller can re-check them against
    /// the value) after removing `v` from its neighbours' lists.
    pub fn solve_dim(&mut self, v: DimVar, value: Dim, origin: Origin) -> DimBounds {
        self.version += 1;
        self.dims.solve(v, value, origin)
    }

    /// Records that row variable `v` stands for `value`, returning its former bounds.
    pub fn solve_row(&mut self, v: RowVar, value: Arc<Row>, origin: Origin) -> RowBounds {
        self.version += 1;
        self.rows.solve(v, value, origin)
    }

    /// The dimension with every solved variable substituted.
    #[inline]
    pub fn subst_dim(&self, d: &Dim) -> Dim {
        if self.dim_is_normal(d) { d.clone() } else { self.subst_dim_changed(d) }
    }

    /// [`Environment::subst_dim`] of a dimension that substitution changes.
    fn subst_dim_changed(&self, d: &Dim) -> Dim {
        if let Dim::Conv(c) = d {
            // A convolution whose parts are known becomes its size: computed without building
            // the substituted convolution (unless it collapses to its output instead).
            if !(c.padded && c.stride == 1 && !self.keep_padded_conv)
                && let Some(n) = self.dim_size(d)
            {
                return Dim::of(n);
            }
        }
        d.map_vars_with(
            &mut |v| match self.dim_entry(v) {
                Some(DimEntry::Solved(x, _)) => Some(self.subst_dim(x)),
                _ => None,
            },
            !self.keep_padded_conv,
        )
    }

    /// [`Environment::subst_dim`], borrowed unchanged when substitution would not change it.
    #[inline]
    pub fn subst_dim_cow<'d>(&self, d: &'d Dim) -> Cow<'d, Dim> {
        if self.dim_is_normal(d) { Cow::Borrowed(d) } else { Cow::Owned(self.subst_dim_changed(d)) }
    }

    /// Whether substitution (and the simplification of arithmetic dimensions that comes with
    /// it) would leave the dimension as it is.
    #[inline]
    pub fn dim_is_normal(&self, d: &Dim) -> bool {
        match d {
            Dim::Solved(_) => true,
            Dim::Var(v) => !matches!(self.dim_entry(*v), Some(DimEntry::Solved(..))),
            Dim::Conv(_) | Dim::Concat(_) => self.arithmetic_is_normal(d),
        }
    }

    /// [`Environment::dim_is_normal`] for a convolution or concatenation.
    fn arithmetic_is_normal(&self, d: &Dim) -> bool {
        match d {
            Dim::Solved(_) | Dim::Var(_) => self.dim_is_normal(d),
            Dim::Conv(c) => {
                !(c.padded && c.stride == 1 && !self.keep_padded_conv)
                    && self.dim_is_normal(&c.output)
                    && self.dim_is_normal(&c.kernel)
                    && c.input_size().is_none()
            }
            Dim::Concat(parts) => {
                parts.len() != 1
                    && parts.iter().any(|p| p.size().is_none())
                    && parts.iter().all(|p| self.dim_is_normal(p))
            }
        }
    }

    /// The row with every solved variable (dimension and row) substituted, borrowed unchanged
    /// when nothing in it is solved (the common case, which then costs no allocation).
    pub fn subst_row_cow<'r>(&self, r: &'r Row) -> Cow<'r, Row> {
        if self.row_is_normal(r) { Cow::Borrowed(r) } else { Cow::Owned(self.subst_row(r)) }
    }

    /// [`Environment::subst_row`] of a shared row: the same row when nothing in it is solved.
    pub fn subst_row_arc(&self, r: &Arc<Row>) -> Arc<Row> {
        if self.row_is_normal(r) { Arc::clone(r) } else { Arc::new(self.subst_row(r)) }
    }

    /// Whether substitution would leave the row as it is.
    pub fn row_is_normal(&self, r: &Row) -> bool {
        r.dims.iter().all(|d| self.dim_is_normal(d))
            && match &r.bcast {
                Bcast::Broadcastable => true,
                Bcast::Var { v, beg_dims } => {
                    !matches!(self.row_entry(*v), Some(RowEntry::Solved(..)))
                        && beg_dims.iter().all(|d| self.dim_is_normal(d))
                }
            }
    }

    /// The row with every solved variable (dimension and row) substituted.
    ///
    /// A solved row variable splices its value between the row's leading and trailing axes,
    /// and the value's own variable may be solved in turn: the chain is measured first, then
    /// the row is built once, leading axes outermost first and trailing axes innermost first.
    pub fn subst_row(&self, r: &Row) -> Row {
        if self.row_is_normal(r) {
            return r.clone();
        }
        let (mut n_beg, mut n_end, mut row) = (0, 0, r);
        let var = loop {
            n_end += row.dims.len();
            match &row.bcast {
                Bcast::Broadcastable => break None,
                Bcast::Var { v, beg_dims } => {
                    n_beg += beg_dims.len();
                    match self.row_entry(*v) {
                        Some(RowEntry::Solved(value, _)) => row = value.as_ref(),
                        _ => break Some(*v),
                    }
                }
            }
        };
        match var {
            None => {
                // All axes in one list: the leading ones are pushed before any trailing one.
                let mut dims = Vec::with_capacity(n_beg + n_end);
                self.fill_row(r, None, &mut dims);
                Row { dims, bcast: Bcast::Broadcastable, id: r.id }
            }
            Some(v) => {
                let mut beg = Vec::with_capacity(n_beg);
                let mut dims = Vec::with_capacity(n_end);
                self.fill_row(r, Some(&mut beg), &mut dims);
                Row { dims, bcast: Bcast::Var { v, beg_dims: beg }, id: r.id }
            }
        }
    }

    /// Pushes the substituted axes of a row chain: leading axes on the way in (to `beg`, or to
    /// `dims` when it is `None`), trailing axes on the way out.
    fn fill_row(&self, r: &Row, mut beg: Option<&mut Vec<Dim>>, dims: &mut Vec<Dim>) {
        if let Bcast::Var { v, beg_dims } = &r.bcast {
            let subst = beg_dims.iter().map(|d| self.subst_dim(d));
            match beg.as_deref_mut() {
                Some(b) => b.extend(subst),
                None => dims.extend(subst),
            }
            if let Some(RowEntry::Solved(value, _)) = self.row_entry(*v) {
                self.fill_row(value, beg, dims);
            }
        }
        dims.extend(r.dims.iter().map(|d| self.subst_dim(d)));
    }

    /// The origin recorded for a solved dimension variable, if any.
    pub fn dim_origin(&self, v: DimVar) -> Option<Origin> {
        match self.dim_entry(v) {
            Some(DimEntry::Solved(_, o)) => Some(o.clone()),
            Some(DimEntry::Bounds(b)) => b.lub.as_ref().map(|(_, o)| o.clone()),
            None => None,
        }
    }

    /// Whether `lo` is reachable from `hi` by following `subr` edges (`hi ≥ … ≥ lo`).
    pub fn dim_below(&mut self, hi: DimVar, lo: DimVar) -> bool {
        let dims = &self.dims;
        self.dim_reach.reachable(hi, lo, |v, up| dims.edges(v, up))
    }

    /// Whether row variable `lo` is reachable from `hi` by following `subr` edges.
    pub fn row_below(&mut self, hi: RowVar, lo: RowVar) -> bool {
        let rows = &self.rows;
        self.row_reach.reachable(hi, lo, |v, up| rows.edges(v, up))
    }

    /// Whether row variable `v` occurs in `row` after substitution (an occurs check).
    pub fn row_mentions(&self, row: &Row, v: RowVar) -> bool {
        self.subst_row(row).var() == Some(v)
    }

    /// Whether every axis of the row is known after substitution (no variable of any kind is
    /// left), checked without building the substituted row.
    pub fn row_is_known(&self, r: &Row) -> bool {
        let dims_known = r.dims.iter().all(|d| self.dim_is_known(d));
        dims_known
            && match &r.bcast {
                Bcast::Broadcastable => true,
                Bcast::Var { v, beg_dims } => {
                    beg_dims.iter().all(|d| self.dim_is_known(d))
                        && match self.row_entry(*v) {
                            Some(RowEntry::Solved(value, _)) => self.row_is_known(value),
                            _ => false,
                        }
                }
            }
    }

    /// The size of a dimension after substitution ([`Dim::size`] of
    /// [`Environment::subst_dim`]), computed without building the substituted dimension.
    pub fn dim_size(&self, d: &Dim) -> Option<usize> {
        match d {
            Dim::Solved(s) => Some(s.d),
            Dim::Var(v) => match self.dim_entry(*v) {
                Some(DimEntry::Solved(value, _)) => self.dim_size(value),
                _ => None,
            },
            Dim::Conv(c) => c.input_size_with(|p| self.dim_size(p)),
            Dim::Concat(parts) => {
                parts.iter().try_fold(0usize, |acc, p| acc.checked_add(self.dim_size(p)?))
            }
        }
    }

    /// Whether a dimension is known after substitution.
    pub fn dim_is_known(&self, d: &Dim) -> bool {
        match d {
            Dim::Solved(_) => true,
            Dim::Var(v) => match self.dim_entry(*v) {
                Some(DimEntry::Solved(value, _)) => self.dim_is_known(value),
                _ => false,
            },
            Dim::Conv(c) => {
                self.dim_is_known(&c.output) && (c.dilation == 0 || self.dim_is_known(&c.kernel))
            }
            Dim::Concat(parts) => parts.iter().all(|p| self.dim_is_known(p)),
        }
    }

    /// Whether `f` holds for some unsolved dimension variable of the row after substitution
    /// (those [`Environment::row_dim_vars`] lists), found without building the substituted row.
    pub fn row_any_dim_var(&self, r: &Row, f: &mut impl FnMut(DimVar) -> bool) -> bool {
        let in_dims = |ds: &[Dim], f: &mut dyn FnMut(DimVar) -> bool| {
            ds.iter().any(|d| self.dim_any_var(d, f))
        };
        if in_dims(&r.dims, f) {
            return true;
        }
        match &r.bcast {
            Bcast::Broadcastable => false,
            Bcast::Var { v, beg_dims } => {
                in_dims(beg_dims, f)
                    || match self.row_entry(*v) {
                        Some(RowEntry::Solved(value, _)) => self.row_any_dim_var(value, f),
                        _ => false,
                    }
            }
        }
    }

    /// Whether `f` holds for some unsolved variable of the dimension after substitution (those
    /// [`Dim::vars`] lists for the substituted dimension).
    fn dim_any_var(&self, d: &Dim, f: &mut dyn FnMut(DimVar) -> bool) -> bool {
        match d {
            Dim::Solved(_) => false,
            Dim::Var(v) => match self.dim_entry(*v) {
                Some(DimEntry::Solved(value, _)) => self.dim_any_var(value, f),
                _ => f(*v),
            },
            // An arithmetic dimension whose parts are all known has become a size; otherwise
            // its variables are those of its parts that count.
            Dim::Conv(c) => {
                self.dim_any_var(&c.output, f)
                    || (c.kernel_counts() && self.dim_any_var(&c.kernel, f))
            }
            Dim::Concat(parts) => parts.iter().any(|p| self.dim_any_var(p, f)),
        }
    }

    /// Every unsolved dimension variable mentioned by a row, after substitution.
    pub fn row_dim_vars(&self, row: &Row) -> Vec<DimVar> {
        let row = self.subst_row(row);
        let mut vs = Vec::new();
        for d in row.all_dims() {
            d.vars(&mut vs);
        }
        vs
    }
}

impl<V: fmt::Display, T: fmt::Display, C: fmt::Display> Table<V, T, C> {
    /// One line per entry; `var` names the variable of an index, `value` renders a value.
    fn write(
        &self,
        f: &mut fmt::Formatter<'_>,
        var: impl Fn(u32) -> V,
        value: impl Fn(&T) -> String,
    ) -> fmt::Result {
        fn list<V: fmt::Display>(vs: &[V]) -> String {
            let parts: Vec<String> = vs.iter().map(|v| v.to_string()).collect();
            format!("[{}]", parts.join(", "))
        }
        for (i, e) in self.entries.iter().enumerate() {
            let v = var(i as u32);
            match e {
                None => {}
                Some(Entry::Solved(x, _)) => writeln!(f, "{v} = {}", value(x))?,
                Some(Entry::Bounds(b)) => {
                    write!(f, "{v}:")?;
                    if !b.cur.is_empty() {
                        write!(f, " cur {}", list(&b.cur))?;
                    }
                    if !b.subr.is_empty() {
                        write!(f, " subr {}", list(&b.subr))?;
                    }
                    if let Some((l, _)) = &b.lub {
                        write!(f, " lub {}", value(l))?;
                    }
                    if let Some((c, _)) = &b.constr {
                        write!(f, " constr {c}")?;
                    }
                    writeln!(f)?;
                }
            }
        }
        Ok(())
    }
}

impl fmt::Display for Environment {
    /// One line per variable that has an entry, dimension variables first, in variable order:
    /// `$d3 = 4` for a solved variable, `$d5: cur [$d6] lub 8 constr >= 3 positions` for
    /// bounds (empty parts left out), rows in brackets. A stable rendering for debugging and
    /// snapshots.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.dims.write(f, DimVar, |d| d.to_string())?;
        self.rows.write(f, RowVar, |r| format!("[{r}]"))
    }
}

/// The buffers of the reachability searches, kept between searches: visit marks indexed by
/// variable number (each search marks with its own generation, so nothing needs clearing) and
/// the two stacks.
#[derive(Clone, Debug)]
struct Reach<V> {
    generation: u32,
    down_marks: Vec<u32>,
    up_marks: Vec<u32>,
    down_stack: Vec<V>,
    up_stack: Vec<V>,
}

impl<V> Default for Reach<V> {
    fn default() -> Self {
        Reach {
            generation: 0,
            down_marks: Vec::new(),
            up_marks: Vec::new(),
            down_stack: Vec::new(),
            up_stack: Vec::new(),
        }
    }
}

/// Marks variable `i` visited in this generation; whether it was not visited before.
fn visit(marks: &mut Vec<u32>, i: usize, generation: u32) -> bool {
    if marks.len() <= i {
        marks.resize(i + 1, 0);
    }
    let fresh = marks[i] != generation;
    marks[i] = generation;
    fresh
}

impl<V: Copy + Eq + Into<usize>> Reach<V> {
    /// Whether `lo` can be reached from `hi` through downward edges (equivalently `hi` from
    /// `lo` through upward ones); `edges(v, up)` lists a variable's neighbours. Both searches
    /// advance in turn and the first to finish decides, so the cost is about the smaller of the
    /// regions below `hi` and above `lo` — long chains of inequalities make one of them large.
    fn reachable<'a>(&mut self, hi: V, lo: V, edges: impl Fn(V, bool) -> &'a [V]) -> bool
    where
        V: 'a,
    {
        if hi == lo {
            return true;
        }
        // Quick answers: most variables have few or no neighbours.
        let (below_hi, above_lo) = (edges(hi, false), edges(lo, true));
        if below_hi.is_empty() || above_lo.is_empty() {
            return false;
        }
        if below_hi.contains(&lo) {
            return true;
        }
        if self.generation == u32::MAX {
            self.down_marks.iter_mut().chain(self.up_marks.iter_mut()).for_each(|m| *m = 0);
            self.generation = 0;
        }
        self.generation += 1;
        let generation = self.generation;
        let Reach { down_marks, up_marks, down_stack, up_stack, .. } = self;
        visit(down_marks, hi.into(), generation);
        visit(up_marks, lo.into(), generation);
        down_stack.clear();
        down_stack.extend_from_slice(below_hi);
        up_stack.clear();
        up_stack.extend_from_slice(above_lo);
        loop {
            match down_stack.pop() {
                None => return false,
                Some(v) if v == lo => return true,
                Some(v) => {
                    if visit(down_marks, v.into(), generation) {
                        // Element by element: the lists are short, a bulk copy costs more.
                        edges(v, false).iter().for_each(|w| down_stack.push(*w));
                    }
                }
            }
            match up_stack.pop() {
                None => return false,
                Some(v) if v == hi => return true,
                Some(v) => {
                    if visit(up_marks, v.into(), generation) {
                        edges(v, true).iter().for_each(|w| up_stack.push(*w));
                    }
                }
            }
        }
    }
}

/// A row with `n` fresh dimension variables (the variables-only template).
pub fn fresh_dims(n: usize, fresh: &mut impl FnMut() -> DimVar) -> Vec<Dim> {
    (0..n).map(|_| Dim::Var(fresh())).collect()
}

/// The row `beg ++ ..v.. ++ dims`.
pub fn row_with_var(beg: Vec<Dim>, v: RowVar, dims: Vec<Dim>, like: &Row) -> Row {
    Row { dims, bcast: Bcast::Var { v, beg_dims: beg }, id: like.id }
}

//! Constraints beyond (in)equalities: lower bounds on dimensions and row constraints.
//!
//! `AtLeast(n)` comes from fixed indexing: an axis indexed at position `i` has at least `i + 1`
//! positions. It propagates upward (`cur ≥ subr` with `subr ≥ n > 1` rules out broadcasting, so
//! `cur = subr`).
//!
//! Row constraints relate several rows, concatenated in memory order:
//! - `TotalElems`: the rows hold `numerator / Π divided_by` elements; the numerator is a number
//!   or `coeff * var / denom` for a dimension variable (so two reshaped tensors can share an
//!   unknown element count). A single missing dimension is solved by division.
//! - `Exact`: the rows concatenated are exactly the given axes (data whose axes are known but
//!   whose split into batch, output and input is inferred).
//!
//! When rows still have unknown row variables the constraint waits; with a single row variable
//! its reduced form is recorded on the variable's entry, which closing consults (stages 3–5).

use std::sync::Arc;

use crate::constraint::{Constr, Constraint, DimConstraint, Origin, RowConstraint, TotalElems};
use crate::dim::Dim;
use crate::error::{Conflict, conflict};
use crate::row::{Bcast, Kind, Row, RowId};
use crate::solve::Solver;
use crate::stage::Stage;
use crate::var::RowVar;

type Derived = Result<Vec<Constr>, Conflict>;

impl Solver {
    /// Applies a constraint on one dimension.
    pub fn apply_dim_constraint(
        &mut self,
        d: &Dim,
        constr: &DimConstraint,
        origin: &Origin,
    ) -> Derived {
        let DimConstraint::AtLeast(n) = constr else { return Ok(vec![]) };
        let n = *n;
        let d = self.env.subst_dim(d);
        if let Some(size) = d.size() {
            // Also for n = 1: position 0 does not exist in an axis of size 0.
            if size < n {
                return Err(conflict(
                    format!("fixed index {} is out of range for an axis of size {size}", n - 1),
                    origin,
                ));
            }
            return Ok(vec![]);
        }
        let Dim::Var(v) = d else {
            if matches!(&d, Dim::Conv(c) if c.is_windowless()) {
                // Its input is not the convolution's to size (see `ConvDim::is_windowless`).
                return Ok(vec![]);
            }
            // An arithmetic dimension: check once its size is known. Meanwhile, a single
            // unknown part learns how large it must at least be, so that closing it to its
            // lower bound gives the axis its positions.
            let out = arithmetic_part_lower_bound(&d, n)
                .filter(|(_, m)| *m > 1)
                .map(|(part, m)| {
                    Constraint::DimConstr { d: part, constr: DimConstraint::AtLeast(m) }.at(origin)
                })
                .into_iter()
                .collect();
            self.defer(Constraint::DimConstr { d, constr: constr.clone() }.at(origin));
            return Ok(out);
        };
        let mut b = self.env.dim_bounds(v).clone();
        let old = b.constr.as_ref().map(|(c, _)| c.clone()).unwrap_or(DimConstraint::Unconstrained);
        let new = old.conjunction(constr);
        if new == old {
            return Ok(vec![]);
        }
        if let (Some((lub, lo)), Some(lower)) = (&b.lub, new.lower_bound())
            && lub.size().is_some_and(|l| l < lower)
        {
            return Err(conflict(
                format!(
                    "fixed index {} is out of range for an axis of size at most {lub}",
                    lower - 1
                ),
                &lo.join(origin),
            ));
        }
        let o = match &b.constr {
            Some((_, o)) => o.join(origin),
            None => origin.clone(),
        };
        let mut out = Vec::new();
        if new.lower_bound().is_some() {
            for c in &b.cur {
                out.push(Constraint::DimConstr { d: Dim::Var(*c), constr: new.clone() }.at(&o));
            }
        }
        b.constr = Some((new, o));
        self.env.set_dim_bounds(v, b);
        Ok(out)
    }

    /// A batch slice: `arg = slot ++ cur`, an equation once one of the two rows has a known
    /// number of axes. Until then the two rows keep their known trailing axes in step: the
    /// argument has at least one axis more than the result shows, the result at least one
    /// fewer than the argument shows, and their last axes are the same (a trailing axis lines
    /// up like any other). From stage 6 on, when neither row is known yet, the smallest
    /// solution is taken: the row with more known axes (counting the sliced one) closes its
    /// variable to no further axes, and determines the other.
    pub fn solve_batch_slice(
        &mut self,
        cur: &Arc<Row>,
        arg: &Arc<Row>,
        slot: &Dim,
        origin: &Origin,
    ) -> Derived {
        let cur = self.env.subst_row_arc(cur);
        let arg = self.env.subst_row_arc(arg);
        let (Some(v), Some(w)) = (cur.var(), arg.var()) else {
            let eq = Constraint::RowEq { r1: Arc::new(slot_then(slot, &cur)), r2: arg };
            return Ok(vec![eq.at(origin)]);
        };
        if self.stage < Stage::RowsToNoMoreAxes || !self.take_closing_turn() {
            let (a, c) = (arg.num_fixed(), cur.num_fixed());
            let trailing_only = arg.beg_dims().is_empty() && cur.beg_dims().is_empty();
            let again =
                Constraint::BatchSlice { cur: cur.clone(), arg: arg.clone(), slot: slot.clone() };
            if a < c + 1 && (trailing_only || a == 0) {
                let mut out = self.expand_row_var(w, 0, c + 1 - a, &arg, origin)?;
                out.push(again.at(origin));
                return Ok(out);
            }
            if trailing_only && c + 1 < a {
                let mut out = self.expand_row_var(v, 0, a - 1 - c, &cur, origin)?;
                out.push(again.at(origin));
                return Ok(out);
            }
            let mut out = Vec::new();
            if trailing_only {
                // Both show their last axes: those are the same axes.
                let k = a.min(c);
                out.extend(
                    arg.dims[a - k..].iter().zip(&cur.dims[c - k..]).map(|(x, y)| {
                        Constraint::DimEq { d1: x.clone(), d2: y.clone() }.at(origin)
                    }),
                );
            }
            self.defer(again.at(origin));
            return Ok(out);
        }
        let (w, id) = self.slice_row_to_close(&cur, &arg).unwrap_or((v, cur.id));
        let mut out = self.bind_row(w, Row::empty(id), origin)?;
        out.push(Constraint::BatchSlice { cur, arg, slot: slot.clone() }.at(origin));
        Ok(out)
    }

    /// The row variable a batch slice whose rows both have one closes at stage 6 (with the row
    /// it belongs to): the argument's when it shows more axes than the result, else the
    /// result's.
    pub(crate) fn slice_row_to_close(&self, cur: &Row, arg: &Row) -> Option<(RowVar, RowId)> {
        let (v, w) = (cur.var()?, arg.var()?);
        Some(if arg.num_fixed() > cur.num_fixed() { (w, arg.id) } else { (v, cur.id) })
    }

    /// Applies a constraint on rows concatenated in memory order.
    pub fn apply_rows_constraint(
        &mut self,
        rows: &[Row],
        constr: &RowConstraint,
        origin: &Origin,
    ) -> Derived {
        let rows: Vec<Row> = rows.iter().map(|r| self.env.subst_row(r)).collect();
        match constr {
            RowConstraint::Unconstrained => Ok(vec![]),
            RowConstraint::Exact(dims) => self.apply_exact(rows, dims, origin),
            RowConstraint::TotalElems { numerator, divided_by } => {
                self.apply_total_elems(rows, numerator, divided_by, origin)
            }
        }
    }

    fn apply_exact(&mut self, rows: Vec<Row>, dims: &[Dim], origin: &Origin) -> Derived {
        let fixed: usize = rows.iter().map(Row::num_fixed).sum();
        let vars: Vec<(usize, RowVar)> =
            rows.iter().enumerate().filter_map(|(i, r)| r.var().map(|v| (i, v))).collect();
        let shown = || rows.iter().map(|r| format!("[{r}]")).collect::<Vec<_>>().join(" ");
        if fixed > dims.len() || (vars.is_empty() && fixed != dims.len()) {
            return Err(conflict(
                format!("rows {} must have exactly {} axes", shown(), dims.len()),
                origin,
            ));
        }
        let eq =
            |d1: &Dim, d2: &Dim| Constraint::DimEq { d1: d1.clone(), d2: d2.clone() }.at(origin);
        let mut out = Vec::new();
        if single_var(&vars).is_some() || fixed == dims.len() {
            // The row variable (which may occur in several rows) takes whatever the other axes
            // leave, shared equally between its occurrences.
            let free = dims.len() - fixed;
            if !vars.is_empty() && !free.is_multiple_of(vars.len()) {
                return Err(conflict(
                    format!(
                        "rows {} must have exactly {} axes: {free} axes cannot be shared by {} \
                         occurrences of one row variable",
                        shown(),
                        dims.len(),
                        vars.len()
                    ),
                    origin,
                ));
            }
            let take = if vars.is_empty() { 0 } else { free / vars.len() };
            let mut pos = 0;
            let mut bound: Vec<RowVar> = Vec::new();
            for r in &rows {
                for d in r.beg_dims() {
                    out.push(eq(d, &dims[pos]));
                    pos += 1;
                }
                if let Some(v) = r.var() {
                    let value = Row::fixed(dims[pos..pos + take].to_vec(), r.id);
                    if bound.contains(&v) {
                        out.push(
                            Constraint::RowEq {
                                r1: Arc::new(Row::of_var(v, r.id)),
                                r2: Arc::new(value),
                            }
                            .at(origin),
                        );
                    } else {
                        bound.push(v);
                        out.extend(self.bind_row(v, value, origin)?);
                    }
                    pos += take;
                }
                for d in &r.dims {
                    out.push(eq(d, &dims[pos]));
                    pos += 1;
                }
            }
            return Ok(out);
        }
        if self.stage >= Stage::RowConstraints {
            return self.keep_output_var_only(
                &rows,
                &vars,
                Constraint::RowsConstr {
                    rows: rows.clone(),
                    constr: RowConstraint::Exact(dims.to_vec()),
                },
                origin,
            );
        }
        self.defer(
            Constraint::RowsConstr { rows, constr: RowConstraint::Exact(dims.to_vec()) }.at(origin),
        );
        Ok(out)
    }

    /// Stage 5 with several row variables: the output row takes the axes, the others get none.
    fn keep_output_var_only(
        &mut self,
        rows: &[Row],
        vars: &[(usize, RowVar)],
        retry: Constraint,
        origin: &Origin,
    ) -> Derived {
        let keep = vars
            .iter()
            .find(|(i, _)| rows[*i].id.kind == Kind::Output)
            .or(vars.last())
            .map(|(_, v)| *v);
        let mut out = Vec::new();
        for (i, v) in vars {
            if Some(*v) != keep {
                out.extend(self.bind_row(*v, Row::empty(rows[*i].id), origin)?);
            }
        }
        out.push(retry.at(origin));
        Ok(out)
    }

    /// Applies `TotalElems`: resolves the numerator and the known divisors, then solves the
    /// rows' unknown axes or row variable for the remaining element count (or waits).
    fn apply_total_elems(
        &mut self,
        rows: Vec<Row>,
        numerator: &TotalElems,
        divided_by: &[crate::var::DimVar],
        origin: &Origin,
    ) -> Derived {
        let (num, strided) = self.resolve_numerator(numerator, origin)?;
        let Some((num, unknown_div)) = self.divide_known_divisors(num, divided_by, origin)? else {
            let constr = RowConstraint::TotalElems {
                numerator: numerator.clone(),
                divided_by: divided_by.to_vec(),
            };
            self.defer(Constraint::RowsConstr { rows, constr }.at(origin));
            return Ok(vec![]);
        };
        let (known, unknown) = known_product(&rows, unknown_div, origin)?;
        let vars: Vec<(usize, RowVar)> =
            rows.iter().enumerate().filter_map(|(i, r)| r.var().map(|v| (i, v))).collect();
        let total = TotalElemsProblem { rows: &rows, numerator, divided_by, strided, origin };
        let Some(n) = num else {
            return self.solve_strided_var(&total, &vars, &unknown, known);
        };
        if known == 0 && n == 0 {
            // No elements: an axis of 0 already accounts for them, whatever the other axes are.
            return Ok(vec![]);
        }
        if known == 0 || n % known != 0 {
            return Err(conflict(
                format!(
                    "{} cannot hold {n} elements: the known axes already give {known}",
                    total.shown()
                ),
                origin,
            ));
        }
        let m = n / known;
        if vars.is_empty() {
            return self.solve_unknown_axes(&total, &unknown, known, n, m);
        }
        if let Some(v) = single_var(&vars) {
            if unknown.is_empty() {
                return self.solve_single_row_var(&total, v, &vars, n, m);
            }
        } else if self.stage >= Stage::RowConstraints {
            return self.keep_output_var_only(&rows, &vars, total.pending(Some(n)), origin);
        }
        self.defer(total.pending(Some(n)).at(origin));
        Ok(vec![])
    }

    /// The numerator of `TotalElems` as a number when it is known, or else its strided form
    /// `(coeff, var, denom)` with `var` still unknown.
    fn resolve_numerator(
        &mut self,
        numerator: &TotalElems,
        origin: &Origin,
    ) -> Result<(Option<usize>, Option<Strided>), Conflict> {
        match numerator {
            TotalElems::NumElems(n) => Ok((Some(*n), None)),
            TotalElems::StridedVar { coeff, var, denom } => {
                match self.env.subst_dim(&Dim::Var(*var)).size() {
                    Some(x) => {
                        let total = coeff.checked_mul(x).ok_or_else(|| too_many(origin))?;
                        if total % denom != 0 {
                            return Err(conflict(
                                format!("{coeff}*{x} elements cannot be divided by {denom}"),
                                origin,
                            ));
                        }
                        Ok((Some(total / denom), None))
                    }
                    None => Ok((None, Some((*coeff, *var, *denom)))),
                }
            }
        }
    }

    /// Divides the numerator by the divisors already known, returning it with the divisors
    /// still unknown; `None` when a divisor is known but the numerator is not (the constraint
    /// then waits as it is).
    fn divide_known_divisors(
        &mut self,
        mut num: Option<usize>,
        divided_by: &[crate::var::DimVar],
        origin: &Origin,
    ) -> Result<Option<Divided>, Conflict> {
        let mut unknown_div = Vec::new();
        for v in divided_by {
            match self.env.subst_dim(&Dim::Var(*v)) {
                d if d.size().is_some() => {
                    let s = d.size().unwrap_or(1);
                    let Some(n) = &mut num else { return Ok(None) };
                    if s == 0 || *n % s != 0 {
                        return Err(conflict(
                            format!("{n} elements cannot be divided by {s}"),
                            origin,
                        ));
                    }
                    *n /= s;
                }
                d => unknown_div.push(d),
            }
        }
        Ok(Some((num, unknown_div)))
    }

    /// `coeff * var / denom = known` with everything else known: solves for `var`, or waits.
    fn solve_strided_var(
        &mut self,
        total: &TotalElemsProblem<'_>,
        vars: &[(usize, RowVar)],
        unknown: &[Dim],
        known: usize,
    ) -> Derived {
        let origin = total.origin;
        let (coeff, var, denom) = total.strided.expect("numerator is either known or strided");
        if vars.is_empty() && unknown.is_empty() {
            let scaled = known.checked_mul(denom).ok_or_else(|| too_many(origin))?;
            if scaled % coeff != 0 {
                return Err(conflict(
                    format!(
                        "{} holds {known} elements, not a multiple of {coeff}/{denom}",
                        total.shown()
                    ),
                    origin,
                ));
            }
            return Ok(vec![
                Constraint::DimEq { d1: Dim::Var(var), d2: Dim::of(scaled / coeff) }.at(origin),
            ]);
        }
        self.defer(total.pending(None).at(origin));
        Ok(vec![])
    }

    /// No row variable: the unknown axes hold the `m` elements beyond the known `known` of
    /// `n` (one axis: exactly `m`; several: all 1 when `m` is 1, else wait).
    fn solve_unknown_axes(
        &mut self,
        total: &TotalElemsProblem<'_>,
        unknown: &[Dim],
        known: usize,
        n: usize,
        m: usize,
    ) -> Derived {
        let origin = total.origin;
        match unknown {
            [] if m == 1 => Ok(vec![]),
            [] => {
                Err(conflict(format!("{} holds {known} elements, not {n}", total.shown()), origin))
            }
            [d] => Ok(vec![Constraint::DimEq { d1: d.clone(), d2: Dim::of(m) }.at(origin)]),
            ds if m == 1 => Ok(ds
                .iter()
                .map(|d| Constraint::DimEq { d1: d.clone(), d2: Dim::of(1) }.at(origin))
                .collect()),
            _ => {
                self.defer(total.pending(Some(n)).at(origin));
                Ok(vec![])
            }
        }
    }

    /// One row variable and no other unknown axis: its axes hold the rest of the elements;
    /// when it occurs in k rows (a square map's input and output), each occurrence holds the
    /// k-th root. The reduced constraint is recorded for closing, and closes it from stage 5 on.
    fn solve_single_row_var(
        &mut self,
        total: &TotalElemsProblem<'_>,
        v: RowVar,
        vars: &[(usize, RowVar)],
        n: usize,
        m: usize,
    ) -> Derived {
        let origin = total.origin;
        let Some(m) = exact_root(m, vars.len()) else {
            return Err(conflict(
                format!(
                    "{} cannot hold {n} elements: its row variable occurs {} times, and \
                     {m} is no such power of a whole number",
                    total.shown(),
                    vars.len()
                ),
                origin,
            ));
        };
        self.record_reduced_total(v, m, origin)?;
        if self.stage >= Stage::RowConstraints {
            let value = if m == 1 { vec![] } else { vec![Dim::of(m)] };
            return self.bind_row(v, Row::fixed(value, total.rows[vars[0].0].id), origin);
        }
        self.defer(total.pending(Some(n)).at(origin));
        Ok(vec![])
    }

    /// Records `TotalElems(m)` on row variable `v`'s entry; a different count already there is
    /// a conflict (recording one over the other would alternate forever).
    fn record_reduced_total(
        &mut self,
        v: RowVar,
        m: usize,
        origin: &Origin,
    ) -> Result<(), Conflict> {
        let reduced =
            RowConstraint::TotalElems { numerator: TotalElems::NumElems(m), divided_by: vec![] };
        match &self.env.row_bounds(v).constr {
            Some((c, _)) if *c == reduced => {}
            Some((RowConstraint::TotalElems { numerator: TotalElems::NumElems(m0), .. }, o)) => {
                return Err(conflict(
                    format!(
                        "the axes of row variable {v} would have to hold both {m0} and \
                         {m} elements"
                    ),
                    &o.join(origin),
                ));
            }
            _ => {
                if let Some(b) = self.env.row_bounds_mut(v) {
                    b.constr = Some((reduced, origin.clone()));
                }
            }
        }
        Ok(())
    }
}

/// A numerator `coeff * var / denom` whose variable is still unknown.
type Strided = (usize, crate::var::DimVar, usize);

/// The numerator divided by the known divisors (when it is known), and the divisors not known
/// yet.
type Divided = (Option<usize>, Vec<Dim>);

/// A `TotalElems` constraint being applied: its rows and original form (to wait with), and
/// the strided numerator when that is still unknown.
struct TotalElemsProblem<'a> {
    rows: &'a [Row],
    numerator: &'a TotalElems,
    divided_by: &'a [crate::var::DimVar],
    strided: Option<Strided>,
    origin: &'a Origin,
}

impl TotalElemsProblem<'_> {
    /// The rows, as error messages show them.
    fn shown(&self) -> String {
        self.rows.iter().map(|r| format!("[{r}]")).collect::<Vec<_>>().join(" ")
    }

    /// The constraint to wait with, its numerator reduced to `num` when that is known.
    fn pending(&self, num: Option<usize>) -> Constraint {
        Constraint::RowsConstr {
            rows: self.rows.to_vec(),
            constr: RowConstraint::TotalElems {
                numerator: match (num, self.strided) {
                    (Some(n), _) => TotalElems::NumElems(n),
                    (None, Some((coeff, var, denom))) => {
                        TotalElems::StridedVar { coeff, var, denom }
                    }
                    (None, None) => self.numerator.clone(),
                },
                divided_by: self.divided_by.to_vec(),
            },
        }
    }
}

/// The product of the rows' known axes, and their unknown axes after `unknown_div` (the
/// divisors not known yet).
fn known_product(
    rows: &[Row],
    unknown_div: Vec<Dim>,
    origin: &Origin,
) -> Result<(usize, Vec<Dim>), Conflict> {
    let mut known = 1usize;
    let mut unknown = unknown_div;
    for r in rows {
        for d in r.all_dims() {
            match d.size() {
                Some(s) => known = known.checked_mul(s).ok_or_else(|| too_many(origin))?,
                None => unknown.push(d),
            }
        }
    }
    Ok((known, unknown))
}

/// The row variable of `vars`, when they are all the same one (occurring once or more).
fn single_var(vars: &[(usize, RowVar)]) -> Option<RowVar> {
    let (_, v) = vars.first()?;
    vars.iter().all(|(_, w)| w == v).then_some(*v)
}

/// The `k`-th root of `m`, when it is a whole number.
fn exact_root(m: usize, k: usize) -> Option<usize> {
    if k == 1 || m <= 1 {
        return Some(m);
    }
    let k32 = u32::try_from(k).ok()?;
    let guess = (m as f64).powf(1.0 / k as f64).round() as usize;
    (guess.saturating_sub(1)..=guess.saturating_add(1)).find(|r| r.checked_pow(k32) == Some(m))
}

/// The row `slot ++ row`.
pub(crate) fn slot_then(slot: &Dim, row: &Row) -> Row {
    match &row.bcast {
        Bcast::Broadcastable => {
            let mut dims = vec![slot.clone()];
            dims.extend(row.dims.iter().cloned());
            Row { dims, bcast: Bcast::Broadcastable, id: row.id }
        }
        Bcast::Var { v, beg_dims } => {
            let mut beg = vec![slot.clone()];
            beg.extend(beg_dims.iter().cloned());
            Row { dims: row.dims.clone(), bcast: Bcast::Var { v: *v, beg_dims: beg }, id: row.id }
        }
    }
}

/// The conflict of an element count that does not fit in `usize`.
fn too_many(origin: &Origin) -> Conflict {
    conflict("the number of elements is too large to represent", origin)
}

/// For an arithmetic dimension that must have at least `n` positions and has exactly one unknown
/// part: that part and the smallest size that gives the dimension `n` positions.
fn arithmetic_part_lower_bound(d: &Dim, n: usize) -> Option<(Dim, usize)> {
    match d {
        Dim::Conv(c) => {
            let (out, kernel) = (c.output.size(), c.kernel.size());
            if !c.kernel_counts() {
                // stride*output >= n.
                return out.is_none().then(|| (c.output.clone(), n.div_ceil(c.stride)));
            }
            match (out, kernel) {
                // stride*(output-1) + dilation*(kernel-1) + 1 >= n.
                (None, Some(k)) if k > 0 => {
                    let span = c.dilation.checked_mul(k - 1)?.checked_add(1)?;
                    let more = n.saturating_sub(span).div_ceil(c.stride);
                    Some((c.output.clone(), more.checked_add(1)?))
                }
                (Some(o), None) if o > 0 => {
                    let covered = c.stride.checked_mul(o - 1)?.checked_add(1)?;
                    let more = n.saturating_sub(covered).div_ceil(c.dilation);
                    Some((c.kernel.clone(), more.checked_add(1)?))
                }
                _ => None,
            }
        }
        Dim::Concat(parts) => {
            let mut unknown = parts.iter().filter(|p| p.size().is_none());
            let part = unknown.next()?;
            if unknown.next().is_some() {
                return None;
            }
            let known = parts.iter().filter_map(Dim::size).try_fold(0usize, usize::checked_add)?;
            Some((part.clone(), n.saturating_sub(known)))
        }
        Dim::Var(_) | Dim::Solved(_) => None,
    }
}

//! Closing variables, stage by stage (stages 2–7 of [`crate::stage::Stage`]).
//!
//! Three closing constraints act once propagation has settled: [`Solver::close_dim_terminal`]
//! and [`Solver::close_row_terminal`] close the dimensions and rows of leaf (terminal) shapes,
//! [`Solver::close_shape_row`] the rows of every other shape of the graph. What each may close
//! depends on the stage; the table is in [`crate::stage`].
//!
//! Leaf shapes close to their least upper bounds because a leaf can always be broadcast: its
//! only shape information comes from its uses. Everything else closes to the smallest shape,
//! since composite tensors get their shapes forced from below by their components. When a leaf
//! row closes to an upper bound, the axes of that bound become part of the leaf and close as
//! leaf axes too.
//!
//! Closing a leaf's dimension to 1, or a leaf's row to no axes, without any upper bound is a
//! *guess* (the classic forgotten hidden dimension); the guessed variables are recorded so the
//! driver can warn, or fail in strict mode. A guess also decides every variable known to be below
//! the guessed one (their only upper bound was that variable), so those count as guessed too:
//! otherwise whether a parameter is warned about would depend on which of two related leaves
//! happened to be closed first.

use std::hash::Hash;
use std::sync::Arc;

use rustc_hash::FxHashSet;

use crate::constraint::{Constr, Constraint, Origin, RowConstraint, TotalElems};
use crate::dim::Dim;
use crate::env::RowEntry;
use crate::error::Conflict;
use crate::row::Row;
use crate::solve::Solver;
use crate::stage::Stage;
use crate::var::{DimVar, RowVar};

type Derived = Result<Vec<Constr>, Conflict>;

impl Solver {
    /// Closes a dimension of a leaf shape according to the stage.
    pub fn close_dim_terminal(&mut self, d: &Dim, origin: &Origin) -> Derived {
        let d = self.env.subst_dim(d);
        let v = match &d {
            Dim::Var(v) => *v,
            Dim::Solved(_) => return Ok(vec![]),
            Dim::Conv(_) | Dim::Concat(_) => {
                // A leaf's convolution or concatenated axis is as large as its parts allow:
                // the parts close like leaf axes.
                let mut vs = Vec::new();
                d.vars(&mut vs);
                return Ok(vs
                    .into_iter()
                    .map(|v| Constraint::TerminalDim(Dim::Var(v)).at(origin))
                    .collect());
            }
        };
        let b = self.env.dim_bounds(v);
        let lower = b.constr.as_ref().and_then(|(c, _)| c.lower_bound());
        // A variable related to other variables (bounded above or below by them) waits for
        // them: closing it early would decide their sizes before their own constraints are
        // known. It closes at the latest with every other dimension in stage 7.
        let unrelated = b.subr.is_empty() && b.cur.is_empty();
        match (&b.lub, lower) {
            (None, None) if self.stage >= Stage::TerminalDimsToOne && unrelated => {
                self.mark_dim_guess(v);
                Ok(vec![Constraint::DimEq { d1: Dim::Var(v), d2: Dim::of(1) }.at(origin)])
            }
            (Some((lub, o)), _) if self.stage >= Stage::TerminalsToLub => {
                Ok(vec![Constraint::DimEq { d1: Dim::Var(v), d2: lub.clone() }.at(&o.join(origin))])
            }
            (None, None) if self.stage >= Stage::DimsToLowerBound && !unrelated => {
                // Related to other variables and not bounded yet: the composite shapes close
                // first (to their lower bounds, forced from below by their arguments), and this
                // leaf axis then equals or broadcasts against what they became. What is left
                // when nothing else can close is closed by the driver like any other variable.
                self.defer(Constraint::TerminalDim(d).at(origin));
                Ok(vec![])
            }
            (None, lower) if self.stage >= Stage::DimsToLowerBound => {
                if lower.is_none() {
                    self.mark_dim_guess(v);
                }
                Ok(vec![
                    Constraint::DimEq { d1: Dim::Var(v), d2: Dim::of(lower.unwrap_or(1)) }
                        .at(origin),
                ])
            }
            _ => {
                self.defer(Constraint::TerminalDim(d).at(origin));
                Ok(vec![])
            }
        }
    }

    /// Closes a row of a leaf shape according to the stage.
    pub fn close_row_terminal(&mut self, r: &Arc<Row>, origin: &Origin) -> Derived {
        let r = self.env.subst_row_arc(r);
        if self.stage == Stage::Online {
            self.defer(Constraint::TerminalRow(r).at(origin));
            return Ok(vec![]);
        }
        let mut out: Vec<Constr> =
            r.all_dims().into_iter().map(|d| Constraint::TerminalDim(d).at(origin)).collect();
        let Some(v) = r.var() else { return Ok(out) };
        let b = self.env.row_bounds(v);
        let total_elems = match &b.constr {
            Some((
                RowConstraint::TotalElems { numerator: TotalElems::NumElems(m), divided_by },
                _,
            )) if divided_by.is_empty() => Some(*m),
            _ => None,
        };
        let var_row = Row::of_var(v, r.id);
        match (&b.lub, total_elems) {
            (Some((lub, o)), t) if self.stage >= Stage::TerminalsToLub && t != Some(1) => {
                // The leaf takes its least upper bound, whose axes become leaf axes; the input of
                // a convolution without window bounds nothing, so that axis is a fresh one.
                let mut lub = self.env.subst_row_arc(lub);
                if lub.all_dims().iter().any(is_windowless) {
                    let vars = &mut self.vars;
                    let fresh =
                        |d: &Dim| if is_windowless(d) { Dim::Var(vars.dim()) } else { d.clone() };
                    lub = Arc::new(lub.map_dims(&mut { fresh }));
                }
                out.extend(self.bind_row(v, lub, &o.join(origin))?);
                out.push(Constraint::TerminalRow(r).at(origin));
            }
            (None, Some(m)) if self.stage >= Stage::TerminalsToLub => {
                let value = if m == 1 { vec![] } else { vec![Dim::of(m)] };
                out.extend(self.bind_row(v, Row::fixed(value, r.id), origin)?);
            }
            (None, None)
                if self.stage >= Stage::TerminalRowsClosed
                    && b.subr.is_empty()
                    && b.cur.is_empty()
                    && !self.waits_with(v) =>
            {
                self.mark_row_guess(v);
                out.extend(self.bind_row(v, Row::empty(r.id), origin)?);
            }
            (lub, _) if self.stage >= Stage::RowsToNoMoreAxes => {
                if lub.is_none() {
                    self.mark_row_guess(v);
                }
                out.extend(self.bind_row(v, Row::empty(r.id), origin)?);
            }
            _ => self.defer(Constraint::TerminalRow(Arc::new(var_row)).at(origin)),
        }
        Ok(out)
    }

    /// Closes the variables of a row of some shape of the graph (from stage 4 on), starting at
    /// axis `from` (the axes before it are closed already).
    pub fn close_shape_row(&mut self, r: &Arc<Row>, from: usize, origin: &Origin) -> Derived {
        // A solved row variable splices axes into the row: substitute, and scan it whole.
        let (r, from) = match r.var() {
            Some(v) if matches!(self.env.row_entry(v), Some(RowEntry::Solved(..))) => {
                (self.env.subst_row_arc(r), 0)
            }
            _ => (Arc::clone(r), from),
        };
        // One variable at a time, the rest of the row after that closing has propagated: the
        // parts of an arithmetic axis depend on each other (closing both parts of `2*b+d = 2`
        // to 1 at once misses its one solution, b = 1 and d = 2). Axes are looked up one by
        // one, so closing a row of n axes costs O(n) in all, not O(n) per variable.
        let mut first_kept = None;
        let mut vs = Vec::new();
        for (i, d) in r.beg_dims().iter().chain(&r.dims).enumerate().skip(from) {
            vs.clear();
            self.env.subst_dim_cow(d).vars(&mut vs);
            for &v in &vs {
                let b = self.env.dim_bounds(v);
                let lower = b.constr.as_ref().and_then(|(c, _)| c.lower_bound());
                let c = match (&b.lub, lower) {
                    (Some((lub, o)), Some(_)) if self.stage >= Stage::TerminalRowsClosed => {
                        Constraint::DimEq { d1: Dim::Var(v), d2: lub.clone() }.at(&o.join(origin))
                    }
                    (_, lower) if self.stage >= Stage::DimsToLowerBound => {
                        if b.lub.is_none() && lower.is_none() {
                            self.mark_dim_guess(v);
                        }
                        Constraint::DimEq { d1: Dim::Var(v), d2: Dim::of(lower.unwrap_or(1)) }
                            .at(origin)
                    }
                    _ => {
                        first_kept.get_or_insert(i);
                        continue;
                    }
                };
                let from = first_kept.unwrap_or(i);
                return Ok(vec![c, Constraint::ShapeRow { row: r, from }.at(origin)]);
            }
        }
        // Every axis before `from` is closed now.
        let from = first_kept.unwrap_or(r.beg_dims().len() + r.dims.len());
        match r.var() {
            Some(v) if self.stage >= Stage::RowsToNoMoreAxes => {
                if self.env.row_bounds(v).lub.is_none() {
                    self.mark_row_guess(v);
                }
                let mut out = self.bind_row(v, Row::empty(r.id), origin)?;
                out.push(Constraint::ShapeRow { row: r, from }.at(origin));
                Ok(out)
            }
            None if first_kept.is_none() => Ok(vec![]),
            _ => {
                self.defer(Constraint::ShapeRow { row: r, from }.at(origin));
                Ok(vec![])
            }
        }
    }
}

impl Solver {
    /// Whether row variable `v` is in a row of a deferred constraint between rows (one waiting
    /// for an alignment to be known): that relates it to other variables as much as a bound
    /// does, so closing it early would decide their sizes.
    fn waits_with(&self, v: RowVar) -> bool {
        let has = |r: &Arc<Row>| self.env.subst_row_cow(r).var() == Some(v);
        self.deferred.iter().any(|c| match &c.c {
            Constraint::RowIneq { cur: a, subr: b }
            | Constraint::RowEq { r1: a, r2: b }
            | Constraint::BatchSlice { cur: a, arg: b, .. } => has(a) || has(b),
            _ => false,
        })
    }

    /// Records that `v` is closed by a guess, with every dimension variable known to be below it.
    fn mark_dim_guess(&mut self, v: DimVar) {
        let env = &self.env;
        mark_below(&mut self.guessed_dims, v, |v| &env.dim_bounds(v).subr);
    }

    /// Records that `v` is closed by a guess, with every row variable known to be below it.
    fn mark_row_guess(&mut self, v: RowVar) {
        let env = &self.env;
        mark_below(&mut self.guessed_rows, v, |v| &env.row_bounds(v).subr);
    }
}

/// Adds `v` and every variable below it (following `subr` edges) to `marked`.
fn mark_below<'a, V: Copy + Eq + Hash + 'a>(
    marked: &mut FxHashSet<V>,
    v: V,
    subr: impl Fn(V) -> &'a [V],
) {
    if subr(v).is_empty() {
        marked.insert(v);
        return;
    }
    let mut stack = vec![v];
    while let Some(v) = stack.pop() {
        if marked.insert(v) {
            stack.extend_from_slice(subr(v));
        }
    }
}

/// Whether `d` is the input axis of a convolution without window (see
/// [`crate::dim::ConvDim::is_windowless`]).
fn is_windowless(d: &Dim) -> bool {
    matches!(d, Dim::Conv(c) if c.is_windowless())
}

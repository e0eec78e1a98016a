//! Row inequalities `cur ≥ subr`: pairing two rows' axes from their ends, and relating what is
//! left of each through the row variables (expanding `cur`, or bounding `subr`).
//!
//! What an einsum pattern changes about the pairing is in `pattern.rs`; how a row variable's
//! bounds are stored and met, in `bounds.rs`.

use std::sync::Arc;

use crate::constraint::{Constr, Constraint, Origin};
use crate::dim::Dim;
use crate::error::conflict;
use crate::row::{Bcast, Row, RowId};
use crate::solve::Solver;
use crate::stage::Stage;
use crate::var::RowVar;

use super::{Derived, same_row};

/// `cur ≥ subr` for two dimensions.
fn dim_ineq(c: &Dim, s: &Dim, origin: &Origin) -> Constr {
    Constraint::DimIneq { cur: c.clone(), subr: s.clone() }.at(origin)
}

/// `cur ≥ subr` with the same row variable on both sides: its axes line up only if the
/// trailing parts have the same length; then the leading parts line up from the right.
fn same_row_var_ineq(cur: &Row, subr: &Row, cv: RowVar, origin: &Origin) -> Derived {
    let (cb, cd) = (cur.beg_dims(), &cur.dims[..]);
    let (sb, sd) = (subr.beg_dims(), &subr.dims[..]);
    if cd.len() != sd.len() || cb.len() < sb.len() {
        return Err(conflict(
            format!("[{cur}] >= [{subr}] would need row variable {cv} to contain itself"),
            origin,
        ));
    }
    let mut out: Vec<Constr> = cd.iter().zip(sd).map(|(c, s)| dim_ineq(c, s, origin)).collect();
    let off = cb.len() - sb.len();
    out.extend(cb[off..].iter().zip(sb).map(|(c, s)| dim_ineq(c, s, origin)));
    Ok(out)
}

/// What is left of each row of `cur ≥ subr` after pairing their ends: leading (`b`) and
/// trailing (`d`) axes of `cur` (`c`) and `subr` (`s`), and whether leading axes anchor at the
/// start of the rows (an einsum pattern on either side).
#[derive(Clone, Copy)]
struct Leftover<'a> {
    cb: &'a [Dim],
    sb: &'a [Dim],
    cd: &'a [Dim],
    sd: &'a [Dim],
    anchored: bool,
}

impl Solver {
    /// Solves `cur ≥ subr` for rows.
    pub fn solve_row_ineq(&mut self, cur: &Row, subr: &Row, origin: &Origin) -> Derived {
        self.solve_shared_row_ineq(&Arc::new(cur.clone()), &Arc::new(subr.clone()), origin)
    }

    /// [`Solver::solve_row_ineq`] of shared rows (those of a constraint).
    pub(crate) fn solve_shared_row_ineq(
        &mut self,
        cur: &Arc<Row>,
        subr: &Arc<Row>,
        origin: &Origin,
    ) -> Derived {
        if let Some(out) = self.solve_known_pattern(cur, subr, origin) {
            return out;
        }
        let cur = self.keep_kernel_dims(cur, self.env.subst_row_arc(cur));
        let subr = self.env.subst_row_arc(subr);
        if same_row(&cur, &subr) {
            return Ok(vec![]);
        }
        // Between two tensors' rows (no einsum pattern on either side) broadcasting lines the
        // rows up from the right: a tensor's known first axes are its first, but where they
        // fall in a longer row depends on how many axes its row variable turns out to hold.
        let anchored = self.is_pattern_row(&cur) || self.is_pattern_row(&subr);
        match (cur.var(), subr.var()) {
            (Some(cv), Some(sv)) if cv == sv => same_row_var_ineq(&cur, &subr, cv, origin),
            (Some(cv), None) => self.known_subr_ineq(cur, subr, cv, anchored, origin),
            _ => self.paired_ends_ineq(cur, subr, anchored, origin),
        }
    }

    /// `cur ≥ subr` where `subr`'s axes are all known and `cur` has row variable `cv`: `subr`'s
    /// first axes pair with `cur`'s leading axes, its last axes with `cur`'s trailing axes, and
    /// `cur`'s row variable must hold the middle.
    fn known_subr_ineq(
        &mut self,
        cur: Arc<Row>,
        subr: Arc<Row>,
        cv: RowVar,
        anchored: bool,
        origin: &Origin,
    ) -> Derived {
        let (cb, cd) = (cur.beg_dims(), &cur.dims[..]);
        let sd = &subr.dims[..];
        let n = sd.len();
        let k = cd.len().min(n);
        let mut out: Vec<Constr> = cd[cd.len() - k..]
            .iter()
            .zip(&sd[n - k..])
            .map(|(c, s)| dim_ineq(c, s, origin))
            .collect();
        let middle = &sd[..n - k];
        if !anchored && !cb.is_empty() && !middle.is_empty() {
            // Whether subr's first axes fall on cur's first axes or inside cur's row
            // variable depends on the variable.
            out.extend(self.wait_or_close(Arc::clone(&cur), Arc::clone(&subr), origin)?);
            return Ok(out);
        }
        let j = cb.len().min(middle.len());
        out.extend(cb[..j].iter().zip(&middle[..j]).map(|(c, s)| dim_ineq(c, s, origin)));
        let rest = &middle[j..];
        if !rest.is_empty() {
            let expanded = self.expand_row_var(cv, 0, rest.len(), &cur, origin)?;
            out.extend(expanded);
            out.push(
                Constraint::RowIneq { cur: Arc::clone(&cur), subr: Arc::clone(&subr) }.at(origin),
            );
        } else {
            let unpaired = cb[j..].iter().chain(&cd[..cd.len() - k]);
            out.extend(self.missing_kernel_axes(unpaired, origin));
        }
        Ok(out)
    }

    /// `cur ≥ subr` in the remaining cases: pairs the leading axes (when anchored) and the
    /// trailing axes, then relates what is left of each row.
    fn paired_ends_ineq(
        &mut self,
        cur: Arc<Row>,
        subr: Arc<Row>,
        anchored: bool,
        origin: &Origin,
    ) -> Derived {
        let (cb, cd) = (cur.beg_dims(), &cur.dims[..]);
        let (sb, sd) = (subr.beg_dims(), &subr.dims[..]);
        let j = if anchored { cb.len().min(sb.len()) } else { 0 };
        let k = cd.len().min(sd.len());
        // Room for the pairs and what relating the rest usually adds.
        let mut out = self.derived_list();
        out.reserve(if j + k > 0 { j + k + 1 } else { 0 });
        out.extend(cb[..j].iter().zip(&sb[..j]).map(|(c, s)| dim_ineq(c, s, origin)));
        out.extend(
            cd[cd.len() - k..].iter().zip(&sd[sd.len() - k..]).map(|(c, s)| dim_ineq(c, s, origin)),
        );
        let left = Leftover {
            cb: &cb[j..],
            sb: &sb[j..],
            cd: &cd[..cd.len() - k],
            sd: &sd[..sd.len() - k],
            anchored,
        };
        match cur.var() {
            None => self.fixed_cur_leftover(&cur, &subr, &left, out, origin),
            Some(cv) => self.var_cur_leftover(&cur, &subr, cv, &left, out, origin),
        }
    }

    /// The leftover axes when `cur` has no row variable (it is exactly its axes): `subr` may
    /// have no more axes, and its row variable gets `cur`'s unpaired axes as a bound.
    fn fixed_cur_leftover(
        &mut self,
        cur: &Arc<Row>,
        subr: &Arc<Row>,
        left: &Leftover<'_>,
        mut out: Vec<Constr>,
        origin: &Origin,
    ) -> Derived {
        let Leftover { sb: sb2, cd: cd2, sd: sd2, anchored, .. } = *left;
        if !sd2.is_empty() {
            return Err(conflict(
                format!(
                    "[{subr}] has more axes than [{cur}]: a sub-tensor cannot have more \
                     axes than the result (maybe use pointmul instead of matmul?)"
                ),
                origin,
            ));
        }
        let Some(sv) = subr.var() else {
            out.extend(self.missing_kernel_axes(cd2.iter(), origin));
            return Ok(out);
        };
        // subr's leading axes are fixed at the start of the row.
        if sb2.len() > cd2.len() {
            return Err(conflict(format!("[{subr}] has more axes than [{cur}]"), origin));
        }
        if !anchored && !sb2.is_empty() && sb2.len() < cd2.len() {
            // subr is a tensor that may be shorter than cur: where its first axes fall
            // depends on its row variable.
            out.extend(self.wait_or_close(Arc::clone(cur), Arc::clone(subr), origin)?);
            return Ok(out);
        }
        out.extend(cd2.iter().zip(sb2).map(|(c, s)| dim_ineq(c, s, origin)));
        let rest = Row::fixed(cd2[sb2.len()..].to_vec(), cur.id);
        let more = self.add_row_lub(sv, rest, origin)?;
        self.absorb(&mut out, more);
        Ok(out)
    }

    /// The leftover axes when `cur` has row variable `cv`: it must supply the axes `subr` has
    /// beyond `cur`'s (or wait, when `cur`'s own leftover axes could), and otherwise bounds
    /// `subr`'s row variable.
    fn var_cur_leftover(
        &mut self,
        cur: &Arc<Row>,
        subr: &Arc<Row>,
        cv: RowVar,
        left: &Leftover<'_>,
        mut out: Vec<Constr>,
        origin: &Origin,
    ) -> Derived {
        let Leftover { cb: cb2, sb: sb2, cd: cd2, sd: sd2, anchored } = *left;
        if !sb2.is_empty() || !sd2.is_empty() {
            // subr has axes cur does not show yet: cur's row variable must supply them,
            // unless cur's own leftover axes could (then wait).
            if (!sd2.is_empty() && !cb2.is_empty())
                || (!sb2.is_empty() && (!cd2.is_empty() || !anchored))
            {
                out.extend(self.wait_or_close(Arc::clone(cur), Arc::clone(subr), origin)?);
                return Ok(out);
            }
            let more = self.expand_row_var(cv, sb2.len(), sd2.len(), cur, origin)?;
            self.absorb(&mut out, more);
            out.push(
                Constraint::RowIneq { cur: Arc::clone(cur), subr: Arc::clone(subr) }.at(origin),
            );
            return Ok(out);
        }
        let Some(sv) = subr.var() else { return Ok(out) };
        if cb2.is_empty() && cd2.is_empty() {
            let more = self.add_row_var_ineq(cv, sv, cur, origin)?;
            self.absorb(&mut out, more);
        } else {
            let rest = Row {
                dims: cd2.to_vec(),
                bcast: Bcast::Var { v: cv, beg_dims: cb2.to_vec() },
                id: cur.id,
            };
            let more = self.add_row_lub(sv, rest, origin)?;
            self.absorb(&mut out, more);
        }
        Ok(out)
    }

    /// An inequality that cannot make progress yet: before stage 6 it waits; from stage 6 on,
    /// a row variable closes to no further axes — the sub-tensor's first, since shrinking
    /// `subr` keeps `cur ≥ subr` satisfiable while shrinking `cur` may not — and it is retried.
    /// A tensor's row variable closes before an einsum pattern's: closing the pattern's first
    /// would make it an ordinary row and lose the anchoring of its leading axes.
    pub(super) fn wait_or_close(
        &mut self,
        cur: Arc<Row>,
        subr: Arc<Row>,
        origin: &Origin,
    ) -> Derived {
        if self.stage < Stage::RowsToNoMoreAxes || !self.take_closing_turn() {
            self.defer(Constraint::RowIneq { cur, subr }.at(origin));
            return Ok(vec![]);
        }
        let Some((v, id)) = self.row_to_close(&cur, &subr) else {
            return Ok(vec![Constraint::RowIneq { cur, subr }.at(origin)]);
        };
        let mut out = self.bind_row(v, Row::empty(id), origin)?;
        out.push(Constraint::RowIneq { cur, subr }.at(origin));
        Ok(out)
    }

    /// The row variable an ambiguous `cur ≥ subr` closes (with the row it belongs to): a
    /// tensor's before a pattern's, the sub-tensor's first.
    pub(crate) fn row_to_close(&self, cur: &Row, subr: &Row) -> Option<(RowVar, RowId)> {
        let var = |r: &Row| r.var().map(|v| (v, r.id));
        let tensor =
            [var(subr), var(cur)].into_iter().flatten().find(|(v, _)| !self.is_template_row(*v));
        tensor.or(var(subr)).or(var(cur))
    }
}

//! Einsum patterns in row inequalities: a pattern's leading axes anchor at the start of the row
//! it is matched with, even once its row variable is known (`solve_known_pattern`), and its
//! kernel labels stay variables so that the pairing of axes sees them as kernels.
//!
//! The ordinary pairing of rows is in `rows.rs`; this file is what an einsum pattern changes
//! about it.

use std::sync::Arc;

use crate::constraint::{Constr, Constraint, Origin};
use crate::dim::Dim;
use crate::env::RowEntry;
use crate::row::{Bcast, Row};
use crate::solve::Solver;
use crate::var::RowVar;

use super::Derived;

impl Solver {
    /// Whether `r` is an einsum pattern's row (its row variable is a pattern's, or was made by
    /// expanding one): its leading axes anchor at the start of the row it is matched with.
    pub(super) fn is_pattern_row(&self, r: &Row) -> bool {
        r.var().is_some_and(|v| self.is_template_row(v))
    }

    /// A kernel's axis the argument lacks is a kernel of one tap (a missing axis broadcasts
    /// like an axis of 1, and a kernel's axis of 1 is one tap).
    pub(super) fn missing_kernel_axes<'d>(
        &self,
        unpaired: impl Iterator<Item = &'d Dim>,
        origin: &Origin,
    ) -> Vec<Constr> {
        unpaired
            .filter(|d| matches!(d, Dim::Var(v) if self.is_kernel_dim(*v)))
            .map(|d| Constraint::DimEq { d1: d.clone(), d2: Dim::of(1) }.at(origin))
            .collect()
    }

    /// `subst`, the substitution of `raw`, with the kernel labels among `raw`'s own axes left as
    /// variables: the inequalities derived from pairing its axes must see that they are kernels
    /// even when another operand has already solved them. (Substitution keeps a row's own
    /// leading axes first and its own trailing axes last.)
    pub(super) fn keep_kernel_dims(&self, raw: &Row, subst: Arc<Row>) -> Arc<Row> {
        let is_kernel = |d: &Dim| matches!(d, Dim::Var(v) if self.is_kernel_dim(*v));
        if self.kernel_dims.is_empty() || !raw.beg_dims().iter().chain(&raw.dims).any(is_kernel) {
            return subst;
        }
        let mut row = Arc::unwrap_or_clone(subst);
        let open = row.var().is_some();
        for (i, d) in raw.beg_dims().iter().enumerate() {
            if is_kernel(d) {
                match &mut row.bcast {
                    Bcast::Var { beg_dims, .. } if open => beg_dims[i] = d.clone(),
                    _ => row.dims[i] = d.clone(),
                }
            }
        }
        let off = row.dims.len() - raw.dims.len();
        for (j, d) in raw.dims.iter().enumerate() {
            if is_kernel(d) {
                row.dims[off + j] = d.clone();
            }
        }
        Arc::new(row)
    }

    /// `cur ≥ subr` where one side is an einsum pattern `beg ++ ..v.. ++ end` with leading axes
    /// whose row variable `v` is already known. Substituting `v` would splice its axes between
    /// `beg` and `end`, and the row would then line up with the other from the right, so `beg`
    /// would lose its anchor. Instead, as the notation says, `end` pairs with the other row's
    /// last axes, `beg` with its first axes, and `v` relates to what is left in the middle.
    /// `None` when there is no such pattern, or when the ordinary rules line the rows up the
    /// same way (the pattern is the result's template and the result does not show its axes
    /// yet: expanding the result gives it the pattern's layout).
    pub(super) fn solve_known_pattern(
        &mut self,
        cur: &Arc<Row>,
        subr: &Arc<Row>,
        origin: &Origin,
    ) -> Option<Derived> {
        // `operand`: the pattern is an operand's template, above the argument's row.
        let (pattern, other, operand) = self.known_pattern_side(cur, subr)?;
        let v = pattern.var()?;
        let (beg, end) = self.pattern_ends(pattern);
        let o = self.env.subst_row(other);
        let paired = match o.var() {
            None => pair_with_fixed_row(&beg, &end, &o, operand)?,
            Some(ov) if end.len() > o.dims.len() || beg.len() > o.beg_dims().len() => {
                if !operand {
                    return None;
                }
                return Some(self.wait_for_pattern_axes(cur, subr, pattern, &o, ov, origin));
            }
            Some(ov) => pair_with_open_row(&beg, &end, &o, ov),
        };
        Some(Ok(pattern_constraints(paired, Row::of_var(v, pattern.id), operand, origin)))
    }

    /// Which side of `cur ≥ subr` is an einsum pattern with leading axes whose row variable is
    /// already solved: `(pattern, other, operand)`, `operand` when the pattern is `cur`.
    fn known_pattern_side<'r>(
        &self,
        cur: &'r Arc<Row>,
        subr: &'r Arc<Row>,
    ) -> Option<(&'r Arc<Row>, &'r Arc<Row>, bool)> {
        let known_pattern = |r: &Row| {
            r.var().is_some_and(|v| {
                !r.beg_dims().is_empty()
                    && self.is_template_row(v)
                    && matches!(self.env.row_entry(v), Some(RowEntry::Solved(..)))
            })
        };
        if known_pattern(cur) {
            Some((cur, subr, true))
        } else if known_pattern(subr) {
            Some((subr, cur, false))
        } else {
            None
        }
    }

    /// The pattern's leading and trailing axes, substituted, with its kernel labels left as
    /// variables (as in `keep_kernel_dims`).
    fn pattern_ends(&self, pattern: &Row) -> (Vec<Dim>, Vec<Dim>) {
        let subst = |d: &Dim| match d {
            Dim::Var(v) if self.is_kernel_dim(*v) => d.clone(),
            _ => self.env.subst_dim(d),
        };
        let beg: Vec<Dim> = pattern.beg_dims().iter().map(subst).collect();
        let end: Vec<Dim> = pattern.dims.iter().map(subst).collect();
        (beg, end)
    }

    /// The argument (`other`, with row variable `ov`) does not show its first or last axes
    /// yet: pairing waits. A bare row variable still learns the pattern as its upper bound.
    fn wait_for_pattern_axes(
        &mut self,
        cur: &Arc<Row>,
        subr: &Arc<Row>,
        pattern: &Row,
        other: &Row,
        ov: RowVar,
        origin: &Origin,
    ) -> Derived {
        let mut out = Vec::new();
        if other.num_fixed() == 0 {
            let spliced = self.env.subst_row(pattern);
            out = self.add_row_lub(ov, spliced, origin)?;
        }
        self.defer(Constraint::RowIneq { cur: Arc::clone(cur), subr: Arc::clone(subr) }.at(origin));
        Ok(out)
    }
}

/// How a known pattern lines up with the other row: pairs of (pattern axis, other axis), and
/// what is left of the other row for the pattern's row variable.
struct PatternPairs<'a> {
    pairs: Vec<(&'a Dim, &'a Dim)>,
    rest: Row,
}

/// Pairs a pattern's ends with a row of known axes `o`: `end` with its last axes, `beg` with
/// the first of the rest. `None` when the pattern, as the result's template, has more axes
/// than the result (the ordinary rules report it).
fn pair_with_fixed_row<'a>(
    beg: &'a [Dim],
    end: &'a [Dim],
    o: &'a Row,
    operand: bool,
) -> Option<PatternPairs<'a>> {
    let od = &o.dims;
    let n = od.len();
    let k = end.len().min(n);
    let middle = &od[..n - k];
    let j = beg.len().min(middle.len());
    if !operand && (k < end.len() || j < beg.len()) {
        // The pattern has more axes than the result: the ordinary rules report it.
        return None;
    }
    let mut pairs: Vec<(&Dim, &Dim)> = end[end.len() - k..].iter().zip(&od[n - k..]).collect();
    pairs.extend(beg[..j].iter().zip(&middle[..j]));
    Some(PatternPairs { pairs, rest: Row::fixed(middle[j..].to_vec(), o.id) })
}

/// Pairs a pattern's ends with a row `o` with row variable `ov` that shows at least as many
/// leading and trailing axes: what is left keeps `ov` between the unpaired axes.
fn pair_with_open_row<'a>(
    beg: &'a [Dim],
    end: &'a [Dim],
    o: &'a Row,
    ov: RowVar,
) -> PatternPairs<'a> {
    let (ob, od) = (o.beg_dims(), &o.dims);
    let mut pairs: Vec<(&Dim, &Dim)> = end.iter().zip(&od[od.len() - end.len()..]).collect();
    pairs.extend(beg.iter().zip(ob));
    let rest = Row {
        dims: od[..od.len() - end.len()].to_vec(),
        bcast: Bcast::Var { v: ov, beg_dims: ob[beg.len()..].to_vec() },
        id: o.id,
    };
    PatternPairs { pairs, rest }
}

/// The constraints of a paired pattern: each pair's dimension inequality, and the pattern's
/// row variable (`var_row`) against what is left, in the direction of `cur ≥ subr`.
fn pattern_constraints(
    paired: PatternPairs<'_>,
    var_row: Row,
    operand: bool,
    origin: &Origin,
) -> Vec<Constr> {
    let mut out: Vec<Constr> = paired
        .pairs
        .into_iter()
        .map(|(p, x)| {
            let (c, s) = if operand { (p, x) } else { (x, p) };
            Constraint::DimIneq { cur: c.clone(), subr: s.clone() }.at(origin)
        })
        .collect();
    let rest = paired.rest;
    let (c, s) = if operand { (var_row, rest) } else { (rest, var_row) };
    out.push(Constraint::RowIneq { cur: Arc::new(c), subr: Arc::new(s) }.at(origin));
    out
}

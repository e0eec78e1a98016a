//! Inequalities `cur ≥ subr`: `solve_dim_ineq`, `solve_row_ineq` and least upper bounds.
//!
//! For dimensions the order is flat: 1 is below everything, other sizes are incomparable. So
//! `cur ≥ subr` with a known `subr > 1` forces `cur = subr`, a known `cur = 1` forces `subr = 1`,
//! and a known `cur > 1` becomes `subr`'s least upper bound. A second, different upper bound
//! `> 1` forces `subr` to 1: the only size below both 3 and 4 is 1. (That is the unique
//! solution, so it is not an error; an operation that then needs the axis larger than 1 reports
//! the conflict.) Between two variables the relation is stored as bounds; a cycle of `≥` means
//! equality.
//!
//! For rows, trailing axes pair from the right (and leading axes from the left when one side is
//! an einsum pattern, see below), and the rest is absorbed by row variables: the `cur` side is
//! expanded with a variables-only template when `subr` has more axes than `cur` can show (so
//! `cur` has at least `subr`'s axes), and the part of `cur` left over becomes `subr`'s least
//! upper bound. Row upper bounds meet dimension-wise;
//! where a meet of two bounds cannot be written down yet (both end in unknown row variables),
//! the second bound waits for a later pass.
//!
//! An einsum pattern's leading axes (before its row variable) anchor at the start of the row it
//! is matched with, its trailing axes at the end, and the row variable takes the middle. That
//! holds even when another operand has already fixed the row variable: such a pattern is not
//! substituted into an ordinary row (`solve_known_pattern`). At stage 6 a tensor's row variable
//! closes before a pattern's for the same reason. Between two tensors' rows broadcasting is
//! NumPy's, from the right: a tensor's leading axes (taken from a pattern) are its first axes,
//! but where they fall in a longer row is known only once its row variable is, so that waits.
//! At stage 6 a constraint stuck on an ambiguity closes a row variable only when it gets the
//! solver's closing turn (one at a time, see `Solver::take_closing_turn`).
//!
//! Convolution and concatenation axes do not broadcast: compared with an unknown axis they are
//! equated. A known size above one whose parts may still make it 1 waits instead, since then
//! either outcome is possible.
//!
//! This file compares dimensions (`solve_dim_ineq`) and holds what the other files share. Rows
//! are paired in `rows.rs`, einsum patterns anchored in `pattern.rs`, and bounds between
//! variables stored and met in `bounds.rs`.

mod bounds;
mod pattern;
mod rows;

use crate::constraint::{Constr, Constraint, Origin};
use crate::dim::Dim;
use crate::error::{Conflict, conflict};
use crate::row::Row;
use crate::solve::Solver;
use crate::unify::labels_agree;

type Derived = Result<Vec<Constr>, Conflict>;

/// Whether a dimension is arithmetic (a convolution or concatenation axis): it does not
/// broadcast.
fn arithmetic(d: &Dim) -> bool {
    matches!(d, Dim::Conv(_) | Dim::Concat(_))
}

/// Whether two dimensions are the same (ignoring projection ids).
fn same_dim(a: &Dim, b: &Dim) -> bool {
    match (a, b) {
        (Dim::Solved(x), Dim::Solved(y)) => x.d == y.d && x.label == y.label,
        _ => a == b,
    }
}

/// Whether two rows are the same (ignoring projection ids and row ids).
fn same_row(a: &Row, b: &Row) -> bool {
    a.bcast_var_eq(b)
        && a.dims.len() == b.dims.len()
        && a.beg_dims().len() == b.beg_dims().len()
        && a.dims.iter().zip(&b.dims).all(|(x, y)| same_dim(x, y))
        && a.beg_dims().iter().zip(b.beg_dims()).all(|(x, y)| same_dim(x, y))
}

impl Row {
    fn bcast_var_eq(&self, other: &Row) -> bool {
        self.var() == other.var()
    }
}

impl Solver {
    /// Solves `cur ≥ subr` for dimensions.
    pub fn solve_dim_ineq(&mut self, cur: &Dim, subr: &Dim, origin: &Origin) -> Derived {
        if matches!(cur, Dim::Var(v) if self.is_kernel_dim(*v)) {
            // A kernel label paired with an argument's axis: that axis is the kernel, it does
            // not broadcast against the label. (Only the label itself, as the pairing of a
            // pattern's row left it: whatever else the label is equated with keeps its own
            // relations.)
            let eq = Constraint::DimEq { d1: cur.clone(), d2: subr.clone() };
            return Ok(self.derive_one(eq.at(origin)));
        }
        let cur = self.env.subst_dim_cow(cur);
        let subr = self.env.subst_dim_cow(subr);
        let (cur, subr) = (cur.as_ref(), subr.as_ref());
        if same_dim(cur, subr) {
            return Ok(vec![]);
        }
        if let (Some(c), Some(s)) = (cur.size(), subr.size()) {
            if c == s {
                if !labels_agree(cur, subr) {
                    return Err(conflict(
                        format!("axes of size {c} have different labels: {cur} vs {subr}"),
                        origin,
                    ));
                }
                return Ok(vec![]);
            }
            if s == 1 {
                return Ok(vec![]);
            }
            return Err(conflict(
                format!(
                    "dimension {subr} cannot broadcast to {cur} ({cur} >= {subr} fails: only a \
                     dimension of 1 broadcasts)"
                ),
                origin,
            ));
        }
        if subr.is_one() {
            return Ok(vec![]);
        }
        let eq =
            |d1: &Dim, d2: &Dim| Constraint::DimEq { d1: d1.clone(), d2: d2.clone() }.at(origin);
        if cur.is_one() {
            return Ok(self.derive_one(eq(subr, cur)));
        }
        if arithmetic(subr) && cur.size().is_some() && subr.can_be_one() {
            // A known size above an arithmetic axis whose parts may still make it 1: once its
            // parts are known it either equals cur or broadcasts as 1, and which one depends on
            // them. Equating now would make the outcome depend on whether the parts were known
            // first.
            self.defer(Constraint::DimIneq { cur: cur.clone(), subr: subr.clone() }.at(origin));
            return Ok(vec![]);
        }
        let windowless = matches!(cur, Dim::Conv(c) if c.is_windowless());
        if let (true, false, Dim::Var(s)) = (arithmetic(cur), windowless, subr) {
            // An axis below a convolution or concatenation axis may still broadcast as 1: the
            // arithmetic axis is an upper bound, like a known size.
            return self.add_dim_lub(*s, cur.clone(), origin);
        }
        if arithmetic(cur) || arithmetic(subr) {
            // Convolution and concatenation axes do not broadcast.
            return Ok(self.derive_one(eq(cur, subr)));
        }
        match (cur, subr) {
            (Dim::Var(_), Dim::Solved(_)) => Ok(self.derive_one(eq(cur, subr))),
            (Dim::Solved(_), Dim::Var(s)) => self.add_dim_lub(*s, cur.clone(), origin),
            (Dim::Var(c), Dim::Var(s)) => self.add_dim_var_ineq(*c, *s, origin),
            _ => Err(conflict(format!("cannot compare {cur} and {subr}"), origin)),
        }
    }
}

//! Bounds: how `cur ≥ subr` is stored once a side is a variable. Between two variables it is
//! an edge of the variables' order (a cycle means equality); a known side is the other's least
//! upper bound, and a second upper bound meets the first (for rows, dimension-wise).

use std::sync::Arc;

use crate::constraint::{Constr, Constraint, DimConstraint, Origin};
use crate::dim::Dim;
use crate::error::conflict;
use crate::row::{Bcast, Row};
use crate::solve::Solver;
use crate::unify::labels_agree;
use crate::var::{DimVar, RowVar};

use super::{Derived, arithmetic, same_dim, same_row};

impl Solver {
    /// `lub ≥ s` for a solved `lub > 1`.
    pub(super) fn add_dim_lub(&mut self, s: DimVar, lub: Dim, origin: &Origin) -> Derived {
        let mut b = self.env.dim_bounds(s).clone();
        if let Some((old, _)) = &mut b.lub {
            // An arithmetic bound may have been solved since it was recorded.
            *old = self.env.subst_dim(old);
        }
        let mut out = self.derived_list();
        match &b.lub {
            None => {
                if let Some((DimConstraint::AtLeast(n), o)) = &b.constr
                    && lub.size().is_some_and(|l| l < *n)
                    && *n > 1
                {
                    return Err(conflict(
                        format!("an axis indexed at position {} cannot be at most {lub}", n - 1),
                        &o.join(origin),
                    ));
                }
                for s2 in &b.subr {
                    out.push(
                        Constraint::DimIneq { cur: lub.clone(), subr: Dim::Var(*s2) }.at(origin),
                    );
                }
                b.lub = Some((lub, origin.clone()));
            }
            Some((old, _)) if old.size().is_none() || lub.size().is_none() => {
                // An arithmetic bound whose size is not known yet: whether the two bounds are
                // the same size (s may be either) or not (s is 1) is decided once it is.
                if !same_dim(old, &lub) {
                    self.defer(Constraint::DimIneq { cur: lub, subr: Dim::Var(s) }.at(origin));
                }
                return Ok(vec![]);
            }
            Some((old, _)) if old.size() == lub.size() => {
                if !labels_agree(old, &lub) {
                    return Err(conflict(
                        format!("axes of size {old} have different labels: {old} vs {lub}"),
                        origin,
                    ));
                }
                return Ok(vec![]);
            }
            Some((_, o)) => {
                let both = o.join(origin);
                out.push(Constraint::DimEq { d1: Dim::Var(s), d2: Dim::of(1) }.at(&both));
                b.lub = Some((Dim::of(1), both));
            }
        }
        self.env.set_dim_bounds(s, b);
        Ok(out)
    }

    /// `c ≥ s` between two dimension variables.
    pub(super) fn add_dim_var_ineq(&mut self, c: DimVar, s: DimVar, origin: &Origin) -> Derived {
        if self.env.dim_below(c, s) {
            // Already known (re-derived constraints land here: check this first, it is quick).
            return Ok(vec![]);
        }
        if self.env.dim_below(s, c) {
            // s ≥ … ≥ c ≥ s: a cycle means equality.
            let eq = Constraint::DimEq { d1: Dim::Var(c), d2: Dim::Var(s) };
            return Ok(self.derive_one(eq.at(origin)));
        }
        let mut out = self.derived_list();
        if let Some(bc) = self.env.dim_bounds_mut(c) {
            bc.subr.push(s);
        }
        if let Some(bs) = self.env.dim_bounds_mut(s) {
            bs.cur.push(c);
        }
        let (bc, bs) = (self.env.dim_bounds(c), self.env.dim_bounds(s));
        if let Some((lub, o)) = &bc.lub {
            out.push(
                Constraint::DimIneq { cur: lub.clone(), subr: Dim::Var(s) }.at(&o.join(origin)),
            );
        }
        // A lower bound > 1 on s rules out broadcasting, so c equals s and shares the bound.
        if let Some((constr, o)) = &bs.constr
            && constr.lower_bound().is_some()
        {
            out.push(
                Constraint::DimConstr { d: Dim::Var(c), constr: constr.clone() }
                    .at(&o.join(origin)),
            );
        }
        Ok(out)
    }
    /// `c ≥ s` between two row variables.
    pub(super) fn add_row_var_ineq(
        &mut self,
        c: RowVar,
        s: RowVar,
        like: &Row,
        origin: &Origin,
    ) -> Derived {
        if self.env.row_below(c, s) {
            return Ok(vec![]);
        }
        if self.env.row_below(s, c) {
            return Ok(vec![
                Constraint::RowEq {
                    r1: Arc::new(Row::of_var(c, like.id)),
                    r2: Arc::new(Row::of_var(s, like.id)),
                }
                .at(origin),
            ]);
        }
        if let Some(bc) = self.env.row_bounds_mut(c) {
            bc.subr.push(s);
        }
        if let Some(bs) = self.env.row_bounds_mut(s) {
            bs.cur.push(c);
        }
        let mut out = self.derived_list();
        if let Some((lub, o)) = &self.env.row_bounds(c).lub {
            out.push(
                Constraint::RowIneq {
                    cur: Arc::clone(lub),
                    subr: Arc::new(Row::of_var(s, like.id)),
                }
                .at(&o.join(origin)),
            );
        }
        Ok(out)
    }

    /// `bound ≥ s` for a row variable `s`: meets `bound` into s's least upper bound.
    pub(super) fn add_row_lub(&mut self, s: RowVar, bound: Row, origin: &Origin) -> Derived {
        let bound = if self.env.row_is_normal(&bound) { bound } else { self.env.subst_row(&bound) };
        if bound.var() == Some(s) {
            // [..s.., more] >= s says nothing useful about s's size.
            return Ok(vec![]);
        }
        let bound = Arc::new(bound);
        let old_lub = self
            .env
            .row_bounds(s)
            .lub
            .as_ref()
            .map(|(r, o)| (self.env.subst_row_arc(r), o.clone()));
        let mut out = self.derived_list();
        let new_lub = match &old_lub {
            None => Arc::clone(&bound),
            Some((old, _)) => match self.meet_rows(old, &bound, origin, &mut out) {
                Some(m) => m,
                None => {
                    let subr = Arc::new(Row::of_var(s, old.id));
                    out.extend(self.wait_or_close(bound, subr, origin)?);
                    return Ok(out);
                }
            },
        };
        if old_lub.as_ref().is_some_and(|(old, _)| same_row(&self.env.subst_row_cow(old), &new_lub))
        {
            return Ok(out);
        }
        for s2 in &self.env.row_bounds(s).subr {
            out.push(
                Constraint::RowIneq {
                    cur: Arc::clone(&bound),
                    subr: Arc::new(Row::of_var(*s2, bound.id)),
                }
                .at(origin),
            );
        }
        let lub_origin = match &old_lub {
            Some((_, o)) => o.join(origin),
            None => origin.clone(),
        };
        if new_lub.is_empty_fixed() {
            // Nothing but no axes is below [].
            out.push(
                Constraint::RowEq {
                    r1: Arc::new(Row::of_var(s, new_lub.id)),
                    r2: Arc::clone(&new_lub),
                }
                .at(&lub_origin),
            );
        }
        if let Some(b) = self.env.row_bounds_mut(s) {
            b.lub = Some((new_lub, lub_origin));
        }
        Ok(out)
    }

    /// The greatest row below both `a` and `b`, or `None` when it cannot be written down yet.
    fn meet_rows(
        &mut self,
        a: &Arc<Row>,
        b: &Row,
        origin: &Origin,
        out: &mut Vec<Constr>,
    ) -> Option<Arc<Row>> {
        if same_row(a, b) {
            return Some(Arc::clone(a));
        }
        let k = a.dims.len().min(b.dims.len());
        let (ra, rb) = (&a.dims[..a.dims.len() - k], &b.dims[..b.dims.len() - k]);
        let a_rest_empty = ra.is_empty() && a.var().is_none();
        let b_rest_empty = rb.is_empty() && b.var().is_none();
        let prefix_same = ra.is_empty()
            && rb.is_empty()
            && a.var() == b.var()
            && a.beg_dims().len() == b.beg_dims().len()
            && a.beg_dims().iter().zip(b.beg_dims()).all(|(x, y)| same_dim(x, y));
        if !(a_rest_empty || b_rest_empty || prefix_same) {
            return None;
        }
        let mut dims = Vec::with_capacity(k);
        for (x, y) in a.dims[a.dims.len() - k..].iter().zip(&b.dims[b.dims.len() - k..]) {
            dims.push(self.meet_dims(x, y, origin, out));
        }
        let bcast =
            if a_rest_empty || b_rest_empty { Bcast::Broadcastable } else { a.bcast.clone() };
        Some(Arc::new(Row { dims, bcast, id: a.id }))
    }

    /// The greatest dimension below both `x` and `y` (a fresh variable when it is not known).
    fn meet_dims(&mut self, x: &Dim, y: &Dim, origin: &Origin, out: &mut Vec<Constr>) -> Dim {
        let x = self.env.subst_dim(x);
        let y = self.env.subst_dim(y);
        if same_dim(&x, &y) || self.dim_known_below(&x, &y) {
            return x;
        }
        if self.dim_known_below(&y, &x) {
            return y;
        }
        if x.is_one() || y.is_one() {
            return Dim::of(1);
        }
        if x.size().is_some() && y.size().is_some() {
            // Two different sizes > 1: only 1 is below both.
            return Dim::of(1);
        }
        // Below an arithmetic axis (which does not broadcast) is only the axis itself: the meet
        // is that axis, below the other (so a parameter bounded by a convolution takes it as its
        // least upper bound). A fresh variable here would be equated with the axis and, while
        // two such axes cannot be compared yet, a new one would be made on every pass.
        if arithmetic(&x) {
            out.push(Constraint::DimIneq { cur: y, subr: x.clone() }.at(origin));
            return x;
        }
        if arithmetic(&y) {
            out.push(Constraint::DimIneq { cur: x, subr: y.clone() }.at(origin));
            return y;
        }
        let l = self.vars.dim();
        out.push(Constraint::DimIneq { cur: x, subr: Dim::Var(l) }.at(origin));
        out.push(Constraint::DimIneq { cur: y, subr: Dim::Var(l) }.at(origin));
        Dim::Var(l)
    }

    /// Whether `x ≤ y` is already known (so the meet of `x` and `y` is `x`).
    fn dim_known_below(&mut self, x: &Dim, y: &Dim) -> bool {
        match (x, y) {
            (_, _) if x.is_one() => true,
            (Dim::Var(a), Dim::Var(b)) => self.env.dim_below(*b, *a),
            (Dim::Var(a), _) => match &self.env.dim_bounds(*a).lub {
                Some((l, _)) => l.size().is_some() && l.size() == y.size(),
                None => false,
            },
            _ => false,
        }
    }
}

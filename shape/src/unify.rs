//! Equations: `unify_dim` and `unify_row`.
//!
//! Unification is strict equality, no broadcasting. Binding a variable re-checks whatever its
//! bounds said against the new value: each `cur` variable must be `≥` it, each `subr` variable
//! `≤` it, the least upper bound `≥` it, and its constraint must hold. Arithmetic dimensions
//! (convolutions, concatenations) are solved for their missing part once enough is known, and
//! deferred until then.

use std::sync::Arc;

use crate::constraint::{Constr, Constraint, Origin, RowConstraint};
use crate::dim::{ConvDim, Dim};
use crate::env::{fresh_dims, row_with_var};
use crate::error::{Conflict, conflict};
use crate::row::{Bcast, MAX_ROW_AXES, Row};
use crate::solve::Solver;
use crate::stage::Stage;
use crate::var::{DimVar, RowVar};

type Derived = Result<Vec<Constr>, Conflict>;

/// Whether two solved dimensions have compatible labels (a missing label matches any).
pub(crate) fn labels_agree(a: &Dim, b: &Dim) -> bool {
    match (a.label(), b.label()) {
        (Some(x), Some(y)) => x == y,
        _ => true,
    }
}

/// Two convolutions of the same stride (and dilation, where the kernel counts) are equal exactly
/// when their outputs are, given equal kernels: the equations that say so, or `None` when the
/// sizes depend on the parts in another way.
fn same_conv_shape(a: &ConvDim, b: &ConvDim) -> Option<Vec<(Dim, Dim)>> {
    if a.stride != b.stride || a.kernel_counts() != b.kernel_counts() {
        return None;
    }
    if !a.kernel_counts() {
        // stride·o1 = stride·o2.
        return Some(vec![(a.output.clone(), b.output.clone())]);
    }
    if a.dilation != b.dilation {
        return None;
    }
    if a.kernel == b.kernel {
        Some(vec![(a.output.clone(), b.output.clone())])
    } else if a.output == b.output {
        Some(vec![(a.kernel.clone(), b.kernel.clone())])
    } else {
        None
    }
}

impl Solver {
    /// Solves `d1 = d2`.
    pub fn unify_dim(&mut self, d1: &Dim, d2: &Dim, origin: &Origin) -> Derived {
        let d1 = self.env.subst_dim_cow(d1);
        let d2 = self.env.subst_dim_cow(d2);
        let (d1, d2) = (d1.as_ref(), d2.as_ref());
        if d1 == d2 {
            // The same dimension (arithmetic ones included, whose parts need not be known).
            return Ok(vec![]);
        }
        match (d1, d2) {
            (Dim::Solved(a), Dim::Solved(b)) => {
                if a.d != b.d {
                    return Err(conflict(
                        format!("dimensions {d1} and {d2} must be equal"),
                        origin,
                    ));
                }
                if !labels_agree(d1, d2) {
                    return Err(conflict(
                        format!("axes of size {} have different labels: {d1} vs {d2}", a.d),
                        origin,
                    ));
                }
                Ok(vec![])
            }
            (Dim::Var(a), Dim::Var(b)) if a == b => Ok(vec![]),
            (Dim::Var(v), other) | (other, Dim::Var(v)) => self.bind_dim(*v, other.clone(), origin),
            (Dim::Conv(c), other) | (other, Dim::Conv(c)) => self.unify_conv(c, other, origin),
            (Dim::Concat(parts), other) | (other, Dim::Concat(parts)) => {
                self.unify_concat(parts, other, origin)
            }
        }
    }

    /// Records `v = value` and re-checks v's former bounds against the value.
    pub(crate) fn bind_dim(&mut self, v: DimVar, value: Dim, origin: &Origin) -> Derived {
        if let Dim::Conv(c) = &value {
            if c.is_windowless() {
                // A convolution without window reads nothing and does not constrain its input:
                // v stays free. Its kernel and output are both 0.
                let zero = |d: &Dim| Constraint::DimEq { d1: d.clone(), d2: Dim::of(0) }.at(origin);
                return Ok(vec![zero(&c.output), zero(&c.kernel)]);
            }
            if c.stride == 1 && c.output.mentions(v) {
                // v = v' + dilation·(k - 1) with v' containing v: only a kernel of 1 (or no
                // kernel) keeps it finite, and then v equals the convolution's output.
                let mut out =
                    vec![Constraint::DimEq { d1: Dim::Var(v), d2: c.output.clone() }.at(origin)];
                if c.kernel_counts() {
                    out.push(Constraint::DimEq { d1: c.kernel.clone(), d2: Dim::of(1) }.at(origin));
                }
                return Ok(out);
            }
            if c.kernel_counts() && c.kernel == Dim::Var(v) && !c.output.mentions(v) {
                // v = stride·(o - 1) + dilation·(v - 1) + 1, i.e.
                // stride·(o - 1) + (dilation - 1)·(v - 1) = 0: the output is 1, and a dilated
                // kernel is 1 too (an undilated one can be anything).
                let mut out =
                    vec![Constraint::DimEq { d1: c.output.clone(), d2: Dim::of(1) }.at(origin)];
                if c.dilation > 1 {
                    out.push(Constraint::DimEq { d1: Dim::Var(v), d2: Dim::of(1) }.at(origin));
                }
                return Ok(out);
            }
            if c.kernel_counts() && c.output == Dim::Var(v) && !c.kernel.mentions(v) {
                // v = stride·(v - 1) + dilation·(k - 1) + 1 with stride > 1:
                // (stride - 1)·(v - 1) + dilation·(k - 1) = 0, so both are 1.
                return Ok(vec![
                    Constraint::DimEq { d1: Dim::Var(v), d2: Dim::of(1) }.at(origin),
                    Constraint::DimEq { d1: c.kernel.clone(), d2: Dim::of(1) }.at(origin),
                ]);
            }
            if (c.kernel_counts() || !c.output.mentions(v)) && value.mentions(v) {
                // Any other convolution mentioning v (in an output that is not just v, or in a
                // kernel that does not count towards the size) constrains its other parts, or
                // holds only for particular sizes: wait until the parts are known and it
                // simplifies. (Binding v to a value that contains it would make substitution
                // recurse forever.) A strided output of v without a kernel, `v = 2*v`, has no
                // solution.
                self.defer(Constraint::DimEq { d1: Dim::Var(v), d2: value.clone() }.at(origin));
                return Ok(vec![]);
            }
        }
        if value.mentions(v) {
            return Err(conflict(
                format!("dimension {v} would have to equal {value}, which contains it"),
                origin,
            ));
        }
        let old = self.env.solve_dim(v, value.clone(), origin.clone());
        let mut out = self.derived_list();
        for c in old.cur {
            out.push(Constraint::DimIneq { cur: Dim::Var(c), subr: value.clone() }.at(origin));
        }
        for s in old.subr {
            out.push(Constraint::DimIneq { cur: value.clone(), subr: Dim::Var(s) }.at(origin));
        }
        if let Some((lub, o)) = old.lub {
            out.push(Constraint::DimIneq { cur: lub, subr: value.clone() }.at(&o.join(origin)));
        }
        if let Some((constr, o)) = old.constr {
            out.push(Constraint::DimConstr { d: value, constr }.at(&o.join(origin)));
        }
        Ok(out)
    }

    /// `conv = other` where `other` is not a variable.
    fn unify_conv(&mut self, c: &Arc<ConvDim>, other: &Dim, origin: &Origin) -> Derived {
        if let Dim::Conv(o) = other
            && let Some(eqs) = same_conv_shape(c, o)
        {
            return Ok(eqs
                .into_iter()
                .map(|(d1, d2)| Constraint::DimEq { d1, d2 }.at(origin))
                .collect());
        }
        let Some(n) = other.size() else {
            // Two arithmetic dimensions with unknown parts: wait for more information.
            self.defer(
                Constraint::DimEq { d1: Dim::Conv(c.clone()), d2: other.clone() }.at(origin),
            );
            return Ok(vec![]);
        };
        let bad = |why: String| Conflict {
            conv: Some(c.clone()),
            ..conflict(
                format!("convolution axis {} cannot have size {n}: {why}", Dim::Conv(c.clone())),
                origin,
            )
        };
        if !c.kernel_counts() {
            let out = c.solve_output(n, 0).map_err(|e| bad(e.0))?;
            return Ok(vec![
                Constraint::DimEq { d1: c.output.clone(), d2: Dim::of(out) }.at(origin),
            ]);
        }
        match (c.output.size(), c.kernel.size()) {
            (_, Some(k)) => {
                let out = c.solve_output(n, k).map_err(|e| bad(e.0))?;
                Ok(vec![Constraint::DimEq { d1: c.output.clone(), d2: Dim::of(out) }.at(origin)])
            }
            (Some(o), None) => {
                let k = c.solve_kernel(n, o).map_err(|e| bad(e.0))?;
                Ok(vec![Constraint::DimEq { d1: c.kernel.clone(), d2: Dim::of(k) }.at(origin)])
            }
            (None, None) => {
                if let Some(eq) = self.conv_part_to_lub(c, origin) {
                    // The size then determines the other part (or fails, naming both sources).
                    let again = Constraint::DimEq { d1: Dim::Conv(c.clone()), d2: other.clone() };
                    let both = eq.origin.clone();
                    return Ok(vec![eq, again.at(&both)]);
                }
                if self.stage == Stage::DimsToLowerBound {
                    self.note_open_conv(c, n, origin);
                }
                self.defer(
                    Constraint::DimEq { d1: Dim::Conv(c.clone()), d2: other.clone() }.at(origin),
                );
                Ok(vec![])
            }
        }
    }

    /// A convolution axis of known size with both its kernel and its output unknown: from the
    /// first closing stage on, a part that has a least upper bound (a later operation matched
    /// it with a known size) takes it, before anything is closed to 1. The part cannot
    /// broadcast inside the convolution, so the bound is the size the later operation needs;
    /// the other part then follows from the size. `None` when neither part has a bound.
    fn conv_part_to_lub(&self, c: &ConvDim, origin: &Origin) -> Option<Constr> {
        if self.stage < Stage::TerminalDimsToOne {
            return None;
        }
        [&c.kernel, &c.output].into_iter().find_map(|part| {
            let Dim::Var(v) = part else { return None };
            let (lub, from) = self.env.dim_bounds(*v).lub.clone()?;
            let eq = Constraint::DimEq { d1: part.clone(), d2: lub };
            Some(eq.at(&origin.join(&from)))
        })
    }

    /// Records a convolution axis whose parts only closing will decide (once per axis).
    fn note_open_conv(&mut self, c: &Arc<ConvDim>, size: usize, origin: &Origin) {
        if !self.open_convs.iter().any(|o| o.conv == *c && o.origin == *origin) {
            let conv = c.clone();
            self.open_convs.push(crate::solve::OpenConv { conv, size, origin: origin.clone() });
        }
    }

    /// `a^b^… = other` where `other` is not a variable.
    fn unify_concat(&mut self, parts: &[Dim], other: &Dim, origin: &Origin) -> Derived {
        let whole = Dim::Concat(parts.to_vec());
        let Some(n) = other.size() else {
            self.defer(Constraint::DimEq { d1: whole, d2: other.clone() }.at(origin));
            return Ok(vec![]);
        };
        let known = parts.iter().filter_map(Dim::size).try_fold(0usize, usize::checked_add);
        let unknown: Vec<&Dim> = parts.iter().filter(|p| p.size().is_none()).collect();
        let Some(known) = known.filter(|k| k.checked_add(unknown.len()).is_some_and(|m| m <= n))
        else {
            let known = parts.iter().filter_map(Dim::size).fold(0usize, usize::saturating_add);
            return Err(conflict(
                format!(
                    "concatenated axis {whole} cannot have size {n}: its known parts already \
                     take {known} positions{}",
                    if unknown.is_empty() {
                        String::new()
                    } else {
                        format!(" and {} more part(s) need at least one each", unknown.len())
                    }
                ),
                origin,
            ));
        };
        match unknown.as_slice() {
            [] if known == n => Ok(vec![]),
            [] => Err(conflict(
                format!("concatenated axis {whole} has size {known}, not {n}"),
                origin,
            )),
            [part] => Ok(vec![
                Constraint::DimEq { d1: (*part).clone(), d2: Dim::of(n - known) }.at(origin),
            ]),
            _ => {
                self.defer(Constraint::DimEq { d1: whole, d2: other.clone() }.at(origin));
                Ok(vec![])
            }
        }
    }

    /// Solves `r1 = r2`: pairs leading axes from the left and trailing axes from the right,
    /// and binds row variables to what is left over.
    pub fn unify_row(&mut self, r1: &Row, r2: &Row, origin: &Origin) -> Derived {
        self.unify_shared_rows(&Arc::new(r1.clone()), &Arc::new(r2.clone()), origin)
    }

    /// [`Solver::unify_row`] of shared rows (those of a constraint).
    pub(crate) fn unify_shared_rows(
        &mut self,
        r1: &Arc<Row>,
        r2: &Arc<Row>,
        origin: &Origin,
    ) -> Derived {
        let a = self.env.subst_row_arc(r1);
        let b = self.env.subst_row_arc(r2);
        if a.dims == b.dims && a.bcast == b.bcast {
            return Ok(vec![]);
        }
        let mismatch =
            |why: &str| conflict(format!("rows [{a}] and [{b}] must be equal, but {why}"), origin);
        let eq =
            |d1: &Dim, d2: &Dim| Constraint::DimEq { d1: d1.clone(), d2: d2.clone() }.at(origin);
        match (a.var(), b.var()) {
            (None, None) => {
                if a.dims.len() != b.dims.len() {
                    return Err(mismatch("they have different numbers of axes"));
                }
                Ok(a.dims.iter().zip(&b.dims).map(|(x, y)| eq(x, y)).collect())
            }
            (Some(v), None) | (None, Some(v)) => {
                let (var_row, fixed) = if a.var().is_some() { (&a, &b) } else { (&b, &a) };
                let (beg, end) = (var_row.beg_dims(), &var_row.dims);
                if fixed.dims.len() < beg.len() + end.len() {
                    return Err(mismatch("the second has fewer axes than the first requires"));
                }
                let n = fixed.dims.len();
                let mut out: Vec<Constr> =
                    beg.iter().zip(&fixed.dims).map(|(x, y)| eq(x, y)).collect();
                out.extend(end.iter().zip(&fixed.dims[n - end.len()..]).map(|(x, y)| eq(x, y)));
                let middle = Row::fixed(fixed.dims[beg.len()..n - end.len()].to_vec(), var_row.id);
                let more = self.bind_row(v, middle, origin)?;
                self.absorb(&mut out, more);
                Ok(out)
            }
            (Some(va), Some(vb)) if va == vb => {
                if a.beg_dims().len() != b.beg_dims().len() || a.dims.len() != b.dims.len() {
                    return Err(mismatch(&format!(
                        "row variable {va} would have to contain itself and more axes"
                    )));
                }
                let mut out: Vec<Constr> =
                    a.beg_dims().iter().zip(b.beg_dims()).map(|(x, y)| eq(x, y)).collect();
                out.extend(a.dims.iter().zip(&b.dims).map(|(x, y)| eq(x, y)));
                Ok(out)
            }
            (Some(va), Some(vb)) => {
                let (ab, bb) = (a.beg_dims(), b.beg_dims());
                let j = ab.len().min(bb.len());
                let k = a.dims.len().min(b.dims.len());
                let mut out: Vec<Constr> = ab.iter().zip(bb).map(|(x, y)| eq(x, y)).collect();
                let (na, nb) = (a.dims.len(), b.dims.len());
                out.extend(a.dims[na - k..].iter().zip(&b.dims[nb - k..]).map(|(x, y)| eq(x, y)));
                // The leftovers: at most one side has leading axes left, at most one trailing.
                let (ab2, bb2) = (ab[j..].to_vec(), bb[j..].to_vec());
                let (ad2, bd2) = (a.dims[..na - k].to_vec(), b.dims[..nb - k].to_vec());
                if ab2.is_empty() && ad2.is_empty() {
                    let more = self.bind_row(va, row_with_var(bb2, vb, bd2, &b), origin)?;
                    self.absorb(&mut out, more);
                } else if bb2.is_empty() && bd2.is_empty() {
                    let more = self.bind_row(vb, row_with_var(ab2, va, ad2, &a), origin)?;
                    self.absorb(&mut out, more);
                } else if self.stage >= Stage::RowsToNoMoreAxes && self.take_closing_turn() {
                    // [x.., ..va..] = [..vb.., y..] has several unrelated solutions; closing
                    // picks the smallest: va gets no further axes.
                    let more = self.bind_row(va, Row::empty(a.id), origin)?;
                    self.absorb(&mut out, more);
                    out.push(Constraint::RowEq { r1: a, r2: b }.at(origin));
                } else {
                    // Wait until one of the variables is known.
                    self.defer(Constraint::RowEq { r1: a, r2: b }.at(origin));
                }
                Ok(out)
            }
        }
    }

    /// Records that row variable `v` stands for `value`, re-checking its former bounds.
    pub(crate) fn bind_row(
        &mut self,
        v: RowVar,
        value: impl Into<Arc<Row>>,
        origin: &Origin,
    ) -> Derived {
        let value = self.env.subst_row_arc(&value.into());
        if value.var() == Some(v) {
            if value.num_fixed() == 0 {
                return Ok(vec![]);
            }
            return Err(conflict(
                format!("row variable {v} would have to equal [{value}], which contains it"),
                origin,
            ));
        }
        let old = self.env.solve_row(v, Arc::clone(&value), origin.clone());
        let mut out = self.derived_list();
        out.reserve(old.cur.len() + old.subr.len() + usize::from(old.lub.is_some()) + 1);
        for c in old.cur {
            out.push(
                Constraint::RowIneq {
                    cur: Arc::new(Row::of_var(c, value.id)),
                    subr: Arc::clone(&value),
                }
                .at(origin),
            );
        }
        for s in old.subr {
            out.push(
                Constraint::RowIneq {
                    cur: Arc::clone(&value),
                    subr: Arc::new(Row::of_var(s, value.id)),
                }
                .at(origin),
            );
        }
        if let Some((lub, o)) = old.lub {
            out.push(
                Constraint::RowIneq { cur: lub, subr: Arc::clone(&value) }.at(&o.join(origin)),
            );
        }
        if let Some((constr, o)) = old.constr
            && constr != RowConstraint::Unconstrained
        {
            let rows = vec![Arc::unwrap_or_clone(value)];
            out.push(Constraint::RowsConstr { rows, constr }.at(&o.join(origin)));
        }
        Ok(out)
    }

    /// Expands row variable `v` of `row` so it has at least `beg` leading and `end` trailing
    /// axes: `v := beg fresh dims ++ ..v2.. ++ end fresh dims`.
    pub(crate) fn expand_row_var(
        &mut self,
        v: RowVar,
        beg: usize,
        end: usize,
        like: &Row,
        origin: &Origin,
    ) -> Derived {
        // Each expansion puts at least one more axis around the new variable, so a variable
        // `depth` expansions away from a declared row sits in a row of at least `depth` axes.
        let depth = self.row_depth.get(v.0 as usize).map_or(0, |d| usize::from(*d)) + 1;
        if depth > MAX_ROW_AXES {
            return Err(conflict(
                format!(
                    "row variable {v} would need more than {MAX_ROW_AXES} axes: the constraints \
                     make a row contain itself and more axes"
                ),
                origin,
            ));
        }
        let vars = &mut self.vars;
        let beg_dims = fresh_dims(beg, &mut || vars.dim());
        let end_dims = fresh_dims(end, &mut || vars.dim());
        let v2 = self.vars.row();
        let i = v2.0 as usize;
        if self.row_depth.len() <= i {
            self.row_depth.resize(i + 1, 0);
        }
        self.row_depth[i] = depth as u8;
        if self.is_template_row(v) {
            self.mark_template_row(v2);
        }
        let template = Row { dims: end_dims, bcast: Bcast::Var { v: v2, beg_dims }, id: like.id };
        self.bind_row(v, template, origin)
    }
}

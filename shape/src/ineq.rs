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

use std::sync::Arc;

use crate::constraint::{Constr, Constraint, DimConstraint, Origin};
use crate::dim::Dim;
use crate::env::RowEntry;
use crate::error::{Conflict, conflict};
use crate::row::{Bcast, Row, RowId};
use crate::solve::Solver;
use crate::stage::Stage;
use crate::unify::labels_agree;
use crate::var::{DimVar, RowVar};

type Derived = Result<Vec<Constr>, Conflict>;

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

    /// `lub ≥ s` for a solved `lub > 1`.
    fn add_dim_lub(&mut self, s: DimVar, lub: Dim, origin: &Origin) -> Derived {
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
    fn add_dim_var_ineq(&mut self, c: DimVar, s: DimVar, origin: &Origin) -> Derived {
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

    /// Whether `r` is an einsum pattern's row (its row variable is a pattern's, or was made by
    /// expanding one): its leading axes anchor at the start of the row it is matched with.
    fn is_pattern_row(&self, r: &Row) -> bool {
        r.var().is_some_and(|v| self.is_template_row(v))
    }

    /// A kernel's axis the argument lacks is a kernel of one tap (a missing axis broadcasts
    /// like an axis of 1, and a kernel's axis of 1 is one tap).
    fn missing_kernel_axes<'d>(
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
    fn keep_kernel_dims(&self, raw: &Row, subst: Arc<Row>) -> Arc<Row> {
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

    /// An inequality that cannot make progress yet: before stage 6 it waits; from stage 6 on,
    /// a row variable closes to no further axes — the sub-tensor's first, since shrinking
    /// `subr` keeps `cur ≥ subr` satisfiable while shrinking `cur` may not — and it is retried.
    /// A tensor's row variable closes before an einsum pattern's: closing the pattern's first
    /// would make it an ordinary row and lose the anchoring of its leading axes.
    fn wait_or_close(&mut self, cur: Arc<Row>, subr: Arc<Row>, origin: &Origin) -> Derived {
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

    /// `cur ≥ subr` where one side is an einsum pattern `beg ++ ..v.. ++ end` with leading axes
    /// whose row variable `v` is already known. Substituting `v` would splice its axes between
    /// `beg` and `end`, and the row would then line up with the other from the right, so `beg`
    /// would lose its anchor. Instead, as the notation says, `end` pairs with the other row's
    /// last axes, `beg` with its first axes, and `v` relates to what is left in the middle.
    /// `None` when there is no such pattern, or when the ordinary rules line the rows up the
    /// same way (the pattern is the result's template and the result does not show its axes
    /// yet: expanding the result gives it the pattern's layout).
    fn solve_known_pattern(
        &mut self,
        cur: &Arc<Row>,
        subr: &Arc<Row>,
        origin: &Origin,
    ) -> Option<Derived> {
        let known_pattern = |r: &Row| {
            r.var().is_some_and(|v| {
                !r.beg_dims().is_empty()
                    && self.is_template_row(v)
                    && matches!(self.env.row_entry(v), Some(RowEntry::Solved(..)))
            })
        };
        // `operand`: the pattern is an operand's template, above the argument's row.
        let (pattern, other, operand) = if known_pattern(cur) {
            (cur, subr, true)
        } else if known_pattern(subr) {
            (subr, cur, false)
        } else {
            return None;
        };
        let v = pattern.var()?;
        // Kernel labels stay variables, as in `keep_kernel_dims`.
        let subst = |d: &Dim| match d {
            Dim::Var(v) if self.is_kernel_dim(*v) => d.clone(),
            _ => self.env.subst_dim(d),
        };
        let beg: Vec<Dim> = pattern.beg_dims().iter().map(subst).collect();
        let end: Vec<Dim> = pattern.dims.iter().map(subst).collect();
        let o = self.env.subst_row(other);
        let (ob, od) = (o.beg_dims(), &o.dims);
        let (pairs, rest): (Vec<(&Dim, &Dim)>, Row) = match o.var() {
            None => {
                let n = od.len();
                let k = end.len().min(n);
                let middle = &od[..n - k];
                let j = beg.len().min(middle.len());
                if !operand && (k < end.len() || j < beg.len()) {
                    // The pattern has more axes than the result: the ordinary rules report it.
                    return None;
                }
                let mut pairs: Vec<(&Dim, &Dim)> =
                    end[end.len() - k..].iter().zip(&od[n - k..]).collect();
                pairs.extend(beg[..j].iter().zip(&middle[..j]));
                (pairs, Row::fixed(middle[j..].to_vec(), o.id))
            }
            Some(ov) => {
                if end.len() > od.len() || beg.len() > ob.len() {
                    if !operand {
                        return None;
                    }
                    // The argument does not show its first or last axes yet: pairing waits.
                    // A bare row variable still learns the pattern as its upper bound.
                    let mut out = Vec::new();
                    if o.num_fixed() == 0 {
                        let spliced = self.env.subst_row(pattern);
                        match self.add_row_lub(ov, spliced, origin) {
                            Ok(derived) => out = derived,
                            Err(e) => return Some(Err(e)),
                        }
                    }
                    self.defer(
                        Constraint::RowIneq { cur: Arc::clone(cur), subr: Arc::clone(subr) }
                            .at(origin),
                    );
                    return Some(Ok(out));
                }
                let mut pairs: Vec<(&Dim, &Dim)> =
                    end.iter().zip(&od[od.len() - end.len()..]).collect();
                pairs.extend(beg.iter().zip(ob));
                let rest = Row {
                    dims: od[..od.len() - end.len()].to_vec(),
                    bcast: Bcast::Var { v: ov, beg_dims: ob[beg.len()..].to_vec() },
                    id: o.id,
                };
                (pairs, rest)
            }
        };
        let var_row = Row::of_var(v, pattern.id);
        let mut out: Vec<Constr> = pairs
            .into_iter()
            .map(|(p, x)| {
                let (c, s) = if operand { (p, x) } else { (x, p) };
                Constraint::DimIneq { cur: c.clone(), subr: s.clone() }.at(origin)
            })
            .collect();
        let (c, s) = if operand { (var_row, rest) } else { (rest, var_row) };
        out.push(Constraint::RowIneq { cur: Arc::new(c), subr: Arc::new(s) }.at(origin));
        Some(Ok(out))
    }

    /// `c ≥ s` between two row variables.
    fn add_row_var_ineq(&mut self, c: RowVar, s: RowVar, like: &Row, origin: &Origin) -> Derived {
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
    fn add_row_lub(&mut self, s: RowVar, bound: Row, origin: &Origin) -> Derived {
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

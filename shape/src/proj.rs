//! Projection inference: from closed shapes to the indexing of one assignment.
//!
//! Knowing that two axes have the same size is not enough to know they are iterated together:
//! two axes can be equal because they are reduced together in *another* operation. To avoid such
//! contamination, each derivation starts from the closed shapes of one step, gives every axis of
//! every tensor instance a fresh projection id (two uses of one tensor get different ids),
//! regenerates the step's constraints with fresh template variables, and re-solves them in a
//! local environment. Then every equation or inequality between two axes becomes a projection
//! equation, solved with union-find:
//!
//! - a broadcast axis of size 1 (the `subr` side of `n ≥ 1`) is indexed at fixed position 0;
//! - a fixed index from the einsum spec or a batch slice fixes its class;
//! - a convolution axis is `stride*output + dilation*kernel` (minus the left padding when
//!   padded), an affine index over the classes of its output and kernel;
//! - a concatenated axis, for the operand that fills part `i` (by the spec's
//!   [`EinsumSpec::concat_fills`](crate::spec::EinsumSpec::concat_fills)), is
//!   `offset_i + part_i`;
//! - every other class of size > 1 is a product-space iterator, in order of first appearance
//!   (result axes first, so reductions are innermost).

use std::sync::Arc;

use rocannl_arrayjit::indexing::{AxisIndex, Projections, Symbol, SymbolGen};
use rustc_hash::FxHashMap;

use crate::constraint::{Constraint, Origin};
use crate::dim::{ConvDim, Dim, SolvedDim};
use crate::env::RowEntry;
use crate::error::{ShapeError, ShapeMismatch};
use crate::inference::Inference;
use crate::logic::{Derivation, Logic, Shape, get_inequalities};
use crate::row::Row;
use crate::row_constraint::slot_then;
use crate::solve::Solver;
use crate::stage::Stage;
use crate::var::{DimVar, ShapeId, StepId};

#[derive(Clone, Debug)]
enum Def {
    Conv {
        stride: usize,
        output: usize,
        dilation: usize,
        kernel: usize,
        padded: bool,
    },
    /// The nodes of the parts, and the parts' label variables (which concatenated axis of the
    /// spec this is).
    Concat(Vec<usize>, Vec<Option<DimVar>>),
}

#[derive(Clone, Debug, Default)]
struct Class {
    size: Option<usize>,
    fixed: Option<AxisIndex>,
    def: Option<Def>,
}

/// Union-find over axis instances and template variables.
struct ProjSolver<'a> {
    local: &'a Solver,
    proj_env: &'a FxHashMap<DimVar, AxisIndex>,
    parent: Vec<usize>,
    info: Vec<Class>,
    /// The node of each projection id and of each local dimension variable, indexed by their
    /// numbers (both are handed out densely by the local solver); `NONE` where there is none.
    by_proj: Vec<usize>,
    by_var: Vec<usize>,
}

/// No node yet.
const NONE: usize = usize::MAX;

/// The entry for index `i` of a dense table, grown as needed.
fn entry(table: &mut Vec<usize>, i: usize) -> &mut usize {
    if table.len() <= i {
        table.resize(i + 1, NONE);
    }
    &mut table[i]
}

impl<'a> ProjSolver<'a> {
    fn new_node(&mut self, class: Class) -> usize {
        self.parent.push(self.parent.len());
        self.info.push(class);
        self.parent.len() - 1
    }

    fn find(&mut self, mut n: usize) -> usize {
        while self.parent[n] != n {
            self.parent[n] = self.parent[self.parent[n]];
            n = self.parent[n];
        }
        n
    }

    fn union(&mut self, a: usize, b: usize) -> Result<(), String> {
        let (ra, rb) = (self.find(a), self.find(b));
        if ra == rb {
            return Ok(());
        }
        let b_info = std::mem::take(&mut self.info[rb]);
        let a_info = &mut self.info[ra];
        match (a_info.size, b_info.size) {
            (Some(x), Some(y)) if x != y => {
                return Err(format!("axes of sizes {x} and {y} would share one index"));
            }
            (None, s) => a_info.size = s,
            _ => {}
        }
        match (&a_info.fixed, b_info.fixed) {
            (Some(x), Some(y)) if *x != y => {
                return Err(format!("one axis would be indexed both at {x} and at {y}"));
            }
            (None, f) => a_info.fixed = f,
            _ => {}
        }
        if a_info.def.is_none() {
            a_info.def = b_info.def;
        }
        self.parent[rb] = ra;
        Ok(())
    }

    fn node(&mut self, d: &Dim) -> Result<usize, String> {
        match d {
            Dim::Var(v) => {
                let known = *entry(&mut self.by_var, v.0 as usize);
                if known != NONE {
                    return Ok(known);
                }
                let fixed = self.proj_env.get(v).cloned();
                let is_fixed = fixed.is_some();
                let n = self.new_node(Class { size: None, fixed, def: None });
                *entry(&mut self.by_var, v.0 as usize) = n;
                let local = self.local;
                if !is_fixed {
                    if let Some(crate::env::DimEntry::Solved(value, _)) = local.env.dim_entry(*v) {
                        let m = self.node(value)?;
                        self.union(n, m)?;
                    }
                } else {
                    let size = self.local.env.dim_size(d);
                    let r = self.find(n);
                    self.info[r].size = self.info[r].size.or(size);
                }
                Ok(n)
            }
            Dim::Solved(SolvedDim { d, proj_id: Some(p), .. }) => {
                let known = *entry(&mut self.by_proj, p.0 as usize);
                if known != NONE {
                    return Ok(known);
                }
                let n = self.new_node(Class { size: Some(*d), ..Class::default() });
                *entry(&mut self.by_proj, p.0 as usize) = n;
                Ok(n)
            }
            Dim::Solved(s) => Ok(self.new_node(Class { size: Some(s.d), ..Class::default() })),
            Dim::Conv(c) => {
                let output = self.node(&c.output)?;
                let kernel = self.node(&c.kernel)?;
                let size = self.local.env.dim_size(d);
                let def = Def::Conv {
                    stride: c.stride,
                    output,
                    dilation: c.dilation,
                    kernel,
                    padded: c.padded,
                };
                Ok(self.new_node(Class { size, fixed: None, def: Some(def) }))
            }
            Dim::Concat(parts) => {
                let ns = parts.iter().map(|p| self.node(p)).collect::<Result<Vec<_>, _>>()?;
                let vars = parts
                    .iter()
                    .map(|p| match p {
                        Dim::Var(v) => Some(*v),
                        _ => None,
                    })
                    .collect();
                let size = self.local.env.dim_size(d);
                Ok(self.new_node(Class { size, fixed: None, def: Some(Def::Concat(ns, vars)) }))
            }
        }
    }

    fn size(&self, d: &Dim) -> Option<usize> {
        self.local.env.dim_size(d)
    }

    /// Links two axes related by an equation (`ineq = false`) or `cur ≥ subr`.
    fn link(&mut self, cur: &Dim, subr: &Dim, ineq: bool) -> Result<(), String> {
        let a = self.node(cur)?;
        let b = self.node(subr)?;
        if ineq && self.size(subr) == Some(1) && self.size(cur) != Some(1) {
            // A broadcast axis: read at position 0.
            let r = self.find(b);
            if self.info[r].fixed.is_none() && self.info[r].def.is_none() {
                self.info[r].fixed = Some(AxisIndex::Fixed(0));
            }
            return Ok(());
        }
        self.union(a, b)
    }

    /// Pushes the axes a row variable stands for in the local solution (unsolved: none, as
    /// closing would make them).
    fn expand_var(&self, v: Option<crate::var::RowVar>, out: &mut Vec<&'a Dim>) {
        let Some(var) = v else { return };
        let local = self.local;
        if let Some(RowEntry::Solved(value, _)) = local.env.row_entry(var) {
            out.extend(value.beg_dims());
            self.expand_var(value.var(), out);
            out.extend(&value.dims);
        }
    }

    /// Links two rows the way the solver lines them up: trailing axes from the right; then the
    /// leading axes of a row with a row variable (an einsum pattern's anchored axes) with the
    /// first remaining axes of the other row; then the rest, including what the row variables
    /// stand for, from the right.
    fn link_rows(&mut self, cur: &Row, subr: &Row, ineq: bool) -> Result<(), String> {
        let (cb, cd) = (cur.beg_dims(), &cur.dims);
        let (sb, sd) = (subr.beg_dims(), &subr.dims);
        let k = cd.len().min(sd.len());
        for (c, s) in cd[cd.len() - k..].iter().zip(&sd[sd.len() - k..]) {
            self.link(c, s, ineq)?;
        }
        let mut cmid: Vec<&Dim> = cb.iter().collect();
        self.expand_var(cur.var(), &mut cmid);
        cmid.extend(&cd[..cd.len() - k]);
        let mut smid: Vec<&Dim> = sb.iter().collect();
        self.expand_var(subr.var(), &mut smid);
        smid.extend(&sd[..sd.len() - k]);
        // How many leading axes are anchored: those before a row variable, against the first
        // axes of the other row.
        let j = match (cur.var().is_some(), subr.var().is_some()) {
            (true, true) => cb.len().min(sb.len()),
            (true, false) => cb.len().min(smid.len()),
            (false, true) => sb.len().min(cmid.len()),
            (false, false) => 0,
        };
        for (c, s) in cmid[..j].iter().zip(&smid[..j]) {
            self.link(c, s, ineq)?;
        }
        let (cmid, smid) = (&cmid[j..], &smid[j..]);
        let m = cmid.len().min(smid.len());
        for (c, s) in cmid[cmid.len() - m..].iter().zip(&smid[smid.len() - m..]) {
            self.link(c, s, ineq)?;
        }
        Ok(())
    }
}

fn too_large() -> String {
    "an index is too large to represent".to_string()
}

/// `k * (offset + Σ terms)`, checking for overflow.
fn scaled(
    terms: Vec<(i64, Symbol)>,
    offset: i64,
    k: usize,
) -> Result<(Vec<(i64, Symbol)>, i64), String> {
    let k = i64::try_from(k).map_err(|_| too_large())?;
    let terms = terms
        .into_iter()
        .map(|(c, s)| c.checked_mul(k).map(|c| (c, s)).ok_or_else(too_large))
        .collect::<Result<Vec<_>, _>>()?;
    Ok((terms, offset.checked_mul(k).ok_or_else(too_large)?))
}

/// Resolves classes to indices, allocating iterators in order of first use.
struct Resolver<'s, 'a> {
    ps: &'s mut ProjSolver<'a>,
    symbols: &'s mut SymbolGen,
    /// The index of each class, by its root node.
    index: Vec<Option<AxisIndex>>,
    product: Vec<(Symbol, usize)>,
    /// For a concatenation operand: for each concatenated axis (by its parts' label variables),
    /// the part the operand fills.
    fills: ConcatFills,
}

/// For each concatenated axis (by its parts' label variables), the part an operand fills.
type ConcatFills = Vec<(Vec<Option<DimVar>>, usize)>;

impl Resolver<'_, '_> {
    fn index_of(&mut self, node: usize, depth: usize) -> Result<AxisIndex, String> {
        let r = self.ps.find(node);
        if let Some(Some(i)) = self.index.get(r) {
            return Ok(i.clone());
        }
        if depth > 64 {
            return Err("cyclic projection definitions".into());
        }
        let class = &self.ps.info[r];
        let (fixed, def, size) = (class.fixed.clone(), class.def.clone(), class.size);
        let idx = if let Some(f) = fixed {
            f
        } else if let Some(def) = def {
            match def {
                Def::Conv { stride, output, dilation, kernel, padded } => {
                    let (ot, oo) = self.index_of(output, depth + 1)?.as_affine();
                    let (mut terms, mut offset) = scaled(ot, oo, stride)?;
                    if dilation > 0 {
                        let (kt, ko) = self.index_of(kernel, depth + 1)?.as_affine();
                        let (kt, ko) = scaled(kt, ko, dilation)?;
                        terms.extend(kt);
                        offset = offset.checked_add(ko).ok_or_else(too_large)?;
                        if padded {
                            let kr = self.ps.find(kernel);
                            let k = self.ps.info[kr].size.unwrap_or(1);
                            let pad = ConvDim::left_padding(dilation, k);
                            offset = i64::try_from(pad)
                                .ok()
                                .and_then(|p| offset.checked_sub(p))
                                .ok_or_else(too_large)?;
                        }
                    }
                    AxisIndex::affine(terms, offset)
                }
                Def::Concat(parts, vars) => {
                    let roots: Vec<usize> = parts.iter().map(|p| self.ps.find(*p)).collect();
                    let Some(&(_, pos)) = self.fills.iter().find(|(v, _)| *v == vars) else {
                        return Err(
                            "a concatenated axis is read without knowing which part it fills"
                                .into(),
                        );
                    };
                    let mut offset = 0i64;
                    for p in &roots[..pos] {
                        let size =
                            self.ps.info[*p].size.ok_or("a concatenated part has no size")?;
                        offset = i64::try_from(size)
                            .ok()
                            .and_then(|s| offset.checked_add(s))
                            .ok_or_else(too_large)?;
                    }
                    let (t, o) = self.index_of(parts[pos], depth + 1)?.as_affine();
                    AxisIndex::affine(t, o.checked_add(offset).ok_or_else(too_large)?)
                }
            }
        } else {
            match size {
                // An axis of 0 positions is iterated too: its empty range empties the loop nest,
                // where a fixed position 0 would be read or written once, out of bounds.
                Some(1) => AxisIndex::Fixed(0),
                Some(d) => {
                    let s = self.symbols.fresh();
                    self.product.push((s, d));
                    AxisIndex::Iterator(s)
                }
                None => return Err("an axis of unknown size".into()),
            }
        };
        if self.index.len() <= r {
            self.index.resize(r + 1, None);
        }
        self.index[r] = Some(idx.clone());
        Ok(idx)
    }
}

impl Inference {
    /// A reshape's projections: the common refinement of both shapes' axes
    /// ([`crate::reshape::reshape_projections`]); a regrouping it cannot index is an error
    /// naming the reshape and both shapes.
    fn reshape_projections_of(
        &self,
        step: StepId,
        cur: ShapeId,
        arg: ShapeId,
        symbols: &mut SymbolGen,
    ) -> Result<Projections, ShapeError> {
        let (cur, arg) = (self.shape(cur), self.shape(arg));
        let fail = |msg: String| {
            let message = format!(
                "reshape '{}' of '{}' from {arg} to {cur}: {msg}",
                cur.debug_name, arg.debug_name
            );
            ShapeError::Mismatch(Box::new(ShapeMismatch {
                message,
                ops: vec![],
                steps: vec![step],
            }))
        };
        let (Some(lhs), Some(rhs)) = (cur.dims(), arg.dims()) else {
            return Err(fail("its shapes are not closed".into()));
        };
        let info = format!("reshape for '{}'", cur.debug_name);
        crate::reshape::reshape_projections(&lhs, &rhs, symbols, info).map_err(fail)
    }

    /// Derives the projections of a step (after [`Inference::finish`]).
    ///
    /// ```
    /// use rocannl_arrayjit::indexing::SymbolGen;
    /// use rocannl_shape::inference::{Inference, ShapeDecl};
    /// use rocannl_shape::logic::Logic;
    /// let mut inf = Inference::new();
    /// let a = inf.new_shape("a", &ShapeDecl::given(&[], &[3], &[2]));
    /// let b = inf.new_shape("b", &ShapeDecl::given(&[], &[4], &[3]));
    /// let c = inf.new_shape("c", &ShapeDecl::inferred());
    /// let step = inf.add_step(c, Logic::Compose(a, b)).unwrap();
    /// inf.finish().unwrap();
    /// let p = inf.derive_projections(step, &mut SymbolGen::default()).unwrap();
    /// assert_eq!(p.to_string(), "[i0:2, i1:4, i2:3] lhs[i0, i1] <- rhs0[i0, i2], rhs1[i2, i1]");
    /// ```
    pub fn derive_projections(
        &self,
        step: StepId,
        symbols: &mut SymbolGen,
    ) -> Result<Projections, ShapeError> {
        self.derive_for(step, None, symbols)
    }

    /// The projections of a concatenation: one per operand, each writing its part of the result.
    pub fn derive_concat_projections(
        &self,
        step: StepId,
        symbols: &mut SymbolGen,
    ) -> Result<Vec<Projections>, ShapeError> {
        let n = self.step_logic(step).args().len();
        (0..n).map(|i| self.derive_for(step, Some(i), symbols)).collect()
    }

    /// The projections of one step (of one operand of a concatenation): the step's constraints
    /// re-derived over fresh projection ids, its template variables solved, the projection ids
    /// linked into classes, and an index resolved for every axis.
    fn derive_for(
        &self,
        step: StepId,
        operand: Option<usize>,
        symbols: &mut SymbolGen,
    ) -> Result<Projections, ShapeError> {
        if !self.is_finished() {
            return Err(ShapeError::Arity(
                "projections need closed shapes: call finish first".into(),
            ));
        }
        let logic = self.step_logic(step).clone();
        let cur_id = self.step_shape(step);
        if let Logic::Reshape(a, _) = logic {
            return self.reshape_projections_of(step, cur_id, a, symbols);
        }
        let mut local = Solver::default();
        local.env.keep_padded_conv = true;
        // Only the result's name is used (in the projections' description).
        let cur_shape = self.shape(cur_id);
        let cur = fresh_proj_ids(cur_shape, &mut local, cur_shape.debug_name.clone());
        let args: Vec<Shape> = logic
            .arg_ids()
            .map(|a| fresh_proj_ids(self.shape(a), &mut local, String::new()))
            .collect();
        let arg_refs: Vec<&Shape> = args.iter().collect();
        let deriv = get_inequalities(&cur, &logic, &arg_refs, &mut local.vars)?;
        deriv.template_rows.iter().for_each(|v| local.mark_template_row(*v));
        // Kernel labels are not marked: whether an argument's axis is the kernel or broadcasts
        // against it was decided by inference, and the labels take the sizes it found.
        let fail = |msg: String| {
            ShapeError::Arity(format!("projection inference for step {}: {msg}", step.0))
        };
        // Only template variables (einsum labels, row variables, slices) need solving: the
        // other constraints already relate known rows.
        if matches!(logic, Logic::Einsum(..) | Logic::BatchSlice(..)) {
            self.solve_template_vars(step, &deriv, &mut local)?;
        }
        let mut ps = link_projections(&local, &deriv).map_err(&fail)?;
        let fills = concat_fills_of(operand, &logic, &deriv)?;
        // Room for the index of every node so far, and of the few resolving may add.
        let index = vec![None; ps.parent.len() + 16];
        let mut res = Resolver { ps: &mut ps, symbols, index, product: vec![], fills };
        let (lhs_dims, project_lhs) = shape_indices(&cur, &mut res).map_err(&fail)?;
        let mut rhs_dims = Vec::new();
        let mut project_rhs = Vec::new();
        for (i, a) in args.iter().enumerate() {
            if operand.is_some_and(|o| o != i) {
                continue;
            }
            let (d, p) = shape_indices(a, &mut res).map_err(&fail)?;
            rhs_dims.push(d);
            project_rhs.push(p);
        }
        let (product_iterators, product_space) = res.product.into_iter().unzip();
        Ok(Projections {
            product_space,
            product_iterators,
            lhs_dims,
            rhs_dims,
            project_lhs,
            project_rhs,
            debug_info: format!("{} for '{}'", logic.describe(), cur.debug_name),
            // Dynamic sizes are the tensor layer's: it marks the iterators of dynamic axes.
            dynamic: vec![],
        })
    }

    /// Solves the step's template variables (einsum labels, row variables, slices) in the
    /// local solver, through every stage.
    fn solve_template_vars(
        &self,
        step: StepId,
        deriv: &Derivation,
        local: &mut Solver,
    ) -> Result<(), ShapeError> {
        let origin = Origin::step(step);
        let mut pending: Vec<_> =
            deriv.constraints.iter().cloned().map(|c| c.at(&origin)).collect();
        // The labels take the sizes the whole graph solved them to. The closed shapes alone
        // do not always determine them (the parts of a concatenation that nothing else sizes
        // were closed with the graph's other variables), and a size is not a projection: it
        // links no axes, so it cannot contaminate this step's projections.
        for (label, v) in &deriv.labels {
            if let Some(size) = self.label_size(step, label) {
                let eq = Constraint::DimEq { d1: Dim::Var(*v), d2: Dim::of(size) };
                pending.push(eq.at(&origin));
            }
        }
        for stage in std::iter::once(Stage::Online).chain(Stage::CLOSING) {
            pending = local.solve(stage, pending).map_err(|c| self.report_local(c))?;
        }
        Ok(())
    }
}

/// `sh` with a fresh projection id on every solved dimension, named `debug_name`.
fn fresh_proj_ids(sh: &Shape, local: &mut Solver, debug_name: String) -> Shape {
    let mut f = |d: &Dim| match d {
        Dim::Solved(s) => Dim::Solved(SolvedDim { proj_id: Some(local.vars.proj()), ..s.clone() }),
        other => other.clone(),
    };
    Shape {
        batch: Arc::new(sh.batch.map_dims(&mut f)),
        input: Arc::new(sh.input.map_dims(&mut f)),
        output: Arc::new(sh.output.map_dims(&mut f)),
        id: sh.id,
        debug_name,
    }
}

/// Links the projection ids that the step's equalities and inequalities relate.
fn link_projections<'a>(
    local: &'a Solver,
    deriv: &'a Derivation,
) -> Result<ProjSolver<'a>, String> {
    let mut ps = ProjSolver {
        local,
        proj_env: &deriv.proj_env,
        parent: Vec::with_capacity(32),
        info: Vec::with_capacity(32),
        by_proj: vec![NONE; local.vars.num_projs()],
        by_var: vec![NONE; local.vars.num_dims()],
    };
    for c in &deriv.constraints {
        match c {
            Constraint::DimEq { d1, d2 } => ps.link(d1, d2, false),
            Constraint::DimIneq { cur, subr } => ps.link(cur, subr, true),
            Constraint::RowEq { r1, r2 } => ps.link_rows(r1, r2, false),
            Constraint::RowIneq { cur, subr } => ps.link_rows(cur, subr, true),
            Constraint::BatchSlice { cur, arg, slot } => {
                ps.link_rows(&slot_then(slot, cur), arg, false)
            }
            _ => Ok(()),
        }?;
    }
    Ok(ps)
}

/// Which part of each concatenated axis the operand fills (the spec says, by the order of the
/// arguments naming each label: `a; a => a^a` fills the first part, then the second); empty
/// unless `operand` is one of a concatenation's.
fn concat_fills_of(
    operand: Option<usize>,
    logic: &Logic,
    deriv: &Derivation,
) -> Result<ConcatFills, ShapeError> {
    let mut fills = Vec::new();
    if let (Some(i), Logic::Einsum(spec, _)) = (operand, logic) {
        for axis in spec.concat_fills().map_err(ShapeError::Spec)? {
            let var = |l: &String| deriv.labels.iter().find(|(n, _)| n == l).map(|(_, v)| *v);
            fills.push((axis.parts.iter().map(var).collect(), axis.fills[i]));
        }
    }
    Ok(fills)
}

/// The sizes and resolved indices of a shape's axes, in memory order.
fn shape_indices(
    sh: &Shape,
    res: &mut Resolver<'_, '_>,
) -> Result<(Vec<usize>, Vec<AxisIndex>), String> {
    let mut dims = Vec::new();
    let mut idx = Vec::new();
    for r in sh.memory_rows() {
        for d in &r.dims {
            dims.push(d.size().ok_or("an axis of unknown size")?);
            let n = res.ps.node(d)?;
            idx.push(res.index_of(n, 0)?);
        }
    }
    Ok((dims, idx))
}

//! The inference driver: shapes, steps, `propagate_shapes` and `finish_inference`.
//!
//! [`Inference`] owns every shape and update step of a graph. [`Inference::add_step`] is
//! `propagate_shapes`: it derives the step's constraints and solves them online (stage 1),
//! updating the shapes involved so partial results are observable. [`Inference::finish`] is
//! `finish_inference`: a second pass over all steps in reverse order, then stages 2–7, after
//! which every shape is closed (no variables left). Guesses made while closing parameters are
//! reported as [`Warning`]s, or as an error in strict mode.

use std::borrow::Cow;
use std::fmt;
use std::sync::Arc;

use rustc_hash::FxHashSet;

use crate::constraint::{Constr, Constraint, Origin};
use crate::dim::Dim;
use crate::env::{DimEntry, Environment, RowEntry};
use crate::error::{Conflict, OpContext, ShapeError, ShapeMismatch};
use crate::logic::{Derivation, Logic, Shape, get_inequalities};
use crate::row::{Kind, Row, RowId};
use crate::solve::Solver;
use crate::stage::Stage;
use crate::var::{DimVar, RowVar, ShapeId, StepId};

/// The largest size of an axis and the largest element count of a tensor: `2^63 - 1`, so that
/// every size, count and offset is a non-negative `i64` in generated code.
pub const MAX_SIZE: usize = i64::MAX as usize;
/// How one row of a new shape is declared.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum RowDecl {
    /// Exactly these axes.
    Given(Vec<usize>),
    /// Exactly these axes, with labels.
    Labeled(Vec<(usize, Option<String>)>),
    /// Exactly this many axes; `None` sizes are inferred (fresh dimension variables).
    Partial(Vec<Option<usize>>),
    /// Inferred from use: a fresh row variable.
    Inferred,
}

/// How a new shape is declared, row by row.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ShapeDecl {
    /// The batch row.
    pub batch: RowDecl,
    /// The input row.
    pub input: RowDecl,
    /// The output row.
    pub output: RowDecl,
}

impl ShapeDecl {
    /// A shape whose rows are all inferred (the result of an operation).
    pub fn inferred() -> ShapeDecl {
        ShapeDecl { batch: RowDecl::Inferred, input: RowDecl::Inferred, output: RowDecl::Inferred }
    }

    /// A shape with all rows given.
    pub fn given(batch: &[usize], input: &[usize], output: &[usize]) -> ShapeDecl {
        ShapeDecl {
            batch: RowDecl::Given(batch.to_vec()),
            input: RowDecl::Given(input.to_vec()),
            output: RowDecl::Given(output.to_vec()),
        }
    }

    fn row(&self, kind: Kind) -> &RowDecl {
        match kind {
            Kind::Batch => &self.batch,
            Kind::Input => &self.input,
            Kind::Output => &self.output,
        }
    }
}

/// A guess made while closing a parameter's shape.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Warning {
    /// The parameter's name (for a convolution axis that closing split, the einsum's result).
    pub param: String,
    /// The row in which the guess was made.
    pub kind: Kind,
    /// A message naming the parameter.
    pub message: String,
}

impl fmt::Display for Warning {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.message)
    }
}

#[derive(Clone, Debug)]
pub(crate) struct StepRecord {
    pub(crate) shape: ShapeId,
    pub(crate) logic: Logic,
    labels: Vec<(String, DimVar)>,
    /// The user's call that made the step, when a library function built it from smaller
    /// operations (`loss::mse at src/main.rs:9:5`).
    within: Option<Arc<str>>,
    /// The operation's name as its user knows it (`sub`, `einsum "ij;jk=>ik"`), if given;
    /// else messages describe its logic.
    op_name: Option<String>,
}

/// Shape inference for one graph.
#[derive(Clone, Debug, Default)]
pub struct Inference {
    pub(crate) solver: Solver,
    shapes: Vec<Shape>,
    /// The rows each shape was declared with (inferred rows start as a row variable).
    initial: Vec<[Row; 3]>,
    pub(crate) steps: Vec<StepRecord>,
    pending: Vec<Constr>,
    finished: bool,
    warnings: Vec<Warning>,
    strict: bool,
    /// The einsum label each label variable stands for (indexed by variable; every derivation
    /// of a step makes its own), so that messages can name them.
    pub(crate) label_names: Vec<Option<Arc<str>>>,
    /// The user's call that steps added from now on belong to ([`Inference::set_within`]).
    within: Option<Arc<str>>,
    /// The name of the next step added ([`Inference::name_next_op`]).
    next_op_name: Option<String>,
}

impl Inference {
    /// Names the user's call that the steps added from now on belong to (`None` ends it):
    /// errors name it beside the operation, so a mismatch inside a loss or a block points at
    /// the user's code rather than at an operation the user never wrote.
    pub fn set_within(&mut self, within: Option<&str>) {
        self.within = within.map(Arc::from);
    }

    /// Names the operation of the next step added (`sub`, `relu`), for messages: without a
    /// name, a step is described by its logic (`pointwise op of 2 argument(s)`).
    pub fn name_next_op(&mut self, name: &str) {
        self.next_op_name = Some(name.to_string());
    }

    /// An empty graph.
    pub fn new() -> Inference {
        Inference::default()
    }

    /// In strict mode, [`Inference::finish`] fails instead of warning when closing has to
    /// guess a parameter's size.
    pub fn set_strict(&mut self, strict: bool) {
        self.strict = strict;
    }

    /// Records every processed constraint (for debugging and solver snapshots).
    pub fn enable_trace(&mut self) {
        self.solver.trace = Some(Vec::new());
    }

    /// The recorded trace.
    pub fn trace(&self) -> &[String] {
        self.solver.trace.as_deref().unwrap_or(&[])
    }

    /// Creates a shape.
    ///
    /// ```
    /// use rocannl_shape::inference::{Inference, ShapeDecl};
    /// let mut inf = Inference::new();
    /// let x = inf.new_shape("x", &ShapeDecl::given(&[2], &[], &[3]));
    /// assert_eq!(inf.shape(x).to_string(), "2|->3");
    /// ```
    pub fn new_shape(&mut self, debug_name: &str, decl: &ShapeDecl) -> ShapeId {
        let id = ShapeId(self.shapes.len() as u32);
        let mut make = |kind: Kind| {
            let rid = RowId { shape: id, kind };
            match decl.row(kind) {
                RowDecl::Given(ds) => Row::fixed(ds.iter().map(|&d| Dim::of(d)).collect(), rid),
                RowDecl::Labeled(ds) => Row::fixed(
                    ds.iter()
                        .map(|(d, l)| match l {
                            Some(l) => Dim::labeled(*d, l),
                            None => Dim::of(*d),
                        })
                        .collect(),
                    rid,
                ),
                RowDecl::Partial(ds) => Row::fixed(
                    ds.iter()
                        .map(|d| match d {
                            Some(d) => Dim::of(*d),
                            None => Dim::Var(self.solver.vars.dim()),
                        })
                        .collect(),
                    rid,
                ),
                RowDecl::Inferred => Row::of_var(self.solver.vars.row(), rid),
            }
        };
        let (batch, input, output) = (make(Kind::Batch), make(Kind::Input), make(Kind::Output));
        self.initial.push([batch.clone(), input.clone(), output.clone()]);
        let (batch, input, output) = (Arc::new(batch), Arc::new(input), Arc::new(output));
        self.shapes.push(Shape { batch, input, output, id, debug_name: debug_name.to_string() });
        id
    }

    /// The current (possibly partially inferred) shape.
    pub fn shape(&self, id: ShapeId) -> &Shape {
        &self.shapes[id.0 as usize]
    }

    /// The number of shapes.
    pub fn num_shapes(&self) -> usize {
        self.shapes.len()
    }

    /// The logic of a step.
    pub fn step_logic(&self, step: StepId) -> &Logic {
        &self.steps[step.0 as usize].logic
    }

    /// The result shape of a step.
    pub fn step_shape(&self, step: StepId) -> ShapeId {
        self.steps[step.0 as usize].shape
    }

    /// Whether all shapes are closed.
    pub fn is_finished(&self) -> bool {
        self.finished
    }

    /// The guesses made while closing parameters (after [`Inference::finish`]).
    pub fn warnings(&self) -> &[Warning] {
        &self.warnings
    }

    /// `propagate_shapes`: adds an operation (or leaf) whose result is `shape`, and solves its
    /// constraints online.
    ///
    /// ```
    /// use rocannl_shape::inference::{Inference, ShapeDecl};
    /// use rocannl_shape::logic::Logic;
    /// let mut inf = Inference::new();
    /// let a = inf.new_shape("a", &ShapeDecl::given(&[], &[], &[2, 3]));
    /// let b = inf.new_shape("b", &ShapeDecl::given(&[], &[], &[3]));
    /// let c = inf.new_shape("c", &ShapeDecl::inferred());
    /// inf.add_step(c, Logic::Pointwise(vec![a, b])).unwrap();
    /// inf.finish().unwrap();
    /// assert_eq!(inf.shape(c).to_string(), "|->2,3");
    /// ```
    pub fn add_step(&mut self, shape: ShapeId, logic: Logic) -> Result<StepId, ShapeError> {
        let step = StepId(self.steps.len() as u32);
        self.finished = false;
        let op_name = self.next_op_name.take();
        let deriv = self.derive(shape, &logic)?;
        deriv.template_rows.iter().for_each(|v| self.solver.mark_template_row(*v));
        deriv.kernel_dims.iter().for_each(|v| self.solver.mark_kernel_dim(*v));
        self.name_labels(&deriv.labels);
        let within = self.within.clone();
        self.steps.push(StepRecord { shape, logic, labels: deriv.labels.clone(), within, op_name });
        let origin = Origin::step(step);
        let cs: Vec<Constr> = deriv.constraints.into_iter().map(|c| c.at(&origin)).collect();
        let rest = self.solver.solve(Stage::Online, cs).map_err(|c| self.report(c))?;
        self.pending.extend(rest);
        self.refresh_step(step);
        Ok(step)
    }

    fn derive(&mut self, shape: ShapeId, logic: &Logic) -> Result<Derivation, ShapeError> {
        let env = &self.solver.env;
        let subst = |id: ShapeId| {
            let sh = &self.shapes[id.0 as usize];
            if Kind::ALL.iter().all(|k| env.row_is_normal(sh.row(*k))) {
                Cow::Borrowed(sh)
            } else {
                // A working copy: deriving constraints does not need the name.
                Cow::Owned(Shape {
                    batch: env.subst_row_arc(&sh.batch),
                    input: env.subst_row_arc(&sh.input),
                    output: env.subst_row_arc(&sh.output),
                    id: sh.id,
                    debug_name: String::new(),
                })
            }
        };
        let cur = subst(shape);
        let args: Vec<Cow<Shape>> = logic.arg_ids().map(subst).collect();
        let arg_refs: Vec<&Shape> = args.iter().map(|a| a.as_ref()).collect();
        get_inequalities(&cur, logic, &arg_refs, &mut self.solver.vars)
    }

    /// `finish_inference`: a second propagation pass in reverse order, then the closing stages.
    /// Afterwards every shape is closed.
    pub fn finish(&mut self) -> Result<(), ShapeError> {
        if self.finished {
            return Ok(());
        }
        // Stage 1 once more, backwards: what later steps taught flows back to earlier ones.
        self.second_pass()?;
        // Stages 2–7: close every variable.
        let pending = self.closing_stages()?;
        // What is left only in unsolved constraints closes, and is solved once more.
        let pending = self.close_leftover_vars(pending)?;
        if let Some(c) = pending.first() {
            let c = c.clone();
            return Err(self.report(Conflict {
                message: format!("could not infer shapes: {} remains unsolved", c.c),
                origin: c.origin,
                conv: None,
            }));
        }
        for sh in &mut self.shapes {
            refresh_shape(&self.solver.env, sh);
        }
        self.check_closed()?;
        self.check_sizes()?;
        self.finished = true;
        self.warnings = self.compute_warnings();
        self.warnings.extend(self.conv_warnings());
        if self.strict
            && let Some(w) = self.warnings.first()
        {
            return Err(ShapeError::Guess(w.message.clone()));
        }
        Ok(())
    }

    /// Stages 2–7 over what the second pass left pending and every shape's rows: the rows
    /// with a lower-bounded dimension join at stage 4, the others at stage 6. Returns what is
    /// still unsolved.
    fn closing_stages(&mut self) -> Result<Vec<Constr>, ShapeError> {
        let mut pending = std::mem::take(&mut self.pending);
        let mut rows = self.shape_rows();
        for stage in Stage::CLOSING {
            if stage == Stage::TerminalRowsClosed {
                // Stage 4 closes lower-bounded dimensions to their upper bounds; the other rows
                // have nothing to close before stage 6.
                let (now, later): (Vec<Constr>, Vec<Constr>) =
                    rows.into_iter().partition(|c| self.has_lower_bounded_dim(&c.c));
                pending.extend(now);
                rows = later;
            }
            if stage == Stage::RowsToNoMoreAxes {
                pending.extend(std::mem::take(&mut rows));
            }
            pending = self.solver.solve(stage, pending).map_err(|c| self.report(c))?;
        }
        Ok(pending)
    }

    /// Variables left only in unsolved constraints (e.g. a concatenation split nothing
    /// determines): closes them and tries once more. Returns what is still unsolved.
    fn close_leftover_vars(&mut self, mut pending: Vec<Constr>) -> Result<Vec<Constr>, ShapeError> {
        if pending.is_empty() {
            return Ok(pending);
        }
        let mut close = Vec::new();
        for c in &pending {
            for v in constraint_dim_vars(&self.solver, &c.c) {
                close.push(
                    Constraint::ShapeRow {
                        row: Arc::new(Row::fixed(vec![Dim::Var(v)], any_row_id())),
                        from: 0,
                    }
                    .at(&c.origin),
                );
            }
        }
        pending.extend(close);
        self.solver.solve(Stage::DimsToLowerBound, pending).map_err(|c| self.report(c))
    }

    /// Every shape is closed: no variable is left in its rows.
    fn check_closed(&self) -> Result<(), ShapeError> {
        let Some(sh) = self.shapes.iter().find(|s| !s.memory_rows().iter().all(|r| r.is_ground()))
        else {
            return Ok(());
        };
        let msg = format!(
            "shape of '{}' is not fully inferred: {}",
            sh.debug_name,
            self.readable(&sh.to_string(), true)
        );
        Err(ShapeError::Mismatch(Box::new(ShapeMismatch {
            message: msg,
            ops: vec![],
            steps: vec![],
        })))
    }

    /// Every size and element count fits in 63 bits ([`MAX_SIZE`]).
    fn check_sizes(&self) -> Result<(), ShapeError> {
        let Some((sh, what)) = self.shapes.iter().find_map(|sh| {
            let dims = sh.dims()?;
            let too_big = |n: usize| n > MAX_SIZE;
            if let Some(d) = dims.iter().find(|d| too_big(**d)) {
                return Some((sh, format!("an axis of {d}")));
            }
            match dims.iter().try_fold(1usize, |acc, d| acc.checked_mul(*d)) {
                Some(n) if !too_big(n) => None,
                Some(n) => Some((sh, format!("{n} elements"))),
                None => Some((sh, "more than 2^64 elements".to_string())),
            }
        }) else {
            return Ok(());
        };
        let msg = format!(
            "'{}' has shape {sh} with {what}: sizes and element counts must fit in 63 bits \
             (at most {MAX_SIZE})",
            sh.debug_name
        );
        Err(ShapeError::Mismatch(Box::new(ShapeMismatch {
            message: msg,
            ops: vec![],
            steps: vec![],
        })))
    }

    /// The second propagation pass: every step's constraints again, in reverse order, so that
    /// what later steps taught flows back to earlier ones.
    fn second_pass(&mut self) -> Result<(), ShapeError> {
        for i in (0..self.steps.len()).rev() {
            if self.step_is_known(i) {
                // Every axis of the step is known: its constraints were checked when the
                // variables were solved, and deriving them again can teach nothing.
                continue;
            }
            let (shape, logic) = (self.steps[i].shape, self.steps[i].logic.clone());
            let deriv = self.derive(shape, &logic)?;
            deriv.template_rows.iter().for_each(|v| self.solver.mark_template_row(*v));
            deriv.kernel_dims.iter().for_each(|v| self.solver.mark_kernel_dim(*v));
            self.name_labels(&deriv.labels);
            let origin = Origin::step(StepId(i as u32));
            let cs: Vec<Constr> = deriv.constraints.into_iter().map(|c| c.at(&origin)).collect();
            let rest = self.solver.solve(Stage::Online, cs).map_err(|c| self.report(c))?;
            self.pending.extend(rest);
        }
        Ok(())
    }

    /// `ShapeRow` constraints for every row of every non-leaf shape (leaf shapes close through
    /// their `TerminalRow` and `TerminalDim` constraints, after the non-leaf rows they are
    /// bounded by).
    fn shape_rows(&self) -> Vec<Constr> {
        let mut out = Vec::new();
        let mut seen: FxHashSet<ShapeId> = self
            .steps
            .iter()
            .filter(|st| matches!(st.logic, Logic::Terminal(_)))
            .map(|st| st.shape)
            .collect();
        for (i, st) in self.steps.iter().enumerate() {
            let origin = Origin::step(StepId(i as u32));
            for sh in std::iter::once(st.shape).chain(st.logic.arg_ids()) {
                if seen.insert(sh) {
                    for kind in Kind::ALL {
                        let r = self.shape(sh).row(kind).clone();
                        out.push(Constraint::ShapeRow { row: r, from: 0 }.at(&origin));
                    }
                }
            }
        }
        out
    }

    fn has_lower_bounded_dim(&self, c: &Constraint) -> bool {
        let Constraint::ShapeRow { row: r, .. } = c else { return false };
        self.solver.env.row_any_dim_var(r, &mut |v| {
            let b = self.solver.env.dim_bounds(v);
            b.constr.as_ref().is_some_and(|(c, _)| c.lower_bound().is_some())
        })
    }

    /// Whether every shape a step mentions is known.
    fn step_is_known(&self, i: usize) -> bool {
        let st = &self.steps[i];
        std::iter::once(st.shape).chain(st.logic.arg_ids()).all(|id| {
            let sh = self.shape(id);
            Kind::ALL.iter().all(|k| self.solver.env.row_is_known(sh.row(*k)))
        })
    }

    fn refresh_step(&mut self, step: StepId) {
        let st = &self.steps[step.0 as usize];
        for id in std::iter::once(st.shape).chain(st.logic.arg_ids()) {
            refresh_shape(&self.solver.env, &mut self.shapes[id.0 as usize]);
        }
    }

    /// The size an einsum label of a step was solved to (a captured dimension).
    ///
    /// ```
    /// use std::sync::Arc;
    /// use rocannl_shape::inference::{Inference, ShapeDecl};
    /// use rocannl_shape::logic::Logic;
    /// use rocannl_shape::spec::EinsumSpec;
    /// let mut inf = Inference::new();
    /// let x = inf.new_shape("x", &ShapeDecl::given(&[], &[], &[7]));
    /// let y = inf.new_shape("y", &ShapeDecl::inferred());
    /// let spec = Arc::new(EinsumSpec::parse("o+k => o").unwrap());
    /// let k = inf.new_shape("k", &ShapeDecl::given(&[], &[], &[3]));
    /// let spec2 = Arc::new(EinsumSpec::parse("o+k; k => o").unwrap());
    /// let step = inf.add_step(y, Logic::Einsum(spec2, vec![x, k])).unwrap();
    /// inf.finish().unwrap();
    /// assert_eq!(inf.label_size(step, "o"), Some(5));
    /// # let _ = spec;
    /// ```
    pub fn label_size(&self, step: StepId, label: &str) -> Option<usize> {
        let st = self.steps.get(step.0 as usize)?;
        let (_, v) = st.labels.iter().find(|(l, _)| l == label)?;
        self.solver.env.subst_dim(&Dim::Var(*v)).size()
    }

    /// Turns a solver conflict into an error naming the operations involved.
    pub(crate) fn report(&self, c: Conflict) -> ShapeError {
        // A convolution axis is named as written, with its stride and kernel.
        let message = match &c.conv {
            Some(conv) => self.name_conv(&c.message, conv, c.origin.steps()),
            None => c.message.clone(),
        };
        let message = self.readable(&message, true);
        let message = match self.contraction_mismatch(c.origin.steps()) {
            Some(contraction) => contraction,
            None => message,
        };
        self.report_message(message, &c.origin)
    }

    /// For a conflict among `steps` that includes a product (`matmul`, `fma`) whose contracted
    /// rows — the first argument's input axes and the second's output axes — have known sizes
    /// that cannot meet: a sentence naming both tensors and both rows. A broadcast failure
    /// alone would not say that the axes were contracted, or whose they were.
    fn contraction_mismatch(&self, steps: &[StepId]) -> Option<String> {
        steps.iter().rev().find_map(|s| {
            let st = self.steps.get(s.0 as usize)?;
            let (Logic::Compose(a, b) | Logic::ComposeAccumulate(a, b, _)) = &st.logic else {
                return None;
            };
            let sizes = |id: ShapeId, kind: Kind| -> Option<Vec<usize>> {
                let shape = self.solver.env.subst_shape(self.shape(id));
                shape.row(kind).dims.iter().map(Dim::size).collect()
            };
            let (input, output) = (sizes(*a, Kind::Input)?, sizes(*b, Kind::Output)?);
            let clash = input.iter().rev().zip(output.iter().rev()).any(|(i, o)| i != o && *o != 1);
            if !clash {
                return None;
            }
            let op = st.op_name.clone().unwrap_or_else(|| st.logic.describe());
            Some(format!(
                "{op} '{}' contracts the input axes of '{}' {input:?} with the output axes of \
                 '{}' {output:?}: contracted axes must have equal sizes (only an axis of 1 \
                 broadcasts)",
                self.shape(st.shape).debug_name,
                self.shape(*a).debug_name,
                self.shape(*b).debug_name,
            ))
        })
    }

    /// [`Inference::report`] of a conflict of a local solve (projection inference), whose
    /// variables are not the graph's.
    pub(crate) fn report_local(&self, c: Conflict) -> ShapeError {
        let message = self.readable(&c.message, false);
        self.report_message(message, &c.origin)
    }

    fn report_message(&self, message: String, origin: &Origin) -> ShapeError {
        let steps: Vec<StepId> = origin.steps().iter().rev().copied().collect();
        let ops = self.op_contexts(&steps);
        ShapeError::Mismatch(Box::new(ShapeMismatch { message, ops, steps }))
    }

    /// Records the labels of a derivation's variables.
    fn name_labels(&mut self, labels: &[(String, DimVar)]) {
        for (label, v) in labels {
            let i = v.0 as usize;
            if self.label_names.len() <= i {
                self.label_names.resize(i + 1, None);
            }
            self.label_names[i] = Some(Arc::from(label.as_str()));
        }
    }

    /// `text` (rows, dimensions, constraints as the solver prints them) without the solver's
    /// variables: a label's variable is written as the label (with `labels`), any other unknown
    /// dimension as `_`, and a row variable as `...` (the notation's anonymous axis and row
    /// variable).
    fn readable(&self, text: &str, labels: bool) -> String {
        let mut out = String::with_capacity(text.len());
        let mut rest = text;
        while let Some(i) = rest.find('$') {
            let (before, from) = rest.split_at(i);
            let digits = from[2.min(from.len())..].chars().take_while(char::is_ascii_digit).count();
            let number = from.get(2..2 + digits).and_then(|d| d.parse::<usize>().ok());
            match (from.as_bytes().get(1), number) {
                (Some(b'd'), Some(n)) => {
                    out.push_str(before);
                    match self.label_names.get(n).filter(|_| labels).and_then(Option::as_ref) {
                        Some(label) => out.push_str(label),
                        None => out.push('_'),
                    }
                }
                (Some(b'r'), Some(_)) => {
                    // `..$r3..` in a row, or `$r3` alone: both are a row variable, `...`.
                    let before = before.strip_suffix("..").unwrap_or(before);
                    out.push_str(before);
                    out.push_str("...");
                    let after = &from[2 + digits..];
                    rest = after.strip_prefix("..").unwrap_or(after);
                    continue;
                }
                _ => {
                    out.push_str(before);
                    out.push('$');
                    rest = &from[1..];
                    continue;
                }
            }
            rest = &from[2 + digits..];
        }
        out.push_str(rest);
        out
    }

    fn op_contexts(&self, steps: &[StepId]) -> Vec<OpContext> {
        let mut ops = Vec::new();
        for s in steps {
            let Some(st) = self.steps.get(s.0 as usize) else { continue };
            let show = |id: ShapeId| {
                self.readable(&self.solver.env.subst_shape(self.shape(id)).to_string(), true)
            };
            let mut shapes = vec![show(st.shape)];
            shapes.extend(
                st.logic
                    .args()
                    .into_iter()
                    .map(|a| format!("'{}' {}", self.shape(a).debug_name, show(a))),
            );
            ops.push(OpContext {
                op: st.op_name.clone().unwrap_or_else(|| st.logic.describe()),
                name: self.shape(st.shape).debug_name.clone(),
                shapes,
                within: st.within.as_deref().map(String::from),
            });
        }
        ops
    }

    /// Renames a shape (its tensor was given a name after it was created).
    pub fn set_debug_name(&mut self, id: ShapeId, name: &str) {
        if let Some(sh) = self.shapes.get_mut(id.0 as usize) {
            sh.debug_name = name.to_string();
        }
    }

    /// The same error with its operations named by their current names.
    pub fn refresh_error(&self, e: ShapeError) -> ShapeError {
        match e {
            ShapeError::Mismatch(mut m) => {
                if !m.steps.is_empty() {
                    m.ops = self.op_contexts(&m.steps);
                }
                ShapeError::Mismatch(m)
            }
            other => other,
        }
    }

    fn compute_warnings(&self) -> Vec<Warning> {
        let mut out = Vec::new();
        let mut seen = FxHashSet::default();
        for st in &self.steps {
            let Logic::Terminal(t) = &st.logic else { continue };
            if !t.param || !seen.insert(st.shape) {
                continue;
            }
            for (n, kind) in Kind::ALL.into_iter().enumerate() {
                let initial = &self.initial[st.shape.0 as usize][n];
                if initial.var().is_none() && initial.sizes().is_some() {
                    continue;
                }
                let name = &self.shape(st.shape).debug_name;
                let (dvars, rvars) = self.vars_in_solution(initial);
                let final_row = self.shape(st.shape).row(kind);
                if dvars.iter().any(|v| self.solver.guessed_dims.contains(v)) {
                    out.push(Warning {
                        param: name.clone(),
                        kind,
                        message: format!(
                            "param {name}: a dimension of its {} row was closed to 1 because \
                             nothing bounds it from above (a size-1 axis it broadcasts against is \
                             no upper bound); give its {} row explicitly if 1 is not intended",
                            kind.name(),
                            kind.name()
                        ),
                    });
                } else if final_row.dims.is_empty()
                    && rvars.iter().any(|v| self.solver.guessed_rows.contains(v))
                {
                    out.push(Warning {
                        param: name.clone(),
                        kind,
                        message: format!(
                            "param {name}: its {} row was closed to no axes because nothing \
                             determines it; did you forget to specify a hidden dimension?",
                            kind.name()
                        ),
                    });
                }
            }
        }
        out
    }

    /// Every variable that took part in a row's solution.
    fn vars_in_solution(&self, row: &Row) -> (Vec<DimVar>, Vec<RowVar>) {
        let mut dims = Vec::new();
        let mut rows = Vec::new();
        let mut stack_rows = vec![row.clone()];
        let mut stack_dims: Vec<Dim> = Vec::new();
        let mut seen_r = FxHashSet::default();
        let mut seen_d = FxHashSet::default();
        while let Some(r) = stack_rows.pop() {
            stack_dims.extend(r.all_dims());
            if let Some(v) = r.var()
                && seen_r.insert(v)
            {
                rows.push(v);
                if let Some(RowEntry::Solved(value, _)) = self.solver.env.row_entry(v) {
                    stack_rows.push(value.as_ref().clone());
                }
            }
        }
        while let Some(d) = stack_dims.pop() {
            let mut vs = Vec::new();
            d.vars(&mut vs);
            for v in vs {
                if seen_d.insert(v) {
                    dims.push(v);
                    if let Some(DimEntry::Solved(value, _)) = self.solver.env.dim_entry(v) {
                        stack_dims.push(value.clone());
                    }
                }
            }
        }
        (dims, rows)
    }
}

/// Substitutes the solved variables into a shape's rows, leaving rows with nothing to
/// substitute untouched.
fn refresh_shape(env: &Environment, sh: &mut Shape) {
    for row in [&mut sh.batch, &mut sh.input, &mut sh.output] {
        if !env.row_is_normal(row) {
            *row = Arc::new(env.subst_row(row));
        }
    }
}

fn any_row_id() -> RowId {
    RowId { shape: ShapeId(u32::MAX), kind: Kind::Output }
}

fn constraint_dim_vars(solver: &Solver, c: &Constraint) -> Vec<DimVar> {
    let mut vs = Vec::new();
    let mut dim = |d: &Dim| solver.env.subst_dim(d).vars(&mut vs);
    match c {
        Constraint::DimEq { d1, d2 } | Constraint::DimIneq { cur: d1, subr: d2 } => {
            dim(d1);
            dim(d2);
        }
        Constraint::DimConstr { d, .. } | Constraint::TerminalDim(d) => dim(d),
        _ => {}
    }
    vs
}

impl crate::env::Environment {
    /// A shape with every solved variable substituted.
    pub fn subst_shape(&self, sh: &Shape) -> Shape {
        Shape {
            batch: self.subst_row_arc(&sh.batch),
            input: self.subst_row_arc(&sh.input),
            output: self.subst_row_arc(&sh.output),
            id: sh.id,
            debug_name: sh.debug_name.clone(),
        }
    }
}

impl Shape {
    /// The closed shape as three lists of sizes, or `None` if it still has variables.
    pub fn rows_sizes(&self) -> Option<[Vec<usize>; 3]> {
        Some([self.batch.sizes()?, self.input.sizes()?, self.output.sizes()?])
    }
}

//! Replaying a [`Plan`] through `Inference`, and the checks that must hold when it succeeds.
//!
//! Errors are fine anywhere — the property under test is that the solver answers (`Ok` or
//! `Err`) without panicking and without looping. Like the tensor graph, the replay keeps adding
//! steps after a step fails, and always calls `finish`. Only a problem in which every step and
//! `finish` succeeded has its projections checked: each index must stay inside its tensor for
//! every point of the product space, except for padded convolutions, whose out-of-range reads
//! are the padding.

use std::sync::Arc;

use rocannl_arrayjit::indexing::{AxisIndex, Projections, Symbol, SymbolGen};
use rocannl_shape::inference::{Inference, RowDecl, ShapeDecl};
use rocannl_shape::logic::{Logic, SliceIndex, Terminal, TerminalData};
use rocannl_shape::spec::EinsumSpec;
use rocannl_shape::var::{ShapeId, StepId};

use crate::plan::{DataPlan, Plan, RowPlan, ShapePlan, StepPlan};

/// The first symbol handed to runtime batch slices, far from the iterators projections use.
const RUNTIME_SYMBOLS: u32 = 1 << 30;

fn row_decl(r: &RowPlan) -> RowDecl {
    match r {
        RowPlan::Given(d) => RowDecl::Given(d.clone()),
        RowPlan::Labeled(d) => RowDecl::Labeled(d.clone()),
        RowPlan::Inferred => RowDecl::Inferred,
    }
}

fn shape_decl(s: &ShapePlan) -> ShapeDecl {
    ShapeDecl { batch: row_decl(&s.batch), input: row_decl(&s.input), output: row_decl(&s.output) }
}

/// The logic of a step, or `None` when its einsum spec does not parse.
fn logic(step: &StepPlan, runtime: &mut u32) -> Option<(ShapeId, Logic)> {
    let id = |i: &u32| ShapeId(*i);
    let ids = |v: &[u32]| v.iter().map(id).collect::<Vec<_>>();
    Some(match step {
        StepPlan::Terminal { shape, param, data, square } => {
            let data = match data {
                DataPlan::Rows => TerminalData::Rows,
                DataPlan::Values(n) => TerminalData::Values(*n),
                DataPlan::Exact(d) => TerminalData::Exact(d.clone()),
            };
            let t = Terminal { param: *param, data, input_equals_output: *square };
            (id(shape), Logic::Terminal(t))
        }
        StepPlan::Pointwise { shape, args } => (id(shape), Logic::Pointwise(ids(args))),
        StepPlan::Compose { shape, a, b } => (id(shape), Logic::Compose(id(a), id(b))),
        StepPlan::ComposeAccumulate { shape, a, b, c } => {
            (id(shape), Logic::ComposeAccumulate(id(a), id(b), id(c)))
        }
        StepPlan::Einsum { shape, spec, padded, args } => {
            let parsed =
                if *padded { EinsumSpec::parse_padded(spec) } else { EinsumSpec::parse(spec) };
            (id(shape), Logic::Einsum(Arc::new(parsed.ok()?), ids(args)))
        }
        StepPlan::Transpose { shape, a } => (id(shape), Logic::Transpose(id(a))),
        StepPlan::BatchSlice { shape, a, index } => {
            let index = match index {
                Some(i) => SliceIndex::Fixed(*i),
                None => {
                    *runtime += 1;
                    SliceIndex::Runtime(Symbol(RUNTIME_SYMBOLS + *runtime))
                }
            };
            (id(shape), Logic::BatchSlice(id(a), index))
        }
        StepPlan::Reshape { shape, a } => (id(shape), Logic::Reshape(id(a), Default::default())),
    })
}

/// What happened when a plan was replayed.
#[derive(Debug)]
pub struct Outcome {
    /// The inference problem after the replay.
    pub inf: Inference,
    /// The steps added successfully.
    pub steps: Vec<StepId>,
    /// Whether every step was added and `finish` succeeded.
    pub all_ok: bool,
}

/// Builds the problem of `plan` and finishes it.
pub fn replay(plan: &Plan) -> Outcome {
    let mut inf = Inference::new();
    inf.set_strict(plan.strict);
    for s in &plan.shapes {
        inf.new_shape("t", &shape_decl(s));
    }
    let mut runtime = 0;
    let mut steps = Vec::new();
    let mut all_ok = true;
    for st in &plan.steps {
        let Some((shape, logic)) = logic(st, &mut runtime) else {
            all_ok = false;
            continue;
        };
        match inf.add_step(shape, logic) {
            Ok(s) => steps.push(s),
            Err(_) => all_ok = false,
        }
    }
    let finished = inf.finish();
    if finished.is_ok() {
        for i in 0..inf.num_shapes() {
            let sh = inf.shape(ShapeId(i as u32));
            assert!(sh.rows_sizes().is_some(), "finish succeeded but {sh} is not closed");
        }
    }
    all_ok &= finished.is_ok();
    Outcome { inf, steps, all_ok }
}

/// Replays `plan`, then derives and checks the projections of every step when all went well.
pub fn check(plan: &Plan) {
    let out = replay(plan);
    if !out.all_ok {
        return;
    }
    let inf = &out.inf;
    for &step in &out.steps {
        let mut symbols = SymbolGen::default();
        let padded = matches!(inf.step_logic(step), Logic::Einsum(s, _) if s.padded);
        if let Ok(p) = inf.derive_projections(step, &mut symbols) {
            check_projections(inf, step, &p, None, padded);
        }
        if matches!(inf.step_logic(step), Logic::Einsum(..))
            && let Ok(ps) = inf.derive_concat_projections(step, &mut symbols)
        {
            for (i, p) in ps.iter().enumerate() {
                check_projections(inf, step, p, Some(i), padded);
            }
        }
    }
}

/// The smallest and largest value of an index over the product space (`None` for an index
/// with a runtime symbol, whose range the projection does not know).
fn index_range(idx: &AxisIndex, p: &Projections) -> Option<(i128, i128)> {
    let (terms, offset) = idx.as_affine();
    let (mut lo, mut hi) = (offset as i128, offset as i128);
    for (c, s) in terms {
        let n = p.product_iterators.iter().position(|x| *x == s)?;
        let last = p.product_space[n] as i128 - 1;
        let (a, b) = (0, c as i128 * last);
        lo += a.min(b);
        hi += a.max(b);
    }
    Some((lo, hi))
}

fn check_projections(
    inf: &Inference,
    step: StepId,
    p: &Projections,
    operand: Option<usize>,
    padded: bool,
) {
    let dims = |id: ShapeId| inf.shape(id).dims().expect("closed shape");
    let logic = inf.step_logic(step);
    let mut args: Vec<ShapeId> = logic.args();
    if let Some(i) = operand {
        args = vec![args[i]];
    }
    assert_eq!(p.lhs_dims, dims(inf.step_shape(step)), "lhs dims of {p}");
    assert_eq!(p.rhs_dims.len(), args.len(), "rhs count of {p}");
    for (d, a) in p.rhs_dims.iter().zip(&args) {
        assert_eq!(*d, dims(*a), "rhs dims of {p}");
    }
    assert_eq!(p.product_space.len(), p.product_iterators.len());
    if padded || p.product_space.contains(&0) {
        return;
    }
    let tensors =
        std::iter::once((&p.lhs_dims, &p.project_lhs)).chain(p.rhs_dims.iter().zip(&p.project_rhs));
    for (dims, idx) in tensors {
        assert_eq!(dims.len(), idx.len(), "one index per axis in {p}");
        for (d, i) in dims.iter().zip(idx) {
            if let Some((lo, hi)) = index_range(i, p) {
                assert!(
                    lo >= 0 && hi < *d as i128,
                    "index {i} ranges over {lo}..={hi} on an axis of {d} in {p} ({})",
                    logic.describe()
                );
            }
        }
    }
}

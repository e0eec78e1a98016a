//! Independent checkers: does a closed solution satisfy each step, and do the projections stay
//! in bounds?
//!
//! The constraint checker works on plain sizes and restates each operation's shape rule from its
//! definition: per-row NumPy broadcasting (`cur ≥ subr`: `subr` aligned from the right, no longer
//! than `cur`, each axis equal or 1) for pointwise, compose and transpose; row equations for batch
//! slicing; and for einsum, the alignment of every pattern row with the actual row (leading
//! axes from the left, trailing axes from the right, the row variable in the middle), with
//! `result ≥ result pattern` and `operand pattern ≥ argument`. The sizes of labels are the ones
//! the solver reports ([`Inference::label_size`]): a witness, checked here. Row variables are
//! not reported, so the checker builds the smallest witness itself (the per-axis maximum of what
//! the arguments put in the middle), which satisfies the result side whenever any value does.

use rocannl_arrayjit::indexing::Projections;
use rocannl_shape::inference::Inference;
use rocannl_shape::logic::{Logic, SliceIndex, TerminalData};
use rocannl_shape::spec::{AxisSpec, EinsumSpec, RowSpec, RowVarSpec};
use rocannl_shape::var::{ShapeId, StepId};

type Rows = [Vec<usize>; 3];

/// `subr` broadcasts into `cur`: no longer, aligned from the right, each axis equal or 1.
pub fn broadcasts(cur: &[usize], subr: &[usize]) -> bool {
    subr.len() <= cur.len()
        && cur.iter().rev().zip(subr.iter().rev()).all(|(c, s)| c == s || *s == 1)
}

fn dim_ge(cur: usize, subr: usize) -> bool {
    cur == subr || subr == 1
}

fn rows(inf: &Inference, id: ShapeId) -> Result<Rows, String> {
    inf.shape(id).rows_sizes().ok_or_else(|| format!("{} is not closed", inf.shape(id)))
}

/// Checks that the closed shapes satisfy the relation of `step`.
pub fn check_step(inf: &Inference, step: StepId) -> Result<(), String> {
    let logic = inf.step_logic(step);
    let cur = rows(inf, inf.step_shape(step))?;
    let args = logic.args().into_iter().map(|a| rows(inf, a)).collect::<Result<Vec<_>, _>>()?;
    let fail = |what: &str| {
        Err(format!("{} violates {what}: result {cur:?}, arguments {args:?}", logic.describe()))
    };
    let ge =
        |c: &[usize], s: &[usize], what: &str| if broadcasts(c, s) { Ok(()) } else { fail(what) };
    match logic {
        Logic::Terminal(t) => {
            let all: Vec<usize> =
                [&cur[0], &cur[2], &cur[1]].into_iter().flatten().copied().collect();
            match &t.data {
                TerminalData::Rows => {}
                TerminalData::Values(n) if all.iter().product::<usize>() != *n => {
                    return fail("its number of values");
                }
                TerminalData::Exact(d) if *d != all => return fail("its exact axes"),
                _ => {}
            }
            if t.input_equals_output && cur[1] != cur[2] {
                return fail("input = output");
            }
        }
        Logic::Pointwise(_) => {
            for a in &args {
                for k in 0..3 {
                    ge(&cur[k], &a[k], "broadcasting")?;
                }
            }
        }
        Logic::Same(_) => {
            if args.iter().any(|a| *a != cur) {
                return fail("equal shapes");
            }
        }
        Logic::Compose(..) | Logic::ComposeAccumulate(..) => {
            let (a, b) = (&args[0], &args[1]);
            ge(&a[1], &b[2], "a.input ≥ b.output")?;
            ge(&cur[0], &a[0], "batch ≥ a.batch")?;
            ge(&cur[0], &b[0], "batch ≥ b.batch")?;
            ge(&cur[1], &b[1], "input ≥ b.input")?;
            ge(&cur[2], &a[2], "output ≥ a.output")?;
            if let Some(c) = args.get(2) {
                for k in 0..3 {
                    ge(&cur[k], &c[k], "broadcasting of the addend")?;
                }
            }
        }
        Logic::Transpose(_) => {
            let a = &args[0];
            ge(&cur[0], &a[0], "batch ≥ a.batch")?;
            ge(&cur[1], &a[2], "input ≥ a.output")?;
            ge(&cur[2], &a[1], "output ≥ a.input")?;
        }
        Logic::BatchSlice(_, index) => {
            let a = &args[0];
            let ok_pos = match index {
                SliceIndex::Fixed(i) => a[0].first().is_some_and(|s| s > i),
                SliceIndex::Runtime(_) => a[0].first().is_some_and(|s| *s > 0),
            };
            if !ok_pos || a[0][1..] != cur[0][..] || a[1] != cur[1] || a[2] != cur[2] {
                return fail("batch slicing");
            }
        }
        Logic::Reshape(..) => {
            let n = |r: &Rows| r.iter().flatten().product::<usize>();
            if n(&cur) != n(&args[0]) {
                return fail("reshape");
            }
        }
        Logic::Einsum(spec, _) => {
            check_einsum(spec, &|l| inf.label_size(step, l), &cur, &args).or_else(|e| fail(&e))?
        }
    }
    Ok(())
}

/// The pairs (pattern axis, actual size), and the actual axes the row variable faces.
type Aligned<'a> = (Vec<(&'a AxisSpec, usize)>, Vec<usize>);

/// One row of a pattern lined up against an actual row.
struct Occurrence<'a> {
    row: &'a RowSpec,
    key: Option<String>,
    actual: &'a [usize],
    /// An operand (`pattern ≥ actual`) or the result (`actual ≥ pattern`).
    operand: bool,
}

impl Occurrence<'_> {
    /// The pairs (pattern axis, actual size) of the leading and trailing axes, and the part of
    /// the actual row the row variable faces.
    fn align(&self) -> Result<Aligned<'_>, String> {
        let (beg, end, a) = (&self.row.beg, &self.row.end, self.actual);
        let n = a.len();
        let k = end.len().min(n);
        let mut pairs: Vec<(&AxisSpec, usize)> =
            end[end.len() - k..].iter().zip(a[n - k..].iter().copied()).collect();
        if !self.operand && end.len() > n {
            return Err(format!("pattern row {} is longer than {a:?}", self.row));
        }
        if self.key.is_none() {
            if self.operand && n > end.len() {
                return Err(format!("{a:?} is longer than pattern row {}", self.row));
            }
            return Ok((pairs, vec![]));
        }
        let middle = &a[..n - k];
        let j = beg.len().min(middle.len());
        if !self.operand && j < beg.len() {
            return Err(format!("pattern row {} is longer than {a:?}", self.row));
        }
        pairs.extend(beg[..j].iter().zip(middle[..j].iter().copied()));
        Ok((pairs, middle[j..].to_vec()))
    }
}

fn conv_size(stride: usize, out: usize, dilation: usize, k: usize, padded: bool) -> usize {
    if padded || dilation == 0 {
        stride * out
    } else {
        stride * out.saturating_sub(1) + dilation * k.saturating_sub(1) + 1
    }
}

/// Checks an einsum step against label sizes (`size`) and the closed rows.
pub fn check_einsum(
    spec: &EinsumSpec,
    size: &dyn Fn(&str) -> Option<usize>,
    cur: &Rows,
    args: &[Rows],
) -> Result<(), String> {
    let mut occs = Vec::new();
    let patterns = spec.operands.iter().zip(args).map(|(p, a)| (p, a, true));
    for (p, actual, operand) in patterns.chain(std::iter::once((&spec.result, cur, false))) {
        for (k, row) in p.rows().into_iter().enumerate() {
            let key = row.var.as_ref().map(|v| match v {
                RowVarSpec::Ellipsis => format!("...{k}"),
                RowVarSpec::Named(n) => n.clone(),
            });
            occs.push(Occurrence { row, key, actual: &actual[k], operand });
        }
    }
    let mut aligned = Vec::new();
    for o in &occs {
        aligned.push(o.align()?);
    }
    // Label sizes: the solver's, or for a label it left unsolved the largest operand size.
    let label = |l: &str| -> usize {
        size(l).unwrap_or_else(|| {
            let mut best = 1;
            for (o, (pairs, _)) in occs.iter().zip(&aligned) {
                for (ax, x) in pairs {
                    if o.operand && matches!(ax, AxisSpec::Label(m) if m == l) {
                        best = best.max(*x);
                    }
                }
            }
            best
        })
    };
    // Row variables: the per-axis maximum of what the operands put in the middle.
    let mut witness: Vec<(String, Vec<usize>)> = Vec::new();
    for (o, (_, middle)) in occs.iter().zip(&aligned) {
        let Some(key) = &o.key else { continue };
        let pos = match witness.iter().position(|(k, _)| k == key) {
            Some(p) => p,
            None => {
                witness.push((key.clone(), vec![]));
                witness.len() - 1
            }
        };
        if o.operand {
            let w = &mut witness[pos].1;
            while w.len() < middle.len() {
                w.insert(0, 1);
            }
            let off = w.len() - middle.len();
            for (slot, x) in w[off..].iter_mut().zip(middle) {
                if *x > 1 && *slot > 1 && slot != x {
                    return Err(format!("row variable {key} would need both {slot} and {x}"));
                }
                *slot = (*slot).max(*x);
            }
        }
    }
    for (o, (pairs, middle)) in occs.iter().zip(&aligned) {
        for (ax, x) in pairs {
            let (t, fixed) = match ax {
                AxisSpec::Label(l) => (label(l), None),
                AxisSpec::Anonymous => continue,
                AxisSpec::Fixed(i) => (0, Some(*i)),
                AxisSpec::Conv { stride, output, dilation, kernel } => {
                    let k = kernel.as_deref().map_or(1, label);
                    let d = if kernel.is_some() { *dilation } else { 0 };
                    (conv_size(*stride, label(output), d, k, spec.padded), None)
                }
                AxisSpec::Concat(parts) => (parts.iter().map(|p| label(p)).sum(), None),
            };
            let ok = match (fixed, o.operand) {
                // An index i needs an axis of at least i + 1 (or a broadcast argument axis).
                (Some(i), true) => *x == 1 || *x > i,
                (Some(i), false) => *x > i || i == 0,
                (None, true) => dim_ge(t, *x),
                (None, false) => dim_ge(*x, t),
            };
            if !ok {
                return Err(format!("axis {ax} of pattern row {} against {x}", o.row));
            }
        }
        if let Some(key) = &o.key {
            let w = &witness.iter().find(|(k, _)| k == key).expect("witness").1;
            let ok = if o.operand { broadcasts(w, middle) } else { broadcasts(middle, w) };
            if !ok {
                return Err(format!("row variable {key} = {w:?} against {middle:?}"));
            }
        }
    }
    Ok(())
}

/// Checks that every index of `p` stays in its tensor's axis at every point of the product
/// space: all points of small spaces, the corners of large ones (an affine index takes its
/// extremes at corners).
pub fn check_projection_bounds(p: &Projections) -> Result<(), String> {
    let space = &p.product_space;
    if space.contains(&0) {
        return Ok(());
    }
    let total: usize = space.iter().product();
    let points: Vec<Vec<i64>> = if total <= 4096 {
        let mut out = vec![vec![]];
        for &n in space {
            out = out
                .into_iter()
                .flat_map(|pt: Vec<i64>| {
                    (0..n as i64).map(move |v| {
                        let mut q = pt.clone();
                        q.push(v);
                        q
                    })
                })
                .collect();
        }
        out
    } else {
        (0..1usize << space.len())
            .map(|mask| {
                space
                    .iter()
                    .enumerate()
                    .map(|(i, &n)| if mask >> i & 1 == 1 { n as i64 - 1 } else { 0 })
                    .collect()
            })
            .collect()
    };
    let tensors =
        std::iter::once((&p.lhs_dims, &p.project_lhs)).chain(p.rhs_dims.iter().zip(&p.project_rhs));
    for (dims, idx) in tensors {
        if dims.len() != idx.len() {
            return Err(format!("{} axes but {} indices in {p}", dims.len(), idx.len()));
        }
        for (d, i) in dims.iter().zip(idx) {
            let (terms, offset) = i.as_affine();
            for pt in &points {
                let mut v = offset;
                for (c, s) in &terms {
                    let Some(n) = p.product_iterators.iter().position(|x| x == s) else {
                        return Err(format!("{i} uses a symbol outside the product space"));
                    };
                    v += c * pt[n];
                }
                if v < 0 || v >= *d as i64 {
                    return Err(format!("index {i} = {v} outside an axis of {d} in {p}"));
                }
            }
        }
    }
    Ok(())
}

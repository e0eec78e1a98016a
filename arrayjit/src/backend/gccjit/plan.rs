//! Planning: the CPU schedule, then the cut of the scheduled program into steps — parallel
//! loop nests, each a function of its own the pool splits across threads, and runs of
//! everything else as serial functions.
//!
//! A nest is parallel when it may be split (its outermost loop is parallel, at a cut point on
//! both sides) and does enough work for a job of the pool, or when it is small but sits among
//! big ones over the same rows, whose job it can share ([`small_joiners`], [`super::group`]).
//! Serial runs are cut where their content says (content-defined chunking), so that equal runs
//! give equal functions wherever they occur ([`super::dedup`]).

use super::dedup;
use super::step::StepKind;
use crate::backend::CompileOptions;
use crate::low_level::{Program, Stmt, cut_points, schedule};

/// The scheduled program, its steps, and which parallel steps are small (below
/// `min_parallel_work`: parallel only to share a job with their neighbours, see
/// [`small_joiners`]; run on the calling thread when they share none).
pub fn plan(prog: &Program, threads: usize, options: &CompileOptions) -> Planned {
    let mut prog = prog.clone();
    let kernel_calls = options.kernel_calls && !options.bounds_check;
    let opts = schedule::CpuSchedule {
        threads,
        kernel_calls,
        bf16_pairs: kernel_calls && crate::kernels::bf16::has_native(),
        map_calls: options.map_calls,
        epilogues: options.epilogues,
    };
    schedule::schedule_cpu(&mut prog, &opts);
    let cuts = cut_points(&prog.body);
    // Loop nests that may run split across the threads: their extent.
    let splittable: Vec<Option<usize>> = prog
        .body
        .iter()
        .enumerate()
        .map(|(i, s)| match s {
            Stmt::For { parallel: true, extent, .. }
                if threads > 1 && *extent > 1 && cuts[i] && cuts[i + 1] =>
            {
                Some(*extent)
            }
            _ => None,
        })
        .collect();
    let big: Vec<bool> = prog
        .body
        .iter()
        .zip(&splittable)
        .map(|(s, e)| e.is_some() && work(s) >= options.min_parallel_work)
        .collect();
    // Bounds-check mode reports the call that went out of range: one call per job there.
    let grouping = options.parallel_groups && !options.bounds_check;
    let joiners = if grouping {
        small_joiners(&prog.body, &splittable, &big)
    } else {
        vec![false; prog.body.len()]
    };
    let mut steps = Vec::new();
    let mut small = Vec::new();
    let mut serial: Vec<Stmt> = Vec::new();
    let flush =
        |serial: &mut Vec<Stmt>, steps: &mut Vec<(Vec<Stmt>, StepKind)>, small: &mut Vec<bool>| {
            if serial.iter().any(|s| !matches!(s, Stmt::Comment(_))) {
                steps.push((std::mem::take(serial), StepKind::Serial));
                small.push(false);
            }
            serial.clear();
        };
    let (mut boundary, mut len) = (false, 0);
    for (i, s) in prog.body.iter().enumerate() {
        match s {
            // A parallel step is a function of its own: it needs a cut on both sides.
            Stmt::For { parallel: true, extent, limit, .. } if big[i] || joiners[i] => {
                flush(&mut serial, &mut steps, &mut small);
                (boundary, len) = (false, 0);
                let limit = limit.map(|l| (prog.symbol_slot(l.size).unwrap_or(0), l.per as i64));
                let kind = StepKind::Parallel { extent: *extent as i64, limit };
                steps.push((vec![s.clone()], kind));
                small.push(!big[i]);
            }
            s => {
                // Serial steps end where the content says (see `SERIAL_STEP_LEN`), so that a
                // repeated run of statements is cut the same way wherever it occurs and its
                // steps are compiled once ([`dedup`]).
                if cuts[i] && (boundary || len >= 2 * SERIAL_STEP_LEN) {
                    flush(&mut serial, &mut steps, &mut small);
                    (boundary, len) = (false, 0);
                }
                if !matches!(s, Stmt::Comment(_)) {
                    len += 1;
                    boundary |=
                        dedup::canonical_hash(&prog, s).is_multiple_of(SERIAL_STEP_LEN as u64);
                }
                serial.push(s.clone());
            }
        }
    }
    flush(&mut serial, &mut steps, &mut small);
    let group_ends = if grouping {
        super::group::group_ends(&prog, &steps)
    } else {
        (1..=steps.len()).collect()
    };
    Planned { prog, steps, small, group_ends }
}

/// A scheduled program cut into steps ([`plan()`]).
pub struct Planned {
    /// The scheduled program.
    pub prog: Program,
    /// Its steps, in order.
    pub steps: Vec<(Vec<Stmt>, StepKind)>,
    /// Per step, a small parallel step ([`small_joiners`]).
    pub small: Vec<bool>,
    /// Per step, the end of the parallel group it starts ([`super::group`]; `k + 1` when it
    /// runs alone).
    pub group_ends: Vec<usize>,
}

/// Which small splittable nests (below the work worth a job of their own) become parallel
/// steps anyway: those in a run of consecutive splittable nests of one trip count (comments
/// aside) that holds a big one. Run on the calling thread between two jobs, such a nest kept
/// the other threads waiting and split the jobs around it; as a step of the same trip count it
/// can share their job ([`super::group`]), and runs on the calling thread only if it shares none.
pub fn small_joiners(body: &[Stmt], splittable: &[Option<usize>], big: &[bool]) -> Vec<bool> {
    let mut out = vec![false; body.len()];
    let real: Vec<usize> =
        (0..body.len()).filter(|i| !matches!(body[*i], Stmt::Comment(_))).collect();
    let mut r = 0;
    while r < real.len() {
        let Some(extent) = splittable[real[r]] else {
            r += 1;
            continue;
        };
        let mut end = r + 1;
        while end < real.len() && splittable[real[end]] == Some(extent) {
            end += 1;
        }
        if real[r..end].iter().any(|i| big[*i]) {
            real[r..end].iter().filter(|i| !big[**i]).for_each(|i| out[*i] = true);
        }
        r = end;
    }
    out
}

/// Top-level statements per serial step, on average: GCC's optimization time grows faster than
/// linearly with function size, so long runs of small nests are cut into several functions. A
/// step ends after a statement whose canonical hash is a multiple of this (content-defined
/// chunking: equal runs of statements get equal cuts wherever they occur, so their steps are
/// deduplicated), or at twice this length.
pub const SERIAL_STEP_LEN: usize = 8;

/// Scalar operations executed by a statement: iterations times expression cost.
pub fn work(s: &Stmt) -> usize {
    fn go(s: &Stmt, mult: usize) -> usize {
        match s {
            Stmt::For { extent, body, .. } => {
                body.iter().map(|b| go(b, mult.saturating_mul(*extent))).sum()
            }
            Stmt::If { body, .. } => body.iter().map(|b| go(b, mult)).sum(),
            Stmt::Set { value, .. } | Stmt::SetLocal { value, .. } => {
                mult.saturating_mul(1 + value.cost() as usize)
            }
            // Three scalar operations (two reads, one multiply-add) per step.
            Stmt::Gemm(g) => {
                mult.saturating_mul(3 * (g.rows_per_call() * g.n.extent).saturating_mul(g.k.extent))
            }
            // Each point: its reads and operations.
            Stmt::Map(m) => mult.saturating_mul(m.points_total().saturating_mul(1 + m.code.len())),
            // Three scalar operations per multiply-add, as a product.
            Stmt::Call(c) => mult.saturating_mul(3 * c.steps()),
            Stmt::Comment(_) => 0,
        }
    }
    go(s, 1)
}

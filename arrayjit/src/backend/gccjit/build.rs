//! Building a routine's machine code: which steps are compiled at which optimization level
//! ([`split_by_work`]), how the builds are spread over child processes ([`balance`]), and the
//! builds themselves, through the compile cache ([`build_all`]).
//!
//! GCC's time is most of a cold compile, so this is where it is spent carefully: the few steps
//! that do nearly all the work at the requested level, the rest at a cheaper one; the builds in
//! parallel processes of about equal cost; every library copied into the cache as it is made.

use std::path::{Path, PathBuf};
use std::time::Instant;

use super::codegen::{self, BuildOptions, BuildTimes, Built, Output};
use super::plan::work;
use super::step::StepKind;
use super::{Code, fork};
use crate::cache::{Cache, EntryKind};
use crate::error::Error;
use crate::low_level::{Program, Stmt};
use crate::tnode::NodeId;

/// What the builds of a routine are made from: its distinct steps ([`super::dedup`]), their buffer
/// slots, function names and content keys.
#[derive(Clone, Copy)]
pub(super) struct BuildInput<'a> {
    pub prog: &'a Program,
    pub steps: &'a [(Vec<Stmt>, StepKind)],
    pub slots: &'a [Vec<NodeId>],
    pub names: &'a [String],
    pub step_keys: &'a [String],
}

impl<'a> BuildInput<'a> {
    /// What each build compiles from.
    fn code(&self) -> codegen::Steps<'a> {
        let BuildInput { prog, steps, slots, names, .. } = *self;
        codegen::Steps { prog, steps, slots, names }
    }
}

/// The result of building: each build's code, the time spent, and each build's cache entry
/// (`None` where it has none).
pub(super) struct BuildOutput {
    pub code: Vec<Code>,
    pub times: BuildTimes,
    pub entries: Vec<Option<String>>,
}

/// Builds the machine code of a planned program's builds (each some of its distinct steps
/// at one optimization level, with the functions named `names`), through the compile cache
/// when there is one: a build whose entry exists is loaded; every other build is compiled
/// into a shared library in a private temporary folder ([`fork::Scratch`]), the builds of
/// different bins (`bin_of`) in parallel child processes ([`fork`]), loaded from there and
/// copied into the cache. A build with nowhere to write, or whose library failed to build or
/// load, is compiled in memory (where a failure is an error). Returns the code of each
/// build, the times, and each build's cache entry (`None` where it has none).
pub(super) fn build_all(
    cache: Option<Cache>,
    input: &BuildInput<'_>,
    builds: &[BuildOptions],
    bin_of: &[usize],
) -> Result<BuildOutput, Error> {
    let step_keys = input.step_keys;
    // A build's entry is named by the content keys of its steps, in order.
    let keys: Vec<String> = builds
        .iter()
        .map(|b| {
            let parts: Vec<&[u8]> = b.steps.iter().map(|k| step_keys[*k].as_bytes()).collect();
            Cache::key(&parts)
        })
        .collect();
    let (mut code, mut entries) = from_cache(cache.as_ref(), &keys);
    // Where each missing build writes its library.
    let scratch = code.iter().any(Option::is_none).then(fork::Scratch::new).flatten();
    let mut targets: Vec<Option<PathBuf>> = (0..builds.len())
        .map(|i| scratch.as_ref().filter(|_| code[i].is_none()).map(|s| s.library(i)))
        .collect();
    let mut times = BuildTimes::default();
    let started = Instant::now();
    let built = build_files(input, builds, bin_of, &targets, &mut times);
    targets.iter_mut().zip(built).filter(|(_, ok)| !ok).for_each(|(t, _)| *t = None);
    // Wall time of the builds, whatever ran where.
    times.compile_s = started.elapsed().as_secs_f64() - times.codegen_s;
    for (i, target) in targets.iter().enumerate() {
        let Some(path) = target else { continue };
        if let Some((lib, stored)) = install(cache.as_ref(), &keys[i], path) {
            code[i] = Some(Code::Library(lib));
            entries[i] = stored.then(|| keys[i].clone());
        }
    }
    // Anything still missing (nowhere to write, a failed build, a library that did not load)
    // is compiled in memory, where a failure is an error.
    for (i, c) in code.iter_mut().enumerate() {
        if c.is_none() {
            let (b, t) = codegen::build(input.code(), &builds[i], Output::Memory)?;
            times.codegen_s += t.codegen_s;
            times.compile_s += t.compile_s;
            match b {
                Built::Memory(r) => *c = Some(Code::Memory(r)),
                Built::File => unreachable!("an in-memory build"),
            }
        }
    }
    Ok(BuildOutput { code: code.into_iter().flatten().collect(), times, entries })
}
/// The code of each build whose entry is in the cache (`None` for the others), and its entry.
fn from_cache(cache: Option<&Cache>, keys: &[String]) -> (Vec<Option<Code>>, Vec<Option<String>>) {
    let mut code: Vec<Option<Code>> = keys.iter().map(|_| None).collect();
    let mut entries: Vec<Option<String>> = keys.iter().map(|_| None).collect();
    let Some(cache) = cache else { return (code, entries) };
    for (i, key) in keys.iter().enumerate() {
        // A library of the user's own, in a folder only the user can write, whose digest
        // matches: one this code generator built.
        let Some(path) = cache.lookup(key) else { continue };
        if let Some(lib) = codegen::load_library(&path) {
            code[i] = Some(Code::Library(lib));
            entries[i] = Some(key.clone());
        }
    }
    (code, entries)
}

/// Builds each build that has a target into its file: by bin, each in a child (GCC's embedded
/// driver then changes only the child's environment, [`crate::env`]); a bin whose fork failed
/// is built here, with the external driver ([`codegen::build`]). Returns which builds succeeded (a failure here is not yet an error: the build is made
/// again in memory, where it becomes one).
fn build_files(
    input: &BuildInput<'_>,
    builds: &[BuildOptions],
    bin_of: &[usize],
    targets: &[Option<PathBuf>],
    times: &mut BuildTimes,
) -> Vec<bool> {
    let mut ok = vec![false; builds.len()];
    let bins = group_by_bin(bin_of, |i| targets[i].is_some());
    if bins.is_empty() {
        return ok;
    }
    let build = |i: usize, locked: bool| {
        let out = Output::SharedLibrary(targets[i].as_deref().unwrap_or(Path::new("")));
        let f = if locked { codegen::build } else { codegen::build_unlocked };
        f(input.code(), &builds[i], out)
    };
    let jobs: Vec<Box<dyn FnOnce() -> bool + '_>> = bins
        .iter()
        .map(|bin| {
            let job = move || bin.iter().all(|&i| build(i, false).is_ok());
            Box::new(job) as Box<dyn FnOnce() -> bool + '_>
        })
        .collect();
    let mut children = Vec::new();
    for (bin, child) in bins.iter().zip(fork::spawn(jobs)) {
        match child {
            Ok(child) => children.push((bin, child)),
            // No fork: built here.
            Err(_) => {
                for &i in bin {
                    if let Ok((_, t)) = build(i, true) {
                        times.codegen_s += t.codegen_s;
                        ok[i] = true;
                    }
                }
            }
        }
    }
    for (bin, child) in children {
        let built = child.wait();
        bin.iter().for_each(|&i| ok[i] = built);
    }
    ok
}

/// The builds `0..bin_of.len()` that `keep` keeps, grouped by bin (one process each), in order
/// of first appearance.
pub(super) fn group_by_bin(bin_of: &[usize], keep: impl Fn(usize) -> bool) -> Vec<Vec<usize>> {
    let mut bins: Vec<Vec<usize>> = Vec::new();
    for i in (0..bin_of.len()).filter(|i| keep(*i)) {
        match bins.iter_mut().find(|b| bin_of[b[0]] == bin_of[i]) {
            Some(b) => b.push(i),
            None => bins.push(vec![i]),
        }
    }
    bins
}

/// Loads a library just built at `path` (in a private folder: nobody else could have written
/// it), then stores a copy in the cache as the entry `key` when there is a cache. Returns the
/// library and whether it was stored; `None` when it does not load.
pub(super) fn install(
    cache: Option<&Cache>,
    key: &str,
    path: &Path,
) -> Option<(libloading::Library, bool)> {
    let lib = codegen::load_library(path)?;
    let stored = cache.and_then(|c| c.store_file(key, path, EntryKind::SharedLibrary)).is_some();
    Some((lib, stored))
}

/// The share of a routine's work (scalar operations) that is compiled at the requested
/// optimization level; the steps doing the rest are compiled at [`COLD_OPT_LEVEL`].
pub const HOT_WORK_SHARE: f64 = 0.95;

/// The optimization level of the steps outside [`HOT_WORK_SHARE`]: `-O2` still vectorizes
/// (GCC's very cheap cost model), at about half of `-O3`'s compile time. Measured on the GPT,
/// MLP and attention documents (docs/benchmarks.md): the rest at `-O1` made a routine up to 2×
/// slower (an attention routine's remaining work, unvectorized); at `-O2` none was slower.
pub const COLD_OPT_LEVEL: u8 = 2;

/// Splits the planned steps into builds by optimization level: the fewest steps that do
/// [`HOT_WORK_SHARE`] of the work (contractions, mostly) at `level`, the rest at
/// [`COLD_OPT_LEVEL`]; a step's work counts once per call (`calls`). GCC's time at `-O3` is mostly spent on the many small nests (pointwise
/// maps, reductions of small tensors, copies) that run for a small part of a step. Returns
/// `(level, step indices)` pairs; one pair when there is nothing to split.
pub fn split_by_work(
    steps: &[(Vec<Stmt>, StepKind)],
    calls: &[usize],
    level: u8,
) -> Vec<(u8, Vec<usize>)> {
    let all: Vec<usize> = (0..steps.len()).collect();
    if level <= COLD_OPT_LEVEL || steps.len() < 2 {
        return vec![(level, all)];
    }
    let works: Vec<f64> = steps
        .iter()
        .zip(calls)
        .map(|((b, _), n)| *n as f64 * b.iter().map(|s| work(s) as f64).sum::<f64>())
        .collect();
    let total: f64 = works.iter().sum();
    let mut order = all.clone();
    order.sort_by(|a, b| works[*b].total_cmp(&works[*a]).then(a.cmp(b)));
    let mut hot = Vec::new();
    let mut covered = 0.0;
    for k in order {
        if covered >= HOT_WORK_SHARE * total {
            break;
        }
        covered += works[k];
        hot.push(k);
    }
    if hot.len() == steps.len() {
        return vec![(level, all)];
    }
    hot.sort_unstable();
    let cold: Vec<usize> = all.into_iter().filter(|k| hot.binary_search(k).is_err()).collect();
    vec![(level, hot), (COLD_OPT_LEVEL, cold)]
}

/// Spreads the steps of `parts` (one `(level, steps)` pair per optimization level) over at most
/// `workers` bins of about equal compile cost, longest first onto the least loaded bin; a bin
/// holds at most one build per level and is built by one process ([`fork`]). GCC's cost is
/// estimated from the statements of a step plus a fixed cost per function, scaled by level.
pub fn balance(
    steps: &[(Vec<Stmt>, StepKind)],
    parts: Vec<(u8, Vec<usize>)>,
    workers: usize,
) -> Vec<Vec<(u8, Vec<usize>)>> {
    if workers <= 1 {
        return vec![parts];
    }
    let mut items: Vec<(f64, u8, usize)> = parts
        .iter()
        .flat_map(|(level, ks)| {
            ks.iter().map(move |k| (compile_cost(&steps[*k].0, *level), *level, *k))
        })
        .collect();
    items.sort_by(|a, b| b.0.total_cmp(&a.0).then(a.2.cmp(&b.2)));
    let mut load = vec![0.0f64; workers];
    let mut bins: Vec<Vec<(u8, Vec<usize>)>> = vec![Vec::new(); workers];
    for (cost, level, k) in items {
        let b = (0..workers).min_by(|x, y| load[*x].total_cmp(&load[*y])).unwrap_or(0);
        load[b] += cost;
        match bins[b].iter_mut().find(|(l, _)| *l == level) {
            Some((_, ks)) => ks.push(k),
            None => bins[b].push((level, vec![k])),
        }
    }
    for bin in &mut bins {
        bin.iter_mut().for_each(|(_, ks)| ks.sort_unstable());
        bin.sort_by_key(|(level, _)| std::cmp::Reverse(*level));
    }
    bins.retain(|b| !b.is_empty());
    bins
}

/// GCC's time on a step, in arbitrary units: a fixed cost per function plus one per statement,
/// times a factor per optimization level (from the compile times of docs/benchmarks.md).
fn compile_cost(body: &[Stmt], level: u8) -> f64 {
    let mut stmts = 0usize;
    body.iter().for_each(|s| s.visit(&mut |_| stmts += 1));
    let factor = [0.3, 1.0, 1.6, 2.4][level.min(3) as usize];
    (20 + stmts) as f64 * factor
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::low_level::{Expr, Index, Var};

    /// A serial step writing `extent` cells of node 0.
    fn nest(extent: usize) -> (Vec<Stmt>, StepKind) {
        let set =
            Stmt::Set { node: NodeId(0), idx: vec![Index::var(Var(0))], value: Expr::Const(1.0) };
        (
            vec![Stmt::For { var: Var(0), extent, limit: None, parallel: false, body: vec![set] }],
            StepKind::Serial,
        )
    }

    #[test]
    fn the_steps_doing_most_of_the_work_keep_the_requested_level() {
        // 1000 + 30 + 10 + 5 + 1 cells: 1000 alone is 96.1% of the work.
        let steps: Vec<_> = [10, 1000, 1, 30, 5].into_iter().map(nest).collect();
        assert_eq!(
            split_by_work(&steps, &[1; 5], 3),
            vec![(3, vec![1]), (COLD_OPT_LEVEL, vec![0, 2, 3, 4])]
        );
        // Nothing to split at the cold level or below, nor with one step.
        assert_eq!(split_by_work(&steps, &[1; 5], 2), vec![(2, vec![0, 1, 2, 3, 4])]);
        assert_eq!(split_by_work(&steps[1..2], &[1], 3), vec![(3, vec![0])]);
        // Equal steps: each is needed for 95%.
        let even: Vec<_> = [10, 10, 10].into_iter().map(nest).collect();
        assert_eq!(split_by_work(&even, &[1; 3], 3), vec![(3, vec![0, 1, 2])]);
    }
}

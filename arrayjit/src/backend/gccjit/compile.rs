//! Compiling a routine, phase by phase, readable top-down from [`Gccjit::compile_routine`]:
//! schedule and cut into steps, one function per distinct step, key each step, take what the
//! compile cache holds, decide what to build now and what in the background, lay out each
//! call's buffer table, build, and assemble the routine that [`Backend::run`] calls.
//!
//! [`Backend::run`]: super::Backend::run

use std::fmt::Write as _;
use std::path::PathBuf;
use std::time::Instant;

use rustc_hash::FxHashMap;

use super::build::{BuildInput, BuildOutput, balance, build_all, split_by_work};
use super::codegen::{self, BuildOptions, RunTable};
use super::plan::Planned;
use super::pool::StepFn;
use super::step::StepKind;
use super::{Code, Gccjit, Loaded, OobSlot, dedup, helpers, tier};
use crate::backend::c_syntax::{CRenderer, Dialect, nodes_of, prelude, storage_ctype};
use crate::backend::host::{HostArena, HostBuffer};
use crate::backend::{BuildReport, BuildRequest, Compiled};
use crate::cache::{Cache, CacheOutcome};
use crate::error::Error;
use crate::low_level::{Program, Stmt};
use crate::tnode::NodeId;

/// What identifies each distinct step of a routine: its optimization level, its content key
/// (its canonical code, level and everything else its machine code depends on) and the
/// function name derived from the key, the same in every library that holds the step.
struct StepIds {
    /// `(level, steps)` per optimization level ([`split_by_work`]).
    parts: Vec<(u8, Vec<usize>)>,
    keys: Vec<String>,
    names: Vec<String>,
}

/// What a compile builds: now (into the cache, or at the first tier outside it), and in the
/// background (the optimized build of a tiered routine).
struct BuildPlan {
    builds: Vec<BuildOptions>,
    bin_of: Vec<usize>,
    cache: Option<Cache>,
    later: Option<tier::Tier>,
    tiered: bool,
}

/// Each call's buffer table (its nodes' addresses, then its seeds'), and what the tables point
/// into that the routine owns.
struct Tables {
    tables: Vec<Vec<*mut u8>>,
    seeds: Vec<Box<[u64]>>,
    scratch: Vec<HostBuffer>,
    arena: HostArena,
    labels: FxHashMap<NodeId, String>,
}

impl Gccjit {
    /// Compiles a program; with `only_cached = Some(prebuild)`, only when every step is in the
    /// compile cache (else `None`, and with `prebuild` the missing steps are built for the cache
    /// in the background: see [`super::Backend::compile_cached`]).
    pub(super) fn compile_routine(
        &mut self,
        prog: &Program,
        req: &BuildRequest,
        only_cached: Option<bool>,
    ) -> Result<Option<Compiled>, Error> {
        let started = Instant::now();
        // The CPU schedule, cut into steps; one function per distinct step.
        let Planned { prog: scheduled, steps, small, group_ends } = self.plan(prog);
        let deduped = dedup::dedup(&scheduled, &steps);
        let planned = Instant::now();
        // The C source, for people (gccjit compiles its own IR of the same steps).
        let source = self.render_planned(&deduped);
        let mut phases = vec![
            ("schedule", (planned - started).as_secs_f64()),
            ("render", planned.elapsed().as_secs_f64()),
        ];
        let started = Instant::now();
        let ids = self.step_ids(&deduped, req.opt_level, &prog.name);
        // Steps compiled before, by this routine or another, come from their libraries.
        let (mut code, mut found) = self.cached_steps(&ids);
        let missing = missing_parts(&ids.parts, &found);
        if let Some(prebuild) = only_cached
            && !missing.is_empty()
        {
            if prebuild {
                let (builds, bin_of) = self.builds(&deduped, missing, &prog.name);
                self.prebuilds.push(self.background(&deduped, &ids, builds, bin_of));
            }
            return Ok(None);
        }
        let plan = self.build_plan(req, &deduped, &ids, missing, &prog.name);
        let tables = self.call_tables(&scheduled, &deduped)?;
        // Build what is missing; record where the new steps are, for the next routine.
        let reused = code.len();
        let input = BuildInput {
            prog: &deduped.prog,
            steps: &deduped.steps,
            slots: &deduped.slots,
            names: &ids.names,
            step_keys: &ids.keys,
        };
        let BuildOutput { code: built, times, entries } =
            build_all(plan.cache, &input, &plan.builds, &plan.bin_of)?;
        self.record_steps(&ids, &plan.builds, &entries);
        for (i, b) in plan.builds.iter().enumerate() {
            b.steps.iter().for_each(|k| found[*k] = Some(reused + i));
        }
        code.extend(built);
        let cache_s = started.elapsed().as_secs_f64() - times.codegen_s - times.compile_s;
        phases.extend([
            ("cache", cache_s.max(0.0)),
            ("codegen", times.codegen_s),
            ("c compile", times.compile_s),
        ]);
        let cache = self.outcome(&plan.builds, &entries, plan.tiered);
        let fns = step_functions(prog, &deduped, &ids, &code, &found)?;
        let listing = calls_listing(&deduped, &group_ends);
        let oob: Box<OobSlot> = Box::default();
        let run_table =
            Box::new(RunTable { helpers: helpers(), slot: &*oob as *const OobSlot as *const u8 });
        let calls = deduped.calls.iter().zip(tables.tables).map(|(c, t)| (c.step, t)).collect();
        self.routines.push(Some(Loaded {
            code,
            names: ids.names,
            background: plan.later,
            _scratch: tables.scratch,
            _seeds: tables.seeds,
            _arena: tables.arena,
            steps: fns,
            calls,
            group_ends,
            small,
            labels: tables.labels,
            deduped,
            oob,
            run_table,
        }));
        let report = BuildReport { phases, cache };
        Ok(Some(Compiled { routine: self.routines.len() - 1, listing: source + &listing, report }))
    }

    /// Each distinct step's level ([`split_by_work`] of `level`), content key and function
    /// name; with a debug folder, the listing's `step_k` behind each symbol name (for people
    /// reading a profile).
    fn step_ids(&self, deduped: &dedup::Deduped, level: u8, routine: &str) -> StepIds {
        let steps = &deduped.steps;
        let mut counts = vec![0usize; steps.len()];
        deduped.calls.iter().for_each(|c| counts[c.step] += 1);
        let level = level.min(3);
        let parts = split_by_work(steps, &counts, level);
        let mut level_of = vec![level; steps.len()];
        for (l, ks) in &parts {
            ks.iter().for_each(|k| level_of[*k] = *l);
        }
        let setup = self.setup_key();
        let symbols = format!("{:?}", deduped.prog.runtime_symbols);
        let keys: Vec<String> = (0..steps.len())
            .map(|k| {
                let level = format!("O{}", level_of[k]);
                let parts: [&[u8]; 4] = [
                    setup.as_bytes(),
                    level.as_bytes(),
                    deduped.keys[k].as_bytes(),
                    symbols.as_bytes(),
                ];
                Cache::key(&parts)
            })
            .collect();
        let names: Vec<String> = keys.iter().map(|k| format!("step_{}", &k[..16])).collect();
        if let Some(d) = self.dump_path(routine) {
            let map: String = names
                .iter()
                .enumerate()
                .map(|(k, n)| format!("step_{k} {n} O{}\n", level_of[k]))
                .collect();
            let _ = std::fs::write(d.with_extension("symbols.txt"), map);
        }
        StepIds { parts, keys, names }
    }

    /// Where libgccjit's own dumps of a routine go, with a debug folder.
    fn dump_path(&self, routine: &str) -> Option<PathBuf> {
        let d = self.opts.debug_dir.as_ref()?;
        let _ = std::fs::create_dir_all(d);
        Some(d.join(format!("{routine}.gccjit.c")))
    }

    /// The libraries in the compile cache that hold some of the steps, and per step the
    /// library that holds it.
    fn cached_steps(&self, ids: &StepIds) -> (Vec<Code>, Vec<Option<usize>>) {
        let mut code: Vec<Code> = Vec::new();
        let mut found: Vec<Option<usize>> = vec![None; ids.keys.len()];
        let Some(cache) = &self.cache else { return (code, found) };
        let mut lib_of_entry: FxHashMap<String, Option<usize>> = FxHashMap::default();
        for (k, key) in ids.keys.iter().enumerate() {
            let Some(entry) = cache.lookup_step(key) else { continue };
            let lib = *lib_of_entry.entry(entry.clone()).or_insert_with(|| {
                let path = cache.lookup(&entry)?;
                // A library this code generator built (its digest matches).
                let lib = codegen::load_library(&path)?;
                code.push(Code::Library(lib));
                Some(code.len() - 1)
            });
            found[k] = lib.filter(|l| code[*l].function(&ids.names[k]).is_some());
        }
        (code, found)
    }

    /// The builds of `missing` (`(level, steps)` pairs), spread over the worker processes
    /// ([`balance`]): each build's options and the bin (child process) it is made in.
    fn builds(
        &self,
        deduped: &dedup::Deduped,
        missing: Vec<(u8, Vec<usize>)>,
        routine: &str,
    ) -> (Vec<BuildOptions>, Vec<usize>) {
        let dump = self.dump_path(routine);
        let mut builds: Vec<BuildOptions> = Vec::new();
        let mut bin_of = Vec::new();
        let bins = balance(&deduped.steps, missing, self.opts.thread_count());
        for (bin, parts) in bins.into_iter().enumerate() {
            for (level, part) in parts {
                let same = builds.iter().filter(|b| b.opt_level == level).count();
                let ext =
                    if same == 0 { format!("O{level}.c") } else { format!("O{level}-{same}.c") };
                builds.push(BuildOptions {
                    opt_level: level,
                    march_native: self.opts.march_native,
                    bounds_check: self.opts.bounds_check,
                    dump: dump.as_ref().map(|d| d.with_extension(ext)),
                    steps: part,
                });
                bin_of.push(bin);
            }
        }
        (builds, bin_of)
    }

    /// A build for later (in the background, [`tier`]): owns what it builds from.
    fn background(
        &self,
        deduped: &dedup::Deduped,
        ids: &StepIds,
        builds: Vec<BuildOptions>,
        bin_of: Vec<usize>,
    ) -> tier::Tier {
        let owned = tier::Owned {
            prog: deduped.prog.clone(),
            steps: deduped.steps.clone(),
            slots: deduped.slots.clone(),
            names: ids.names.clone(),
            step_keys: ids.keys.clone(),
            builds,
            bin_of,
        };
        tier::Tier::Waiting(Some((Box::new(owned), self.cache.clone())))
    }

    /// What to build now. Tiered ([`tier`]): the missing steps at `-O0` now, outside the cache,
    /// and at their own levels in the background; else at their own levels now, into the cache.
    fn build_plan(
        &self,
        req: &BuildRequest,
        deduped: &dedup::Deduped,
        ids: &StepIds,
        missing: Vec<(u8, Vec<usize>)>,
        routine: &str,
    ) -> BuildPlan {
        let tiered = req.tiered
            && !self.opts.bounds_check
            && missing.iter().any(|(l, _)| *l > tier::FIRST_TIER_LEVEL);
        if !tiered {
            let (builds, bin_of) = self.builds(deduped, missing, routine);
            return BuildPlan { builds, bin_of, cache: self.cache.clone(), later: None, tiered };
        }
        let mut all: Vec<usize> = missing.iter().flat_map(|(_, ks)| ks.clone()).collect();
        all.sort_unstable();
        let (builds, bin_of) = self.builds(deduped, vec![(tier::FIRST_TIER_LEVEL, all)], routine);
        let (later, later_bins) = self.builds(deduped, missing, routine);
        let later = Some(self.background(deduped, ids, later, later_bins));
        BuildPlan { builds, bin_of, cache: None, later, tiered }
    }

    /// One buffer table per call, in its step's slot order, then the address of the call's
    /// seeds ([`dedup`]); the routine's own buffers (packed operands of the CPU schedule) and
    /// its arena of intermediates ([`crate::low_level::memory`]).
    fn call_tables(&self, scheduled: &Program, deduped: &dedup::Deduped) -> Result<Tables, Error> {
        let arena = HostArena::new(scheduled)?;
        let mut scratch: FxHashMap<NodeId, HostBuffer> = FxHashMap::default();
        let mut labels: FxHashMap<NodeId, String> = FxHashMap::default();
        let mut tables = Vec::with_capacity(deduped.calls.len());
        let mut seeds = Vec::with_capacity(deduped.calls.len());
        for call in &deduped.calls {
            let mut table = Vec::with_capacity(call.nodes.len() + 1);
            for n in &call.nodes {
                let ptr = match scheduled.scratch_of(*n) {
                    Some(s) if s.per_thread => std::ptr::null_mut(),
                    Some(_) => match scratch.entry(*n) {
                        std::collections::hash_map::Entry::Occupied(b) => b.get().as_ptr(),
                        std::collections::hash_map::Entry::Vacant(e) => {
                            e.insert(HostBuffer::new(&scheduled.nodes[n])?).as_ptr()
                        }
                    },
                    None => {
                        let (ptr, label) = self.buffer_of(&arena, *n)?;
                        labels.insert(*n, label);
                        ptr
                    }
                };
                table.push(ptr);
            }
            let call_seeds: Box<[u64]> = call.seeds.clone().into_boxed_slice();
            table.push(call_seeds.as_ptr() as *mut u8);
            seeds.push(call_seeds);
            tables.push(table);
        }
        let scratch = scratch.into_values().collect();
        Ok(Tables { tables, seeds, scratch, arena, labels })
    }

    /// A node's address and label: its slot in the routine's arena, or its own buffer.
    fn buffer_of(&self, arena: &HostArena, n: NodeId) -> Result<(*mut u8, String), Error> {
        match arena.slot(n) {
            Some((ptr, node)) => Ok((ptr, node.label.clone())),
            None => {
                let b = self.buffers.get(n).ok_or(Error::UnknownNode(n.0))?;
                Ok((b.as_ptr(), b.node.label.clone()))
            }
        }
    }

    /// Records in the cache's step index which entry holds each step just built.
    fn record_steps(&self, ids: &StepIds, builds: &[BuildOptions], entries: &[Option<String>]) {
        let Some(cache) = &self.cache else { return };
        for (b, entry) in builds.iter().zip(entries) {
            let Some(entry) = entry else { continue };
            for k in &b.steps {
                cache.store_step(&ids.keys[*k], entry);
            }
        }
    }

    /// What the compile cache did for a routine: nothing to build is a hit; a tiered routine's
    /// optimized build is stored once made.
    fn outcome(
        &self,
        builds: &[BuildOptions],
        entries: &[Option<String>],
        tiered: bool,
    ) -> CacheOutcome {
        match (&self.cache, builds.is_empty()) {
            (None, _) => CacheOutcome::Off,
            (Some(_), false) if tiered => CacheOutcome::Miss,
            (Some(_), true) => CacheOutcome::Hit,
            (Some(_), false) if entries.iter().any(Option::is_some) => CacheOutcome::Miss,
            (Some(_), false) => CacheOutcome::Off,
        }
    }

    /// What every step's machine code depends on besides the step itself: the code
    /// generator (a digest of this crate's sources, made by its build script, so that an entry
    /// made by another generator is never used and no version needs bumping by hand),
    /// libgccjit's version, the host's target flags and the options. Part of each step's
    /// content key; nothing in it names the routine (its steps are canonical, [`dedup`]), so
    /// routines and programs with steps in common share them.
    fn setup_key(&self) -> String {
        let v = gccjit::Version::get();
        format!(
            "rocannl-gccjit {} codegen {}; libgccjit {}.{}.{}; march_native={} {:?} bounds_check={}",
            env!("CARGO_PKG_VERSION"),
            env!("ROCANNL_CODEGEN_DIGEST"),
            v.major,
            v.minor,
            v.patch,
            self.opts.march_native,
            codegen::host_arch_flags(),
            self.opts.bounds_check,
        )
    }

    /// The C source of a planned program: what `render` shows, and the compile cache's key.
    pub(super) fn render_planned(&self, deduped: &dedup::Deduped) -> String {
        let prog = &deduped.prog;
        let steps = &deduped.steps;
        let r = CRenderer {
            prog,
            dialect: Dialect::C,
            bounds_check: self.opts.bounds_check,
            seed_numbers: true,
        };
        let mut out = prelude(Dialect::C);
        if self.opts.bounds_check {
            out.push_str("extern void rc_report(void *err, long long node, long long axis, long long index, long long bound);\n");
        }
        for (k, (body, kind)) in steps.iter().enumerate() {
            let slots = &deduped.slots[k];
            let _ = writeln!(
                out,
                "\n/* {} */\nvoid step_{k}(void **bufs, long long *syms, long long lo, long long hi, void *err) {{",
                match kind {
                    StepKind::Serial => "serial".to_string(),
                    StepKind::Parallel { extent, .. } => format!("parallel over 0..{extent}"),
                }
            );
            for n in nodes_of(body) {
                let node = &prog.nodes[&n];
                let ty = storage_ctype(node.prec);
                let p = CRenderer::ptr_name(n);
                if prog.scratch_of(n).is_some_and(|s| s.per_thread) {
                    let len = node.num_elements().max(1);
                    let _ = writeln!(out, "  {ty} a_n{}[{len}];\n  {ty} *{p} = a_n{};", n.0, n.0);
                } else {
                    let slot = slots.iter().position(|s| *s == n).unwrap_or(0);
                    let _ = writeln!(out, "  {ty} *{p} = ({ty} *)bufs[{slot}];");
                }
            }
            if deduped.calls.iter().any(|c| c.step == k && !c.seeds.is_empty()) {
                let _ = writeln!(
                    out,
                    "  const unsigned long long *seeds = (const unsigned long long *)bufs[{}];",
                    slots.len()
                );
            }
            r.declarations(&mut out, body, 1);
            match (kind, body.as_slice()) {
                (StepKind::Parallel { .. }, [Stmt::For { var, body: inner, .. }]) => {
                    CRenderer::for_header(&mut out, 1, &var.to_string(), "lo", "hi");
                    r.stmts(&mut out, inner, 2);
                    out.push_str("  }\n");
                }
                _ => r.stmts(&mut out, body, 1),
            }
            out.push_str("}\n");
        }
        out
    }
}

/// The missing steps of each `(level, steps)` part (those `found` holds no library for).
fn missing_parts(parts: &[(u8, Vec<usize>)], found: &[Option<usize>]) -> Vec<(u8, Vec<usize>)> {
    parts
        .iter()
        .map(|(l, ks)| (*l, ks.iter().copied().filter(|k| found[*k].is_none()).collect()))
        .filter(|(_, ks): &(u8, Vec<usize>)| !ks.is_empty())
        .collect()
}

/// Each distinct step's function, from the library that holds it.
fn step_functions(
    prog: &Program,
    deduped: &dedup::Deduped,
    ids: &StepIds,
    code: &[Code],
    found: &[Option<usize>],
) -> Result<Vec<(StepFn, StepKind)>, Error> {
    let mut fns = Vec::with_capacity(deduped.steps.len());
    for (k, (_, kind)) in deduped.steps.iter().enumerate() {
        let name = &ids.names[k];
        let Some(ptr) = found[k].and_then(|l| code[l].function(name)) else {
            return Err(Error::Compile {
                backend: "gccjit",
                routine: prog.name.clone(),
                log: format!("compiled code has no function {name}"),
            });
        };
        // SAFETY: every step function was built with exactly the `StepFn` signature.
        let f: StepFn = unsafe { std::mem::transmute::<*mut (), StepFn>(ptr) };
        fns.push((f, kind.clone()));
    }
    Ok(fns)
}

/// The order in which a routine calls its distinct steps and the nodes of each call, as a
/// comment after the source: for people, not part of the cache key. Calls that run as one job
/// of the pool ([`group`]) say so: `[job 3]` on each of them.
pub(super) fn calls_listing(deduped: &dedup::Deduped, group_ends: &[usize]) -> String {
    let mut out = String::from("\n/* calls, in order:\n");
    let mut jobs = 0;
    let mut k = 0;
    while k < deduped.calls.len() {
        let end = group_ends.get(k).copied().unwrap_or(k + 1).max(k + 1);
        for c in &deduped.calls[k..end] {
            let nodes: Vec<String> = c.nodes.iter().map(|n| n.to_string()).collect();
            let job = if end - k > 1 { format!("  [job {jobs}]") } else { String::new() };
            let _ = writeln!(out, "   step_{}({}){job}", c.step, nodes.join(", "));
        }
        jobs += usize::from(end - k > 1);
        k = end;
    }
    out.push_str("*/\n");
    out
}

//! The native backend: libgccjit IR built directly from the low-level IR.
//!
//! Compiling a routine: the CPU schedule ([`crate::low_level::schedule`]) reorders and tiles
//! contractions; the top-level statements are grouped into *steps* — every parallel loop nest
//! with enough work becomes its own step, split across the context's persistent thread pool;
//! everything else runs in order on the calling thread — and one libgccjit context holding all
//! steps is compiled once (`-O3 -march=native` by default). Running a routine calls the steps'
//! function pointers in order with a buffer table built at compile time: no allocation, no
//! thread spawning, no lookups per run.

pub mod codegen;
pub mod dedup;
pub mod fork;
pub mod group;
pub mod plan;
pub mod pool;
pub mod tier;

use std::fmt::Write as _;
use std::path::{Path, PathBuf};

use rustc_hash::FxHashMap;
use std::sync::Mutex;
use std::time::Instant;

use codegen::{BuildOptions, BuildTimes, Built, Output, RunTable, StepKind};
use plan::{Planned, work};
use pool::{Pool, StepFn};

use super::c_syntax::{CRenderer, Dialect, nodes_of, prelude, storage_ctype};
use super::host::{HostArena, HostBuffer, HostBuffers};
use super::{Backend, BackendKind, CompileOptions};
use crate::cache::{Cache, CacheOutcome, EntryKind};
use crate::error::Error;
use crate::low_level::{Program, Stmt};
use crate::ndarray::NdArray;
use crate::tnode::{NodeId, TensorNode};

/// Where bounds-check mode reports the first bad index of a run.
#[derive(Debug, Default)]
struct OobSlot {
    first: Mutex<Option<(i64, i64, i64, i64)>>,
}

unsafe extern "C" fn report_oob(table: *mut u8, node: i64, axis: i64, index: i64, bound: i64) {
    // SAFETY: generated code passes the run table given to the step, whose slot is the routine's
    // `OobSlot`; both live as long as the routine.
    let slot = unsafe { &*((*(table as *const RunTable)).slot as *const OobSlot) };
    let mut first = slot.first.lock().unwrap_or_else(|e| e.into_inner());
    if first.is_none() {
        *first = Some((node, axis, index, bound));
    }
}

extern "C" fn f16_to_f32(h: u16) -> f32 {
    half::f16::from_bits(h).to_f32()
}

extern "C" fn f32_to_f16(x: f32) -> u16 {
    half::f16::from_f32(x).to_bits()
}

extern "C" fn bf16_to_f32(h: u16) -> f32 {
    half::bf16::from_bits(h).to_f32()
}

extern "C" fn f32_to_bf16(x: f32) -> u16 {
    half::bf16::from_f32(x).to_bits()
}

/// The helper addresses of the run table, indexed by `codegen::HELPER_*`.
fn helpers() -> [usize; codegen::HELPERS] {
    let mut h = [0usize; codegen::HELPERS];
    h[codegen::HELPER_F16_TO_F32] = f16_to_f32 as *const () as usize;
    h[codegen::HELPER_F32_TO_F16] = f32_to_f16 as *const () as usize;
    h[codegen::HELPER_BF16_TO_F32] = bf16_to_f32 as *const () as usize;
    h[codegen::HELPER_F32_TO_BF16] = f32_to_bf16 as *const () as usize;
    h[codegen::HELPER_REPORT] = report_oob as *const () as usize;
    h[codegen::HELPER_GEMM_F32] = crate::kernels::rc_gemm_f32 as *const () as usize;
    h[codegen::HELPER_GEMM_F64] = crate::kernels::rc_gemm_f64 as *const () as usize;
    h[codegen::HELPER_GEMM_EPI_F32] = crate::kernels::rc_gemm_epi_f32 as *const () as usize;
    h[codegen::HELPER_GEMM_EPI_F64] = crate::kernels::rc_gemm_epi_f64 as *const () as usize;
    h[codegen::HELPER_GEMM_BF16] = crate::kernels::rc_gemm_bf16 as *const () as usize;
    h[codegen::HELPER_MAP_F32] = crate::kernels::rc_map_f32 as *const () as usize;
    h[codegen::HELPER_MAP_F64] = crate::kernels::rc_map_f64 as *const () as usize;
    h
}

/// Keeps compiled machine code alive: in memory, or a shared library from the compile cache.
enum Code {
    Memory(gccjit::CompileResult),
    Library(libloading::Library),
}

impl Code {
    fn function(&self, name: &str) -> Option<*mut ()> {
        match self {
            Code::Memory(r) => r.get_function(name).map(|p| p.as_ptr()),
            Code::Library(lib) => {
                // SAFETY: the symbol is a step function of the library, used as `StepFn` only.
                let sym = unsafe { lib.get::<*mut ()>(name.as_bytes()) }.ok()?;
                Some(*sym)
            }
        }
    }
}

/// What the builds of a routine are made from: its distinct steps ([`dedup`]), their buffer
/// slots, function names and content keys.
#[derive(Clone, Copy)]
struct BuildInput<'a> {
    prog: &'a Program,
    steps: &'a [(Vec<Stmt>, StepKind)],
    slots: &'a [Vec<NodeId>],
    names: &'a [String],
    step_keys: &'a [String],
}

/// The result of building: each build's code, the time spent, and each build's cache entry
/// (`None` where it has none).
struct BuildOutput {
    code: Vec<Code>,
    times: BuildTimes,
    entries: Vec<Option<String>>,
}

struct Compiled {
    /// Keeps the machine code alive (one per optimization level, see [`split_by_work`], plus
    /// the optimized builds swapped in by [`tier`]).
    code: Vec<Code>,
    /// Each distinct step's function name.
    names: Vec<String>,
    /// The optimized build, made in the background while the steps run a first tier.
    background: Option<tier::Tier>,
    /// The routine's own buffers (packed operands of the CPU schedule), in `table`.
    _scratch: Vec<HostBuffer>,
    /// The routine's intermediates ([`crate::low_level::memory`]), in `table`.
    _arena: HostArena,
    /// The distinct steps' functions ([`dedup`]).
    steps: Vec<(StepFn, StepKind)>,
    /// In run order: a distinct step and the buffer table of that call.
    calls: Vec<(usize, Vec<*mut u8>)>,
    /// Per call, the end of the parallel group it starts ([`group`]; `k + 1` when it runs
    /// alone).
    group_ends: Vec<usize>,
    /// Per call, a small parallel step ([`plan::small_joiners`]): a group of nothing else runs on
    /// the calling thread.
    small: Vec<bool>,
    /// Labels of the real nodes, for bounds-check reports.
    labels: FxHashMap<NodeId, String>,
    /// Which real node each call's canonical nodes stand for.
    deduped: dedup::Deduped,
    oob: Box<OobSlot>,
    /// Passed to every step: helper addresses and the report slot (points into `oob`).
    run_table: Box<RunTable>,
}

impl Compiled {
    /// Waits for the background build, if any, and swaps its functions in (a build that failed
    /// leaves the first tier in place: same values, slower).
    fn swap_in(&mut self) {
        let Some(upgrade) = self.background.take().and_then(tier::Tier::finish) else {
            return;
        };
        for (lib, ks) in upgrade.libs.into_iter().zip(upgrade.steps) {
            let code = Code::Library(lib);
            for k in ks {
                if let Some(ptr) = code.function(&self.names[k]) {
                    // SAFETY: every step function was built with exactly the `StepFn` signature.
                    self.steps[k].0 = unsafe { std::mem::transmute::<*mut (), StepFn>(ptr) };
                }
            }
            self.code.push(code);
        }
    }
}

/// The gccjit backend.
pub struct Gccjit {
    buffers: HostBuffers,
    /// `None` once released.
    routines: Vec<Option<Compiled>>,
    pool: Pool,
    opts: CompileOptions,
    cache: Option<Cache>,
    last_outcome: CacheOutcome,
    last_phases: Vec<(&'static str, f64)>,
    /// Builds made only for the compile cache ([`Backend::compile_cached`]).
    prebuilds: Vec<tier::Tier>,
}

impl std::fmt::Debug for Gccjit {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Gccjit({} routines, {:?})", self.routines.len(), self.pool)
    }
}

impl Gccjit {
    /// A backend with a pool of `opts.thread_count()` threads.
    pub fn new(opts: &CompileOptions) -> Gccjit {
        Gccjit {
            buffers: HostBuffers::default(),
            routines: Vec::new(),
            pool: Pool::new(opts.thread_count()),
            opts: opts.clone(),
            cache: Cache::open(&opts.cache),
            last_outcome: CacheOutcome::Off,
            last_phases: Vec::new(),
            prebuilds: Vec::new(),
        }
    }

    /// The scheduled program cut into steps ([`plan::plan`]).
    fn plan(&self, prog: &Program) -> Planned {
        plan::plan(prog, self.pool.threads(), &self.opts)
    }

    /// Builds the machine code of a planned program's builds (each some of its distinct steps
    /// at one optimization level, with the functions named `names`), through the compile cache
    /// when there is one: a build whose entry exists is loaded; every other build is compiled
    /// into a shared library in a private temporary folder ([`fork::Scratch`]), the builds of
    /// different bins (`bin_of`) in parallel child processes ([`fork`]), loaded from there and
    /// copied into the cache. A build with nowhere to write, or whose library failed to build or
    /// load, is compiled in memory (where a failure is an error). Returns the code of each
    /// build, the times, and each build's cache entry (`None` where it has none).
    fn build_all(
        cache: Option<Cache>,
        input: &BuildInput<'_>,
        builds: &[BuildOptions],
        bin_of: &[usize],
    ) -> Result<BuildOutput, Error> {
        let BuildInput { prog, steps, slots, names, step_keys } = *input;
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
                let (b, t) = codegen::build(prog, steps, slots, names, &builds[i], Output::Memory)?;
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

    /// What every step's machine code depends on besides the step itself: the code
    /// generator's and libgccjit's versions, the host's target flags and the options. Part of
    /// each step's content key; nothing in it names the routine (its steps are canonical,
    /// [`dedup`]), so routines and programs with steps in common share them.
    fn setup_key(&self) -> String {
        let v = gccjit::Version::get();
        // The codegen number changes whenever the code generated for the same program changes
        // (8: exp and tanh inline, f16 conversions inline; 9: -O2 vectorizes with alias checks;
        // 10: f32 -> bf16 by one biased addition; 11: bf16 products, a new run-table slot;
        // 12: maps and reductions call the map kernel, two new slots; 13: products with
        // epilogues, two new slots; 14: `pow` through a plain external declaration; 16: `f32`
        // `log`, `exp2`, `log2`, `erf` and `pow` inline, `f32` constants rounded to `f32`), so
        // older cache entries are not used.
        format!(
            "rocannl-gccjit {} codegen 16; libgccjit {}.{}.{}; march_native={} {:?} bounds_check={}",
            env!("CARGO_PKG_VERSION"),
            v.major,
            v.minor,
            v.patch,
            self.opts.march_native,
            codegen::host_arch_flags(),
            self.opts.bounds_check,
        )
    }

    /// Compiles a program; with `only_cached = Some(prebuild)`, only when every step is in the
    /// compile cache (else `None`, and with `prebuild` the missing steps are built for the cache
    /// in the background: see [`Backend::compile_cached`]).
    fn compile_inner(
        &mut self,
        prog: &Program,
        only_cached: Option<bool>,
    ) -> Result<Option<(usize, String)>, Error> {
        let started = Instant::now();
        let Planned { prog: scheduled, steps: planned_steps, small, group_ends } = self.plan(prog);
        let deduped = dedup::dedup(&scheduled, &planned_steps);
        let planned = Instant::now();
        let source = self.render_planned(&deduped);
        self.last_phases = vec![
            ("schedule", (planned - started).as_secs_f64()),
            ("render", planned.elapsed().as_secs_f64()),
        ];
        let steps = &deduped.steps;
        let slots = &deduped.slots;
        let mut counts = vec![0usize; steps.len()];
        deduped.calls.iter().for_each(|c| counts[c.step] += 1);
        let dump = self.opts.debug_dir.as_ref().map(|d| d.join(format!("{}.gccjit.c", prog.name)));
        if let Some(d) = &self.opts.debug_dir {
            let _ = std::fs::create_dir_all(d);
        }
        let level = self.opts.opt_level.min(3);
        let parts = split_by_work(steps, &counts, level);
        let mut level_of = vec![level; steps.len()];
        for (l, ks) in &parts {
            ks.iter().for_each(|k| level_of[*k] = *l);
        }
        // Each distinct step's content key (its canonical code, level and everything else its
        // machine code depends on) and the function name derived from it, the same in every
        // library that holds the step.
        let setup = self.setup_key();
        let step_keys: Vec<String> = (0..steps.len())
            .map(|k| {
                let level = format!("O{}", level_of[k]);
                let symbols = format!("{:?}", deduped.prog.runtime_symbols);
                let parts: [&[u8]; 4] = [
                    setup.as_bytes(),
                    level.as_bytes(),
                    deduped.keys[k].as_bytes(),
                    symbols.as_bytes(),
                ];
                Cache::key(&parts)
            })
            .collect();
        let names: Vec<String> = step_keys.iter().map(|k| format!("step_{}", &k[..16])).collect();
        // For people reading a profile: the listing's `step_k` behind each symbol name.
        if let Some(d) = &dump {
            let map: String = names
                .iter()
                .enumerate()
                .map(|(k, n)| format!("step_{k} {n} O{}\n", level_of[k]))
                .collect();
            let _ = std::fs::write(d.with_extension("symbols.txt"), map);
        }
        let started = Instant::now();
        // Steps compiled before, by this routine or another, come from their libraries.
        let mut code: Vec<Code> = Vec::new();
        let mut lib_of_entry: FxHashMap<String, Option<usize>> = FxHashMap::default();
        let mut found: Vec<Option<usize>> = vec![None; steps.len()];
        if let Some(cache) = self.cache.clone() {
            for k in 0..steps.len() {
                let Some(entry) = cache.lookup_step(&step_keys[k]) else { continue };
                let lib = *lib_of_entry.entry(entry.clone()).or_insert_with(|| {
                    let path = cache.lookup(&entry)?;
                    // A library this code generator built (its digest matches).
                    let lib = codegen::load_library(&path)?;
                    code.push(Code::Library(lib));
                    Some(code.len() - 1)
                });
                found[k] = lib.filter(|l| code[*l].function(&names[k]).is_some());
            }
        }
        let missing: Vec<(u8, Vec<usize>)> = parts
            .into_iter()
            .map(|(l, ks)| (l, ks.into_iter().filter(|k| found[*k].is_none()).collect()))
            .filter(|(_, ks): &(u8, Vec<usize>)| !ks.is_empty())
            .collect();
        let workers = self.opts.thread_count();
        let make_builds = |missing: Vec<(u8, Vec<usize>)>| {
            let mut builds: Vec<BuildOptions> = Vec::new();
            let mut bin_of = Vec::new();
            for (bin, parts) in balance(steps, missing, workers).into_iter().enumerate() {
                for (level, part) in parts {
                    let same = builds.iter().filter(|b| b.opt_level == level).count();
                    let ext = if same == 0 {
                        format!("O{level}.c")
                    } else {
                        format!("O{level}-{same}.c")
                    };
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
        };
        // A build for later: owns what it builds from.
        let cache_handle = self.cache.clone();
        let later = |builds: Vec<BuildOptions>, bin_of: Vec<usize>| {
            let owned = tier::Owned {
                prog: deduped.prog.clone(),
                steps: steps.clone(),
                slots: slots.clone(),
                names: names.clone(),
                step_keys: step_keys.clone(),
                builds,
                bin_of,
            };
            tier::Tier::Waiting(Some((Box::new(owned), cache_handle.clone())))
        };
        if let Some(prebuild) = only_cached
            && !missing.is_empty()
        {
            if prebuild {
                let (builds, bin_of) = make_builds(missing);
                self.prebuilds.push(later(builds, bin_of));
            }
            return Ok(None);
        }
        // Tiered ([`tier`]): the missing steps are built at `-O0` now, outside the cache, and at
        // their own levels in the background.
        let tiered = self.opts.tiered
            && !self.opts.bounds_check
            && missing.iter().any(|(l, _)| *l > tier::FIRST_TIER_LEVEL);
        let (builds, bin_of, cache, optimized) = if tiered {
            let mut all: Vec<usize> = missing.iter().flat_map(|(_, ks)| ks.clone()).collect();
            all.sort_unstable();
            let (b, bins) = make_builds(vec![(tier::FIRST_TIER_LEVEL, all)]);
            (b, bins, None, Some(make_builds(missing)))
        } else {
            let (b, bins) = make_builds(missing);
            (b, bins, self.cache.clone(), None)
        };
        // One buffer table per call, in its step's slot order.
        let arena = HostArena::new(&scheduled)?;
        let mut scratch: FxHashMap<NodeId, HostBuffer> = FxHashMap::default();
        let mut labels: FxHashMap<NodeId, String> = FxHashMap::default();
        let mut tables = Vec::with_capacity(deduped.calls.len());
        for call in &deduped.calls {
            let mut table = Vec::with_capacity(call.nodes.len());
            for n in &call.nodes {
                let ptr = match scheduled.scratch_of(*n) {
                    Some(s) if s.per_thread => std::ptr::null_mut(),
                    Some(_) => match scratch.entry(*n) {
                        std::collections::hash_map::Entry::Occupied(b) => b.get().as_ptr(),
                        std::collections::hash_map::Entry::Vacant(e) => {
                            e.insert(HostBuffer::new(&scheduled.nodes[n])?).as_ptr()
                        }
                    },
                    None => match arena.slot(*n) {
                        Some((ptr, node)) => {
                            labels.insert(*n, node.label.clone());
                            ptr
                        }
                        None => {
                            let b = self.buffers.get(*n).ok_or(Error::UnknownNode(n.0))?;
                            labels.insert(*n, b.node.label.clone());
                            b.as_ptr()
                        }
                    },
                };
                table.push(ptr);
            }
            tables.push(table);
        }
        let reused = code.len();
        let input =
            BuildInput { prog: &deduped.prog, steps, slots, names: &names, step_keys: &step_keys };
        let BuildOutput { code: built, times, entries } =
            Self::build_all(cache, &input, &builds, &bin_of)?;
        // Record where the new steps are, for the next routine.
        if let Some(cache) = &self.cache {
            for (b, entry) in builds.iter().zip(&entries) {
                for k in b.steps.iter().filter(|_| entry.is_some()) {
                    cache.store_step(&step_keys[*k], entry.as_deref().unwrap_or_default());
                }
            }
        }
        for (i, b) in builds.iter().enumerate() {
            b.steps.iter().for_each(|k| found[*k] = Some(reused + i));
        }
        let background = optimized.map(|(b, bins)| later(b, bins));
        code.extend(built);
        let cache_s = started.elapsed().as_secs_f64() - times.codegen_s - times.compile_s;
        self.last_phases.extend([
            ("cache", cache_s.max(0.0)),
            ("codegen", times.codegen_s),
            ("c compile", times.compile_s),
        ]);
        self.last_outcome = match (&self.cache, builds.is_empty()) {
            (None, _) => CacheOutcome::Off,
            // The optimized build is stored once made.
            (Some(_), false) if tiered => CacheOutcome::Miss,
            (Some(_), true) => CacheOutcome::Hit,
            (Some(_), false) if entries.iter().any(Option::is_some) => CacheOutcome::Miss,
            (Some(_), false) => CacheOutcome::Off,
        };
        let mut fns = Vec::with_capacity(steps.len());
        for (k, (_, kind)) in steps.iter().enumerate() {
            let name = &names[k];
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
        let oob: Box<OobSlot> = Box::default();
        let run_table =
            Box::new(RunTable { helpers: helpers(), slot: &*oob as *const OobSlot as *const u8 });
        let calls = deduped.calls.iter().zip(tables).map(|(c, table)| (c.step, table)).collect();
        let listing = calls_listing(&deduped, &group_ends);
        self.routines.push(Some(Compiled {
            code,
            names,
            background,
            _scratch: scratch.into_values().collect(),
            _arena: arena,
            steps: fns,
            calls,
            group_ends,
            small,
            labels,
            deduped,
            oob,
            run_table,
        }));
        Ok(Some((self.routines.len() - 1, source + &listing)))
    }

    /// The C source of a planned program: what `render` shows, and the compile cache's key.
    fn render_planned(&self, deduped: &dedup::Deduped) -> String {
        let prog = &deduped.prog;
        let steps = &deduped.steps;
        let r = CRenderer { prog, dialect: Dialect::C, bounds_check: self.opts.bounds_check };
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

/// Builds each build that has a target into its file: by bin, each in a child (GCC's driver
/// then changes only the child's environment, [`crate::env`]); a bin whose fork failed is built
/// here. Returns which builds succeeded (a failure here is not yet an error: the build is made
/// again in memory, where it becomes one).
fn build_files(
    input: &BuildInput<'_>,
    builds: &[BuildOptions],
    bin_of: &[usize],
    targets: &[Option<PathBuf>],
    times: &mut BuildTimes,
) -> Vec<bool> {
    let BuildInput { prog, steps, slots, names, .. } = *input;
    let mut ok = vec![false; builds.len()];
    let bins = group_by_bin(bin_of, |i| targets[i].is_some());
    if bins.is_empty() {
        return ok;
    }
    let build = |i: usize, locked: bool| {
        let out = Output::SharedLibrary(targets[i].as_deref().unwrap_or(Path::new("")));
        let f = if locked { codegen::build } else { codegen::build_unlocked };
        f(prog, steps, slots, names, &builds[i], out)
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
fn group_by_bin(bin_of: &[usize], keep: impl Fn(usize) -> bool) -> Vec<Vec<usize>> {
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
fn install(cache: Option<&Cache>, key: &str, path: &Path) -> Option<(libloading::Library, bool)> {
    let lib = codegen::load_library(path)?;
    let stored = cache.and_then(|c| c.store_file(key, path, EntryKind::SharedLibrary)).is_some();
    Some((lib, stored))
}

/// The rows of a parallel step's outermost loop to split across the threads: a dynamic batch's
/// rows only.
fn rows_to_run(kind: &StepKind, symbols: &[i64]) -> i64 {
    match kind {
        StepKind::Parallel { extent, limit: Some((slot, per)) } => {
            let n = symbols.get(*slot).copied().unwrap_or(*extent * per);
            (*extent).min((n + per - 1) / per).max(0)
        }
        StepKind::Parallel { extent, limit: None } => *extent,
        StepKind::Serial => 1,
    }
}

/// The order in which a routine calls its distinct steps and the nodes of each call, as a
/// comment after the source: for people, not part of the cache key. Calls that run as one job
/// of the pool ([`group`]) say so: `[job 3]` on each of them.
fn calls_listing(deduped: &dedup::Deduped, group_ends: &[usize]) -> String {
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

impl Backend for Gccjit {
    fn kind(&self) -> BackendKind {
        BackendKind::Gccjit
    }

    fn render(&self, prog: &Program) -> Result<String, Error> {
        let Planned { prog, steps, group_ends, .. } = self.plan(prog);
        let deduped = dedup::dedup(&prog, &steps);
        Ok(self.render_planned(&deduped) + &calls_listing(&deduped, &group_ends))
    }

    fn compile(&mut self, prog: &Program) -> Result<(usize, String), Error> {
        self.compile_inner(prog, None)?.ok_or_else(|| Error::Compile {
            backend: "gccjit",
            routine: prog.name.clone(),
            log: "nothing was built".into(),
        })
    }

    fn compile_cached(
        &mut self,
        prog: &Program,
        prebuild: bool,
    ) -> Result<Option<(usize, String)>, Error> {
        if self.cache.is_none() {
            return Ok(None);
        }
        self.compile_inner(prog, Some(prebuild))
    }
    fn last_cache_outcome(&self) -> CacheOutcome {
        self.last_outcome
    }

    fn last_compile_phases(&self) -> Vec<(&'static str, f64)> {
        self.last_phases.clone()
    }

    fn set_opt_level(&mut self, level: u8) {
        self.opts.opt_level = level;
    }

    fn alloc(&mut self, node: &TensorNode) -> Result<(), Error> {
        self.buffers.alloc(node)
    }

    fn has_buffer(&self, node: NodeId) -> bool {
        self.buffers.contains(node)
    }

    fn host_buffers(&self) -> Option<&HostBuffers> {
        Some(&self.buffers)
    }

    fn set_tiered(&mut self, on: bool) {
        self.opts.tiered = on;
    }

    fn runs_optimized(&self, routine: usize) -> bool {
        self.routines
            .get(routine)
            .is_some_and(|r| r.as_ref().is_some_and(|r| r.background.is_none()))
    }

    fn release(&mut self, routine: usize) -> Result<(), Error> {
        // Its code, arena and scratch go; a background build still under way is stopped.
        if let Some(r) = self.routines.get_mut(routine) {
            *r = None;
        }
        Ok(())
    }

    fn finish_builds(&mut self) {
        for r in self.routines.iter_mut().flatten() {
            r.swap_in();
        }
        for t in self.prebuilds.drain(..) {
            let _ = t.finish();
        }
    }

    fn run(&mut self, routine: usize, symbols: &[i64]) -> Result<(), Error> {
        let r = super::live_routine(&mut self.routines, routine)?;
        if r.background.as_ref().is_some_and(tier::Tier::ready) {
            r.swap_in();
        }
        let r = &*r;
        let syms = if symbols.is_empty() { [0i64].as_ptr() } else { symbols.as_ptr() };
        let err = &*r.run_table as *const RunTable as *mut u8;
        let mut next = 0;
        for (k, (step, table)) in r.calls.iter().enumerate() {
            if k < next {
                // Ran as part of its group.
                continue;
            }
            next = r.group_ends[k];
            let (f, kind) = &r.steps[*step];
            match kind {
                // SAFETY: the table points to live buffers of this backend, the symbols slice
                // outlives the call, and `err` points to this routine's report slot.
                StepKind::Serial => unsafe { f(table.as_ptr(), syms, 0, 1, err) },
                // Small steps with no big one in their group: on this thread, over all rows.
                StepKind::Parallel { .. } if r.small[k..next].iter().all(|s| *s) => {
                    for (step, table) in &r.calls[k..next] {
                        let (f, kind) = &r.steps[*step];
                        // SAFETY: as above; a parallel step may run any range of its rows.
                        unsafe { f(table.as_ptr(), syms, 0, rows_to_run(kind, symbols), err) };
                    }
                }
                StepKind::Parallel { .. } => {
                    let mut parts: [pool::Part; group::MAX_GROUP] =
                        [(*f, table.as_ptr()); group::MAX_GROUP];
                    let mut extent = 0;
                    for (j, (step, table)) in r.calls[k..next].iter().enumerate() {
                        let (f, kind) = &r.steps[*step];
                        parts[j] = (*f, table.as_ptr());
                        extent = extent.max(rows_to_run(kind, symbols));
                    }
                    // SAFETY: as above; the group's steps were checked to touch, for the rows of
                    // one chunk, no bytes another step touches for another chunk ([`group`]), and
                    // `Pool::run_group` returns only after every chunk finished.
                    unsafe { self.pool.run_group(&parts[..next - k], syms, err, extent) }
                }
            }
            if self.opts.bounds_check {
                let hit = r.oob.first.lock().unwrap_or_else(|e| e.into_inner()).take();
                if let Some((canon, axis, index, bound)) = hit {
                    // The step's code names its canonical node; this call's table says which
                    // real node that is.
                    let node = r
                        .deduped
                        .real_node(k, NodeId(canon as u32))
                        .unwrap_or(NodeId(canon as u32));
                    let label = r.labels.get(&node).cloned().unwrap_or_default();
                    return Err(Error::OutOfBounds {
                        node: node.0,
                        label,
                        axis: axis as usize,
                        index,
                        bound: bound as usize,
                    });
                }
            }
        }
        // A tiered routine's optimized build starts once its first run has ended, and so do the
        // builds for the cache only (finished ones are let go).
        if let Some(Some(r)) = self.routines.get_mut(routine)
            && let Some(t) = &mut r.background
        {
            t.start();
        }
        if !self.prebuilds.is_empty() {
            self.prebuilds.iter_mut().for_each(tier::Tier::start);
            self.prebuilds.retain(|t| !t.ready());
        }
        Ok(())
    }

    fn write(&mut self, node: NodeId, data: &NdArray) -> Result<(), Error> {
        self.buffers.write(node, data)
    }

    fn read(&self, node: NodeId) -> Result<NdArray, Error> {
        self.buffers.read(node)
    }
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

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
pub mod pool;

use std::fmt::Write as _;
use std::sync::Mutex;
use std::time::Instant;

use codegen::{BuildOptions, BuildTimes, Built, Output, RunTable, StepKind};
use pool::{Pool, StepFn};

use super::c_syntax::{CRenderer, Dialect, nodes_of, prelude, storage_ctype};
use super::host::{HostArena, HostBuffer, HostBuffers};
use super::{Backend, BackendKind, CompileOptions};
use crate::cache::{Cache, CacheOutcome};
use crate::error::Error;
use crate::low_level::{Program, Stmt, cut_points, schedule};
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
fn helpers() -> [usize; 5] {
    let mut h = [0usize; 5];
    h[codegen::HELPER_F16_TO_F32] = f16_to_f32 as *const () as usize;
    h[codegen::HELPER_F32_TO_F16] = f32_to_f16 as *const () as usize;
    h[codegen::HELPER_BF16_TO_F32] = bf16_to_f32 as *const () as usize;
    h[codegen::HELPER_F32_TO_BF16] = f32_to_bf16 as *const () as usize;
    h[codegen::HELPER_REPORT] = report_oob as *const () as usize;
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

struct Compiled {
    /// Keeps the machine code alive (one per optimization level, see [`split_by_work`]).
    _code: Vec<Code>,
    /// The routine's own buffers (packed operands of the CPU schedule), in `table`.
    _scratch: Vec<HostBuffer>,
    /// The routine's intermediates ([`crate::low_level::memory`]), in `table`.
    _arena: HostArena,
    steps: Vec<(StepFn, StepKind)>,
    table: Vec<*mut u8>,
    labels: Vec<(NodeId, String)>,
    oob: Box<OobSlot>,
    /// Passed to every step: helper addresses and the report slot (points into `oob`).
    run_table: Box<RunTable>,
}

/// The gccjit backend.
pub struct Gccjit {
    buffers: HostBuffers,
    routines: Vec<Compiled>,
    pool: Pool,
    opts: CompileOptions,
    cache: Option<Cache>,
    last_outcome: CacheOutcome,
    last_phases: Vec<(&'static str, f64)>,
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
        }
    }

    /// The scheduled program and its steps.
    fn plan(&self, prog: &Program) -> (Program, Vec<(Vec<Stmt>, StepKind)>) {
        let mut prog = prog.clone();
        schedule::schedule_cpu(&mut prog);
        let threads = self.pool.threads();
        let cuts = cut_points(&prog.body);
        let mut steps = Vec::new();
        let mut serial: Vec<Stmt> = Vec::new();
        let flush = |serial: &mut Vec<Stmt>, steps: &mut Vec<(Vec<Stmt>, StepKind)>| {
            if serial.iter().any(|s| !matches!(s, Stmt::Comment(_))) {
                steps.push((std::mem::take(serial), StepKind::Serial));
            }
            serial.clear();
        };
        for (i, s) in prog.body.iter().enumerate() {
            match s {
                // A parallel step is a function of its own: it needs a cut on both sides.
                Stmt::For { parallel: true, extent, .. }
                    if threads > 1
                        && *extent > 1
                        && cuts[i]
                        && cuts[i + 1]
                        && work(s) >= self.opts.min_parallel_work =>
                {
                    flush(&mut serial, &mut steps);
                    steps.push((vec![s.clone()], StepKind::Parallel { extent: *extent as i64 }));
                }
                s => {
                    if serial.len() >= SERIAL_STEP_LEN && cuts[i] {
                        flush(&mut serial, &mut steps);
                    }
                    serial.push(s.clone());
                }
            }
        }
        flush(&mut serial, &mut steps);
        (prog, steps)
    }

    /// Builds the machine code of some steps of a planned program, through the compile cache
    /// when there is one: a valid entry is loaded; otherwise the code is compiled into a shared
    /// library in the cache folder and loaded from there. Without a usable cache it is compiled
    /// in memory. Sets `last_outcome`.
    fn build_through_cache(
        &mut self,
        prog: &Program,
        steps: &[(Vec<Stmt>, StepKind)],
        slots: &[NodeId],
        opts: &BuildOptions,
        source: &str,
    ) -> Result<(Code, BuildTimes), Error> {
        self.last_outcome = CacheOutcome::Off;
        let in_memory = || -> Result<(Code, BuildTimes), Error> {
            let (built, t) = codegen::build(prog, steps, slots, opts, Output::Memory)?;
            match built {
                Built::Memory(r) => Ok((Code::Memory(r), t)),
                Built::File => unreachable!("an in-memory build"),
            }
        };
        let Some(cache) = self.cache.clone() else { return in_memory() };
        let key = self.cache_key(prog, source, slots, opts);
        if let Some(path) = cache.lookup(&key) {
            // SAFETY: the library is a routine this code generator built (its digest matches);
            // loading it runs no initializers of ours.
            if let Ok(lib) = unsafe { libloading::Library::new(&path) } {
                self.last_outcome = CacheOutcome::Hit;
                return Ok((Code::Library(lib), BuildTimes::default()));
            }
        }
        if let Some(temp) = cache.temp_path(&key) {
            let (_, t) = codegen::build(prog, steps, slots, opts, Output::SharedLibrary(&temp))?;
            let loaded = cache.store(&key, &temp).and_then(|path| {
                // SAFETY: as above: a library just built by this code generator.
                unsafe { libloading::Library::new(path) }.ok()
            });
            if let Some(lib) = loaded {
                self.last_outcome = CacheOutcome::Miss;
                return Ok((Code::Library(lib), t));
            }
        }
        in_memory()
    }

    /// Everything the machine code of a planned program depends on: the generated source
    /// (every statement, buffer slot, size, precision, step and its kind), the low-level
    /// program, the options, the code generator's and libgccjit's versions and the host's
    /// target flags.
    fn cache_key(
        &self,
        prog: &Program,
        source: &str,
        slots: &[NodeId],
        opts: &BuildOptions,
    ) -> String {
        let ir = prog.to_string();
        let nodes: String = slots
            .iter()
            .map(|n| {
                let node = &prog.nodes[n];
                format!("{n}:{:?}:{}:{:?};", node.dims, node.prec, prog.scratch_of(*n).is_some())
            })
            .collect();
        let v = gccjit::Version::get();
        let setup = format!(
            "rocannl-gccjit {} codegen 3; libgccjit {}.{}.{}; O{} march_native={} {:?} bounds_check={} steps={:?}",
            env!("CARGO_PKG_VERSION"),
            v.major,
            v.minor,
            v.patch,
            opts.opt_level,
            opts.march_native,
            codegen::host_arch_flags(),
            opts.bounds_check,
            opts.steps,
        );
        Cache::key(&[setup.as_bytes(), source.as_bytes(), ir.as_bytes(), nodes.as_bytes()])
    }

    /// The C source of a planned program: what `render` shows, and the compile cache's key.
    fn render_planned(&self, prog: &Program, steps: &[(Vec<Stmt>, StepKind)]) -> String {
        let r = CRenderer { prog, dialect: Dialect::C, bounds_check: self.opts.bounds_check };
        let mut out = prelude(Dialect::C);
        if self.opts.bounds_check {
            out.push_str("extern void rc_report(void *err, long long node, long long axis, long long index, long long bound);\n");
        }
        let slots: Vec<NodeId> = prog.materialized_nodes();
        for (k, (body, kind)) in steps.iter().enumerate() {
            let _ = writeln!(
                out,
                "\n/* {} */\nvoid step_{k}(void **bufs, long long *syms, long long lo, long long hi, void *err) {{",
                match kind {
                    StepKind::Serial => "serial".to_string(),
                    StepKind::Parallel { extent } => format!("parallel over 0..{extent}"),
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
/// [`COLD_OPT_LEVEL`]. GCC's time at `-O3` is mostly spent on the many small nests (pointwise
/// maps, reductions of small tensors, copies) that run for a small part of a step. Returns
/// `(level, step indices)` pairs; one pair when there is nothing to split.
pub fn split_by_work(steps: &[(Vec<Stmt>, StepKind)], level: u8) -> Vec<(u8, Vec<usize>)> {
    let all: Vec<usize> = (0..steps.len()).collect();
    if level <= COLD_OPT_LEVEL || steps.len() < 2 {
        return vec![(level, all)];
    }
    let works: Vec<f64> =
        steps.iter().map(|(b, _)| b.iter().map(|s| work(s) as f64).sum()).collect();
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

/// Top-level statements per serial step: GCC's optimization time grows faster than linearly
/// with function size, so long runs of small nests are cut into several functions.
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
            Stmt::Comment(_) => 0,
        }
    }
    go(s, 1)
}

impl Backend for Gccjit {
    fn kind(&self) -> BackendKind {
        BackendKind::Gccjit
    }

    fn render(&self, prog: &Program) -> Result<String, Error> {
        let (prog, steps) = self.plan(prog);
        Ok(self.render_planned(&prog, &steps))
    }

    fn compile(&mut self, prog: &Program) -> Result<(usize, String), Error> {
        let started = Instant::now();
        let (scheduled, steps) = self.plan(prog);
        let planned = Instant::now();
        let source = self.render_planned(&scheduled, &steps);
        self.last_phases = vec![
            ("schedule", (planned - started).as_secs_f64()),
            ("render", planned.elapsed().as_secs_f64()),
        ];
        let slots: Vec<NodeId> = scheduled.materialized_nodes();
        let mut table = Vec::with_capacity(slots.len());
        let mut labels = Vec::with_capacity(slots.len());
        let mut scratch = Vec::new();
        let arena = HostArena::new(&scheduled)?;
        for n in &slots {
            match scheduled.scratch_of(*n) {
                Some(s) if s.per_thread => table.push(std::ptr::null_mut()),
                Some(_) => {
                    let b = HostBuffer::new(&scheduled.nodes[n])?;
                    table.push(b.as_ptr());
                    scratch.push(b);
                }
                None => match arena.slot(*n) {
                    Some((ptr, node)) => {
                        table.push(ptr);
                        labels.push((*n, node.label.clone()));
                    }
                    None => {
                        let b = self.buffers.get(*n).ok_or(Error::UnknownNode(n.0))?;
                        table.push(b.as_ptr());
                        labels.push((*n, b.node.label.clone()));
                    }
                },
            }
        }
        let dump = self.opts.debug_dir.as_ref().map(|d| d.join(format!("{}.gccjit.c", prog.name)));
        if let Some(d) = &self.opts.debug_dir {
            let _ = std::fs::create_dir_all(d);
        }
        let level = self.opts.opt_level.min(3);
        let mut parts = split_by_work(&steps, level);
        let mut code = Vec::with_capacity(parts.len());
        let mut owner = vec![0; steps.len()];
        let mut times = BuildTimes::default();
        let mut outcomes = Vec::new();
        let started = Instant::now();
        for (i, (level, part)) in parts.iter_mut().enumerate() {
            part.iter().for_each(|k| owner[*k] = i);
            let opts = BuildOptions {
                opt_level: *level,
                march_native: self.opts.march_native,
                bounds_check: self.opts.bounds_check,
                dump: dump.as_ref().map(|d| d.with_extension(format!("O{level}.c"))),
                steps: std::mem::take(part),
            };
            let (c, t) = self.build_through_cache(&scheduled, &steps, &slots, &opts, &source)?;
            times.codegen_s += t.codegen_s;
            times.compile_s += t.compile_s;
            outcomes.push(self.last_outcome);
            code.push(c);
        }
        let cache_s = started.elapsed().as_secs_f64() - times.codegen_s - times.compile_s;
        self.last_phases.extend([
            ("cache", cache_s.max(0.0)),
            ("codegen", times.codegen_s),
            ("c compile", times.compile_s),
        ]);
        self.last_outcome = if outcomes.contains(&CacheOutcome::Miss) {
            CacheOutcome::Miss
        } else if !outcomes.is_empty() && outcomes.iter().all(|o| *o == CacheOutcome::Hit) {
            CacheOutcome::Hit
        } else {
            CacheOutcome::Off
        };
        let mut fns = Vec::with_capacity(steps.len());
        for (k, (_, kind)) in steps.iter().enumerate() {
            let name = format!("step_{k}");
            let Some(ptr) = code[owner[k]].function(&name) else {
                return Err(Error::Compile {
                    backend: "gccjit",
                    routine: prog.name.clone(),
                    log: format!("compiled code has no function {name}"),
                });
            };
            // SAFETY: `step_k` was built with exactly the `StepFn` signature.
            let f: StepFn = unsafe { std::mem::transmute::<*mut (), StepFn>(ptr) };
            fns.push((f, kind.clone()));
        }
        let oob: Box<OobSlot> = Box::default();
        let run_table =
            Box::new(RunTable { helpers: helpers(), slot: &*oob as *const OobSlot as *const u8 });
        self.routines.push(Compiled {
            _code: code,
            _scratch: scratch,
            _arena: arena,
            steps: fns,
            table,
            labels,
            oob,
            run_table,
        });
        Ok((self.routines.len() - 1, source))
    }

    fn last_cache_outcome(&self) -> CacheOutcome {
        self.last_outcome
    }

    fn last_compile_phases(&self) -> Vec<(&'static str, f64)> {
        self.last_phases.clone()
    }

    fn alloc(&mut self, node: &TensorNode) -> Result<(), Error> {
        self.buffers.alloc(node)
    }

    fn has_buffer(&self, node: NodeId) -> bool {
        self.buffers.contains(node)
    }

    fn run(&mut self, routine: usize, symbols: &[i64]) -> Result<(), Error> {
        let Some(r) = self.routines.get(routine) else {
            return Err(Error::ForeignRoutine(format!("#{routine}")));
        };
        let syms = if symbols.is_empty() { [0i64].as_ptr() } else { symbols.as_ptr() };
        let err = &*r.run_table as *const RunTable as *mut u8;
        for (f, kind) in &r.steps {
            match kind {
                // SAFETY: the table points to live buffers of this backend, the symbols slice
                // outlives the call, and `err` points to this routine's report slot.
                StepKind::Serial => unsafe { f(r.table.as_ptr(), syms, 0, 1, err) },
                // SAFETY: as above; `Pool::run` returns only after every chunk finished.
                StepKind::Parallel { extent } => unsafe {
                    self.pool.run(*f, r.table.as_ptr(), syms, err, *extent)
                },
            }
            if self.opts.bounds_check {
                let hit = r.oob.first.lock().unwrap_or_else(|e| e.into_inner()).take();
                if let Some((node, axis, index, bound)) = hit {
                    let label = r
                        .labels
                        .iter()
                        .find(|(n, _)| n.0 as i64 == node)
                        .map_or_else(String::new, |(_, l)| l.clone());
                    return Err(Error::OutOfBounds {
                        node: node as u32,
                        label,
                        axis: axis as usize,
                        index,
                        bound: bound as usize,
                    });
                }
            }
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
            vec![Stmt::For { var: Var(0), extent, parallel: false, body: vec![set] }],
            StepKind::Serial,
        )
    }

    #[test]
    fn the_steps_doing_most_of_the_work_keep_the_requested_level() {
        // 1000 + 30 + 10 + 5 + 1 cells: 1000 alone is 96.1% of the work.
        let steps: Vec<_> = [10, 1000, 1, 30, 5].into_iter().map(nest).collect();
        assert_eq!(
            split_by_work(&steps, 3),
            vec![(3, vec![1]), (COLD_OPT_LEVEL, vec![0, 2, 3, 4])]
        );
        // Nothing to split at the cold level or below, nor with one step.
        assert_eq!(split_by_work(&steps, 2), vec![(2, vec![0, 1, 2, 3, 4])]);
        assert_eq!(split_by_work(&steps[1..2], 3), vec![(3, vec![0])]);
        // Equal steps: each is needed for 95%.
        let even: Vec<_> = [10, 10, 10].into_iter().map(nest).collect();
        assert_eq!(split_by_work(&even, 3), vec![(3, vec![0, 1, 2])]);
    }
}

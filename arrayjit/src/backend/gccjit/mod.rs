//! The native backend: libgccjit IR built directly from the low-level IR.
//!
//! Compiling a routine: the CPU schedule ([`crate::low_level::schedule`]) reorders and tiles
//! contractions; the top-level statements are grouped into *steps* — every parallel loop nest
//! with enough work becomes its own step, split across the context's persistent thread pool;
//! everything else runs in order on the calling thread — and one libgccjit context holding all
//! steps is compiled once (`-O3 -march=native` by default). Running a routine calls the steps'
//! function pointers in order with a buffer table built at compile time: no allocation, no
//! thread spawning, no lookups per run.

mod build;
mod calls;
pub mod codegen;
mod compile;
mod convert;
pub mod dedup;
mod driver;
mod emit;
mod expr;
pub mod fork;
pub mod group;
mod inline_math;
pub mod plan;
pub mod pool;
pub mod step;
pub mod tier;

use rustc_hash::FxHashMap;
use std::sync::Mutex;

pub use build::{COLD_OPT_LEVEL, HOT_WORK_SHARE, balance, split_by_work};
use codegen::RunTable;
use plan::Planned;
use pool::{Pool, StepFn};
use step::StepKind;

use super::host::{HostArena, HostBuffer, HostBuffers};
use super::{Backend, BackendKind, BuildRequest, CompileOptions, Compiled};
use crate::cache::Cache;
use crate::error::Error;
use crate::low_level::Program;
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
    h[codegen::HELPER_ATTENTION_F32] =
        crate::kernels::attention::rc_attention_f32 as *const () as usize;
    h[codegen::HELPER_GATHER_F32] = crate::kernels::gather::rc_gather_f32 as *const () as usize;
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

struct Loaded {
    /// Keeps the machine code alive (one per optimization level, see [`split_by_work`], plus
    /// the optimized builds swapped in by [`tier`]).
    code: Vec<Code>,
    /// Each distinct step's function name.
    names: Vec<String>,
    /// The optimized build, made in the background while the steps run a first tier.
    background: Option<tier::Tier>,
    /// The routine's own buffers (packed operands of the CPU schedule), in `table`.
    _scratch: Vec<HostBuffer>,
    /// Each call's seeds, in `table` after its nodes ([`dedup`]).
    _seeds: Vec<Box<[u64]>>,
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

impl Loaded {
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
    routines: Vec<Option<Loaded>>,
    pool: Pool,
    opts: CompileOptions,
    cache: Option<Cache>,
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
            prebuilds: Vec::new(),
        }
    }

    /// The scheduled program cut into steps ([`plan::plan`]).
    fn plan(&self, prog: &Program) -> Planned {
        plan::plan(prog, self.pool.threads(), &self.opts)
    }
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

impl Backend for Gccjit {
    fn kind(&self) -> BackendKind {
        BackendKind::Gccjit
    }

    fn render(&self, prog: &Program) -> Result<String, Error> {
        let Planned { prog, steps, group_ends, .. } = self.plan(prog);
        let deduped = dedup::dedup(&prog, &steps);
        Ok(self.render_planned(&deduped) + &compile::calls_listing(&deduped, &group_ends))
    }

    fn compile(&mut self, prog: &Program, req: &BuildRequest) -> Result<Compiled, Error> {
        self.compile_routine(prog, req, None)?.ok_or_else(|| Error::Compile {
            backend: "gccjit",
            routine: prog.name.clone(),
            log: "nothing was built".into(),
        })
    }

    fn compile_cached(
        &mut self,
        prog: &Program,
        req: &BuildRequest,
        prebuild: bool,
    ) -> Result<Option<Compiled>, Error> {
        if self.cache.is_none() {
            return Ok(None);
        }
        self.compile_routine(prog, req, Some(prebuild))
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

    fn runs_optimized(&self, routine: usize) -> bool {
        self.routines
            .get(routine)
            .is_some_and(|r| r.as_ref().is_some_and(|r| r.background.is_none()))
    }

    fn builds_pending(&self) -> bool {
        self.routines.iter().flatten().any(|r| r.background.is_some())
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

//! Contexts: one backend, its buffers, and the routines compiled for it.
//!
//! A [`Context`] is what the tensor layer talks to. `compile` runs the whole pipeline
//! ([`crate::compile_program`], then the backend) for one assignment sequence and allocates a
//! zeroed buffer for every persistent node the routine touches that has none yet, so an
//! initialization routine and a training-step routine compiled on one context share their
//! parameters. The routine's intermediates live in its own arena instead, sized by the memory
//! plan ([`crate::low_level::memory`]): they cannot be read after it has run.
//! `run` binds runtime symbols, checks that they keep every index in range, and executes.

use crate::cache::CacheOutcome;
use crate::low_level::Program;
use crate::low_level::estimate::{Estimate, WorkLimit, estimate};
use std::path::Path;
use std::sync::Arc;

use rustc_hash::FxHashMap;

use crate::assignments::Asgn;
use crate::backend::interp::Interp;
use crate::backend::{Backend, BackendKind, BuildReport, BuildRequest, CompileOptions, Compiled};
use crate::error::Error;
use crate::indexing::Symbol;
use crate::low_level::RuntimeCheck;
use crate::ndarray::NdArray;
use crate::tnode::{NodeId, NodeTable, TensorNode};

/// The optimization level of [`Context::compile_once`] when it builds native code.
pub const RUN_ONCE_OPT_LEVEL: u8 = 1;

/// The most work (scalar operations of one run, [`crate::low_level::estimate`]) of a routine
/// that [`Context::compile_once`] runs on the interpreter rather than building native code: about
/// 40 ms of the interpreter at ~40 ns per operation, less than GCC's fixed cost of one build
/// (assembler and linker included) on the machines of docs/benchmarks.md.
pub const RUN_ONCE_INTERP_WORK: u64 = 1 << 20;

/// A compiled routine: a handle into the context that compiled it, plus what it was built from.
#[derive(Clone, Debug)]
pub struct Routine {
    name: String,
    index: usize,
    owner: Arc<()>,
    low_level: String,
    source: String,
    virtual_nodes: Vec<NodeId>,
    runtime_symbols: Vec<Symbol>,
    runtime_checks: Vec<RuntimeCheck>,
    report: CompileReport,
    /// Run by the context's interpreter on the backend's host buffers, not by the backend.
    interpreted: bool,
}

/// How a routine was compiled: where the time went and what the compile cache did.
#[derive(Clone, Debug, PartialEq)]
pub struct CompileReport {
    /// Seconds per phase, in order: `lowering`, `optimization`, then the backend's own
    /// (gccjit: `schedule`, `render`, `cache`, `codegen`, `c compile`).
    pub phases: Vec<(&'static str, f64)>,
    /// What the compile cache did.
    pub cache: CacheOutcome,
    /// Floating-point operations of one run ([`crate::low_level::flops`]).
    pub flops: u64,
}

impl Routine {
    /// How the routine was compiled.
    pub fn report(&self) -> &CompileReport {
        &self.report
    }

    /// The routine's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The routine's number in its context: distinct routines of one context have distinct
    /// numbers.
    pub fn index(&self) -> usize {
        self.index
    }

    /// The optimized low-level IR, in its stable text form.
    pub fn low_level_text(&self) -> &str {
        &self.low_level
    }

    /// The generated source (C for gccjit, CUDA C for cuda, the IR for interp).
    pub fn source_text(&self) -> &str {
        &self.source
    }

    /// The nodes that the optimizer inlined or removed: they have no buffer for this routine.
    pub fn virtual_nodes(&self) -> &[NodeId] {
        &self.virtual_nodes
    }

    /// The runtime symbols `run` must bind.
    pub fn runtime_symbols(&self) -> &[Symbol] {
        &self.runtime_symbols
    }
}

/// A backend with its buffers.
///
/// ```
/// use std::sync::Arc;
/// use rocannl_arrayjit::assignments::{Asgn, FetchOp, ScalarExpr};
/// use rocannl_arrayjit::indexing::{Projections, SymbolGen};
/// use rocannl_arrayjit::ops::{BinOp, Prec};
/// use rocannl_arrayjit::tnode::{MemoryMode, NodeTable};
/// use rocannl_arrayjit::{BackendKind, CompileOptions, Context, NdArray};
///
/// let mut nodes = NodeTable::default();
/// let x = nodes.add("x", &[3], Prec::F32, MemoryMode::HostVisible);
/// let y = nodes.add("y", &[3], Prec::F32, MemoryMode::HostVisible);
/// let step = Asgn::Accum {
///     lhs: y,
///     accum: Some(BinOp::Add),
///     rhs: vec![x],
///     expr: ScalarExpr::bin(BinOp::Mul, ScalarExpr::Arg(0), ScalarExpr::Const(2.0)),
///     projections: Arc::new(Projections::identity(&[3], 1, &mut SymbolGen::default())),
///     initialize_neutral: false,
/// };
/// let mut ctx = Context::new(BackendKind::Interp, CompileOptions::default()).unwrap();
/// let r = ctx.compile("step", &step, &nodes).unwrap();
/// ctx.write(x, &NdArray::from_f64(Prec::F32, &[3], &[1.0, 2.0, 3.0]).unwrap()).unwrap();
/// ctx.run(&r, &[]).unwrap();
/// ctx.run(&r, &[]).unwrap();
/// assert_eq!(ctx.read(y).unwrap().to_f64_vec(), vec![4.0, 8.0, 12.0]);
/// ```
pub struct Context {
    backend: Box<dyn Backend>,
    opts: CompileOptions,
    owner: Arc<()>,
    nodes: FxHashMap<NodeId, TensorNode>,
    symbol_scratch: Vec<i64>,
    /// Runs the small run-once routines of a native backend ([`Context::compile_once`]).
    interp: Interp,
}

impl std::fmt::Debug for Context {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Context").field("backend", &self.backend.kind()).finish()
    }
}

impl Context {
    /// A context for a backend. CUDA without a driver or a device gives [`Error::NoDevice`].
    pub fn new(kind: BackendKind, opts: CompileOptions) -> Result<Context, Error> {
        let backend: Box<dyn Backend> = match kind {
            BackendKind::Interp => Box::new(Interp::new(&opts)),
            #[cfg(feature = "gccjit")]
            BackendKind::Gccjit => Box::new(crate::backend::gccjit::Gccjit::new(&opts)),
            #[cfg(not(feature = "gccjit"))]
            BackendKind::Gccjit => return Err(Error::NotBuiltIn("gccjit")),
            #[cfg(feature = "cuda")]
            BackendKind::Cuda => Box::new(crate::backend::cuda::Cuda::new(&opts)?),
            #[cfg(not(feature = "cuda"))]
            BackendKind::Cuda => return Err(Error::NotBuiltIn("cuda")),
            BackendKind::CudaSim => Box::new(crate::backend::cuda_sim::CudaSim::new()),
        };
        let interp = Interp::new(&opts);
        Ok(Context {
            backend,
            opts,
            owner: Arc::new(()),
            nodes: FxHashMap::default(),
            symbol_scratch: Vec::new(),
            interp,
        })
    }

    /// The backend's kind.
    pub fn kind(&self) -> BackendKind {
        self.backend.kind()
    }

    /// The options routines are compiled with.
    pub fn options(&self) -> &CompileOptions {
        &self.opts
    }

    /// Lowers, optimizes and compiles one routine for the whole assignment sequence, and
    /// allocates zeroed buffers for the nodes it touches that have none yet.
    pub fn compile(
        &mut self,
        name: &str,
        asgn: &Asgn,
        nodes: &NodeTable,
    ) -> Result<Routine, Error> {
        self.compile_with(name, asgn, nodes, false)
    }

    /// Refuses a routine whose estimate exceeds the limits ([`CompileOptions::limits`]).
    fn check_limits(&self, name: &str, need: Estimate) -> Result<(), Error> {
        let limits = self.opts.limits;
        let kind = self.backend.kind();
        let work = limits.max_work.resolve(kind.default_max_work());
        let default_for = (limits.max_work == WorkLimit::Default).then_some(kind);
        for (resource, value, limit, default_for) in [
            ("memory", need.memory_bytes, limits.max_memory, None),
            ("work", need.work, work, default_for),
        ] {
            if let Some(limit) = limit.filter(|l| value > *l) {
                return Err(Error::LimitExceeded {
                    routine: name.to_string(),
                    resource,
                    estimate: value,
                    limit,
                    default_for,
                });
            }
        }
        Ok(())
    }

    /// The pipeline of one routine, a phase per line: the front end (lowering and
    /// optimization, [`crate::front_end`]), the memory plan, the estimate checked against the
    /// limits before anything is allocated, the buffers that outlive the routine, the backend's
    /// build (or the interpreter for a small routine run once), the debug dumps, the report.
    fn compile_with(
        &mut self,
        name: &str,
        asgn: &Asgn,
        nodes: &NodeTable,
        once: bool,
    ) -> Result<Routine, Error> {
        let (mut prog, front_phases) = crate::front_end(name, asgn, nodes, &self.opts)?;
        // Only native code calls the attention and lookup kernels; every other backend (and a
        // routine run once, which may be interpreted, or one whose accesses are all checked)
        // computes them as ordinary nests.
        let native = self.backend.kind() == BackendKind::Gccjit
            && self.opts.kernel_calls
            && !self.opts.bounds_check
            && !once;
        let expanded =
            crate::low_level::expand_calls(&mut prog, |p, c| native && kernel_takes(p, c));
        if cfg!(debug_assertions) && expanded {
            crate::low_level::verify::verify(&prog, "kernel call expansion")?;
        }
        // Intermediates without a buffer share one arena of the routine's own.
        crate::low_level::memory::plan_arena(&mut prog, |n| self.backend.has_buffer(n));
        let need = estimate(&prog, |n| self.backend.has_buffer(n));
        self.check_limits(name, need)?;
        self.allocate(&prog, asgn, nodes)?;
        let low_level = prog.to_string();
        let interpret = once && need.work <= RUN_ONCE_INTERP_WORK;
        let (compiled, interpreted) = self.build(&prog, once, interpret, &low_level);
        self.dump(name, asgn, &prog, &low_level, &compiled, interpreted)?;
        let compiled = compiled?;
        let mut phases = front_phases.to_vec();
        phases.extend(compiled.report.phases);
        let flops = crate::low_level::flops(&prog);
        let report = CompileReport { phases, cache: compiled.report.cache, flops };
        for n in &prog.virtual_nodes {
            if let Some(node) = prog.nodes.get(n) {
                self.nodes.entry(*n).or_insert_with(|| node.clone());
            }
        }
        Ok(Routine {
            name: name.to_string(),
            index: compiled.routine,
            owner: self.owner.clone(),
            low_level,
            source: compiled.listing,
            virtual_nodes: prog.virtual_nodes,
            runtime_symbols: prog.runtime_symbols,
            runtime_checks: prog.runtime_checks,
            report,
            interpreted,
        })
    }

    /// Zeroed buffers for the nodes a routine materializes outside its arena, and for the
    /// nodes with no elements (no code touches them; they still get their empty buffer, so
    /// that they can be read and written like any other).
    fn allocate(&mut self, prog: &Program, asgn: &Asgn, nodes: &NodeTable) -> Result<(), Error> {
        for id in prog.materialized_nodes() {
            let node = &prog.nodes[&id];
            if prog.arena.offset_of(id).is_none() {
                self.backend.alloc(node)?;
            }
            self.nodes.insert(id, node.clone());
        }
        for id in asgn.nodes() {
            let node = nodes.get(id)?;
            if node.num_elements() == 0 && !self.backend.has_buffer(id) {
                self.backend.alloc(node)?;
                self.nodes.insert(id, node.clone());
            }
        }
        Ok(())
    }

    /// What a routine is built at: a routine run once at a lower level and without tiers
    /// (GCC's `-O3` time would exceed any run time it saves), the others as the options say.
    fn request(&self, once: bool) -> BuildRequest {
        let req = BuildRequest::from_options(&self.opts);
        if once {
            BuildRequest { opt_level: req.opt_level.min(RUN_ONCE_OPT_LEVEL), tiered: false }
        } else {
            req
        }
    }

    /// The backend's build of a routine, or the interpreter's: a small routine run once
    /// (`interpret`) costs less on the interpreter than GCC's fixed cost, and computes the same
    /// bits — unless its native code is in the compile cache, which is faster still (if it is
    /// not, it is built for the cache in the background, for the next process). Only with
    /// tiers: a context without them builds everything natively and caches it. Returns the
    /// build and whether it is the interpreter's.
    fn build(
        &mut self,
        prog: &Program,
        once: bool,
        interpret: bool,
        low_level: &str,
    ) -> (Result<Compiled, Error>, bool) {
        let req = self.request(once);
        let interpret = interpret
            && self.opts.tiered
            && self.backend.kind() != BackendKind::Interp
            && self.backend.host_buffers().is_some();
        if interpret {
            match self.backend.compile_cached(prog, &req, true) {
                Ok(Some(c)) => return (Ok(c), false),
                Err(e) => return (Err(e), false),
                Ok(None) => {}
            }
            if let Some(buffers) = self.backend.host_buffers() {
                let built = self.interp.compile_on(prog, buffers).map(|routine| Compiled {
                    routine,
                    listing: low_level.to_string(),
                    report: BuildReport::default(),
                });
                return (built, true);
            }
        }
        (self.backend.compile(prog, &req), false)
    }

    /// With [`CompileOptions::debug_dir`], the routine's assignments, low-level IR and
    /// generated source (of a build that failed too: that is when it is needed most).
    fn dump(
        &self,
        name: &str,
        asgn: &Asgn,
        prog: &Program,
        low_level: &str,
        compiled: &Result<Compiled, Error>,
        interpreted: bool,
    ) -> Result<(), Error> {
        let Some(dir) = &self.opts.debug_dir else { return Ok(()) };
        let ext = match self.backend.kind() {
            _ if interpreted => "interp.txt",
            BackendKind::Interp => "interp.txt",
            BackendKind::Gccjit => "c",
            BackendKind::Cuda => "cu",
            BackendKind::CudaSim => "kernels.txt",
        };
        let source = match compiled {
            Ok(c) => c.listing.clone(),
            Err(_) => self.backend.render(prog)?,
        };
        write_debug(dir, &format!("{name}.asgn.txt"), &asgn.to_string())?;
        write_debug(dir, &format!("{name}.ll.txt"), low_level)?;
        // The simulator runs the kernels the cuda backend prints: their CUDA C too, so that it
        // can be read (and compiled with NVRTC) on a machine without a GPU.
        #[cfg(feature = "cuda")]
        if self.backend.kind() == BackendKind::CudaSim && !interpreted {
            write_debug(
                dir,
                &format!("{name}.cu"),
                &crate::backend::cuda::render::render(prog).source,
            )?;
        }
        write_debug(dir, &format!("{name}.{ext}"), &source)
    }

    /// Compiles a routine that will run once (parameter initialization), for the least time
    /// compiling plus running: on a native backend with tiers ([`CompileOptions::tiered`]), a
    /// routine of at most [`RUN_ONCE_INTERP_WORK`] operations whose native code is not in the
    /// compile cache runs on the interpreter, on the backend's buffers (the same bits, and no
    /// GCC at all), and is built for the cache in the background; otherwise it is built at
    /// `-O1` (GCC's `-O3` time would exceed any run time it saves), without tiers. Otherwise as
    /// [`Context::compile`].
    pub fn compile_once(
        &mut self,
        name: &str,
        asgn: &Asgn,
        nodes: &NodeTable,
    ) -> Result<Routine, Error> {
        self.compile_with(name, asgn, nodes, true)
    }

    /// Waits until every routine runs its optimized build: with tiered builds
    /// ([`CompileOptions::tiered`]) a routine first runs a quick build while the optimized one
    /// is made in the background. Values are the same before and after; only speed changes.
    /// Benchmarks call this before timing steady state.
    pub fn finish_builds(&mut self) {
        self.backend.finish_builds();
    }

    /// Whether some routine still runs its quick first build, its optimized build under way or
    /// ready to be swapped in by its next run ([`CompileOptions::tiered`]). Does not wait: a
    /// program can report when the optimized code starts serving without blocking for it.
    pub fn builds_pending(&self) -> bool {
        self.backend.builds_pending()
    }

    /// Whether a routine runs its final code: false while a tiered routine still runs its quick
    /// first build (until a run after its optimized build is ready, or
    /// [`Context::finish_builds`]).
    pub fn runs_optimized(&self, routine: &Routine) -> bool {
        routine.interpreted || self.backend.runs_optimized(routine.index)
    }

    /// Runs a routine with values for its runtime symbols.
    pub fn run(&mut self, routine: &Routine, bindings: &[(Symbol, i64)]) -> Result<(), Error> {
        if !Arc::ptr_eq(&routine.owner, &self.owner) {
            return Err(Error::ForeignRoutine(routine.name.clone()));
        }
        self.symbol_scratch.clear();
        for s in &routine.runtime_symbols {
            let v = bindings.iter().find(|(b, _)| b == s).ok_or(Error::MissingBinding(*s))?.1;
            self.symbol_scratch.push(v);
        }
        for c in &routine.runtime_checks {
            let mut shift = 0;
            for (coeff, s) in &c.sym_terms {
                let slot = routine.runtime_symbols.iter().position(|x| x == s).unwrap_or(0);
                shift += coeff * self.symbol_scratch.get(slot).copied().unwrap_or(0);
            }
            if c.lo + shift < 0 || c.hi + shift >= c.bound as i64 {
                let (_, symbol) = c.sym_terms[0];
                let slot = routine.runtime_symbols.iter().position(|x| *x == symbol).unwrap_or(0);
                let label = self.nodes.get(&c.node).map_or_else(String::new, |n| n.label.clone());
                return Err(Error::SymbolOutOfRange {
                    symbol,
                    value: self.symbol_scratch.get(slot).copied().unwrap_or(0),
                    node: c.node.0,
                    label,
                    axis: c.axis,
                    bound: c.bound,
                });
            }
        }
        let ran = if routine.interpreted {
            let Some(buffers) = self.backend.host_buffers() else {
                return Err(Error::ForeignRoutine(routine.name.clone()));
            };
            self.interp.run_on(routine.index, &self.symbol_scratch, buffers)
        } else {
            self.backend.run(routine.index, &self.symbol_scratch)
        };
        ran.map_err(|e| match e {
            Error::ReleasedRoutine(_) => Error::ReleasedRoutine(routine.name.clone()),
            e => e,
        })
    }

    /// Releases a compiled routine: its intermediates' memory (on a GPU, back to the device's
    /// caching pool for the next routine to reuse) and its code. The handle and its clones
    /// cannot run afterwards ([`Error::ReleasedRoutine`]); the tensors it wrote keep their
    /// values. For a process that compiles many graphs over its life (an evaluation graph per
    /// checkpoint, a generation graph per length) and keeps only the latest.
    ///
    /// ```
    /// # use rocannl_arrayjit::{BackendKind, CompileOptions, Context, Error};
    /// # use rocannl_arrayjit::assignments::Asgn;
    /// # use rocannl_arrayjit::tnode::NodeTable;
    /// let mut ctx = Context::new(BackendKind::Interp, CompileOptions::default())?;
    /// let r = ctx.compile("nothing", &Asgn::Noop, &NodeTable::default())?;
    /// ctx.run(&r, &[])?;
    /// ctx.release(&r)?;
    /// assert!(matches!(ctx.run(&r, &[]), Err(Error::ReleasedRoutine(_))));
    /// # Ok::<(), Error>(())
    /// ```
    pub fn release(&mut self, routine: &Routine) -> Result<(), Error> {
        if !Arc::ptr_eq(&routine.owner, &self.owner) {
            return Err(Error::ForeignRoutine(routine.name.clone()));
        }
        if routine.interpreted {
            self.interp.release_on(routine.index);
            return Ok(());
        }
        self.backend.release(routine.index)
    }

    /// The device memory pool's figures: allocations from the device, reuses, bytes in use and
    /// cached (the CUDA backend and its simulator; `None` on the CPU backends).
    pub fn device_pool_stats(&self) -> Option<crate::backend::device_pool::PoolStats> {
        self.backend.pool_stats()
    }

    /// Allocates a zeroed buffer for a node unless it has one (e.g. to write parameters before
    /// any routine using them is compiled).
    pub fn ensure_buffer(&mut self, node: &TensorNode) -> Result<(), Error> {
        self.backend.alloc(node)?;
        self.nodes.insert(node.id, node.clone());
        Ok(())
    }

    /// Whether a node has a buffer in this context.
    pub fn has_buffer(&self, node: NodeId) -> bool {
        self.backend.has_buffer(node)
    }

    /// Copies host data into a node's buffer, converting the precision.
    pub fn write(&mut self, node: NodeId, data: &NdArray) -> Result<(), Error> {
        self.check_buffer(node)?;
        self.backend.write(node, data)
    }

    /// Copies a node's buffer to the host.
    pub fn read(&self, node: NodeId) -> Result<NdArray, Error> {
        self.check_buffer(node)?;
        self.backend.read(node)
    }

    fn check_buffer(&self, node: NodeId) -> Result<(), Error> {
        if self.backend.has_buffer(node) {
            return Ok(());
        }
        match self.nodes.get(&node) {
            Some(n) => Err(Error::NotMaterialized { id: node.0, label: n.label.clone() }),
            None => Err(Error::UnknownNode(node.0)),
        }
    }
}

fn write_debug(dir: &Path, file: &str, text: &str) -> Result<(), Error> {
    let path = dir.join(file);
    let io = |source| Error::Io { path: path.display().to_string(), source };
    std::fs::create_dir_all(dir).map_err(io)?;
    std::fs::write(&path, text).map_err(io)
}

/// Whether the kernel of `call` takes its tensors' precisions: `f32` tensors (and `u32` or
/// `f32` ids for a lookup).
fn kernel_takes(prog: &crate::low_level::Program, call: &crate::low_level::Call) -> bool {
    use crate::low_level::Call;
    use crate::ops::Prec;
    let prec = |n: &crate::tnode::NodeId| prog.nodes[n].prec;
    match call {
        Call::Attention(a) => a.nodes().iter().all(|n| prec(n) == Prec::F32),
        Call::Gather(g) => {
            let a = &g.asgn;
            prec(&a.table) == Prec::F32
                && prec(&a.out) == Prec::F32
                && matches!(prec(&a.ids), Prec::U32 | Prec::F32)
        }
    }
}

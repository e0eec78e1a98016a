//! Backends: one trait, four implementations (the last a test backend that simulates the
//! third's kernels).
//!
//! A backend keeps three steps apart:
//! - **render**: a pure function from the low-level IR to source text (C for gccjit, CUDA C
//!   for cuda, the IR itself for the interpreter) — testable without any compiler or device;
//! - **compile**: turn a program into something runnable (libgccjit machine code, PTX loaded
//!   into a CUDA module, a resolved tree for the interpreter), once per routine;
//! - **run**: execute a compiled routine on the backend's buffers with runtime symbol values.
//!
//! Buffers belong to the backend (host memory for the CPU backends, device memory for CUDA),
//! keyed by [`NodeId`], allocated zeroed once and shared by every routine of a context.

pub mod c_syntax;
#[cfg(feature = "cuda")]
pub mod cuda;
pub mod cuda_sim;
pub mod device_pool;
#[cfg(feature = "gccjit")]
pub mod gccjit;
pub mod host;
pub mod interp;
pub mod kernel_ir;

use std::path::PathBuf;

use crate::error::Error;
use crate::low_level::Program;
use crate::ndarray::NdArray;
use crate::tnode::{NodeId, TensorNode};

/// The backends this crate knows.
///
/// ```
/// use rocannl_arrayjit::BackendKind;
/// assert_eq!(BackendKind::from_name("interp").unwrap(), BackendKind::Interp);
/// assert!(BackendKind::from_name("tpu").is_err());
/// assert!(BackendKind::available().contains(&BackendKind::Interp));
/// assert!(BackendKind::available().contains(&BackendKind::default()));
/// ```
#[derive(Copy, Clone, Debug, PartialEq, Eq, Hash)]
pub enum BackendKind {
    /// The reference interpreter.
    Interp,
    /// Native code through libgccjit.
    Gccjit,
    /// CUDA C through NVRTC and the CUDA driver.
    Cuda,
    /// The CUDA backend's kernels executed on the CPU by a simulator that checks them (a test
    /// backend: [`cuda_sim`]).
    CudaSim,
}

impl BackendKind {
    /// The backend called `name` (`interp`, `gccjit`, `cuda` or the test backend `cuda-sim`).
    pub fn from_name(name: &str) -> Result<BackendKind, Error> {
        match name {
            "interp" => Ok(BackendKind::Interp),
            "gccjit" => Ok(BackendKind::Gccjit),
            "cuda" => Ok(BackendKind::Cuda),
            "cuda-sim" => Ok(BackendKind::CudaSim),
            other => Err(Error::UnknownBackend(other.to_string())),
        }
    }

    /// Whether the backend interprets programs (the interpreter, and the kernel simulator,
    /// slower still) rather than running native code.
    pub fn interprets(self) -> bool {
        matches!(self, BackendKind::Interp | BackendKind::CudaSim)
    }

    /// The default work limit of a routine this backend compiles
    /// ([`crate::low_level::estimate::WorkLimit::Default`]).
    pub fn default_max_work(self) -> u64 {
        crate::low_level::estimate::default_max_work(self.interprets())
    }

    /// The backend's name.
    pub fn name(self) -> &'static str {
        match self {
            BackendKind::Interp => "interp",
            BackendKind::Gccjit => "gccjit",
            BackendKind::Cuda => "cuda",
            BackendKind::CudaSim => "cuda-sim",
        }
    }

    /// The backends built into this build (cuda is listed even without a GPU; creating a
    /// context for it then fails with [`Error::NoDevice`]).
    pub fn available() -> Vec<BackendKind> {
        let mut v = vec![BackendKind::Interp];
        if cfg!(feature = "gccjit") {
            v.push(BackendKind::Gccjit);
        }
        if cfg!(feature = "cuda") {
            v.push(BackendKind::Cuda);
        }
        v
    }
}

impl Default for BackendKind {
    /// The fastest CPU backend built in.
    fn default() -> Self {
        if cfg!(feature = "gccjit") { BackendKind::Gccjit } else { BackendKind::Interp }
    }
}

/// Settings of compilation.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CompileOptions {
    /// When set, every compiled routine's assignments, low-level IR and generated source are
    /// written to this folder (`{name}.asgn.txt`, `{name}.ll.txt`, `{name}.c` / `{name}.cu`;
    /// gccjit also writes what it gave GCC, `{name}.gccjit.O3.c` and so on, and
    /// `{name}.gccjit.symbols.txt`: the symbol of each step of the listing, the name a
    /// profiler shows).
    pub debug_dir: Option<PathBuf>,
    /// Check every index of every access and report the tensor, index and bound instead of
    /// touching memory out of range.
    pub bounds_check: bool,
    /// Optimization level of native code, 0..=3.
    pub opt_level: u8,
    /// Generate code for the host CPU's full instruction set (`-march=native`).
    pub march_native: bool,
    /// Worker threads of CPU backends (default: the number of cores).
    pub threads: Option<usize>,
    /// Inline intermediates into their consumers.
    pub virtualize: bool,
    /// gccjit: a routine whose steps are not all in the compile cache is first built quickly
    /// (`-O0`) and runs at once, while the build at `opt_level` is made in the background and
    /// swapped in by a later run when ready ([`crate::Context::finish_builds`] waits for it).
    /// Both builds compute the same bits. Off, a compile returns only once the optimized build
    /// is done.
    pub tiered: bool,
    /// Matrix products call the shape-generic kernel ([`crate::kernels`]) instead of being
    /// generated as loop nests (CPU backends; off in bounds-check mode, which checks every
    /// access of generated code). The results are the same bits either way.
    pub kernel_calls: bool,
    /// Which nests call the shape-generic map kernel instead of being generated (gccjit;
    /// [`crate::low_level::schedule::MapCalls`]): by default the reductions that are not
    /// products, a quarter less compile time at the same speed.
    pub map_calls: crate::low_level::schedule::MapCalls,
    /// Pointwise nests on a product's result (bias, activation, scaling) run inside the
    /// product's call, on each strip of the result as it becomes final (gccjit;
    /// [`crate::low_level::Epilogue`]). Off by default: on the machines measured it gained no
    /// run time and cost about 5 % more compile time (docs/benchmarks.md, "Epilogues").
    pub epilogues: bool,
    /// Consecutive parallel nests over the same rows, each touching for a row only bytes of
    /// that row, run as one job of the thread pool: each thread's chunk of rows goes through
    /// every nest in order, with no wait between them (gccjit;
    /// [`crate::backend::gccjit::group`]). The results are the same bits either way.
    pub parallel_groups: bool,
    /// Loop nests with fewer scalar operations than this run on the calling thread.
    pub min_parallel_work: usize,
    /// The persistent compile cache (see [`crate::cache`]); from the environment by default.
    pub cache: crate::cache::CacheMode,
    /// What one routine may need: new buffers' bytes and statement executions per run,
    /// checked before anything is allocated or run.
    pub limits: crate::low_level::estimate::Limits,
}

impl Default for CompileOptions {
    fn default() -> Self {
        CompileOptions {
            debug_dir: None,
            bounds_check: false,
            opt_level: 3,
            march_native: true,
            threads: None,
            virtualize: true,
            tiered: true,
            kernel_calls: true,
            map_calls: crate::low_level::schedule::MapCalls::Reductions,
            epilogues: false,
            parallel_groups: true,
            min_parallel_work: 1 << 15,
            cache: crate::cache::CacheMode::FromEnv,
            limits: crate::low_level::estimate::Limits::default(),
        }
    }
}

impl CompileOptions {
    /// The number of worker threads to use.
    pub fn thread_count(&self) -> usize {
        self.threads
            .unwrap_or_else(|| std::thread::available_parallelism().map_or(1, |n| n.get()))
            .max(1)
    }
}

/// A backend's compiled routine by index (routines are kept in a table, `None` once released):
/// [`Error::ReleasedRoutine`] for a released one, [`Error::ForeignRoutine`] for an index the
/// table never held.
pub(crate) fn live_routine<T>(routines: &mut [Option<T>], routine: usize) -> Result<&mut T, Error> {
    match routines.get_mut(routine) {
        Some(Some(r)) => Ok(r),
        Some(None) => Err(Error::ReleasedRoutine(format!("#{routine}"))),
        None => Err(Error::ForeignRoutine(format!("#{routine}"))),
    }
}

/// Host data fits a node's buffer: the same dims (what every backend's `write` checks first).
pub(crate) fn check_dims(node: &TensorNode, data: &NdArray) -> Result<(), Error> {
    if data.dims() == node.dims.as_slice() {
        return Ok(());
    }
    Err(Error::ShapeMismatch {
        id: node.id.0,
        expected: node.dims.clone(),
        got: data.dims().to_vec(),
    })
}

/// What one build asks of a backend besides the program: the settings that differ from
/// routine to routine (a routine run once is built at a lower level and without tiers; see
/// [`crate::Context::compile_once`]). Everything else comes from the backend's
/// [`CompileOptions`], fixed when it was made.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BuildRequest {
    /// Optimization level of native code, 0..=3 (native backends; the others ignore it).
    pub opt_level: u8,
    /// Tiered builds ([`CompileOptions::tiered`]; native backends).
    pub tiered: bool,
}

impl BuildRequest {
    /// The request a context makes for its ordinary routines.
    pub fn from_options(opts: &CompileOptions) -> BuildRequest {
        BuildRequest { opt_level: opts.opt_level, tiered: opts.tiered }
    }
}

/// How a routine was built: seconds per backend phase and what the compile cache did.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct BuildReport {
    /// Seconds per phase, in order (gccjit: `schedule`, `render`, `cache`, `codegen`,
    /// `c compile`; cuda: `render`, `nvrtc` (the cache's lookups included), `load`).
    pub phases: Vec<(&'static str, f64)>,
    /// What the compile cache did.
    pub cache: crate::cache::CacheOutcome,
}

/// A routine a backend compiled: its index in the backend's table, the generated source it
/// compiled (what [`Backend::render`] gives, rendered once) and how it was built.
#[derive(Clone, Debug)]
pub struct Compiled {
    /// The routine's index, for [`Backend::run`] and [`Backend::release`].
    pub routine: usize,
    /// The generated source.
    pub listing: String,
    /// Phases and cache outcome.
    pub report: BuildReport,
}

/// A backend: buffers plus render, compile and run. Compiling takes everything it depends on as
/// arguments and returns everything it produces: no setting changes between calls, and no
/// result waits in the backend for a later getter.
pub trait Backend {
    /// Which backend this is.
    fn kind(&self) -> BackendKind;
    /// The generated source of a program (pure; no compiler involved).
    fn render(&self, prog: &Program) -> Result<String, Error>;
    /// Compiles a program whose buffers are already allocated.
    fn compile(&mut self, prog: &Program, req: &BuildRequest) -> Result<Compiled, Error>;
    /// [`Backend::compile`] when every part of the program's code is in the compile cache, else
    /// `None` (backends without a cache: always `None`). Then, with `prebuild`, the code is
    /// built into the cache in the background (after the next run of any routine), for later
    /// processes; this process does not use it.
    fn compile_cached(
        &mut self,
        _prog: &Program,
        _req: &BuildRequest,
        _prebuild: bool,
    ) -> Result<Option<Compiled>, Error> {
        Ok(None)
    }
    /// Whether a routine runs its final code (false while a tiered routine still runs its quick
    /// first build).
    fn runs_optimized(&self, _routine: usize) -> bool {
        true
    }
    /// Whether some routine still runs its quick first build (its optimized build under way
    /// or not yet swapped in). Does not wait.
    fn builds_pending(&self) -> bool {
        false
    }
    /// Waits for every routine's background build and swaps it in, and for the builds made
    /// only for the compile cache (a no-op for backends without tiers).
    fn finish_builds(&mut self) {}
    /// Allocates a zeroed buffer for a node unless it already has one.
    fn alloc(&mut self, node: &TensorNode) -> Result<(), Error>;
    /// Releases a compiled routine: its intermediates' memory (on a device, back to the caching
    /// pool, [`device_pool`]) and its code. Running it afterwards is
    /// [`Error::ReleasedRoutine`]; releasing it again does nothing.
    fn release(&mut self, routine: usize) -> Result<(), Error>;
    /// The device memory pool's figures (device backends).
    fn pool_stats(&self) -> Option<device_pool::PoolStats> {
        None
    }
    /// Whether the node has a buffer.
    fn has_buffer(&self, node: NodeId) -> bool;
    /// The buffers in host memory, for backends that keep them there (the CPU backends).
    fn host_buffers(&self) -> Option<&host::HostBuffers> {
        None
    }
    /// Runs a compiled routine; `symbols` holds the runtime symbols' values in slot order.
    fn run(&mut self, routine: usize, symbols: &[i64]) -> Result<(), Error>;
    /// Copies host data into a node's buffer (converting the precision).
    fn write(&mut self, node: NodeId, data: &NdArray) -> Result<(), Error>;
    /// Copies a node's buffer to the host.
    fn read(&self, node: NodeId) -> Result<NdArray, Error>;
}

//! Building libgccjit IR directly from the low-level IR (no C text in between).
//!
//! A routine becomes one libgccjit context, compiled once, holding one function per *step*: a
//! parallel loop nest (its outermost loop runs `lo..hi`, so the pool can split it) or a run of
//! small statements executed on the calling thread. Every step has the signature
//! `void step(void **bufs, long long *syms, long long lo, long long hi, void *err)`.
//!
//! This file is the build's entry point and its settings ([`build`], [`BuildOptions`], the run
//! table); the function of one step is built by `emit.rs` and its siblings (see there).
//!
//! - Buffers are cast once per step to typed pointers; cells are addressed by flat row-major
//!   offsets that are affine in the loop variables, which GCC's vectorizer understands.
//! - Arithmetic is done in `float` (for f16, bf16, f32) or `double`; f16/bf16 are converted
//!   inline on load and store (`convert.rs`).
//! - Operations are built as the op table's [`crate::ops::Lowering`] says (`expr.rs`), the same
//!   recipe the C listing is rendered from; selections (`where`, `max`, `relu`, ...) are small
//!   diamonds GCC if-converts.
//! - In bounds-check mode, every access first compares each axis index with its bound and on
//!   failure calls back into Rust with (node, axis, index, bound) and returns.

use gccjit::{Context, OptimizationLevel};

use super::emit::Gen;
use super::step::StepKind;
use crate::error::Error;
use crate::low_level::{Program, Stmt};
use crate::tnode::NodeId;

/// The callback generated code calls when bounds-check mode finds a bad index: `(run table,
/// node, axis, index, bound)`.
pub type ReportFn = unsafe extern "C" fn(*mut u8, i64, i64, i64, i64);

/// The table every step receives as its last argument: the addresses of the Rust helpers it
/// calls, read at run time — machine code never holds an address of this process, so a
/// compiled routine can be cached on disk and loaded by another process — and the slot where
/// bounds-check mode reports.
#[repr(C)]
#[derive(Debug)]
pub struct RunTable {
    /// Indexed by the `HELPER_*` constants.
    pub helpers: [usize; HELPERS],
    /// The bounds-check report slot (opaque to generated code).
    pub slot: *const u8,
}

/// `f16 bits -> f32`.
pub const HELPER_F16_TO_F32: usize = 0;
/// `f32 -> f16 bits`.
pub const HELPER_F32_TO_F16: usize = 1;
/// `bf16 bits -> f32`.
pub const HELPER_BF16_TO_F32: usize = 2;
/// `f32 -> bf16 bits`.
pub const HELPER_F32_TO_BF16: usize = 3;
/// The bounds-check report ([`ReportFn`]).
pub const HELPER_REPORT: usize = 4;
/// [`crate::kernels::rc_gemm_f32`].
pub const HELPER_GEMM_F32: usize = 5;
/// [`crate::kernels::rc_gemm_f64`].
pub const HELPER_GEMM_F64: usize = 6;
/// [`crate::kernels::rc_gemm_bf16`].
pub const HELPER_GEMM_BF16: usize = 7;
/// [`crate::kernels::rc_map_f32`].
pub const HELPER_MAP_F32: usize = 8;
/// [`crate::kernels::rc_map_f64`].
pub const HELPER_MAP_F64: usize = 9;
/// [`crate::kernels::rc_gemm_epi_f32`].
pub const HELPER_GEMM_EPI_F32: usize = 10;
/// [`crate::kernels::rc_gemm_epi_f64`].
pub const HELPER_GEMM_EPI_F64: usize = 11;
/// [`crate::kernels::attention::rc_attention_f32`].
pub const HELPER_ATTENTION_F32: usize = 12;
/// [`crate::kernels::gather::rc_gather_f32`].
pub const HELPER_GATHER_F32: usize = 13;
/// The number of helpers in the run table.
pub const HELPERS: usize = 14;

/// Where a build goes.
pub enum Output<'a> {
    /// Compiled and loaded in memory.
    Memory,
    /// Written as a shared library to this path.
    SharedLibrary(&'a std::path::Path),
}

/// Seconds a build spent building libgccjit IR and compiling it.
#[derive(Copy, Clone, Debug, Default)]
pub struct BuildTimes {
    /// Building the IR.
    pub codegen_s: f64,
    /// GCC: optimization, code generation, assembly and linking.
    pub compile_s: f64,
}

/// A finished build.
pub enum Built {
    /// In memory.
    Memory(gccjit::CompileResult),
    /// On disk, at the path of [`Output::SharedLibrary`].
    File,
}

/// Settings of one build.
#[derive(Clone, Debug)]
pub struct BuildOptions {
    /// 0..=3.
    pub opt_level: u8,
    /// `-march=native`.
    pub march_native: bool,
    /// Check every index.
    pub bounds_check: bool,
    /// Where libgccjit writes its own C-like dump, if anywhere.
    pub dump: Option<std::path::PathBuf>,
    /// Which of the planned steps this build compiles (by index; `step_k` keeps its index).
    pub steps: Vec<usize>,
}

/// What a build compiles from: the program, its planned steps, and each step's buffer slots
/// (the nodes of its table, in order) and function name.
#[derive(Clone, Copy)]
pub struct Steps<'a> {
    /// The program the steps are cut from.
    pub prog: &'a Program,
    /// The steps.
    pub steps: &'a [(Vec<Stmt>, StepKind)],
    /// Each step's buffer slots.
    pub slots: &'a [Vec<NodeId>],
    /// Each step's function name.
    pub names: &'a [String],
}

/// Builds one libgccjit context for `steps` and compiles it in this process, holding
/// [`super::fork::gcc_lock`], with libgccjit's external driver: GCC runs as a program, so this
/// process's environment is never changed ([`crate::env`]). The `gccjit` crate panics on
/// libgccjit errors in debug builds; such a panic is caught and returned as a typed error.
pub fn build(
    src: Steps<'_>,
    opts: &BuildOptions,
    output: Output<'_>,
) -> Result<(Built, BuildTimes), Error> {
    let _guard = super::fork::gcc_lock();
    build_caught(src, opts, output, Driver::External)
}

/// [`build`] without taking the lock and with libgccjit's embedded driver (GCC's driver run
/// inside the process, which changes the environment while it runs): for a forked child,
/// which inherited the lock held and whose environment is its own.
pub fn build_unlocked(
    src: Steps<'_>,
    opts: &BuildOptions,
    output: Output<'_>,
) -> Result<(Built, BuildTimes), Error> {
    build_caught(src, opts, output, Driver::Embedded)
}

/// How libgccjit runs GCC's driver (assembling and linking).
#[derive(Clone, Copy, PartialEq, Eq)]
enum Driver {
    /// Inside the process: fast, but it sets and restores environment variables.
    Embedded,
    /// As a program (`gcc` of the same version, found on `PATH`): the environment untouched.
    External,
}

fn build_caught(
    src: Steps<'_>,
    opts: &BuildOptions,
    output: Output<'_>,
    driver: Driver,
) -> Result<(Built, BuildTimes), Error> {
    let run = std::panic::AssertUnwindSafe(|| build_unchecked(src, opts, output, driver));
    std::panic::catch_unwind(run).unwrap_or_else(|panic| {
        let log = panic
            .downcast_ref::<String>()
            .cloned()
            .or_else(|| panic.downcast_ref::<&str>().map(|s| s.to_string()))
            .unwrap_or_else(|| "libgccjit reported an error".to_string());
        Err(Error::Compile { backend: "gccjit", routine: src.prog.name.clone(), log })
    })
}

fn build_unchecked(
    src: Steps<'_>,
    opts: &BuildOptions,
    output: Output<'_>,
    driver: Driver,
) -> Result<(Built, BuildTimes), Error> {
    let Steps { prog, steps, slots, names } = src;
    let started = std::time::Instant::now();
    let ctx = Context::default();
    if driver == Driver::External {
        super::driver::use_external_driver(&ctx);
    }
    set_options(&ctx, opts, &output);
    for &k in &opts.steps {
        let (body, kind) = &steps[k];
        let mut g = Gen::new(&ctx, prog, &slots[k], opts.bounds_check, &names[k]);
        g.function(body, kind);
    }
    if let Some(path) = &opts.dump {
        ctx.dump_to_file(path.display().to_string(), false);
    }
    let fail = |log: String| Error::Compile { backend: "gccjit", routine: prog.name.clone(), log };
    if let Ok(Some(e)) = ctx.get_first_error() {
        return Err(fail(e.to_string()));
    }
    let built_ir = std::time::Instant::now();
    let built = match output {
        Output::Memory => ctx.compile().map(Built::Memory).map_err(fail)?,
        Output::SharedLibrary(path) => {
            ctx.compile_to_file(gccjit::OutputKind::DynamicLibrary, path.display().to_string());
            if let Ok(Some(e)) = ctx.get_first_error() {
                return Err(fail(e.to_string()));
            }
            Built::File
        }
    };
    let times = BuildTimes {
        codegen_s: (built_ir - started).as_secs_f64(),
        compile_s: built_ir.elapsed().as_secs_f64(),
    };
    Ok((built, times))
}

/// GCC's options for a build: optimization level, target, floating-point semantics.
fn set_options(ctx: &Context<'static>, opts: &BuildOptions, output: &Output<'_>) {
    ctx.set_optimization_level(match opts.opt_level {
        0 => OptimizationLevel::None,
        1 => OptimizationLevel::Limited,
        2 => OptimizationLevel::Standard,
        _ => OptimizationLevel::Aggressive,
    });
    if opts.march_native {
        for flag in host_arch_flags() {
            ctx.add_command_line_option(flag);
        }
    }
    ctx.add_command_line_option("-fno-math-errno");
    ctx.add_command_line_option("-fno-trapping-math");
    // Every operation rounds as the interpreter does: `a * b + c` is not fused behind the
    // program's back (the IR says `fma` where it wants one).
    ctx.add_command_line_option("-ffp-contract=off");
    ctx.add_command_line_option("--param=vect-max-version-for-alias-checks=64");
    if opts.opt_level == 2 {
        // GCC 12's `-O2` vectorizes only loops that need no runtime check ("very cheap"), and
        // a step's buffers come from a table, so every loop that reads one tensor and writes
        // another needs an alias check: the `-O2` steps ran scalar. "Cheap" allows the check
        // (char_gpt: f32 387 -> 530 steps/s, bf16 237 -> 365; compile +15 %).
        ctx.add_command_line_option("-fvect-cost-model=cheap");
    }
    ctx.set_print_errors_to_stderr(false);
    if let Output::SharedLibrary(_) = output {
        // The library is linked against nothing: what it calls (the C math library, `memset`)
        // is found in the process when it is loaded ([`load_library`] binds every symbol then,
        // so anything missing is a failed load, never a failed call). The C library's startup
        // files and the default libraries cost the linker more than GCC's `-O0` compile of a
        // small routine.
        ctx.add_driver_option("-nostdlib");
    }
}

/// Loads a shared library this code generator built, binding every symbol at once
/// (`RTLD_NOW`): a library that needs something the process does not have fails here, and its
/// routine is compiled again in memory, linked normally.
pub fn load_library(path: &std::path::Path) -> Option<libloading::Library> {
    #[cfg(unix)]
    {
        use libloading::os::unix::{Library, RTLD_LOCAL, RTLD_NOW};
        // SAFETY: a library of this code generator's: loading it runs no initializers of ours.
        unsafe { Library::open(Some(path), RTLD_NOW | RTLD_LOCAL) }.ok().map(Into::into)
    }
    #[cfg(not(unix))]
    {
        // SAFETY: as above.
        unsafe { libloading::Library::new(path) }.ok()
    }
}

/// Code generation flags for the host CPU. libgccjit cannot expand `-march=native` (that is the
/// driver's job), so the host's features, as detected by the Rust runtime, are mapped to the
/// x86-64 micro-architecture levels, up to the cap of `ROCANNL_ISA`
/// ([`crate::kernels::Isa::cap`]).
pub fn host_arch_flags() -> Vec<&'static str> {
    #[cfg(target_arch = "x86_64")]
    {
        use crate::kernels::Isa;
        use std::arch::is_x86_feature_detected as has;
        let cap = Isa::cap();
        if cap == Isa::Generic {
            return vec![];
        }
        if cap >= Isa::Avx512
            && has!("avx512f")
            && has!("avx512bw")
            && has!("avx512dq")
            && has!("avx512vl")
        {
            return vec!["-march=x86-64-v4", "-mprefer-vector-width=512"];
        }
        if cap >= Isa::Avx2 && has!("avx2") && has!("fma") && has!("bmi2") {
            return vec!["-march=x86-64-v3"];
        }
        if has!("sse4.2") && has!("popcnt") {
            return vec!["-march=x86-64-v2"];
        }
        vec![]
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        vec!["-mcpu=native"]
    }
}

//! Building libgccjit IR directly from the low-level IR (no C text in between).
//!
//! A routine becomes one libgccjit context, compiled once, holding one function per *step*: a
//! parallel loop nest (its outermost loop runs `lo..hi`, so the pool can split it) or a run of
//! small statements executed on the calling thread. Every step has the signature
//! `void step(void **bufs, long long *syms, long long lo, long long hi, void *err)`.
//!
//! - Buffers are cast once per step to typed pointers; cells are addressed by flat row-major
//!   offsets that are affine in the loop variables, which GCC's vectorizer understands.
//! - Arithmetic is done in `float` (for f16, bf16, f32) or `double`; f16/bf16 are converted on
//!   load and store by calls to the `half` crate through function pointers.
//! - Selections (`where`, `max`, `relu`, ...) are small diamonds GCC if-converts.
//! - In bounds-check mode, every access first compares each axis index with its bound and on
//!   failure calls back into Rust with (node, axis, index, bound) and returns.

use gccjit::{
    BinaryOp, Block, ComparisonOp, Context, Function, FunctionType, LValue, OptimizationLevel,
    RValue, ToRValue, Type, UnaryOp,
};
use rustc_hash::FxHashMap;

use crate::backend::c_syntax::nodes_of;
use crate::error::Error;
use crate::low_level::{Expr, IdxVar, Index, Limit, LocalId, Program, Stmt, Var};
use crate::math;
use crate::ops::{BinOp, Prec, SPLITMIX_GAMMA, SPLITMIX_M1, SPLITMIX_M2, TernOp, UnOp};
use crate::tnode::{NodeId, row_major_strides};

/// How a step is run.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum StepKind {
    /// On the calling thread, once.
    Serial,
    /// Split over `0..extent` of its outermost loop across the pool.
    Parallel {
        /// The outermost loop's trip count.
        extent: i64,
        /// A dynamic batch's limit on that loop ([`Limit`]): the slot of its size among the
        /// runtime symbols and the rows per iteration. Only the iterations below it are split.
        limit: Option<(usize, i64)>,
    },
}

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
/// The number of helpers in the run table.
pub const HELPERS: usize = 12;

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

/// Builds one libgccjit context for `steps` and compiles it in this process, holding
/// [`super::fork::gcc_lock`], with libgccjit's external driver: GCC runs as a program, so this
/// process's environment is never changed ([`crate::env`]). The `gccjit` crate panics on
/// libgccjit errors in debug builds; such a panic is caught and returned as a typed error.
pub fn build(
    prog: &Program,
    steps: &[(Vec<Stmt>, StepKind)],
    slots: &[Vec<NodeId>],
    names: &[String],
    opts: &BuildOptions,
    output: Output<'_>,
) -> Result<(Built, BuildTimes), Error> {
    let _guard = super::fork::gcc_lock();
    build_caught(prog, steps, slots, names, opts, output, Driver::External)
}

/// [`build`] without taking the lock and with libgccjit's embedded driver (GCC's driver run
/// inside the process, which changes the environment while it runs): for a forked child,
/// which inherited the lock held and whose environment is its own.
pub fn build_unlocked(
    prog: &Program,
    steps: &[(Vec<Stmt>, StepKind)],
    slots: &[Vec<NodeId>],
    names: &[String],
    opts: &BuildOptions,
    output: Output<'_>,
) -> Result<(Built, BuildTimes), Error> {
    build_caught(prog, steps, slots, names, opts, output, Driver::Embedded)
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
    prog: &Program,
    steps: &[(Vec<Stmt>, StepKind)],
    slots: &[Vec<NodeId>],
    names: &[String],
    opts: &BuildOptions,
    output: Output<'_>,
    driver: Driver,
) -> Result<(Built, BuildTimes), Error> {
    let run = std::panic::AssertUnwindSafe(|| {
        build_unchecked(prog, steps, slots, names, opts, output, driver)
    });
    std::panic::catch_unwind(run).unwrap_or_else(|panic| {
        let log = panic
            .downcast_ref::<String>()
            .cloned()
            .or_else(|| panic.downcast_ref::<&str>().map(|s| s.to_string()))
            .unwrap_or_else(|| "libgccjit reported an error".to_string());
        Err(Error::Compile { backend: "gccjit", routine: prog.name.clone(), log })
    })
}

fn build_unchecked(
    prog: &Program,
    steps: &[(Vec<Stmt>, StepKind)],
    slots: &[Vec<NodeId>],
    names: &[String],
    opts: &BuildOptions,
    output: Output<'_>,
    driver: Driver,
) -> Result<(Built, BuildTimes), Error> {
    let started = std::time::Instant::now();
    let ctx = Context::default();
    if driver == Driver::External {
        super::driver::use_external_driver(&ctx);
    }
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

struct Types<'c> {
    f32: Type<'c>,
    f64: Type<'c>,
    i64: Type<'c>,
    u64: Type<'c>,
    u16: Type<'c>,
    u32: Type<'c>,
    int: Type<'c>,
    boolean: Type<'c>,
}

struct Gen<'c> {
    ctx: &'c Context<'static>,
    prog: &'c Program,
    t: Types<'c>,
    func: Function<'c>,
    /// The function's first block: loads of helper addresses.
    entry: Block<'c>,
    /// Where the function's code begins.
    start: Block<'c>,
    block: Block<'c>,
    bufs: RValue<'c>,
    syms: RValue<'c>,
    lo: RValue<'c>,
    hi: RValue<'c>,
    err: RValue<'c>,
    slots: &'c [NodeId],
    ptrs: FxHashMap<NodeId, LValue<'c>>,
    vars: FxHashMap<Var, LValue<'c>>,
    /// Locals made for loop limits so far (for unique names).
    limits: u32,
    locals: FxHashMap<LocalId, LValue<'c>>,
    /// The run table's helper addresses, loaded once per function when first needed.
    helper_ptrs: FxHashMap<usize, LValue<'c>>,
    /// The call's seeds, by number, loaded once per function when first needed.
    seeds: FxHashMap<u64, LValue<'c>>,
    /// C library functions declared as plain external functions (see [`Gen::libm_call`]).
    libm: FxHashMap<String, Function<'c>>,
    bounds_check: bool,
    fresh: usize,
    /// The function's name (its epilogues' names start with it).
    fn_name: String,
    /// An epilogue function's first and last column (else unused).
    cols: Option<(RValue<'c>, RValue<'c>)>,
}

impl<'c> Gen<'c> {
    /// A step's function: `(bufs, syms, lo, hi, err)`, exported.
    fn new(
        ctx: &'c Context<'static>,
        prog: &'c Program,
        slots: &'c [NodeId],
        bounds_check: bool,
        name: &str,
    ) -> Gen<'c> {
        Gen::with_signature(ctx, prog, slots, bounds_check, name, false)
    }

    /// A step's function, or with `epilogue` an epilogue's ([`crate::kernels::EpilogueFn`]:
    /// `(bufs, syms, row0, row1, err, col0, col1)`, internal to the build).
    fn with_signature(
        ctx: &'c Context<'static>,
        prog: &'c Program,
        slots: &'c [NodeId],
        bounds_check: bool,
        name: &str,
        epilogue: bool,
    ) -> Gen<'c> {
        let void_ptr = ctx.new_type::<()>().make_pointer();
        let t = Types {
            f32: ctx.new_type::<f32>(),
            f64: ctx.new_type::<f64>(),
            i64: ctx.new_type::<i64>(),
            u64: ctx.new_type::<u64>(),
            u16: ctx.new_type::<u16>(),
            u32: ctx.new_type::<u32>(),
            int: ctx.new_type::<i32>(),
            boolean: ctx.new_type::<bool>(),
        };
        let mut params = vec![
            ctx.new_parameter(None, void_ptr.make_pointer(), "bufs"),
            ctx.new_parameter(None, t.i64.make_pointer(), "syms"),
            ctx.new_parameter(None, t.i64, "lo"),
            ctx.new_parameter(None, t.i64, "hi"),
            ctx.new_parameter(None, void_ptr, "err"),
        ];
        if epilogue {
            params.push(ctx.new_parameter(None, t.i64, "col0"));
            params.push(ctx.new_parameter(None, t.i64, "col1"));
        }
        let kind = if epilogue { FunctionType::Internal } else { FunctionType::Exported };
        let func = ctx.new_function(None, kind, ctx.new_type::<()>(), &params, name, false);
        // Helper addresses are loaded in `entry`, which jumps to `start` once the function is
        // complete; the code proper begins in `start`.
        let entry = func.new_block("entry");
        let block = func.new_block("start");
        Gen {
            entry,
            start: block,
            ctx,
            prog,
            t,
            func,
            block,
            bufs: params[0].to_rvalue(),
            syms: params[1].to_rvalue(),
            lo: params[2].to_rvalue(),
            hi: params[3].to_rvalue(),
            err: params[4].to_rvalue(),
            slots,
            ptrs: FxHashMap::default(),
            vars: FxHashMap::default(),
            limits: 0,
            locals: FxHashMap::default(),
            helper_ptrs: FxHashMap::default(),
            seeds: FxHashMap::default(),
            libm: FxHashMap::default(),
            bounds_check,
            fresh: 0,
            fn_name: name.to_string(),
            cols: epilogue.then(|| (params[5].to_rvalue(), params[6].to_rvalue())),
        }
    }

    fn name(&mut self, base: &str) -> String {
        self.fresh += 1;
        format!("{base}{}", self.fresh)
    }

    fn new_block(&mut self, base: &str) -> Block<'c> {
        let name = self.name(base);
        self.func.new_block(name)
    }

    fn new_local(&mut self, ty: Type<'c>, base: &str) -> LValue<'c> {
        let name = self.name(base);
        self.func.new_local(None, ty, name)
    }

    fn storage_type(&self, prec: Prec) -> Type<'c> {
        match prec {
            Prec::F16 | Prec::Bf16 => self.t.u16,
            Prec::F32 => self.t.f32,
            Prec::F64 => self.t.f64,
            Prec::U32 => self.t.u32,
        }
    }

    fn compute_type(&self, prec: Prec) -> Type<'c> {
        if prec == Prec::F64 { self.t.f64 } else { self.t.f32 }
    }

    fn function(&mut self, body: &[Stmt], kind: &StepKind) {
        self.pointers(body);
        match kind {
            StepKind::Serial => self.stmts(body),
            StepKind::Parallel { .. } => match body {
                [Stmt::For { var, limit, body, .. }] => {
                    let (lo, hi) = (self.lo, self.hi);
                    let hi = self.limited(hi, *limit);
                    self.for_loop(*var, lo, hi, body);
                }
                other => self.stmts(other),
            },
        }
        self.block.end_with_void_return(None);
        self.entry.end_with_jump(None, self.start);
    }

    /// An epilogue's function: its body on rows `lo..hi` × columns `col0..col1`, each row and
    /// column split into the epilogue's variables.
    fn epilogue_function(&mut self, e: &crate::low_level::Epilogue) {
        self.pointers(&e.body);
        let (lo, hi) = (self.lo, self.hi);
        let (c0, c1) = self.cols.expect("an epilogue's function has columns");
        self.counted(lo, hi, |g, row| {
            g.split(row, &e.rows);
            g.counted(c0, c1, |g, col| {
                g.split(col, &e.cols);
                g.stmts(&e.body);
            });
        });
        self.block.end_with_void_return(None);
        self.entry.end_with_jump(None, self.start);
    }

    /// A loop of a fresh counter from `from` to `to`, `body` given the counter.
    fn counted(
        &mut self,
        from: RValue<'c>,
        to: RValue<'c>,
        body: impl FnOnce(&mut Self, RValue<'c>),
    ) {
        let x = self.new_local(self.t.i64, "n");
        self.loop_over(x, from, to, |g| body(g, x.to_rvalue()));
    }

    /// Sets the variables of an epilogue axis (outermost first) from the axis' position.
    fn split(&mut self, x: RValue<'c>, axis: &[(Var, usize)]) {
        let mut rest = x;
        for (k, &(v, extent)) in axis.iter().enumerate().rev() {
            let l = self.var(v);
            if k == 0 {
                self.block.add_assignment(None, l, rest);
                break;
            }
            let e = self.long(extent as i64);
            let r = self.ctx.new_binary_op(None, BinaryOp::Modulo, self.t.i64, rest, e);
            self.block.add_assignment(None, l, r);
            let q = self.ctx.new_binary_op(None, BinaryOp::Divide, self.t.i64, rest, e);
            rest = self.temp(q, self.t.i64);
        }
    }

    /// Typed buffer pointers for every node the statements touch.
    fn pointers(&mut self, body: &[Stmt]) {
        for n in nodes_of(body) {
            let node = &self.prog.nodes[&n];
            let elem = self.storage_type(node.prec);
            let ty = elem.make_pointer();
            let ptr = self.func.new_local(None, ty, format!("p_n{}", n.0));
            if self.prog.scratch_of(n).is_some_and(|s| s.per_thread) {
                // A small array on this function's stack: private to the calling thread, and
                // known to GCC not to alias any buffer.
                let len = node.num_elements().max(1) as u64;
                let arr_ty = self.ctx.new_array_type(None, elem, len);
                let arr = self.func.new_local(None, arr_ty, format!("a_n{}", n.0));
                let zero = self.ctx.new_rvalue_zero(self.t.i64);
                let first = self.ctx.new_array_access(None, arr.to_rvalue(), zero);
                self.block.add_assignment(None, ptr, first.get_address(None));
            } else {
                let slot = self.slots.iter().position(|s| *s == n).unwrap_or(0);
                let idx = self.ctx.new_rvalue_from_long(self.t.i64, slot as i64);
                let raw = self.ctx.new_array_access(None, self.bufs, idx).to_rvalue();
                self.block.add_assignment(None, ptr, self.ctx.new_cast(None, raw, ty));
            }
            self.ptrs.insert(n, ptr);
        }
    }

    fn stmts(&mut self, body: &[Stmt]) {
        for s in body {
            self.stmt(s);
        }
    }

    fn var(&mut self, v: Var) -> LValue<'c> {
        if let Some(l) = self.vars.get(&v) {
            return *l;
        }
        let l = self.func.new_local(None, self.t.i64, format!("v{}", v.0));
        self.vars.insert(v, l);
        l
    }

    /// `min(to, ceil(size / per))` for a loop with a [`Limit`] (a dynamic batch's rows), else
    /// `to`.
    fn limited(&mut self, to: RValue<'c>, limit: Option<Limit>) -> RValue<'c> {
        let Some(Limit { size, per }) = limit else { return to };
        let slot = self.prog.symbol_slot(size).unwrap_or(0) as i64;
        let n = self.ctx.new_array_access(None, self.syms, self.long(slot)).to_rvalue();
        let per = per as i64;
        let sum = self.ctx.new_binary_op(None, BinaryOp::Plus, self.t.i64, n, self.long(per - 1));
        let rows = self.ctx.new_binary_op(None, BinaryOp::Divide, self.t.i64, sum, self.long(per));
        let out = self.func.new_local(None, self.t.i64, format!("limit{}", self.limits));
        self.limits += 1;
        self.block.add_assignment(None, out, to);
        let less = self.ctx.new_comparison(None, ComparisonOp::LessThan, rows, to);
        let lower = self.new_block("limit");
        let after = self.new_block("limited");
        self.block.end_with_conditional(None, less, lower, after);
        lower.add_assignment(None, out, rows);
        lower.end_with_jump(None, after);
        self.block = after;
        out.to_rvalue()
    }

    fn for_loop(&mut self, var: Var, from: RValue<'c>, to: RValue<'c>, body: &[Stmt]) {
        let v = self.var(var);
        self.loop_over(v, from, to, |g| g.stmts(body));
    }

    /// `for (x = from; x < to; ++x) body`.
    fn loop_over(
        &mut self,
        x: LValue<'c>,
        from: RValue<'c>,
        to: RValue<'c>,
        body: impl FnOnce(&mut Self),
    ) {
        let cond = self.new_block("cond");
        let inner = self.new_block("body");
        let after = self.new_block("after");
        self.block.add_assignment(None, x, from);
        self.block.end_with_jump(None, cond);
        let test = self.ctx.new_comparison(None, ComparisonOp::LessThan, x.to_rvalue(), to);
        cond.end_with_conditional(None, test, inner, after);
        self.block = inner;
        body(self);
        let one = self.ctx.new_rvalue_one(self.t.i64);
        self.block.add_assignment_op(None, x, BinaryOp::Plus, one);
        self.block.end_with_jump(None, cond);
        self.block = after;
    }

    fn stmt(&mut self, s: &Stmt) {
        match s {
            Stmt::Comment(c) => self.block.add_comment(None, c),
            Stmt::For { var, extent, limit, body, .. } => {
                let zero = self.ctx.new_rvalue_zero(self.t.i64);
                let to = self.ctx.new_rvalue_from_long(self.t.i64, *extent as i64);
                let to = self.limited(to, *limit);
                self.for_loop(*var, zero, to, body);
            }
            Stmt::If { guards, body } => {
                let mut cond: Option<RValue<'c>> = None;
                for g in guards {
                    let i = self.index(&g.index);
                    let zero = self.ctx.new_rvalue_zero(self.t.i64);
                    let bound = self.ctx.new_rvalue_from_long(self.t.i64, g.bound as i64);
                    let ge =
                        self.ctx.new_comparison(None, ComparisonOp::GreaterThanEquals, i, zero);
                    let lt = self.ctx.new_comparison(None, ComparisonOp::LessThan, i, bound);
                    let both =
                        self.ctx.new_binary_op(None, BinaryOp::LogicalAnd, self.t.boolean, ge, lt);
                    cond = Some(match cond {
                        None => both,
                        Some(c) => self.ctx.new_binary_op(
                            None,
                            BinaryOp::LogicalAnd,
                            self.t.boolean,
                            c,
                            both,
                        ),
                    });
                }
                let then = self.new_block("then");
                let after = self.new_block("endif");
                let cond = cond.unwrap_or_else(|| self.ctx.new_rvalue_one(self.t.boolean));
                self.block.end_with_conditional(None, cond, then, after);
                self.block = then;
                self.stmts(body);
                self.block.end_with_jump(None, after);
                self.block = after;
            }
            Stmt::Set { node, idx, value } => {
                let prec = self.prog.nodes[node].prec;
                let ty = self.compute_type(self.prog.compute_prec(value, prec));
                let v = self.expr(value, ty);
                let cell = self.cell(*node, idx);
                let stored = self.storage_value(v, prec);
                self.block.add_assignment(None, cell, stored);
            }
            Stmt::SetLocal { local, value } => {
                let prec = self.prog.locals[local.0 as usize];
                let lty = self.compute_type(prec);
                let ty = self.compute_type(self.prog.compute_prec(value, prec));
                let v = self.expr(value, ty);
                let l = self.local(*local);
                let v = if ty == lty { v } else { self.ctx.new_cast(None, v, lty) };
                self.block.add_assignment(None, l, v);
            }
            Stmt::Gemm(g) => self.gemm(g),
            Stmt::Map(m) => self.map(m),
        }
    }

    /// A local array of `i64` holding a kernel call's descriptor words (indices over the
    /// enclosing loops and runtime symbols).
    fn words(&mut self, what: &str, desc: &[Index]) -> LValue<'c> {
        let arr_ty = self.ctx.new_array_type(None, self.t.i64, desc.len() as u64);
        let name = self.name(what);
        let arr = self.func.new_local(None, arr_ty, name);
        for (k, i) in desc.iter().enumerate() {
            let v = self.index(i);
            let slot = self.ctx.new_array_access(None, arr.to_rvalue(), self.long(k as i64));
            self.block.add_assignment(None, slot, v);
        }
        arr
    }

    /// A call of the shape-generic product through the run table: the descriptor in a local
    /// array, the operands' first cells.
    fn gemm(&mut self, g: &crate::low_level::Gemm) {
        let arr = self.words("gemm_desc", &g.descriptor());
        let c_ty = self.storage_type(g.prec).make_pointer();
        let factor_ty = if g.bf16_pairs { self.t.u16.make_pointer() } else { c_ty };
        let mut args = Vec::with_capacity(8);
        for o in g.operands() {
            let off = self.index(&o.offset);
            let base = self.ptrs[&o.node].to_rvalue();
            args.push(self.ctx.new_array_access(None, base, off).get_address(None));
        }
        let first = self.ctx.new_array_access(None, arr.to_rvalue(), self.long(0));
        args.push(first.get_address(None));
        let mut params = vec![c_ty, factor_ty, factor_ty, self.t.i64.make_pointer()];
        if let Some(e) = &g.epilogue {
            // The epilogue's own function, called by the kernel with this step's arguments.
            let void_ptr = self.ctx.new_type::<()>().make_pointer();
            let i64 = self.t.i64;
            let epi_ty = self.ctx.new_function_pointer_type(
                None,
                self.ctx.new_type::<()>(),
                &[void_ptr.make_pointer(), i64.make_pointer(), i64, i64, void_ptr, i64, i64],
                false,
            );
            let name = self.name(&format!("{}_epilogue", self.fn_name));
            let mut sub = Gen::with_signature(
                self.ctx,
                self.prog,
                self.slots,
                self.bounds_check,
                &name,
                true,
            );
            sub.epilogue_function(e);
            args.push(self.ctx.new_cast(None, sub.func.get_address(None), epi_ty));
            args.extend([self.bufs, self.syms, self.err]);
            params.extend([epi_ty, void_ptr.make_pointer(), i64.make_pointer(), void_ptr]);
        }
        let fty =
            self.ctx.new_function_pointer_type(None, self.ctx.new_type::<()>(), &params, false);
        let k = match (g.bf16_pairs, g.prec, g.epilogue.is_some()) {
            (true, ..) => HELPER_GEMM_BF16,
            (false, Prec::F64, false) => HELPER_GEMM_F64,
            (false, Prec::F64, true) => HELPER_GEMM_EPI_F64,
            (false, _, true) => HELPER_GEMM_EPI_F32,
            _ => HELPER_GEMM_F32,
        };
        let f = self.helper(k, fty);
        let call = self.ctx.new_call_through_ptr(None, f, &args);
        self.block.add_eval(None, call);
    }

    /// A call of the map kernel through the run table: the operands' first cells and the
    /// descriptor's words in local arrays.
    fn map(&mut self, m: &crate::low_level::Map) {
        let arr = self.words("map_desc", &m.descriptor());
        let elem_ptr = self.storage_type(m.prec).make_pointer();
        let n = 1 + m.inputs.len();
        let ptrs_ty = self.ctx.new_array_type(None, elem_ptr, n as u64);
        let name = self.name("map_ptrs");
        let ptrs = self.func.new_local(None, ptrs_ty, name);
        for (k, o) in m.operands().enumerate() {
            let off = self.index(&o.offset);
            let base = self.ptrs[&o.node].to_rvalue();
            let cell = self.ctx.new_array_access(None, base, off).get_address(None);
            let slot = self.ctx.new_array_access(None, ptrs.to_rvalue(), self.long(k as i64));
            self.block.add_assignment(None, slot, cell);
        }
        let fty = self.ctx.new_function_pointer_type(
            None,
            self.ctx.new_type::<()>(),
            &[elem_ptr.make_pointer(), self.t.i64.make_pointer()],
            false,
        );
        let k = if m.prec == Prec::F64 { HELPER_MAP_F64 } else { HELPER_MAP_F32 };
        let f = self.helper(k, fty);
        let first_ptr = self.ctx.new_array_access(None, ptrs.to_rvalue(), self.long(0));
        let first_word = self.ctx.new_array_access(None, arr.to_rvalue(), self.long(0));
        let call = self.ctx.new_call_through_ptr(
            None,
            f,
            &[first_ptr.get_address(None), first_word.get_address(None)],
        );
        self.block.add_eval(None, call);
    }

    fn local(&mut self, l: LocalId) -> LValue<'c> {
        if let Some(x) = self.locals.get(&l) {
            return *x;
        }
        let ty = self.compute_type(self.prog.locals[l.0 as usize]);
        let x = self.func.new_local(None, ty, format!("t{}", l.0));
        self.locals.insert(l, x);
        x
    }

    fn long(&self, v: i64) -> RValue<'c> {
        self.ctx.new_rvalue_from_long(self.t.i64, v)
    }

    fn index(&mut self, i: &Index) -> RValue<'c> {
        let mut acc: Option<RValue<'c>> = None;
        for &(c, x) in &i.terms {
            let v = match x {
                IdxVar::Loop(v) => self.var(v).to_rvalue(),
                IdxVar::Sym(s) => {
                    let slot = self.prog.symbol_slot(s).unwrap_or(0) as i64;
                    self.ctx.new_array_access(None, self.syms, self.long(slot)).to_rvalue()
                }
            };
            let term = if c == 1 {
                v
            } else {
                self.ctx.new_binary_op(None, BinaryOp::Mult, self.t.i64, self.long(c), v)
            };
            acc = Some(match acc {
                None => term,
                Some(a) => self.ctx.new_binary_op(None, BinaryOp::Plus, self.t.i64, a, term),
            });
        }
        match acc {
            None => self.long(i.offset),
            Some(a) if i.offset == 0 => a,
            Some(a) => {
                self.ctx.new_binary_op(None, BinaryOp::Plus, self.t.i64, a, self.long(i.offset))
            }
        }
    }

    fn cell(&mut self, node: NodeId, idx: &[Index]) -> LValue<'c> {
        let dims = self.prog.nodes[&node].dims.clone();
        if self.bounds_check {
            for (axis, (i, &d)) in idx.iter().zip(&dims).enumerate() {
                self.check(node, axis, i, d);
            }
        }
        let strides = row_major_strides(&dims);
        let mut terms = Vec::new();
        let mut offset = 0;
        for (i, s) in idx.iter().zip(strides) {
            terms.extend(i.terms.iter().map(|&(c, x)| (c * s as i64, x)));
            offset += i.offset * s as i64;
        }
        let flat = self.index(&Index::new(terms, offset));
        let ptr = self.ptrs[&node].to_rvalue();
        self.ctx.new_array_access(None, ptr, flat)
    }

    fn check(&mut self, node: NodeId, axis: usize, i: &Index, bound: usize) {
        let v = self.index(i);
        let tmp = self.new_local(self.t.i64, "chk");
        self.block.add_assignment(None, tmp, v);
        let zero = self.long(0);
        let lt0 = self.ctx.new_comparison(None, ComparisonOp::LessThan, tmp.to_rvalue(), zero);
        let b = self.long(bound as i64);
        let ge = self.ctx.new_comparison(None, ComparisonOp::GreaterThanEquals, tmp.to_rvalue(), b);
        let bad = self.ctx.new_binary_op(None, BinaryOp::LogicalOr, self.t.boolean, lt0, ge);
        let fail = self.new_block("oob");
        let ok = self.new_block("inb");
        self.block.end_with_conditional(None, bad, fail, ok);
        let fty = self.ctx.new_function_pointer_type(
            None,
            self.ctx.new_type::<()>(),
            &[self.err.get_type(), self.t.i64, self.t.i64, self.t.i64, self.t.i64],
            false,
        );
        let f = self.helper(HELPER_REPORT, fty);
        let args = [self.err, self.long(node.0 as i64), self.long(axis as i64), tmp.to_rvalue(), b];
        let call = self.ctx.new_call_through_ptr(None, f, &args);
        fail.add_eval(None, call);
        fail.end_with_void_return(None);
        self.block = ok;
    }

    /// A helper's address from the run table, as a function pointer of type `fty`. It is loaded
    /// into a local at the function's entry the first time it is needed, so loops call through
    /// a register.
    fn helper(&mut self, k: usize, fty: Type<'c>) -> RValue<'c> {
        let p = match self.helper_ptrs.get(&k) {
            Some(p) => *p,
            None => {
                let void_ptr = self.ctx.new_type::<()>().make_pointer();
                let table = self.ctx.new_cast(None, self.err, void_ptr.make_pointer());
                let slot = self.ctx.new_array_access(None, table, self.long(k as i64));
                let p = self.func.new_local(None, void_ptr, format!("helper{k}"));
                self.entry.add_assignment(None, p, slot.to_rvalue());
                self.helper_ptrs.insert(k, p);
                p
            }
        };
        self.ctx.new_cast(None, p.to_rvalue(), fty)
    }

    /// bf16 bits to f32, inline: the bits are the top half of the f32's (no call, so loops
    /// over bf16 tensors vectorize).
    fn bf16_to_f32(&self, bits: RValue<'c>) -> RValue<'c> {
        let wide = self.ctx.new_cast(None, bits, self.t.u32);
        let sixteen = self.ctx.new_rvalue_from_int(self.t.u32, 16);
        let shifted = self.ctx.new_binary_op(None, BinaryOp::LShift, self.t.u32, wide, sixteen);
        self.ctx.new_bitcast(None, shifted, self.t.f32)
    }

    /// f32 to bf16 bits, inline, rounding to nearest even and keeping NaN a (quiet) NaN,
    /// exactly as the `half` crate (and so the interpreter) does: `(x + 0x7fff + lsb) >> 16`
    /// with `lsb` the kept part's last bit (a carry out of the dropped half is the rounding,
    /// up to infinity), and `nan ? (x >> 16) | 0x40`. Four integer operations and a blend per
    /// value, all of which vectorize.
    fn f32_to_bf16(&mut self, v: RValue<'c>) -> RValue<'c> {
        let u32t = self.t.u32;
        let k = |g: &Self, c: i64| g.ctx.new_rvalue_from_long(u32t, c);
        let bin = |g: &Self, op, a, b| g.ctx.new_binary_op(None, op, u32t, a, b);
        let x = self.ctx.new_bitcast(None, v, u32t);
        let x = self.temp(x, u32t);
        let hi = bin(self, BinaryOp::RShift, x, k(self, 16));
        let hi = self.temp(hi, u32t);
        let lsb = bin(self, BinaryOp::BitwiseAnd, hi, k(self, 1));
        let biased = bin(self, BinaryOp::Plus, bin(self, BinaryOp::Plus, x, k(self, 0x7fff)), lsb);
        let rounded = bin(self, BinaryOp::RShift, biased, k(self, 16));
        let magnitude = bin(self, BinaryOp::BitwiseAnd, x, k(self, 0x7fff_ffff));
        let nan = self.cmp(ComparisonOp::GreaterThan, magnitude, k(self, 0x7f80_0000));
        let quiet = bin(self, BinaryOp::BitwiseOr, hi, k(self, 0x40));
        let bits = self.select(nan, quiet, rounded, u32t);
        self.ctx.new_cast(None, bits, self.t.u16)
    }

    /// f16 bits to f32, inline and branch-free (so loops over f16 tensors vectorize), exactly
    /// as the `half` crate (and so the interpreter) converts: normal and subnormal values by
    /// moving the bits into an f32 and scaling by 2¹¹² (exact), infinities and NaN (made quiet,
    /// payload kept) selected.
    fn f16_to_f32(&mut self, bits: RValue<'c>) -> RValue<'c> {
        let (u32t, f32t) = (self.t.u32, self.t.f32);
        let k = |g: &Self, c: i64| g.ctx.new_rvalue_from_long(u32t, c);
        let bin = |g: &Self, op, a, b| g.ctx.new_binary_op(None, op, u32t, a, b);
        let h = self.ctx.new_cast(None, bits, u32t);
        let h = self.temp(h, u32t);
        let magnitude = bin(self, BinaryOp::BitwiseAnd, h, k(self, 0x7fff));
        let magnitude = self.temp(magnitude, u32t);
        let moved = bin(self, BinaryOp::LShift, magnitude, k(self, 13));
        let moved = self.ctx.new_bitcast(None, moved, f32t);
        let scaled = self.ctx.new_binary_op(
            None,
            BinaryOp::Mult,
            f32t,
            moved,
            self.float(2f64.powi(112), f32t),
        );
        let finite = self.ctx.new_bitcast(None, scaled, u32t);
        let payload = bin(
            self,
            BinaryOp::LShift,
            bin(self, BinaryOp::BitwiseAnd, magnitude, k(self, 0x3ff)),
            k(self, 13),
        );
        let quiet = self.cmp(ComparisonOp::GreaterThan, magnitude, k(self, 0x7c00));
        let quiet = self.select(quiet, k(self, 0x40_0000), k(self, 0), u32t);
        let special = bin(
            self,
            BinaryOp::BitwiseOr,
            bin(self, BinaryOp::BitwiseOr, k(self, 0x7f80_0000), payload),
            quiet,
        );
        let is_special = self.cmp(ComparisonOp::GreaterThanEquals, magnitude, k(self, 0x7c00));
        let body = self.select(is_special, special, finite, u32t);
        let sign = bin(
            self,
            BinaryOp::LShift,
            bin(self, BinaryOp::BitwiseAnd, h, k(self, 0x8000)),
            k(self, 16),
        );
        let out = bin(self, BinaryOp::BitwiseOr, body, sign);
        self.ctx.new_bitcast(None, out, f32t)
    }

    /// f32 to f16 bits, inline and branch-free, rounding to nearest even exactly as the `half`
    /// crate does: normal results by integer rounding of the rebiased bits, subnormal ones by
    /// one float addition of 0.5 (whose last place is f16's smallest subnormal), overflow to
    /// infinity, NaN quiet with its payload's top bits.
    fn f32_to_f16(&mut self, v: RValue<'c>) -> RValue<'c> {
        let (u32t, f32t) = (self.t.u32, self.t.f32);
        let k = |g: &Self, c: i64| g.ctx.new_rvalue_from_long(u32t, c);
        let bin = |g: &Self, op, a, b| g.ctx.new_binary_op(None, op, u32t, a, b);
        let x = self.ctx.new_bitcast(None, v, u32t);
        let x = self.temp(x, u32t);
        let a = bin(self, BinaryOp::BitwiseAnd, x, k(self, 0x7fff_ffff));
        let a = self.temp(a, u32t);
        // Subnormal or zero: a < 2^-14.
        let as_float = self.ctx.new_bitcast(None, a, f32t);
        let sum =
            self.ctx.new_binary_op(None, BinaryOp::Plus, f32t, as_float, self.float(0.5, f32t));
        let sub =
            bin(self, BinaryOp::Minus, self.ctx.new_bitcast(None, sum, u32t), k(self, 0x3f00_0000));
        // Normal: rebias, add 0xfff plus the kept mantissa's last bit, shift (a carry into
        // the exponent is the correct rounding, up to infinity).
        let odd = bin(
            self,
            BinaryOp::BitwiseAnd,
            bin(self, BinaryOp::RShift, a, k(self, 13)),
            k(self, 1),
        );
        let rebased = bin(self, BinaryOp::Plus, a, k(self, 0xc800_0fff));
        let normal =
            bin(self, BinaryOp::RShift, bin(self, BinaryOp::Plus, rebased, odd), k(self, 13));
        let small = self.cmp(ComparisonOp::LessThan, a, k(self, 0x3880_0000));
        let o = self.select(small, sub, normal, u32t);
        let huge = self.cmp(ComparisonOp::GreaterThanEquals, a, k(self, 0x4780_0000));
        let o = self.select(huge, k(self, 0x7c00), o, u32t);
        let nan = self.cmp(ComparisonOp::GreaterThan, a, k(self, 0x7f80_0000));
        let payload = bin(
            self,
            BinaryOp::RShift,
            bin(self, BinaryOp::BitwiseAnd, a, k(self, 0x7f_ffff)),
            k(self, 13),
        );
        let quiet_nan = bin(self, BinaryOp::BitwiseOr, k(self, 0x7e00), payload);
        let o = self.select(nan, quiet_nan, o, u32t);
        let sign = bin(
            self,
            BinaryOp::RShift,
            bin(self, BinaryOp::BitwiseAnd, x, k(self, 0x8000_0000)),
            k(self, 16),
        );
        let out = bin(self, BinaryOp::BitwiseOr, o, sign);
        self.ctx.new_cast(None, out, self.t.u16)
    }

    fn storage_value(&mut self, v: RValue<'c>, prec: Prec) -> RValue<'c> {
        let t = &self.t;
        let as_f32 = if v.get_type() == t.f32 { v } else { self.ctx.new_cast(None, v, t.f32) };
        match prec {
            Prec::F16 => self.f32_to_f16(as_f32),
            Prec::Bf16 => self.f32_to_bf16(as_f32),
            Prec::F32 => as_f32,
            Prec::F64 => {
                if v.get_type() == t.f64 {
                    v
                } else {
                    self.ctx.new_cast(None, v, t.f64)
                }
            }
            Prec::U32 => self.id_value(v),
        }
    }

    /// A computed value stored as an id, as Rust's `as u32` (and so the interpreter) converts:
    /// toward zero, saturating, `nan` to 0 (a C conversion out of range would be undefined).
    fn id_value(&mut self, v: RValue<'c>) -> RValue<'c> {
        let f64t = self.t.f64;
        let x = self.cast(v, f64t);
        let x = self.temp(x, f64t);
        let max = self.float(4_294_967_295.0, f64t);
        let zero = self.float(0.0, f64t);
        let big = self.cmp(ComparisonOp::GreaterThanEquals, x, max);
        let clamped = self.select(big, max, x, f64t);
        let low = self.cmp(ComparisonOp::LessThanEquals, x, zero);
        let clamped = self.select(low, zero, clamped, f64t);
        let nan = self.cmp(ComparisonOp::NotEquals, x, x);
        let clamped = self.select(nan, zero, clamped, f64t);
        self.ctx.new_cast(None, clamped, self.t.u32)
    }

    fn cast(&self, v: RValue<'c>, ty: Type<'c>) -> RValue<'c> {
        if v.get_type() == ty { v } else { self.ctx.new_cast(None, v, ty) }
    }

    fn float(&self, x: f64, ty: Type<'c>) -> RValue<'c> {
        // Rounded to `f32` here: libgccjit keeps a `float` constant's `double` value as given,
        // and GCC's constant folding then computes with the unrounded value (widened to
        // `double`, `pow(x, 1.0/3)` used a third to 53 bits where the interpreter uses `f32`'s).
        let x = if ty == self.t.f32 { x as f32 as f64 } else { x };
        self.ctx.new_rvalue_from_double(ty, x)
    }

    fn bool_to_float(&self, b: RValue<'c>, ty: Type<'c>) -> RValue<'c> {
        let i = self.ctx.new_cast(None, b, self.t.int);
        self.ctx.new_cast(None, i, ty)
    }

    /// `cond ? a : b` as a diamond of blocks writing a fresh local.
    ///
    /// Both values are computed before the branch, so the diamond only chooses between
    /// registers and no memory is read under a condition. GCC 12 if-converts a load under a
    /// condition into a masked load, and its loop vectorizer drops the permutation of grouped
    /// masked loads (GCC PR 114375, fixed in GCC 14): the mask of one group of cells was applied
    /// to the next ones, and `where` returned neither branch for some cells.
    fn select(
        &mut self,
        cond: RValue<'c>,
        a: RValue<'c>,
        b: RValue<'c>,
        ty: Type<'c>,
    ) -> RValue<'c> {
        let a = self.temp(a, ty);
        let res = self.new_local(ty, "sel");
        self.block.add_assignment(None, res, b);
        let then = self.new_block("sel_then");
        let after = self.new_block("sel_end");
        self.block.end_with_conditional(None, cond, then, after);
        then.add_assignment(None, res, a);
        then.end_with_jump(None, after);
        self.block = after;
        res.to_rvalue()
    }

    /// Evaluates into a fresh local so the value can be used several times.
    fn temp(&mut self, v: RValue<'c>, ty: Type<'c>) -> RValue<'c> {
        let l = self.new_local(ty, "e");
        self.block.add_assignment(None, l, v);
        l.to_rvalue()
    }

    fn builtin(&self, name: &str, ty: Type<'c>, args: &[RValue<'c>]) -> RValue<'c> {
        let suffix = if ty == self.t.f32 { "f" } else { "" };
        let f = self.ctx.get_builtin_function(format!("__builtin_{name}{suffix}"));
        self.ctx.new_call(None, f, args)
    }

    /// A call of the C library's function (`name`, or `name` + `f` in f32) through a plain
    /// external declaration, which GCC does not know as a builtin: it cannot rewrite it. For
    /// `pow` that matters: GCC turns `__builtin_pow(x, 0.5)` into `sqrt(x)`, which differs at
    /// `-0` (`-0` instead of `+0`) and `-inf` (NaN instead of `+inf`).
    fn libm_call(&mut self, name: &str, ty: Type<'c>, args: &[RValue<'c>]) -> RValue<'c> {
        let suffix = if ty == self.t.f32 { "f" } else { "" };
        let full = format!("{name}{suffix}");
        let ctx = self.ctx;
        let f = *self.libm.entry(full.clone()).or_insert_with(|| {
            let params: Vec<_> =
                (0..args.len()).map(|i| ctx.new_parameter(None, ty, format!("a{i}"))).collect();
            ctx.new_function(None, FunctionType::Extern, ty, &params, &full, false)
        });
        self.ctx.new_call(None, f, args)
    }

    fn cmp(&self, op: ComparisonOp, a: RValue<'c>, b: RValue<'c>) -> RValue<'c> {
        self.ctx.new_comparison(None, op, a, b)
    }

    fn expr(&mut self, e: &Expr, ty: Type<'c>) -> RValue<'c> {
        match e {
            Expr::Const(c) => self.float(*c, ty),
            Expr::Get(n, idx) => {
                let prec = self.prog.nodes[n].prec;
                let cell = self.cell(*n, idx).to_rvalue();
                let v = match prec {
                    Prec::F16 => self.f16_to_f32(cell),
                    Prec::Bf16 => self.bf16_to_f32(cell),
                    _ => cell,
                };
                self.cast(v, ty)
            }
            Expr::Local(l) => {
                let x = self.local(*l).to_rvalue();
                self.cast(x, ty)
            }
            Expr::IndexValue(i) => {
                let v = self.index(i);
                self.ctx.new_cast(None, v, ty)
            }
            Expr::Uniform { seed, offset } => self.uniform(*seed, offset, ty),
            Expr::Unop(op, a) => {
                let a = self.expr(a, ty);
                self.unop(*op, a, ty)
            }
            Expr::Binop(op, a, b) => {
                let a = self.expr(a, ty);
                let b = self.expr(b, ty);
                self.binop(*op, a, b, ty)
            }
            Expr::Ternop(op, a, b, c) => {
                let a = self.expr(a, ty);
                let b = self.expr(b, ty);
                let c = self.expr(c, ty);
                match op {
                    TernOp::Fma => self.builtin("fma", ty, &[a, b, c]),
                    TernOp::Where => {
                        let zero = self.float(0.0, ty);
                        let cond = self.cmp(ComparisonOp::NotEquals, a, zero);
                        self.select(cond, b, c, ty)
                    }
                }
            }
        }
    }

    fn unop(&mut self, op: UnOp, a: RValue<'c>, ty: Type<'c>) -> RValue<'c> {
        let zero = self.float(0.0, ty);
        let one = self.float(1.0, ty);
        match op {
            UnOp::Identity => a,
            UnOp::Neg => self.ctx.new_unary_op(None, UnaryOp::Minus, ty, a),
            UnOp::Relu => {
                let a = self.temp(a, ty);
                let neg = self.cmp(ComparisonOp::LessThan, a, zero);
                self.select(neg, zero, a, ty)
            }
            UnOp::Sat01 => {
                let a = self.temp(a, ty);
                let hi = self.cmp(ComparisonOp::GreaterThan, a, one);
                let top = self.select(hi, one, a, ty);
                let lo = self.cmp(ComparisonOp::LessThan, a, zero);
                self.select(lo, zero, top, ty)
            }
            UnOp::Exp if ty == self.t.f32 => math::exp(&mut Inline(self), a),
            UnOp::Exp => self.builtin("exp", ty, &[a]),
            UnOp::Log if ty == self.t.f32 => math::log(&mut Inline(self), a),
            UnOp::Log => self.builtin("log", ty, &[a]),
            UnOp::Exp2 if ty == self.t.f32 => math::exp2(&mut Inline(self), a),
            UnOp::Exp2 => self.builtin("exp2", ty, &[a]),
            UnOp::Log2 if ty == self.t.f32 => math::log2(&mut Inline(self), a),
            UnOp::Log2 => self.builtin("log2", ty, &[a]),
            // The instruction: `-fno-math-errno` leaves no reason to call the library.
            UnOp::Sqrt => self.builtin("sqrt", ty, &[a]),
            UnOp::Sin => self.builtin("sin", ty, &[a]),
            UnOp::Cos => self.builtin("cos", ty, &[a]),
            UnOp::Tanh if ty == self.t.f32 => math::tanh(&mut Inline(self), a),
            UnOp::Tanh => self.builtin("tanh", ty, &[a]),
            UnOp::Erf if ty == self.t.f32 => math::erf(&mut Inline(self), a),
            UnOp::Erf => self.builtin("erf", ty, &[a]),
            UnOp::Abs => self.builtin("fabs", ty, &[a]),
            UnOp::Recip => self.ctx.new_binary_op(None, BinaryOp::Divide, ty, one, a),
            UnOp::Sigmoid => {
                let neg = self.ctx.new_unary_op(None, UnaryOp::Minus, ty, a);
                let e = self.unop(UnOp::Exp, neg, ty);
                let den = self.ctx.new_binary_op(None, BinaryOp::Plus, ty, one, e);
                self.ctx.new_binary_op(None, BinaryOp::Divide, ty, one, den)
            }
            UnOp::Not => {
                let c = self.cmp(ComparisonOp::Equals, a, zero);
                self.bool_to_float(c, ty)
            }
        }
    }

    fn binop(&mut self, op: BinOp, a: RValue<'c>, b: RValue<'c>, ty: Type<'c>) -> RValue<'c> {
        let arith = |g: &Self, o| g.ctx.new_binary_op(None, o, ty, a, b);
        match op {
            BinOp::Add => arith(self, BinaryOp::Plus),
            BinOp::Sub => arith(self, BinaryOp::Minus),
            BinOp::Mul => arith(self, BinaryOp::Mult),
            BinOp::Div => arith(self, BinaryOp::Divide),
            BinOp::Pow if ty == self.t.f32 => math::pow(&mut Inline(self), a, b),
            BinOp::Pow => self.libm_call("pow", ty, &[a, b]),
            BinOp::Max | BinOp::Min => {
                let a = self.temp(a, ty);
                let b = self.temp(b, ty);
                let dir = if op == BinOp::Max {
                    ComparisonOp::GreaterThan
                } else {
                    ComparisonOp::LessThan
                };
                // `(a ⊳ b || a != a) ? a : b` as two selections with one comparison each:
                // simple diamonds GCC if-converts, so loops of maxima (pooling, row maxima)
                // vectorize.
                let better = self.cmp(dir, a, b);
                let r = self.select(better, a, b, ty);
                let nan = self.cmp(ComparisonOp::NotEquals, a, a);
                self.select(nan, a, r, ty)
            }
            BinOp::Lt => self.bool_to_float(self.cmp(ComparisonOp::LessThan, a, b), ty),
            BinOp::Le => self.bool_to_float(self.cmp(ComparisonOp::LessThanEquals, a, b), ty),
            BinOp::Gt => self.bool_to_float(self.cmp(ComparisonOp::GreaterThan, a, b), ty),
            BinOp::Eq => self.bool_to_float(self.cmp(ComparisonOp::Equals, a, b), ty),
            BinOp::Ne => self.bool_to_float(self.cmp(ComparisonOp::NotEquals, a, b), ty),
            BinOp::Second => b,
        }
    }

    /// The call's seed number `k` ([`super::dedup`]): the `k`-th value of the `u64` array in
    /// the buffer table's slot after the nodes, loaded into a local at the function's entry.
    fn seed(&mut self, k: u64) -> RValue<'c> {
        if let Some(l) = self.seeds.get(&k) {
            return l.to_rvalue();
        }
        let u = self.t.u64;
        let slot = self.long(self.slots.len() as i64);
        let raw = self.ctx.new_array_access(None, self.bufs, slot).to_rvalue();
        let table = self.ctx.new_cast(None, raw, u.make_pointer());
        let value = self.ctx.new_array_access(None, table, self.long(k as i64));
        let l = self.func.new_local(None, u, format!("seed{k}"));
        self.entry.add_assignment(None, l, value.to_rvalue());
        self.seeds.insert(k, l);
        l.to_rvalue()
    }

    /// `uniform(seed, offset)` for the call's seed number `seed`.
    fn uniform(&mut self, seed: u64, offset: &Index, ty: Type<'c>) -> RValue<'c> {
        let u = self.t.u64;
        let k = |g: &Self, x: u64| g.ctx.new_rvalue_from_long(u, x as i64);
        let off = self.index(offset);
        let off = self.ctx.new_cast(None, off, u);
        let z = self.new_local(u, "rng");
        let plus1 = self.ctx.new_binary_op(None, BinaryOp::Plus, u, off, k(self, 1));
        let mixed = self.ctx.new_binary_op(None, BinaryOp::Mult, u, plus1, k(self, SPLITMIX_GAMMA));
        let seed = self.seed(seed);
        let start = self.ctx.new_binary_op(None, BinaryOp::Plus, u, seed, mixed);
        self.block.add_assignment(None, z, start);
        for (shift, mul) in [(30, Some(SPLITMIX_M1)), (27, Some(SPLITMIX_M2)), (31, None)] {
            let sh =
                self.ctx.new_binary_op(None, BinaryOp::RShift, u, z.to_rvalue(), k(self, shift));
            let x = self.ctx.new_binary_op(None, BinaryOp::BitwiseXor, u, z.to_rvalue(), sh);
            let x = match mul {
                Some(m) => self.ctx.new_binary_op(None, BinaryOp::Mult, u, x, k(self, m)),
                None => x,
            };
            self.block.add_assignment(None, z, x);
        }
        let top = self.ctx.new_binary_op(None, BinaryOp::RShift, u, z.to_rvalue(), k(self, 40));
        let top = self.ctx.new_cast(None, top, self.t.i64);
        let f = self.ctx.new_cast(None, top, ty);
        let scale = self.float(1.0 / 16_777_216.0, ty);
        self.ctx.new_binary_op(None, BinaryOp::Mult, ty, f, scale)
    }
}

/// The `f32` special functions emitted inline ([`crate::math`]): straight-line arithmetic that
/// the loop vectorizer turns into vector code, the interpreter's operations one for one.
struct Inline<'g, 'c>(&'g mut Gen<'c>);

impl<'c> math::Emit for Inline<'_, 'c> {
    type F = RValue<'c>;
    type U = RValue<'c>;
    type D = RValue<'c>;
    fn f(&mut self, c: f32) -> RValue<'c> {
        self.0.float(c as f64, self.0.t.f32)
    }
    fn u(&mut self, c: u32) -> RValue<'c> {
        self.0.ctx.new_rvalue_from_long(self.0.t.u32, c as i64)
    }
    fn d(&mut self, c: f64) -> RValue<'c> {
        self.0.float(c, self.0.t.f64)
    }
    fn add(&mut self, a: RValue<'c>, b: RValue<'c>) -> RValue<'c> {
        self.0.ctx.new_binary_op(None, BinaryOp::Plus, self.0.t.f32, a, b)
    }
    fn sub(&mut self, a: RValue<'c>, b: RValue<'c>) -> RValue<'c> {
        self.0.ctx.new_binary_op(None, BinaryOp::Minus, self.0.t.f32, a, b)
    }
    fn mul(&mut self, a: RValue<'c>, b: RValue<'c>) -> RValue<'c> {
        self.0.ctx.new_binary_op(None, BinaryOp::Mult, self.0.t.f32, a, b)
    }
    fn div(&mut self, a: RValue<'c>, b: RValue<'c>) -> RValue<'c> {
        self.0.ctx.new_binary_op(None, BinaryOp::Divide, self.0.t.f32, a, b)
    }
    fn fma(&mut self, a: RValue<'c>, b: RValue<'c>, c: RValue<'c>) -> RValue<'c> {
        self.0.builtin("fma", self.0.t.f32, &[a, b, c])
    }
    fn lt_select(
        &mut self,
        a: RValue<'c>,
        b: RValue<'c>,
        x: RValue<'c>,
        y: RValue<'c>,
    ) -> RValue<'c> {
        let cond = self.0.cmp(ComparisonOp::LessThan, a, b);
        let ty = self.0.t.f32;
        self.0.select(cond, x, y, ty)
    }
    fn to_bits(&mut self, a: RValue<'c>) -> RValue<'c> {
        self.0.ctx.new_bitcast(None, a, self.0.t.u32)
    }
    fn bits_to_f32(&mut self, a: RValue<'c>) -> RValue<'c> {
        self.0.ctx.new_bitcast(None, a, self.0.t.f32)
    }
    fn uadd(&mut self, a: RValue<'c>, b: RValue<'c>) -> RValue<'c> {
        self.0.ctx.new_binary_op(None, BinaryOp::Plus, self.0.t.u32, a, b)
    }
    fn usub(&mut self, a: RValue<'c>, b: RValue<'c>) -> RValue<'c> {
        self.0.ctx.new_binary_op(None, BinaryOp::Minus, self.0.t.u32, a, b)
    }
    fn and(&mut self, a: RValue<'c>, b: RValue<'c>) -> RValue<'c> {
        self.0.ctx.new_binary_op(None, BinaryOp::BitwiseAnd, self.0.t.u32, a, b)
    }
    fn or(&mut self, a: RValue<'c>, b: RValue<'c>) -> RValue<'c> {
        self.0.ctx.new_binary_op(None, BinaryOp::BitwiseOr, self.0.t.u32, a, b)
    }
    fn shl(&mut self, a: RValue<'c>, s: u32) -> RValue<'c> {
        let s = self.u(s);
        self.0.ctx.new_binary_op(None, BinaryOp::LShift, self.0.t.u32, a, s)
    }
    fn sar(&mut self, a: RValue<'c>, s: u32) -> RValue<'c> {
        let int = self.0.t.int;
        let signed = self.0.ctx.new_cast(None, a, int);
        let s = self.0.ctx.new_rvalue_from_int(int, s as i32);
        let shifted = self.0.ctx.new_binary_op(None, BinaryOp::RShift, int, signed, s);
        self.0.ctx.new_cast(None, shifted, self.0.t.u32)
    }
    fn widen(&mut self, a: RValue<'c>) -> RValue<'c> {
        self.0.ctx.new_cast(None, a, self.0.t.f64)
    }
    fn narrow(&mut self, a: RValue<'c>) -> RValue<'c> {
        self.0.ctx.new_cast(None, a, self.0.t.f32)
    }
    fn dadd(&mut self, a: RValue<'c>, b: RValue<'c>) -> RValue<'c> {
        self.0.ctx.new_binary_op(None, BinaryOp::Plus, self.0.t.f64, a, b)
    }
    fn dsub(&mut self, a: RValue<'c>, b: RValue<'c>) -> RValue<'c> {
        self.0.ctx.new_binary_op(None, BinaryOp::Minus, self.0.t.f64, a, b)
    }
    fn dmul(&mut self, a: RValue<'c>, b: RValue<'c>) -> RValue<'c> {
        self.0.ctx.new_binary_op(None, BinaryOp::Mult, self.0.t.f64, a, b)
    }
    fn ddiv(&mut self, a: RValue<'c>, b: RValue<'c>) -> RValue<'c> {
        self.0.ctx.new_binary_op(None, BinaryOp::Divide, self.0.t.f64, a, b)
    }
    fn dfma(&mut self, a: RValue<'c>, b: RValue<'c>, c: RValue<'c>) -> RValue<'c> {
        self.0.builtin("fma", self.0.t.f64, &[a, b, c])
    }
    fn dlt_select(
        &mut self,
        a: RValue<'c>,
        b: RValue<'c>,
        x: RValue<'c>,
        y: RValue<'c>,
    ) -> RValue<'c> {
        let cond = self.0.cmp(ComparisonOp::LessThan, a, b);
        let ty = self.0.t.f64;
        self.0.select(cond, x, y, ty)
    }
    fn keep(&mut self, a: RValue<'c>) -> RValue<'c> {
        let ty = self.0.t.f32;
        self.0.temp(a, ty)
    }
    fn keep_u(&mut self, a: RValue<'c>) -> RValue<'c> {
        let ty = self.0.t.u32;
        self.0.temp(a, ty)
    }
    fn keep_d(&mut self, a: RValue<'c>) -> RValue<'c> {
        let ty = self.0.t.f64;
        self.0.temp(a, ty)
    }
}

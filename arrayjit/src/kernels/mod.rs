//! Shape-generic kernels: machine code that exists before any routine is compiled.
//!
//! Most of a training step's work is matrix products (a layer's forward pass, both gradients),
//! and generating a loop nest for each of them made GCC spend most of a routine's compile time
//! optimizing many near-identical nests. The product is instead one kernel, written once in
//! Rust, compiled with the crate for each instruction set it supports and picked for the host
//! when it runs ([`Isa::host`]); a routine calls it with sizes and strides as arguments
//! ([`crate::low_level::Gemm`], introduced by the CPU schedule). Only what is specific to the
//! program — pointwise maps, materialized operands, small nests — is left to generate.
//!
//! The kernels compute exactly what the loop nest they replace computes: each cell of the
//! result is `t := init; for k in order: t := fma(a, b, t)` (or `t := t + a·b`, the product
//! rounded first, when the program does not fuse), in the operands' precision. Blocking,
//! packing and vectorizing across cells change where values are kept, never the operations on
//! one cell or their order, so a kernel call gives the same bits as the interpreter running
//! the nest.

pub mod gemm;
pub mod simd;

pub use gemm::{Gemm, gemm};

/// An instruction set a kernel is compiled for.
#[derive(Copy, Clone, Debug, PartialEq, Eq, Hash)]
pub enum Isa {
    /// Portable code (scalar or whatever the target's baseline vectorizes to).
    Generic,
    /// AVX2 with FMA (x86-64-v3).
    Avx2,
    /// AVX-512 F (x86-64-v4).
    Avx512,
}

impl Isa {
    /// Every instruction set this host can run, the best last.
    pub fn available() -> Vec<Isa> {
        let mut out = vec![Isa::Generic];
        #[cfg(target_arch = "x86_64")]
        {
            use std::arch::is_x86_feature_detected as has;
            if has!("avx2") && has!("fma") {
                out.push(Isa::Avx2);
            }
            if has!("avx512f") && has!("avx2") && has!("fma") {
                out.push(Isa::Avx512);
            }
        }
        out
    }

    /// The best instruction set of this host (detected once).
    pub fn host() -> Isa {
        static HOST: std::sync::OnceLock<Isa> = std::sync::OnceLock::new();
        *HOST.get_or_init(|| *Isa::available().last().unwrap_or(&Isa::Generic))
    }

    /// The name shown in reports.
    pub fn name(self) -> &'static str {
        match self {
            Isa::Generic => "generic",
            Isa::Avx2 => "avx2",
            Isa::Avx512 => "avx512",
        }
    }
}

/// Flags of [`rc_gemm_f32`] and [`rc_gemm_f64`]: the result accumulates onto its old values.
pub const GEMM_ACCUMULATE: i64 = 1;
/// Flags of [`rc_gemm_f32`] and [`rc_gemm_f64`]: each step is one fused multiply-add.
pub const GEMM_FUSED: i64 = 2;

/// The signature generated code calls [`rc_gemm_f32`] and [`rc_gemm_f64`] with:
/// `(c, rsc, csc, a, rsa, csa, b, rsb, csb, m, n, k, flags)`, strides in elements.
pub type GemmFn<T> = unsafe extern "C" fn(
    *mut T,
    i64,
    i64,
    *const T,
    i64,
    i64,
    *const T,
    i64,
    i64,
    i64,
    i64,
    i64,
    i64,
);

macro_rules! entry {
    ($name:ident, $t:ty) => {
        /// The entry point generated code calls (through the run table), with the host's best
        /// instruction set: `C (+)= A·B`, `C` of `m × n`, `A` of `m × k`, `B` of `k × n`.
        ///
        /// # Safety
        /// Every cell the sizes and strides address must be valid for the access, and `c`'s
        /// cells must not overlap `a`'s or `b`'s.
        pub unsafe extern "C" fn $name(
            c: *mut $t,
            rsc: i64,
            csc: i64,
            a: *const $t,
            rsa: i64,
            csa: i64,
            b: *const $t,
            rsb: i64,
            csb: i64,
            m: i64,
            n: i64,
            k: i64,
            flags: i64,
        ) {
            let g = Gemm {
                m: m.max(0) as usize,
                n: n.max(0) as usize,
                k: k.max(0) as usize,
                a,
                rsa: rsa as isize,
                csa: csa as isize,
                b,
                rsb: rsb as isize,
                csb: csb as isize,
                c,
                rsc: rsc as isize,
                csc: csc as isize,
                accumulate: flags & GEMM_ACCUMULATE != 0,
                fused: flags & GEMM_FUSED != 0,
            };
            // SAFETY: the caller's contract.
            unsafe { gemm(&g, Isa::host()) }
        }
    };
}

entry!(rc_gemm_f32, f32);
entry!(rc_gemm_f64, f64);

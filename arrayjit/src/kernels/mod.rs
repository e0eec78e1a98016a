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

pub mod attention;
pub mod bf16;
pub mod gather;
pub mod gemm;
pub mod map;
pub mod simd;

pub use bf16::rc_gemm_bf16;
pub use gemm::{EpilogueCall, EpilogueFn, Gemm, gemm};
pub use map::{rc_map_f32, rc_map_f64};

/// An instruction set a kernel is compiled for.
#[derive(Copy, Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Isa {
    /// Portable code (scalar or whatever the target's baseline vectorizes to).
    Generic,
    /// AVX2 with FMA (x86-64-v3).
    Avx2,
    /// AVX-512 F (x86-64-v4).
    Avx512,
}

impl Isa {
    /// Every instruction set this host can run, the best last, up to the cap of
    /// `ROCANNL_ISA` ([`Isa::cap`]).
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
        out.retain(|i| *i <= Isa::cap());
        out
    }

    /// The best instruction set of this host (detected once), up to the cap.
    pub fn host() -> Isa {
        static HOST: std::sync::OnceLock<Isa> = std::sync::OnceLock::new();
        *HOST.get_or_init(|| *Isa::available().last().unwrap_or(&Isa::Generic))
    }

    /// The most this process uses, read once from the environment: `ROCANNL_ISA=avx2` makes an
    /// AVX-512 host run (and generate) what an AVX2-only host would, `generic` portable code
    /// only (kernels and generated code for baseline x86-64); unset (or `avx512`), whatever the
    /// host has. Another value is warned about and ignored. Kernels, generated code's target flags
    /// and the bf16 instructions all follow it, so one machine can measure and test every path.
    pub fn cap() -> Isa {
        static CAP: std::sync::OnceLock<Isa> = std::sync::OnceLock::new();
        if let Some(cap) = CAP.get() {
            return *cap;
        }
        // Read before the one-time initializer, not in it: the read takes the environment lock
        // ([`crate::env`]), and a thread holding that lock must never wait for an initializer
        // another thread is running.
        let raw = crate::env::var("ROCANNL_ISA");
        *CAP.get_or_init(|| {
            let Some(v) = raw else { return Isa::Avx512 };
            match v.to_ascii_lowercase().as_str() {
                "generic" => Isa::Generic,
                "avx2" => Isa::Avx2,
                "avx512" | "" => Isa::Avx512,
                other => {
                    // Not an error: the process still runs, on the host's best.
                    eprintln!(
                        "warning: ROCANNL_ISA={other} is not avx512, avx2 or generic; \
                         using the host's best instruction set"
                    );
                    Isa::Avx512
                }
            }
        })
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

/// A product's sizes and steps as generated code passes them to [`rc_gemm_f32`] and
/// [`rc_gemm_f64`] (one array of `i64`, so the call has four arguments whatever the product).
///
/// The call computes rows `row_start .. row_start + row_count` of an `m × n` product with a
/// reduction of `k`, each size clipped to its dynamic count when that is not negative; the
/// operand pointers point at the cell of row 0, column 0.
#[repr(C)]
#[derive(Copy, Clone, Debug, Default, PartialEq, Eq)]
pub struct GemmDesc {
    /// `C`'s row step.
    pub rsc: i64,
    /// `C`'s column step.
    pub csc: i64,
    /// `A`'s row step.
    pub rsa: i64,
    /// `A`'s column step.
    pub csa: i64,
    /// `B`'s row step.
    pub rsb: i64,
    /// `B`'s column step.
    pub csb: i64,
    /// The first row this call computes.
    pub row_start: i64,
    /// The most rows this call computes.
    pub row_count: i64,
    /// Rows of the product.
    pub m: i64,
    /// A dynamic count of rows, or -1.
    pub m_dyn: i64,
    /// Columns of the product.
    pub n: i64,
    /// A dynamic count of columns, or -1.
    pub n_dyn: i64,
    /// The reduction.
    pub k: i64,
    /// A dynamic count of reduction steps, or -1.
    pub k_dyn: i64,
    /// [`GEMM_ACCUMULATE`], [`GEMM_FUSED`] and [`GEMM_BF16_RESULT`].
    pub flags: i64,
}

/// The number of `i64` in a [`GemmDesc`].
pub const GEMM_DESC_LEN: usize = 15;

impl GemmDesc {
    /// The product this call computes, from the operands' first cells: `(m, n, k)` clipped,
    /// the rows of this call, and the pointers advanced to its first row.
    pub fn clip(&self) -> (usize, usize, usize, isize) {
        let eff = |ext: i64, dyn_: i64| if dyn_ >= 0 { ext.min(dyn_) } else { ext }.max(0);
        let m = eff(self.m, self.m_dyn);
        let rows = (m - self.row_start).min(self.row_count).max(0);
        (
            rows as usize,
            eff(self.n, self.n_dyn) as usize,
            eff(self.k, self.k_dyn) as usize,
            self.row_start as isize,
        )
    }
}

impl GemmDesc {
    /// The product this call computes, from the operands' first cells (row 0, column 0):
    /// sizes clipped, pointers advanced to the call's first row; `None` when it has no rows.
    ///
    /// # Safety
    /// The call's first row must lie inside `c` and `a`.
    pub unsafe fn product<T, F>(&self, c: *mut T, a: *const F, b: *const F) -> Option<Gemm<T, F>> {
        let (m, n, k, start) = self.clip();
        if m == 0 {
            return None;
        }
        // SAFETY: the caller's contract.
        let (c, a) =
            unsafe { (c.offset(start * self.rsc as isize), a.offset(start * self.rsa as isize)) };
        Some(Gemm {
            m,
            n,
            k,
            a,
            rsa: self.rsa as isize,
            csa: self.csa as isize,
            b,
            rsb: self.rsb as isize,
            csb: self.csb as isize,
            c,
            rsc: self.rsc as isize,
            csc: self.csc as isize,
            accumulate: self.flags & GEMM_ACCUMULATE != 0,
            fused: self.flags & GEMM_FUSED != 0,
            epilogue: None,
        })
    }
}

/// Flags of a [`GemmDesc`]: the result accumulates onto its old values.
pub const GEMM_ACCUMULATE: i64 = 1;
/// Flags of a [`GemmDesc`]: each step is one fused multiply-add.
pub const GEMM_FUSED: i64 = 2;
/// Flags of a [`GemmDesc`]: the bf16 product's result is bf16 ([`bf16::rc_gemm_bf16`] rounds
/// each cell when it stores it, and reads bf16 cells when accumulating).
pub const GEMM_BF16_RESULT: i64 = 4;

/// The signature generated code calls [`rc_gemm_f32`] and [`rc_gemm_f64`] with: `(c, a, b,
/// desc)`.
pub type GemmFn<T> = unsafe extern "C" fn(*mut T, *const T, *const T, *const GemmDesc);

macro_rules! entry {
    ($name:ident, $t:ty) => {
        /// The entry point generated code calls (through the run table), with the host's best
        /// instruction set: `C (+)= A·B` as the descriptor says.
        ///
        /// # Safety
        /// `desc` must point at a descriptor; every cell its sizes and steps address from the
        /// three pointers must be valid for the access, and `c`'s cells must not overlap `a`'s
        /// or `b`'s.
        pub unsafe extern "C" fn $name(
            c: *mut $t,
            a: *const $t,
            b: *const $t,
            desc: *const GemmDesc,
        ) {
            // SAFETY: the caller's contract (the descriptor, and its first row inside `c`, `a`).
            let Some(g) = (unsafe { (*desc).product(c, a, b) }) else { return };
            // SAFETY: the caller's contract.
            unsafe { gemm(&g, Isa::host()) }
        }
    };
}

entry!(rc_gemm_f32, f32);
entry!(rc_gemm_f64, f64);

/// The signature generated code calls [`rc_gemm_epi_f32`] and [`rc_gemm_epi_f64`] with: `(c,
/// a, b, desc, epilogue, bufs, syms, err)`.
pub type GemmEpiFn<T> = unsafe extern "C" fn(
    *mut T,
    *const T,
    *const T,
    *const GemmDesc,
    EpilogueFn,
    *mut *mut u8,
    *const i64,
    *mut u8,
);

macro_rules! entry_epi {
    ($name:ident, $t:ty) => {
        /// The entry point of a product with an epilogue (through the run table): `C (+)=
        /// A·B` as the descriptor says, then `epilogue(bufs, syms, rows, err, columns)` on
        /// each strip of `C` as it becomes final.
        ///
        /// # Safety
        /// As the entry point without an epilogue; `epilogue` must be safe to call with the
        /// step's `bufs`, `syms` and `err` on any rows and columns of the product.
        #[allow(clippy::too_many_arguments)]
        pub unsafe extern "C" fn $name(
            c: *mut $t,
            a: *const $t,
            b: *const $t,
            desc: *const GemmDesc,
            epilogue: EpilogueFn,
            bufs: *mut *mut u8,
            syms: *const i64,
            err: *mut u8,
        ) {
            // SAFETY: the caller's contract (the descriptor, and its first row inside `c`, `a`).
            let Some(mut g) = (unsafe { (*desc).product(c, a, b) }) else { return };
            // SAFETY: the caller's contract.
            let row0 = unsafe { (*desc).clip().3 } as i64;
            g.epilogue = Some(EpilogueCall { f: epilogue, bufs, syms, err, row0 });
            // SAFETY: the caller's contract.
            unsafe { gemm(&g, Isa::host()) }
        }
    };
}

entry_epi!(rc_gemm_epi_f32, f32);
entry_epi!(rc_gemm_epi_f64, f64);

// The entry points have the signatures generated code calls them with.
const _: GemmFn<f32> = rc_gemm_f32;
const _: GemmFn<f64> = rc_gemm_f64;
const _: GemmEpiFn<f32> = rc_gemm_epi_f32;
const _: GemmEpiFn<f64> = rc_gemm_epi_f64;

/// Deterministic values in `[-1, 1)` with many distinct roundings (and some exact zeros and
/// negatives), for the kernels' tests.
#[cfg(test)]
pub(crate) fn test_values(n: usize, seed: u64) -> Vec<f64> {
    let mut s = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..n)
        .map(|_| {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            ((s >> 11) as f64 / (1u64 << 53) as f64) * 2.0 - 1.0
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_descriptor_is_fifteen_words() {
        assert_eq!(size_of::<GemmDesc>(), GEMM_DESC_LEN * 8);
    }

    #[test]
    fn clipping_takes_the_rows_of_the_block_and_the_dynamic_counts() {
        let d = GemmDesc {
            row_start: 64,
            row_count: 64,
            m: 128,
            m_dyn: 100,
            n: 10,
            n_dyn: -1,
            k: 9,
            k_dyn: 4,
            ..Default::default()
        };
        assert_eq!(d.clip(), (36, 10, 4, 64));
        let past = GemmDesc {
            row_start: 64,
            row_count: 64,
            m: 128,
            m_dyn: 37,
            n: 1,
            n_dyn: -1,
            k: 1,
            k_dyn: -1,
            ..Default::default()
        };
        assert_eq!(past.clip().0, 0);
    }
}

//! Vectors of lanes for the micro-kernels: one trait over the host's vector registers (and a
//! one-lane scalar for portable code), so each kernel is written once.
//!
//! Every method is `#[inline(always)]`: the kernels are instantiated inside functions compiled
//! with the instruction set's target features, and the intrinsics they call can only be
//! inlined there. An operation on a vector is the same operation on each lane, rounded once per
//! lane, exactly as the scalar code it stands for.

use std::ops::{Add, Mul};

/// The element types the kernels compute in.
pub trait Elem: Copy + Add<Output = Self> + Mul<Output = Self> + 'static {
    /// Zero.
    const ZERO: Self;
    /// `a·b + c` rounded once.
    fn fma(a: Self, b: Self, c: Self) -> Self;
}

impl Elem for f32 {
    const ZERO: f32 = 0.0;
    #[inline(always)]
    fn fma(a: f32, b: f32, c: f32) -> f32 {
        a.mul_add(b, c)
    }
}

impl Elem for f64 {
    const ZERO: f64 = 0.0;
    #[inline(always)]
    fn fma(a: f64, b: f64, c: f64) -> f64 {
        a.mul_add(b, c)
    }
}

/// A vector of `W` lanes of `E`.
pub trait Lanes: Copy {
    /// The element type.
    type E: Elem;
    /// Lanes per vector.
    const W: usize;
    /// All lanes 0.
    ///
    /// # Safety
    /// The host must have the vector's instruction set.
    unsafe fn zero() -> Self;
    /// `W` consecutive elements.
    ///
    /// # Safety
    /// As [`Lanes::zero`]; `p..p+W` must be readable.
    unsafe fn load(p: *const Self::E) -> Self;
    /// Writes `W` consecutive elements.
    ///
    /// # Safety
    /// As [`Lanes::zero`]; `p..p+W` must be writable.
    unsafe fn store(self, p: *mut Self::E);
    /// Every lane `x`.
    ///
    /// # Safety
    /// As [`Lanes::zero`].
    unsafe fn splat(x: Self::E) -> Self;
    /// `a·b + c` per lane, rounded once.
    ///
    /// # Safety
    /// As [`Lanes::zero`].
    unsafe fn fma(a: Self, b: Self, c: Self) -> Self;
    /// `c + a·b` per lane, the product rounded first.
    ///
    /// # Safety
    /// As [`Lanes::zero`].
    unsafe fn mul_add_rounded(a: Self, b: Self, c: Self) -> Self;

    /// Packs `steps × cols` cells whose columns are contiguous along the steps (column `j`
    /// starts at `src + j·col_step`) into `dst`, step by step (`cols` values per step): a
    /// transpose. Copies values only; the vector versions move 8 × 8 blocks through registers.
    ///
    /// # Safety
    /// As [`Lanes::zero`]; the cells must be readable and `dst` must hold `steps × cols`.
    #[inline(always)]
    unsafe fn pack_columns(
        src: *const Self::E,
        col_step: isize,
        steps: usize,
        cols: usize,
        dst: *mut Self::E,
    ) {
        for j in 0..cols {
            // SAFETY: the caller's contract.
            let col = unsafe { src.offset(j as isize * col_step) };
            for p in 0..steps {
                unsafe { *dst.add(p * cols + j) = *col.add(p) };
            }
        }
    }
}

macro_rules! scalar_lanes {
    ($t:ty) => {
        impl Lanes for $t {
            type E = $t;
            const W: usize = 1;
            #[inline(always)]
            unsafe fn zero() -> $t {
                0.0
            }
            #[inline(always)]
            unsafe fn load(p: *const $t) -> $t {
                // SAFETY: the caller's contract.
                unsafe { *p }
            }
            #[inline(always)]
            unsafe fn store(self, p: *mut $t) {
                // SAFETY: the caller's contract.
                unsafe { *p = self }
            }
            #[inline(always)]
            unsafe fn splat(x: $t) -> $t {
                x
            }
            #[inline(always)]
            unsafe fn fma(a: $t, b: $t, c: $t) -> $t {
                a.mul_add(b, c)
            }
            #[inline(always)]
            unsafe fn mul_add_rounded(a: $t, b: $t, c: $t) -> $t {
                c + a * b
            }
        }
    };
}

scalar_lanes!(f32);
scalar_lanes!(f64);

#[cfg(target_arch = "x86_64")]
mod x86 {
    use super::Lanes;
    use std::arch::x86_64::*;

    macro_rules! vector_lanes {
        ($v:ty, $e:ty, $w:expr, $zero:ident, $load:ident, $store:ident, $splat:ident, $fma:ident, $mul:ident, $add:ident $(, pack_columns = $pack:ident)?) => {
            impl Lanes for $v {
                type E = $e;
                const W: usize = $w;
                #[inline(always)]
                unsafe fn zero() -> $v {
                    // SAFETY: the caller's contract (the instruction set).
                    unsafe { $zero() }
                }
                #[inline(always)]
                unsafe fn load(p: *const $e) -> $v {
                    // SAFETY: the caller's contract.
                    unsafe { $load(p) }
                }
                #[inline(always)]
                unsafe fn store(self, p: *mut $e) {
                    // SAFETY: the caller's contract.
                    unsafe { $store(p, self) }
                }
                #[inline(always)]
                unsafe fn splat(x: $e) -> $v {
                    // SAFETY: the caller's contract (the instruction set).
                    unsafe { $splat(x) }
                }
                #[inline(always)]
                unsafe fn fma(a: $v, b: $v, c: $v) -> $v {
                    // SAFETY: the caller's contract (the instruction set).
                    unsafe { $fma(a, b, c) }
                }
                #[inline(always)]
                unsafe fn mul_add_rounded(a: $v, b: $v, c: $v) -> $v {
                    // SAFETY: the caller's contract (the instruction set).
                    unsafe { $add(c, $mul(a, b)) }
                }
                $(
                #[inline(always)]
                unsafe fn pack_columns(
                    src: *const $e,
                    col_step: isize,
                    steps: usize,
                    cols: usize,
                    dst: *mut $e,
                ) {
                    // SAFETY: the caller's contract.
                    unsafe { $pack(src, col_step, steps, cols, dst) }
                }
                )?
            }
        };
    }

    /// The 8 × 8 transpose of [`Lanes::pack_columns`] for f32 (AVX2 shuffles; AVX-512 hosts
    /// have AVX2): whole blocks of 8 columns × 8 steps, the rest one value at a time.
    #[inline(always)]
    unsafe fn pack_columns_f32(
        src: *const f32,
        col_step: isize,
        steps: usize,
        cols: usize,
        dst: *mut f32,
    ) {
        // SAFETY (whole function): the caller's contract ([`Lanes::pack_columns`]).
        unsafe {
            let (whole_cols, whole_steps) = (cols / 8 * 8, steps / 8 * 8);
            for j in (0..whole_cols).step_by(8) {
                let col = |i: usize| src.offset((j + i) as isize * col_step);
                for p in (0..whole_steps).step_by(8) {
                    let r: [__m256; 8] = std::array::from_fn(|i| _mm256_loadu_ps(col(i).add(p)));
                    let t0 = _mm256_unpacklo_ps(r[0], r[1]);
                    let t1 = _mm256_unpackhi_ps(r[0], r[1]);
                    let t2 = _mm256_unpacklo_ps(r[2], r[3]);
                    let t3 = _mm256_unpackhi_ps(r[2], r[3]);
                    let t4 = _mm256_unpacklo_ps(r[4], r[5]);
                    let t5 = _mm256_unpackhi_ps(r[4], r[5]);
                    let t6 = _mm256_unpacklo_ps(r[6], r[7]);
                    let t7 = _mm256_unpackhi_ps(r[6], r[7]);
                    let u0 = _mm256_shuffle_ps::<0x44>(t0, t2);
                    let u1 = _mm256_shuffle_ps::<0xEE>(t0, t2);
                    let u2 = _mm256_shuffle_ps::<0x44>(t1, t3);
                    let u3 = _mm256_shuffle_ps::<0xEE>(t1, t3);
                    let u4 = _mm256_shuffle_ps::<0x44>(t4, t6);
                    let u5 = _mm256_shuffle_ps::<0xEE>(t4, t6);
                    let u6 = _mm256_shuffle_ps::<0x44>(t5, t7);
                    let u7 = _mm256_shuffle_ps::<0xEE>(t5, t7);
                    let o = [
                        _mm256_permute2f128_ps::<0x20>(u0, u4),
                        _mm256_permute2f128_ps::<0x20>(u1, u5),
                        _mm256_permute2f128_ps::<0x20>(u2, u6),
                        _mm256_permute2f128_ps::<0x20>(u3, u7),
                        _mm256_permute2f128_ps::<0x31>(u0, u4),
                        _mm256_permute2f128_ps::<0x31>(u1, u5),
                        _mm256_permute2f128_ps::<0x31>(u2, u6),
                        _mm256_permute2f128_ps::<0x31>(u3, u7),
                    ];
                    for (q, v) in o.iter().enumerate() {
                        _mm256_storeu_ps(dst.add((p + q) * cols + j), *v);
                    }
                }
                for p in whole_steps..steps {
                    for i in 0..8 {
                        *dst.add(p * cols + j + i) = *col(i).add(p);
                    }
                }
            }
            for j in whole_cols..cols {
                let col = src.offset(j as isize * col_step);
                for p in 0..steps {
                    *dst.add(p * cols + j) = *col.add(p);
                }
            }
        }
    }

    vector_lanes!(
        __m256,
        f32,
        8,
        _mm256_setzero_ps,
        _mm256_loadu_ps,
        _mm256_storeu_ps,
        _mm256_set1_ps,
        _mm256_fmadd_ps,
        _mm256_mul_ps,
        _mm256_add_ps,
        pack_columns = pack_columns_f32
    );
    vector_lanes!(
        __m256d,
        f64,
        4,
        _mm256_setzero_pd,
        _mm256_loadu_pd,
        _mm256_storeu_pd,
        _mm256_set1_pd,
        _mm256_fmadd_pd,
        _mm256_mul_pd,
        _mm256_add_pd
    );
    vector_lanes!(
        __m512,
        f32,
        16,
        _mm512_setzero_ps,
        _mm512_loadu_ps,
        _mm512_storeu_ps,
        _mm512_set1_ps,
        _mm512_fmadd_ps,
        _mm512_mul_ps,
        _mm512_add_ps,
        pack_columns = pack_columns_f32
    );
    vector_lanes!(
        __m512d,
        f64,
        8,
        _mm512_setzero_pd,
        _mm512_loadu_pd,
        _mm512_storeu_pd,
        _mm512_set1_pd,
        _mm512_fmadd_pd,
        _mm512_mul_pd,
        _mm512_add_pd
    );
}

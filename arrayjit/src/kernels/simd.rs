//! Vectors of lanes for the micro-kernels: one trait over the host's vector registers (and a
//! one-lane scalar for portable code), so each kernel is written once.
//!
//! Every method is `#[inline(always)]`: the kernels are instantiated inside functions compiled
//! with the instruction set's target features, and the intrinsics they call can only be
//! inlined there. An operation on a vector is the same operation on each lane, rounded once per
//! lane, exactly as the scalar code it stands for.

use super::gemm::Elem;

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
        ($v:ty, $e:ty, $w:expr, $zero:ident, $load:ident, $store:ident, $splat:ident, $fma:ident, $mul:ident, $add:ident) => {
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
            }
        };
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
        _mm256_add_ps
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
        _mm512_add_ps
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

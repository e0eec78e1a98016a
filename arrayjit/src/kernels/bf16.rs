//! Matrix products of bf16 operands into f32, with the host's bf16 dot-product instruction.
//!
//! A product of two bf16 values is exact in f32, and AVX-512 BF16's `vdpbf16ps` adds two such
//! products to an f32 accumulator per lane: 32 multiply-adds per instruction, twice the f32
//! fused multiply-add's 16 (on a 2-vCPU Zen 5: 418 GFLOP/s against 260 on one core). What it
//! computes defines the pairwise product here, on every path and in the interpreter:
//!
//! for each cell, `t := c` (accumulating) or `+0`; then for each pair `p` of the reduction,
//! `t := (t + a[2p+1]·b[2p+1]) + a[2p]·b[2p]`, each addition rounded to nearest even; a missing
//! odd element (odd `k`) is a product of zeros. Subnormal inputs count as zero and subnormal
//! results (of a product or a sum) become zero of the same sign — the instruction's fixed
//! DAZ/FTZ behaviour, which [`reference()`] reproduces, so both paths give the same bits.
//!
//! The sums run in another order than the nest's sequential `fma` (and underflow differently),
//! so, as every half-precision product already, they equal the interpreter's nest within one
//! rounding of the result, not bit for bit.
//!
//! Only hosts with AVX-512 BF16 run it natively; the CPU schedule calls it only there
//! ([`has_native`]), and elsewhere converts the operands to f32 for [`super::gemm()`].

use super::GemmDesc;

/// A product as [`rc_gemm_bf16`] computes it: f32 `C`, bf16 factors as bits (pointers at row
/// 0, column 0 of this call; the `fused` flag is not used: the pairwise product is one
/// definition).
pub type GemmBf16 = super::Gemm<f32, u16>;

/// Whether this host has the bf16 dot-product instruction (detected once).
pub fn has_native() -> bool {
    static HAS: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *HAS.get_or_init(|| {
        #[cfg(target_arch = "x86_64")]
        {
            std::arch::is_x86_feature_detected!("avx512bf16")
                && std::arch::is_x86_feature_detected!("avx512f")
                && std::arch::is_x86_feature_detected!("avx512bw")
                && super::Isa::cap() == super::Isa::Avx512
        }
        #[cfg(not(target_arch = "x86_64"))]
        {
            false
        }
    })
}

/// bf16 bits to f32 (exactly; [`pair_step`] flushes subnormals).
fn widen(h: u16) -> f32 {
    f32::from_bits((h as u32) << 16)
}

/// A subnormal input as zero of its sign (the instruction's DAZ).
fn daz(x: f32) -> f32 {
    ftz(x)
}

/// One pair of the pairwise product, on the values of bf16 factors:
/// `(t + a_odd·b_odd) + a_even·b_even`, as the instruction computes it: a subnormal factor or
/// incoming `t` counts as zero, each product is exact (in f64: two 8-bit significands), each
/// sum is rounded once to f32 and a subnormal sum becomes zero. (Checked against `vdpbf16ps`
/// on millions of lanes chosen to produce subnormals, as well as on normal values.) The one
/// definition the kernel's portable path and the interpreter share.
///
/// ```
/// use rocannl_arrayjit::kernels::bf16::pair_step;
/// assert_eq!(pair_step(1.0, (2.0, 3.0), (0.5, 4.0)), 9.0);
/// ```
pub fn pair_step(t: f32, (a_even, b_even): (f32, f32), (a_odd, b_odd): (f32, f32)) -> f32 {
    let product = |a: f32, b: f32| daz(a) as f64 * daz(b) as f64;
    let t = ftz((daz(t) as f64 + product(a_odd, b_odd)) as f32);
    ftz((t as f64 + product(a_even, b_even)) as f32)
}

/// A subnormal value as zero of its sign (the instruction's FTZ and DAZ).
fn ftz(x: f32) -> f32 {
    if x != 0.0 && x.abs() < f32::MIN_POSITIVE {
        f32::from_bits(x.to_bits() & 0x8000_0000)
    } else {
        x
    }
}

/// The pairwise product cell by cell, as the module documentation defines it: the portable
/// path, and the interpreter's.
///
/// # Safety
/// Every cell the sizes and steps address must be valid; `c` must not overlap `a` or `b`.
pub unsafe fn reference(g: &GemmBf16) {
    for i in 0..g.m as isize {
        for j in 0..g.n as isize {
            // SAFETY (block): the caller's contract.
            let c = unsafe { g.c.offset(i * g.rsc + j * g.csc) };
            let mut t = if g.accumulate { unsafe { *c } } else { 0.0 };
            let cell = |p: usize| -> (f32, f32) {
                if p >= g.k {
                    return (0.0, 0.0);
                }
                let p = p as isize;
                let a = unsafe { *g.a.offset(i * g.rsa + p * g.csa) };
                let b = unsafe { *g.b.offset(p * g.rsb + j * g.csb) };
                (widen(a), widen(b))
            };
            for p in 0..g.k.div_ceil(2) {
                t = pair_step(t, cell(2 * p), cell(2 * p + 1));
            }
            unsafe { *c = t };
        }
    }
}

/// Columns per register tile (two vectors of 16 f32 lanes) and rows per tile.
const NR: usize = 32;
const MR: usize = 8;

/// The product on the host's best path.
///
/// # Safety
/// As [`reference()`].
pub unsafe fn gemm_bf16(g: &GemmBf16) {
    if g.m == 0 || g.n == 0 {
        return;
    }
    #[cfg(target_arch = "x86_64")]
    if has_native() {
        // SAFETY: the instruction set was detected; the caller's contract.
        unsafe { native(g) };
        return;
    }
    // SAFETY: the caller's contract.
    unsafe { reference(g) }
}

thread_local! {
    /// Each thread's packed panels (pairs of `B` along the reduction, pairs of `A`), kept
    /// between calls.
    static PACK: std::cell::RefCell<(Vec<u32>, Vec<u32>)> =
        const { std::cell::RefCell::new((Vec::new(), Vec::new())) };
}

/// `permutex2var` indices taking 16-bit lanes `j` of two vectors (the second's from 32) into
/// pairs `(first[j], second[j])`, for `j` in 0..16 (`LO`) and 16..32 (`HI`).
const INTERLEAVE_LO: [u16; 32] = interleave(0);
const INTERLEAVE_HI: [u16; 32] = interleave(16);

const fn interleave(from: u16) -> [u16; 32] {
    let mut out = [0u16; 32];
    let mut j = 0;
    while j < 16 {
        out[2 * j] = from + j as u16;
        out[2 * j + 1] = 32 + from + j as u16;
        j += 1;
    }
    out
}

/// Two bf16 values as one 32-bit lane: the even element low, the odd one high (the pairing
/// `vdpbf16ps` multiplies lane by lane).
fn pair(even: u16, odd: u16) -> u32 {
    even as u32 | (odd as u32) << 16
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx512bw,avx512bf16")]
unsafe fn native(g: &GemmBf16) {
    use std::arch::x86_64::*;
    let kp = g.k.div_ceil(2);
    let blocks = g.m.div_ceil(MR);
    PACK.with(|pack| {
        let mut pack = pack.borrow_mut();
        let (bp, ap) = &mut *pack;
        bp.resize(kp * NR, 0);
        ap.resize(blocks * kp * MR, 0);
        // SAFETY (block): every read is inside the operands (the caller's contract), every
        // packed index inside the buffers sized above.
        unsafe {
            // A, once per call: per block of MR rows, per pair, MR lanes (rows past the last
            // repeat it; their results are dropped).
            for blk in 0..blocks {
                let dst = ap.as_mut_ptr().add(blk * kp * MR);
                if g.rsa == 1 && (blk + 1) * MR <= g.m {
                    // The block's rows are contiguous (a transposed `A`, as in a weight's
                    // gradient): per pair, MR evens and MR odds, interleaved.
                    let base = g.a.add(blk * MR);
                    for p in 0..kp {
                        let even = _mm_loadu_si128(base.offset((2 * p) as isize * g.csa).cast());
                        let odd = if 2 * p + 1 < g.k {
                            _mm_loadu_si128(base.offset((2 * p + 1) as isize * g.csa).cast())
                        } else {
                            _mm_setzero_si128()
                        };
                        let out = dst.add(p * MR).cast::<__m128i>();
                        _mm_storeu_si128(out, _mm_unpacklo_epi16(even, odd));
                        _mm_storeu_si128(out.add(1), _mm_unpackhi_epi16(even, odd));
                    }
                    continue;
                }
                for r in 0..MR {
                    let i = (blk * MR + r).min(g.m - 1);
                    let row = g.a.offset(i as isize * g.rsa);
                    for p in 0..kp {
                        let even = *row.offset((2 * p) as isize * g.csa);
                        let odd = if 2 * p + 1 < g.k {
                            *row.offset((2 * p + 1) as isize * g.csa)
                        } else {
                            0
                        };
                        *dst.add(p * MR + r) = pair(even, odd);
                    }
                }
            }
            for j0 in (0..g.n).step_by(NR) {
                let nr = NR.min(g.n - j0);
                // B's panel: per pair, NR lanes (zero past the last column), shared by every
                // block of rows. Rows contiguous and a whole panel: two rows of NR values
                // interleaved by two permutes.
                if g.csb == 1 && nr == NR {
                    let lo = _mm512_loadu_si512(INTERLEAVE_LO.as_ptr().cast());
                    let hi = _mm512_loadu_si512(INTERLEAVE_HI.as_ptr().cast());
                    for p in 0..kp {
                        let row = |q: usize| g.b.offset(q as isize * g.rsb + j0 as isize);
                        let even = _mm512_loadu_si512(row(2 * p).cast());
                        let odd = if 2 * p + 1 < g.k {
                            _mm512_loadu_si512(row(2 * p + 1).cast())
                        } else {
                            _mm512_setzero_si512()
                        };
                        let dst = bp.as_mut_ptr().add(p * NR).cast::<__m512i>();
                        _mm512_storeu_si512(dst, _mm512_permutex2var_epi16(even, lo, odd));
                        _mm512_storeu_si512(dst.add(1), _mm512_permutex2var_epi16(even, hi, odd));
                    }
                }
                for p in (0..kp).filter(|_| !(g.csb == 1 && nr == NR)) {
                    let even = g.b.offset((2 * p) as isize * g.rsb + j0 as isize * g.csb);
                    // Past the last row for an odd reduction: computed, never read.
                    let odd =
                        g.b.wrapping_offset((2 * p + 1) as isize * g.rsb + j0 as isize * g.csb);
                    let dst = bp.as_mut_ptr().add(p * NR);
                    for j in 0..NR {
                        *dst.add(j) = if j >= nr {
                            0
                        } else if 2 * p + 1 < g.k {
                            pair(*even.offset(j as isize * g.csb), *odd.offset(j as isize * g.csb))
                        } else {
                            pair(*even.offset(j as isize * g.csb), 0)
                        };
                    }
                }
                for blk in 0..blocks {
                    let i0 = blk * MR;
                    let mr = MR.min(g.m - i0);
                    let apk = ap.as_ptr().add(blk * kp * MR);
                    let mut acc = [[_mm512_setzero_ps(); 2]; MR];
                    let whole = nr == NR && g.csc == 1;
                    if g.accumulate {
                        for (r, row) in acc.iter_mut().enumerate().take(mr) {
                            let c = g.c.offset((i0 + r) as isize * g.rsc + j0 as isize * g.csc);
                            for (v, x) in row.iter_mut().enumerate() {
                                *x = if whole {
                                    _mm512_loadu_ps(c.add(16 * v))
                                } else {
                                    let mut lanes = [0f32; 16];
                                    for (l, lane) in lanes.iter_mut().enumerate() {
                                        let j = 16 * v + l;
                                        if j < nr {
                                            *lane = *c.offset(j as isize * g.csc);
                                        }
                                    }
                                    _mm512_loadu_ps(lanes.as_ptr())
                                };
                            }
                        }
                    }
                    for p in 0..kp {
                        let b0: __m512bh =
                            std::mem::transmute(_mm512_loadu_si512(bp.as_ptr().add(p * NR).cast()));
                        let b1: __m512bh = std::mem::transmute(_mm512_loadu_si512(
                            bp.as_ptr().add(p * NR + 16).cast(),
                        ));
                        for (r, row) in acc.iter_mut().enumerate() {
                            let a: __m512bh =
                                std::mem::transmute(_mm512_set1_epi32(*apk.add(p * MR + r) as i32));
                            row[0] = _mm512_dpbf16_ps(row[0], a, b0);
                            row[1] = _mm512_dpbf16_ps(row[1], a, b1);
                        }
                    }
                    for (r, row) in acc.iter().enumerate().take(mr) {
                        let c = g.c.offset((i0 + r) as isize * g.rsc + j0 as isize * g.csc);
                        for (v, x) in row.iter().enumerate() {
                            if whole {
                                _mm512_storeu_ps(c.add(16 * v), *x);
                            } else {
                                let mut lanes = [0f32; 16];
                                _mm512_storeu_ps(lanes.as_mut_ptr(), *x);
                                for (l, lane) in lanes.iter().enumerate() {
                                    let j = 16 * v + l;
                                    if j < nr {
                                        *c.offset(j as isize * g.csc) = *lane;
                                    }
                                }
                            }
                        }
                    }
                }
            }
        }
    });
}

/// The entry point generated code calls (through the run table): `C (+)= A·B` with bf16 `A`
/// and `B` and an f32 `C`, as the descriptor says (its fused flag is ignored: the pairwise
/// product is one definition).
///
/// # Safety
/// `desc` must point at a descriptor; every cell its sizes and steps address from the three
/// pointers must be valid for the access, and `c`'s cells must not overlap `a`'s or `b`'s.
pub unsafe extern "C" fn rc_gemm_bf16(
    c: *mut f32,
    a: *const u16,
    b: *const u16,
    desc: *const GemmDesc,
) {
    // SAFETY: the caller's contract (the descriptor, and its first row inside `c` and `a`).
    let Some(g) = (unsafe { (*desc).product(c, a, b) }) else { return };
    // SAFETY: the caller's contract.
    unsafe { gemm_bf16(&g) }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn bits(x: f32) -> u16 {
        half::bf16::from_f32(x).to_bits()
    }

    /// Runs `f` on an `m × k` by `k × n` product (B transposed when asked, and A when `m` is
    /// even) and returns C.
    fn run(m: usize, k: usize, n: usize, bt: bool, acc: bool, f: unsafe fn(&GemmBf16)) -> Vec<f32> {
        let a: Vec<u16> = (0..m * k)
            .map(|i| bits((crate::ops::uniform(1, i as u64) * 4.0 - 2.0) as f32))
            .collect();
        let b: Vec<u16> = (0..k * n)
            .map(|i| bits((crate::ops::uniform(2, i as u64) * 4.0 - 2.0) as f32))
            .collect();
        let mut c: Vec<f32> = (0..m * n).map(|i| crate::ops::uniform(3, i as u64) as f32).collect();
        let (rsb, csb) = if bt { (1, k as isize) } else { (n as isize, 1) };
        let (rsa, csa) = if m.is_multiple_of(2) { (1, m as isize) } else { (k as isize, 1) };
        let g = GemmBf16 {
            m,
            n,
            k,
            a: a.as_ptr(),
            rsa,
            csa,
            b: b.as_ptr(),
            rsb,
            csb,
            c: c.as_mut_ptr(),
            rsc: n as isize,
            csc: 1,
            accumulate: acc,
            fused: false,
            epilogue: None,
        };
        // SAFETY: the buffers hold every cell the sizes address.
        unsafe { f(&g) };
        c
    }

    #[test]
    fn the_native_product_gives_the_reference_bits() {
        if !has_native() {
            eprintln!("no AVX-512 BF16 here: the native path is not tested");
            return;
        }
        for (m, k, n) in [
            (1, 1, 1),
            (8, 2, 32),
            (9, 7, 33),
            (17, 64, 70),
            (64, 257, 96),
            (3, 300, 5),
            (34, 513, 64),
            (16, 9, 65),
        ] {
            for bt in [false, true] {
                for acc in [false, true] {
                    let want = run(m, k, n, bt, acc, reference);
                    let got = run(m, k, n, bt, acc, native_entry);
                    let same = got.iter().zip(&want).all(|(x, y)| x.to_bits() == y.to_bits());
                    assert!(same, "{m}x{k}x{n} bt {bt} acc {acc}");
                }
            }
        }
    }

    #[test]
    fn the_native_product_gives_the_reference_bits_near_the_bottom_of_the_range() {
        if !has_native() {
            return;
        }
        // Factors down to subnormal bf16, accumulators down to subnormal f32: products and
        // sums underflow.
        let (m, k, n) = (9, 35, 40);
        let draw = |seed, i: usize, lo: u32, span: u32| -> u16 {
            let u = crate::ops::uniform(seed, i as u64);
            let e = lo + (u * span as f64) as u32;
            let mantissa = (crate::ops::uniform(seed + 7, i as u64) * 128.0) as u32;
            ((e << 7 | mantissa) as u16) | if i.is_multiple_of(3) { 0x8000 } else { 0 }
        };
        let a: Vec<u16> = (0..m * k).map(|i| draw(11, i, 0, 70)).collect();
        let b: Vec<u16> = (0..k * n).map(|i| draw(12, i, 40, 60)).collect();
        let c0: Vec<f32> = (0..m * n)
            .map(|i| f32::from_bits((draw(13, i, 0, 8) as u32) << 16 | i as u32 & 0xffff))
            .collect();
        let run = |f: unsafe fn(&GemmBf16)| {
            let mut c = c0.clone();
            let g = GemmBf16 {
                m,
                n,
                k,
                a: a.as_ptr(),
                rsa: k as isize,
                csa: 1,
                b: b.as_ptr(),
                rsb: n as isize,
                csb: 1,
                c: c.as_mut_ptr(),
                rsc: n as isize,
                csc: 1,
                accumulate: true,
                fused: false,
                epilogue: None,
            };
            // SAFETY: the buffers hold every cell the sizes address.
            unsafe { f(&g) };
            c.iter().map(|x| x.to_bits()).collect::<Vec<_>>()
        };
        assert_eq!(run(native_entry), run(reference));
    }

    unsafe fn native_entry(g: &GemmBf16) {
        // SAFETY: the test checked the instruction set; the caller's contract.
        #[cfg(target_arch = "x86_64")]
        unsafe {
            native(g)
        }
    }

    #[test]
    fn the_reference_is_the_pairwise_sum_and_close_to_exact() {
        let (m, k, n) = (5, 37, 6);
        let c = run(m, k, n, false, false, reference);
        // Within a few roundings of the exact (f64) sum of the same bf16 products.
        let a: Vec<f32> = (0..m * k)
            .map(|i| widen(bits((crate::ops::uniform(1, i as u64) * 4.0 - 2.0) as f32)))
            .collect();
        let b: Vec<f32> = (0..k * n)
            .map(|i| widen(bits((crate::ops::uniform(2, i as u64) * 4.0 - 2.0) as f32)))
            .collect();
        for i in 0..m {
            for j in 0..n {
                let exact: f64 = (0..k).map(|p| a[i * k + p] as f64 * b[p * n + j] as f64).sum();
                let scale: f64 = (0..k).map(|p| (a[i * k + p] * b[p * n + j]).abs() as f64).sum();
                assert!((c[i * n + j] as f64 - exact).abs() <= scale * 1e-6, "cell {i},{j}");
            }
        }
        // Subnormal inputs count as zero, a subnormal sum becomes zero.
        assert_eq!(daz(widen(1)), 0.0);
        assert_eq!(ftz(1e-40).to_bits(), 0);
        assert_eq!(ftz(-1e-40).to_bits(), 0x8000_0000);
    }
}

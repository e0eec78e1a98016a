//! Matrix products of bf16 operands into f32 (or into bf16, rounded once per cell), with the
//! host's bf16 dot-product instruction.
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

/// The same product into a bf16 `C` ([`super::GEMM_BF16_RESULT`]): each cell's f32 sum is
/// rounded once when stored, as a product into an f32 buffer copied into the bf16 result would
/// be, without the buffer and the copy.
pub type GemmBf16Rounded = super::Gemm<u16, u16>;

/// A cell of the product's result: f32, or bf16 bits. A bf16 cell is read exactly and written
/// rounded to nearest even with NaN kept a (quiet) NaN, bit for bit as the `half` crate (and so
/// the interpreter) rounds: `(x + 0x7fff + lsb) >> 16`, or `(x >> 16) | 0x40` for a NaN.
pub trait ResultCell: Copy + 'static {
    /// The cell's value.
    fn get(self) -> f32;
    /// A value as a cell.
    fn put(x: f32) -> Self;
    /// Sixteen consecutive cells' values.
    ///
    /// # Safety
    /// The sixteen cells must be readable; the host must have AVX-512 (F and BW).
    #[cfg(target_arch = "x86_64")]
    unsafe fn load16(p: *const Self) -> std::arch::x86_64::__m512;
    /// Writes sixteen consecutive cells.
    ///
    /// # Safety
    /// The sixteen cells must be writable; the host must have AVX-512 (F and BW).
    #[cfg(target_arch = "x86_64")]
    unsafe fn store16(p: *mut Self, v: std::arch::x86_64::__m512);
}

impl ResultCell for f32 {
    fn get(self) -> f32 {
        self
    }
    fn put(x: f32) -> f32 {
        x
    }
    #[cfg(target_arch = "x86_64")]
    #[inline]
    #[target_feature(enable = "avx512f")]
    unsafe fn load16(p: *const f32) -> std::arch::x86_64::__m512 {
        // SAFETY: the caller's contract.
        unsafe { std::arch::x86_64::_mm512_loadu_ps(p) }
    }
    #[cfg(target_arch = "x86_64")]
    #[inline]
    #[target_feature(enable = "avx512f")]
    unsafe fn store16(p: *mut f32, v: std::arch::x86_64::__m512) {
        // SAFETY: the caller's contract.
        unsafe { std::arch::x86_64::_mm512_storeu_ps(p, v) }
    }
}

impl ResultCell for u16 {
    fn get(self) -> f32 {
        widen(self)
    }
    fn put(x: f32) -> u16 {
        half::bf16::from_f32(x).to_bits()
    }
    #[cfg(target_arch = "x86_64")]
    #[inline]
    #[target_feature(enable = "avx512f,avx512bw")]
    unsafe fn load16(p: *const u16) -> std::arch::x86_64::__m512 {
        use std::arch::x86_64::*;
        // SAFETY: the caller's contract.
        unsafe {
            let h = _mm256_loadu_si256(p.cast());
            _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16))
        }
    }
    #[cfg(target_arch = "x86_64")]
    #[inline]
    #[target_feature(enable = "avx512f,avx512bw")]
    unsafe fn store16(p: *mut u16, v: std::arch::x86_64::__m512) {
        use std::arch::x86_64::*;
        // SAFETY: the caller's contract.
        unsafe {
            let x = _mm512_castps_si512(v);
            let hi = _mm512_srli_epi32(x, 16);
            let lsb = _mm512_and_si512(hi, _mm512_set1_epi32(1));
            let biased = _mm512_add_epi32(_mm512_add_epi32(x, _mm512_set1_epi32(0x7fff)), lsb);
            let rounded = _mm512_srli_epi32(biased, 16);
            let nan = _mm512_cmp_ps_mask(v, v, _CMP_UNORD_Q);
            let quiet = _mm512_or_si512(hi, _mm512_set1_epi32(0x40));
            let bits = _mm512_mask_blend_epi32(nan, rounded, quiet);
            _mm256_storeu_si256(p.cast(), _mm512_cvtepi32_epi16(bits));
        }
    }
}

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
pub unsafe fn reference<C: ResultCell>(g: &super::Gemm<C, u16>) {
    for i in 0..g.m as isize {
        for j in 0..g.n as isize {
            // SAFETY (block): the caller's contract.
            let c = unsafe { g.c.offset(i * g.rsc + j * g.csc) };
            let mut t = if g.accumulate { unsafe { (*c).get() } } else { 0.0 };
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
            unsafe { *c = C::put(t) };
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
pub unsafe fn gemm_bf16<C: ResultCell>(g: &super::Gemm<C, u16>) {
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
unsafe fn native<C: ResultCell>(g: &super::Gemm<C, u16>) {
    // Kept whole: a register-tiled SIMD kernel, whose loop structure must be read at once.
    use std::arch::x86_64::*;
    let kp = g.k.div_ceil(2);
    let blocks = g.m.div_ceil(MR);
    // Rows of `A` contiguous along an even reduction already hold their pairs, even element
    // low, as consecutive 32-bit words: the kernel reads them where they are.
    let direct = g.csa == 1 && g.k.is_multiple_of(2);
    PACK.with(|pack| {
        let mut pack = pack.borrow_mut();
        let (bp, ap) = &mut *pack;
        bp.resize(kp * NR, 0);
        ap.resize(if direct { 0 } else { blocks * kp * MR }, 0);
        // SAFETY (block): every read is inside the operands (the caller's contract), every
        // packed index inside the buffers sized above.
        unsafe {
            // A, once per call unless read directly: per block of MR rows, per pair, MR lanes
            // (rows past the last repeat it; their results are dropped).
            for blk in (0..blocks).filter(|_| !direct) {
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
                    // Where row `r`'s pair `p` is: `arow[r] + p * astep`.
                    let (arow, astep): ([*const u32; MR], usize) = if direct {
                        let row = |r: usize| {
                            let i = (i0 + r).min(g.m - 1);
                            g.a.offset(i as isize * g.rsa).cast::<u32>()
                        };
                        (std::array::from_fn(row), 1)
                    } else {
                        let apk = ap.as_ptr().add(blk * kp * MR);
                        (std::array::from_fn(|r| apk.add(r)), MR)
                    };
                    let mut acc = [[_mm512_setzero_ps(); 2]; MR];
                    let whole = nr == NR && g.csc == 1;
                    if g.accumulate {
                        for (r, row) in acc.iter_mut().enumerate().take(mr) {
                            let c = g.c.offset((i0 + r) as isize * g.rsc + j0 as isize * g.csc);
                            for (v, x) in row.iter_mut().enumerate() {
                                *x = if whole {
                                    C::load16(c.add(16 * v))
                                } else {
                                    let mut lanes = [0f32; 16];
                                    for (l, lane) in lanes.iter_mut().enumerate() {
                                        let j = 16 * v + l;
                                        if j < nr {
                                            *lane = (*c.offset(j as isize * g.csc)).get();
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
                            let pair = arow[r].add(p * astep).read_unaligned();
                            let a: __m512bh = std::mem::transmute(_mm512_set1_epi32(pair as i32));
                            row[0] = _mm512_dpbf16_ps(row[0], a, b0);
                            row[1] = _mm512_dpbf16_ps(row[1], a, b1);
                        }
                    }
                    for (r, row) in acc.iter().enumerate().take(mr) {
                        let c = g.c.offset((i0 + r) as isize * g.rsc + j0 as isize * g.csc);
                        for (v, x) in row.iter().enumerate() {
                            if whole {
                                C::store16(c.add(16 * v), *x);
                            } else {
                                let mut lanes = [0f32; 16];
                                _mm512_storeu_ps(lanes.as_mut_ptr(), *x);
                                for (l, lane) in lanes.iter().enumerate() {
                                    let j = 16 * v + l;
                                    if j < nr {
                                        *c.offset(j as isize * g.csc) = C::put(*lane);
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
/// and `B` and an f32 `C` — or a bf16 `C` when the descriptor has
/// [`super::GEMM_BF16_RESULT`] (`c` then points at bf16 cells) — as the descriptor says (its
/// fused flag is ignored: the pairwise product is one definition).
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
    // SAFETY (block): the caller's contract (the descriptor, and its first row inside `c` and
    // `a`, in `c`'s cell type).
    unsafe {
        if (*desc).flags & super::GEMM_BF16_RESULT != 0 {
            let Some(g) = (*desc).product(c.cast::<u16>(), a, b) else { return };
            gemm_bf16(&g)
        } else {
            let Some(g) = (*desc).product(c, a, b) else { return };
            gemm_bf16(&g)
        }
    }
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
        let g = product((m, k, n), (&a, rsa, csa), (&b, rsb, csb), &mut c, acc);
        // SAFETY: the buffers hold every cell the sizes address.
        unsafe { f(&g) };
        c
    }

    /// An `m × k` by `k × n` product into a row-major `c`, with the factors' steps given.
    fn product(
        (m, k, n): (usize, usize, usize),
        (a, rsa, csa): (&[u16], isize, isize),
        (b, rsb, csb): (&[u16], isize, isize),
        c: &mut [f32],
        accumulate: bool,
    ) -> GemmBf16 {
        GemmBf16 {
            rsa,
            csa,
            rsb,
            csb,
            accumulate,
            ..GemmBf16::row_major(m, k, n, a.as_ptr(), b.as_ptr(), c.as_mut_ptr())
        }
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

    /// Rows of `A` read in place (contiguous along an even reduction) at odd row steps and an
    /// odd start, so that the 32-bit pairs are not aligned, with a last block of rows cut short.
    #[test]
    fn the_native_product_reads_unaligned_rows_of_a_in_place() {
        if !has_native() {
            return;
        }
        let (m, k, n) = (11, 36, 40);
        let rsa = k + 3;
        let a: Vec<u16> = (0..1 + m * rsa)
            .map(|i| bits((crate::ops::uniform(4, i as u64) * 4.0 - 2.0) as f32))
            .collect();
        let b: Vec<u16> = (0..k * n)
            .map(|i| bits((crate::ops::uniform(5, i as u64) * 4.0 - 2.0) as f32))
            .collect();
        for acc in [false, true] {
            let run = |f: unsafe fn(&GemmBf16)| {
                let mut c: Vec<f32> =
                    (0..m * n).map(|i| crate::ops::uniform(6, i as u64) as f32).collect();
                let g = product(
                    (m, k, n),
                    (&a[1..], rsa as isize, 1),
                    (&b, n as isize, 1),
                    &mut c,
                    acc,
                );
                // SAFETY: the buffers hold every cell the sizes and steps address.
                unsafe { f(&g) };
                c
            };
            let (want, got) = (run(reference), run(native_entry));
            assert!(got.iter().zip(&want).all(|(x, y)| x.to_bits() == y.to_bits()), "acc {acc}");
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
                accumulate: true,
                ..GemmBf16::row_major(m, k, n, a.as_ptr(), b.as_ptr(), c.as_mut_ptr())
            };
            // SAFETY: the buffers hold every cell the sizes address.
            unsafe { f(&g) };
            c.iter().map(|x| x.to_bits()).collect::<Vec<_>>()
        };
        assert_eq!(run(native_entry), run(reference));
    }

    /// A bf16 result ([`GemmBf16Rounded`]) is the f32 result rounded once per cell, on both
    /// paths, accumulating onto bf16 cells or not, with values that overflow to infinities and
    /// make NaN (whose rounding keeps them quiet NaN).
    #[test]
    fn the_rounded_result_is_the_f32_result_rounded_once() {
        for (m, k, n) in [(1, 1, 1), (9, 7, 33), (17, 64, 70), (8, 130, 32), (16, 9, 65)] {
            let mut a: Vec<u16> = (0..m * k)
                .map(|i| bits((crate::ops::uniform(1, i as u64) * 4.0 - 2.0) as f32))
                .collect();
            let mut b: Vec<u16> = (0..k * n)
                .map(|i| bits((crate::ops::uniform(2, i as u64) * 4.0 - 2.0) as f32))
                .collect();
            // Infinite factors in A's first row against 2 in B's first rows: infinite
            // products of both signs, NaN where they meet; huge ones in the second row, whose
            // sums overflow.
            for (p, x) in a.iter_mut().take(k.min(4)).enumerate() {
                *x = bits(if p % 2 == 0 { f32::INFINITY } else { f32::NEG_INFINITY });
            }
            for x in a.iter_mut().skip(k).take(k.min(4)) {
                *x = bits(3e38);
            }
            b.iter_mut().take(n * k.min(4)).for_each(|x| *x = bits(2.0));
            let c0: Vec<u16> =
                (0..m * n).map(|i| bits(crate::ops::uniform(3, i as u64) as f32 - 0.5)).collect();
            for acc in [false, true] {
                // Row-major `A · B` into `c`, whatever `c`'s cells.
                fn row_major<C>(
                    (m, k, n): (usize, usize, usize),
                    (a, b): (&[u16], &[u16]),
                    c: *mut C,
                    accumulate: bool,
                ) -> super::super::Gemm<C, u16> {
                    super::super::Gemm {
                        accumulate,
                        ..super::super::Gemm::row_major(m, k, n, a.as_ptr(), b.as_ptr(), c)
                    }
                }
                let product =
                    |c: *mut u16| -> GemmBf16Rounded { row_major((m, k, n), (&a, &b), c, acc) };
                let mut wide: Vec<f32> = c0.iter().map(|h| widen(*h)).collect();
                let g: GemmBf16 = super::super::Gemm {
                    c: wide.as_mut_ptr(),
                    ..row_major((m, k, n), (&a, &b), std::ptr::null_mut::<f32>(), acc)
                };
                // SAFETY: the buffers hold every cell the sizes address.
                unsafe { reference(&g) };
                let want: Vec<u16> = wide.iter().map(|x| bits(*x)).collect();
                if k >= 2 {
                    assert!(want.iter().any(|h| h & 0x7fff > 0x7f80), "a NaN among the results");
                }
                let mut got = c0.clone();
                // SAFETY: as above.
                unsafe { reference(&product(got.as_mut_ptr())) };
                assert_eq!(got, want, "reference {m}x{k}x{n} acc {acc}");
                if has_native() {
                    let mut got = c0.clone();
                    // SAFETY: as above; the instruction set was detected.
                    #[cfg(target_arch = "x86_64")]
                    unsafe {
                        native(&product(got.as_mut_ptr()))
                    };
                    assert_eq!(got, want, "native {m}x{k}x{n} acc {acc}");
                }
            }
        }
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

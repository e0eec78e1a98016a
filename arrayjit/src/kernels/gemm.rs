//! The matrix product `C (+)= A·B` over strided operands: packed panels of `B`, a
//! register-tiled micro-kernel, cache blocking.
//!
//! The classic structure (Goto and van de Geijn), minus the packing of `A`: the reduction is cut
//! into blocks of `KC` steps and the columns into blocks of `NC`; for each, a block of `B` is
//! copied into panels of `NR` columns laid out step by step (every layout of `B` — transposed,
//! strided, broadcast with step 0 — becomes the same contiguous stream, so the backward pass's
//! `A·Bᵀ` needs no transpose of its own); the micro-kernel keeps an `MR × NR` tile of `C` in
//! registers and, for each step, adds `MR` values of `A` (broadcast, read in place through one
//! pointer per row, any steps) times one panel row of `B`. Rows are taken in blocks of `MC` so
//! that the rows of `A` a block reads stay in L2 while every panel of `B` passes over them.
//! (Packing a row-major `A` as well bought nothing measurable at these sizes: its rows are read
//! as `MR` sequential streams.) A transposed `A` — a weight's gradient `Xᵀ·dY`, its rows `X`'s
//! columns — is read one cache line per step, a row of `X` apart; when that step is more than
//! 2 KiB (one or two steps per page), each block of rows is first copied into panels of `MR`
//! rows laid out step by step.
//!
//! Exactness: a cell's steps are applied in reduction order, block after block (a block
//! starts from the cell's value stored by the previous one, which is exact), each step one
//! `fma` or a rounded product then a rounded add, as the nest it replaces says. Panels are
//! padded with zeros past the edges and the rows of `A` past its last repeat that row; those
//! cells are computed and thrown away.

use std::cell::RefCell;

use super::Isa;
pub use super::simd::Elem;
use super::simd::Lanes;

/// A product `C (+)= A·B`: `C` has `m` rows and `n` columns, `A` `m` rows and `k` columns, `B`
/// `k` rows and `n` columns; `rs*` and `cs*` are the steps (in elements) between rows and
/// between columns of each operand, any sign, 0 for a broadcast.
#[derive(Copy, Clone, Debug)]
pub struct Gemm<T, F = T> {
    /// Rows of `C` and `A`.
    pub m: usize,
    /// Columns of `C` and `B`.
    pub n: usize,
    /// The reduction: columns of `A`, rows of `B`.
    pub k: usize,
    /// `A`'s first cell.
    pub a: *const F,
    /// `A`'s row step.
    pub rsa: isize,
    /// `A`'s column step.
    pub csa: isize,
    /// `B`'s first cell.
    pub b: *const F,
    /// `B`'s row step.
    pub rsb: isize,
    /// `B`'s column step.
    pub csb: isize,
    /// `C`'s first cell.
    pub c: *mut T,
    /// `C`'s row step.
    pub rsc: isize,
    /// `C`'s column step.
    pub csc: isize,
    /// Each cell starts from its old value (else from 0).
    pub accumulate: bool,
    /// Each step is one fused multiply-add (else a rounded product, then a rounded sum).
    pub fused: bool,
    /// Work to run on each strip of `C` as it becomes final.
    pub epilogue: Option<EpilogueCall>,
}

impl<T, F> Gemm<T, F> {
    /// A product of contiguous row-major operands (`A` `m × k`, `B` `k × n`, `C` `m × n`) that
    /// starts each cell from 0, rounds each product and has no epilogue; other steps and
    /// settings by struct update (`Gemm { accumulate: true, ..Gemm::row_major(..) }`).
    pub fn row_major(m: usize, k: usize, n: usize, a: *const F, b: *const F, c: *mut T) -> Self {
        Gemm {
            m,
            n,
            k,
            a,
            rsa: k as isize,
            csa: 1,
            b,
            rsb: n as isize,
            csb: 1,
            c,
            rsc: n as isize,
            csc: 1,
            accumulate: false,
            fused: false,
            epilogue: None,
        }
    }
}

/// The signature of generated epilogue code: `(bufs, syms, row0, row1, err, col0, col1)` runs
/// the epilogue on rows `row0..row1` × columns `col0..col1` of the product (counted from the
/// product's row 0, not the call's first row); `bufs`, `syms` and `err` are the calling step's.
pub type EpilogueFn = unsafe extern "C" fn(*mut *mut u8, *const i64, i64, i64, *mut u8, i64, i64);

/// An epilogue as a call hands it to the product: the generated function and the calling
/// step's arguments.
#[derive(Copy, Clone, Debug)]
pub struct EpilogueCall {
    /// The generated code.
    pub f: EpilogueFn,
    /// The step's buffer table.
    pub bufs: *mut *mut u8,
    /// The step's runtime symbols.
    pub syms: *const i64,
    /// The step's run table.
    pub err: *mut u8,
    /// The product's row of `C`'s first row (a call of one block of rows starts past 0).
    pub row0: i64,
}

impl EpilogueCall {
    /// Runs the epilogue on rows `i0..i1` and columns `j0..j1` of this call.
    ///
    /// # Safety
    /// The generated code's contract: the cells must be final, the buffers those it was built
    /// for.
    #[inline]
    unsafe fn run(&self, i0: usize, i1: usize, j0: usize, j1: usize) {
        let r = self.row0;
        // SAFETY: the caller's contract.
        unsafe {
            (self.f)(
                self.bufs,
                self.syms,
                r + i0 as i64,
                r + i1 as i64,
                self.err,
                j0 as i64,
                j1 as i64,
            )
        }
    }
}

/// The cache blocking: reduction steps per block, rows of `A` per packed block, columns of `B`
/// per packed block.
#[derive(Copy, Clone, Debug)]
struct Blocking {
    kc: usize,
    mc: usize,
    nc: usize,
}

/// Sized for 32–48 KiB of L1 and 1–2 MiB of L2 per core: a `B` panel (`KC × NR`) stays in L1
/// while an `A` block (`MC × KC`, 96 KiB in f32) stays in L2; the `B` block (`KC × NC`) is
/// reused by every row block.
const BLOCKING_F32: Blocking = Blocking { kc: 256, mc: 96, nc: 1024 };
const BLOCKING_F64: Blocking = Blocking { kc: 192, mc: 96, nc: 512 };

/// The step between reduction steps of `A`, in bytes, beyond which a block of a transposed `A`
/// is packed ([`pack_a`]): one or two steps per 4 KiB page, each step a cache line and a page
/// the stream of one tile has to bring in. Alternated in one process on the 2-vCPU Xeon
/// (family 6 model 207), one thread, weight gradients `m × k · k × n` with `A` stored `k × m`,
/// in place ÷ packed time: `m` = 128, 0.81 (n 128) and 0.99 (n 512); `m` = 512, 0.91; `m` =
/// 768, 1.06; `m` = 1024, 1.18; `m` = 1536, 1.13 and 1.16; `m` = 2048, 1.29.
const PACK_A_STEP: usize = 2048;

/// Computes the product with the kernels of `isa`, which must be available on this host
/// ([`Isa::available`]); the host's best is [`Isa::host`].
///
/// # Safety
/// Every cell the sizes and strides address must be valid for the access, and `C`'s cells
/// must not overlap `A`'s or `B`'s (nor, for distinct `(row, column)`, each other).
pub unsafe fn gemm<T: Kernels>(g: &Gemm<T>, isa: Isa) {
    // SAFETY: the caller's contract; the instruction set is checked below.
    unsafe {
        match isa {
            #[cfg(target_arch = "x86_64")]
            Isa::Avx512 if std::arch::is_x86_feature_detected!("avx512f") => T::avx512(g),
            #[cfg(target_arch = "x86_64")]
            Isa::Avx2 if std::arch::is_x86_feature_detected!("fma") => T::avx2(g),
            _ => T::generic(g),
        }
    }
}

/// The kernels of one element type, one per instruction set.
pub trait Kernels: Elem {
    /// Portable.
    ///
    /// # Safety
    /// As [`gemm`].
    unsafe fn generic(g: &Gemm<Self>);
    /// AVX2 + FMA; the host must have them.
    ///
    /// # Safety
    /// As [`gemm`].
    unsafe fn avx2(g: &Gemm<Self>);
    /// AVX-512 F; the host must have it.
    ///
    /// # Safety
    /// As [`gemm`].
    unsafe fn avx512(g: &Gemm<Self>);
}

macro_rules! kernels {
    ($t:ty, $blk:expr, $generic:ty, $avx2:ty, $avx512:ty) => {
        impl Kernels for $t {
            unsafe fn generic(g: &Gemm<$t>) {
                // SAFETY: the caller's contract.
                unsafe { driver::<$t, $generic, 4>(g, $blk) }
            }

            unsafe fn avx2(g: &Gemm<$t>) {
                #[cfg(target_arch = "x86_64")]
                #[target_feature(enable = "avx2,fma")]
                unsafe fn go(g: &Gemm<$t>) {
                    // SAFETY: the caller's contract.
                    unsafe { driver::<$t, $avx2, 6>(g, $blk) }
                }
                #[cfg(not(target_arch = "x86_64"))]
                unsafe fn go(g: &Gemm<$t>) {
                    // SAFETY: the caller's contract.
                    unsafe { Self::generic(g) }
                }
                // SAFETY: the caller's contract (the host has the features).
                unsafe { go(g) }
            }

            unsafe fn avx512(g: &Gemm<$t>) {
                #[cfg(target_arch = "x86_64")]
                #[target_feature(enable = "avx512f,avx2,fma")]
                unsafe fn go(g: &Gemm<$t>) {
                    // SAFETY: the caller's contract.
                    unsafe { driver::<$t, $avx512, 8>(g, $blk) }
                }
                #[cfg(not(target_arch = "x86_64"))]
                unsafe fn go(g: &Gemm<$t>) {
                    // SAFETY: the caller's contract.
                    unsafe { Self::generic(g) }
                }
                // SAFETY: the caller's contract (the host has the features).
                unsafe { go(g) }
            }
        }
    };
}

// Register tiles, rows × two vectors of columns: AVX-512 has 32 vector registers, so 8 rows
// (16 accumulators, plus the `B` row and a broadcast); AVX2 has 16, so 6 rows (12
// accumulators). Portable code: 4 rows × 2 scalars.
#[cfg(target_arch = "x86_64")]
kernels!(f32, BLOCKING_F32, f32, std::arch::x86_64::__m256, std::arch::x86_64::__m512);
#[cfg(target_arch = "x86_64")]
kernels!(f64, BLOCKING_F64, f64, std::arch::x86_64::__m256d, std::arch::x86_64::__m512d);
#[cfg(not(target_arch = "x86_64"))]
kernels!(f32, BLOCKING_F32, f32, f32, f32);
#[cfg(not(target_arch = "x86_64"))]
kernels!(f64, BLOCKING_F64, f64, f64, f64);

/// Columns per call of an epilogue (at least; whole register tiles): long enough rows for the
/// generated code's vector loops, few enough cells to stay in the first-level cache.
const EPILOGUE_COLS: usize = 128;

/// Vectors of columns per register tile.
const NV: usize = 2;
/// The most cells of a register tile (for the edge tiles' buffer).
const MAX_TILE: usize = 8 * 2 * 16;

/// A cache line of zeros: the unit of the packing buffer, so that every packed panel row
/// starts on a line and a vector load never straddles two.
#[derive(Copy, Clone)]
#[repr(C, align(64))]
struct Line([u64; 8]);

thread_local! {
    /// Each thread's packing buffer (a block of `B`), kept between calls: a fresh allocation
    /// of this size per call would be mapped and faulted in every time.
    static PACK: RefCell<Vec<Line>> = const { RefCell::new(Vec::new()) };
    /// Each thread's buffer for a block of a transposed `A` ([`pack_a`]).
    static PACK_A: RefCell<Vec<Line>> = const { RefCell::new(Vec::new()) };
}

/// A buffer of at least `len` elements of `T`, aligned to a cache line.
fn words<T>(buf: &mut Vec<Line>, len: usize) -> *mut T {
    let need = (len * size_of::<T>()).div_ceil(size_of::<Line>());
    if buf.len() < need {
        buf.resize(need, Line([0; 8]));
    }
    buf.as_mut_ptr().cast()
}

/// The edge tiles' buffer, aligned as the packing buffer is.
#[repr(C, align(64))]
struct TileBuf<E>([E; MAX_TILE]);

/// The blocked loops around packing and the micro-kernel: register tiles of `MR` rows ×
/// `NV` vectors `V` of columns.
#[inline(always)]
unsafe fn driver<T: Elem, V: Lanes<E = T>, const MR: usize>(g: &Gemm<T>, blk: Blocking) {
    let Gemm { m, n, k, .. } = *g;
    let nr = NV * V::W;
    debug_assert!(MR * nr <= MAX_TILE);
    if m == 0 || n == 0 {
        return;
    }
    if k == 0 {
        // An empty sum: the cells start, and stay, at 0 (or their old values).
        if !g.accumulate {
            for i in 0..m {
                for j in 0..n {
                    // SAFETY: a cell of C (the caller's contract).
                    unsafe { *g.c.offset(i as isize * g.rsc + j as isize * g.csc) = T::ZERO };
                }
            }
        }
        if let Some(e) = &g.epilogue {
            // SAFETY: every cell is final.
            unsafe { e.run(0, m, 0, n) };
        }
        return;
    }
    let kc_max = blk.kc.min(k);
    let nc_max = blk.nc.min(n).next_multiple_of(nr);
    // The buffers' addresses are taken out of the thread-local: code inside its closure would
    // be compiled without the caller's target features. Nothing else on this thread touches
    // them until this call returns (the kernels do not call back).
    let bp: *mut T = PACK.with(|pack| words::<T>(&mut pack.borrow_mut(), nc_max * kc_max));
    // A transposed `A` (a weight's gradient, `Xᵀ·dY`: rows contiguous) is read one cache line
    // per step and row tile, lines a row of `X` apart; when that is more than `PACK_A_STEP`
    // bytes, its blocks are copied into row panels first.
    let pack_a_blocks = g.rsa == 1 && g.csa.unsigned_abs() * size_of::<T>() > PACK_A_STEP;
    let ap: *mut T = if pack_a_blocks {
        let rows = blk.mc.min(m).next_multiple_of(MR);
        PACK_A.with(|pack| words::<T>(&mut pack.borrow_mut(), rows * kc_max))
    } else {
        std::ptr::null_mut()
    };
    for jc in (0..n).step_by(blk.nc) {
        let nc = blk.nc.min(n - jc);
        for pc in (0..k).step_by(blk.kc) {
            let kc = blk.kc.min(k - pc);
            // SAFETY: the block lies inside B; the buffer holds `nc_max × kc_max`.
            unsafe { pack_b::<V>(g, pc, kc, jc, nc, nr, bp) };
            let load = g.accumulate || pc > 0;
            for ic in (0..m).step_by(blk.mc) {
                let mc = blk.mc.min(m - ic);
                if pack_a_blocks {
                    // SAFETY: the block lies inside A; the buffer holds `mc` rounded up × `kc`.
                    unsafe { pack_a::<T, MR>(g, ic, mc, pc, kc, ap) };
                }
                // Columns of this block the epilogue has run on.
                let mut done = 0;
                for jr in (0..nc).step_by(nr) {
                    for ir in (0..mc).step_by(MR) {
                        let (i, j) = ((ic + ir) as isize, (jc + jr) as isize);
                        // A's rows of the tile: in place, or the tile's panel of the copy.
                        let (a, rsa, csa) = if pack_a_blocks {
                            // SAFETY: panel `ir / MR` of the buffer.
                            (unsafe { ap.add(ir * kc) }.cast_const(), 1, MR as isize)
                        } else {
                            // SAFETY: the tile's first row and the block's first step of A.
                            (unsafe { g.a.offset(i * g.rsa + pc as isize * g.csa) }, g.rsa, g.csa)
                        };
                        // SAFETY: the tile's valid part lies inside C.
                        unsafe {
                            let tile = Tile {
                                kc,
                                a,
                                rsa,
                                csa,
                                b: bp.add(jr * kc),
                                c: g.c.offset(i * g.rsc + j * g.csc),
                                rsc: g.rsc,
                                csc: g.csc,
                                mr: MR.min(mc - ir),
                                nr: nr.min(nc - jr),
                                load,
                            };
                            if g.fused {
                                micro::<V, MR, true>(&tile)
                            } else {
                                micro::<V, MR, false>(&tile)
                            }
                        }
                    }
                    // Strips of `mc` rows × at least `EPILOGUE_COLS` columns are final after
                    // the last block of steps, and still in the first-level cache.
                    let end = (jr + nr).min(nc);
                    if let Some(e) = g.epilogue.as_ref().filter(|_| pc + kc == k)
                        && (end - done >= EPILOGUE_COLS || end == nc)
                    {
                        // SAFETY: the strip's cells are final.
                        unsafe { e.run(ic, ic + mc, jc + done, jc + end) };
                        done = end;
                    }
                }
            }
        }
    }
}

/// Copies rows `ic..ic+mc` × steps `pc..pc+kc` of a transposed `A` (rows contiguous, `rsa` 1)
/// into panels of `MR` rows, each laid out step by step (`MR` values per step, the last panel's
/// missing rows left as they are: the micro-kernel reads a tile's valid rows only). For each
/// step, the block's rows are read in their order in memory.
#[inline(always)]
unsafe fn pack_a<T: Elem, const MR: usize>(
    g: &Gemm<T>,
    ic: usize,
    mc: usize,
    pc: usize,
    kc: usize,
    out: *mut T,
) {
    for p in 0..kc {
        // SAFETY: row `ic`, step `pc + p` of A.
        let src = unsafe { g.a.offset(ic as isize + (pc + p) as isize * g.csa) };
        for r0 in (0..mc).step_by(MR) {
            let rows = MR.min(mc - r0);
            // SAFETY: panel `r0 / MR`, step `p` of the buffer (`mc` rounded up × `kc`).
            let dst = unsafe { out.add(r0 * kc + p * MR) };
            // SAFETY: `rows` contiguous cells of A's block.
            unsafe { std::ptr::copy_nonoverlapping(src.add(r0), dst, rows) };
        }
    }
}

/// Copies steps `pc..pc+kc` × columns `jc..jc+nc` of `B` into panels of `nr` columns, each
/// laid out step by step (`nr` values per step), the last panel padded with zeros.
#[inline(always)]
unsafe fn pack_b<V: Lanes>(
    g: &Gemm<V::E>,
    pc: usize,
    kc: usize,
    jc: usize,
    nc: usize,
    nr: usize,
    out: *mut V::E,
) {
    for (panel, jr) in (0..nc).step_by(nr).enumerate() {
        let cols = nr.min(nc - jr);
        // SAFETY: inside the buffer (`nc` rounded up to `nr`, times `kc`).
        let dst = unsafe { out.add(panel * nr * kc) };
        if cols == nr && g.rsb == 1 && g.csb != 1 {
            // `B` transposed (a weight stored `[out, in]`): columns contiguous along the steps.
            // SAFETY: the panel's cells of B; the panel holds `kc × nr`.
            unsafe {
                let src = g.b.offset(pc as isize + (jc + jr) as isize * g.csb);
                V::pack_columns(src, g.csb, kc, nr, dst);
            }
            continue;
        }
        for p in 0..kc {
            // SAFETY: row `pc + p` of B, and step `p` of the panel.
            let (row, d) = unsafe { (g.b.offset((pc + p) as isize * g.rsb), dst.add(p * nr)) };
            if cols == nr && g.csb == 1 {
                // SAFETY: `nr` contiguous cells of B; inside the panel.
                unsafe { std::ptr::copy_nonoverlapping(row.add(jc + jr), d, nr) };
            } else if cols == nr {
                // A whole panel row with a stride (`B` transposed): no edge test.
                // SAFETY: cells of B; inside the panel.
                let src = unsafe { row.offset((jc + jr) as isize * g.csb) };
                for j in 0..nr {
                    unsafe { *d.add(j) = *src.offset(j as isize * g.csb) };
                }
            } else {
                for j in 0..nr {
                    let v = if j < cols {
                        // SAFETY: a cell of B.
                        unsafe { *row.offset((jc + jr + j) as isize * g.csb) }
                    } else {
                        V::E::ZERO
                    };
                    // SAFETY: inside the panel.
                    unsafe { *d.add(j) = v };
                }
            }
        }
    }
}

/// One call of the micro-kernel: `kc` steps of packed panels into a tile of `C` whose valid
/// part is `mr × nr`.
struct Tile<T> {
    kc: usize,
    /// `A` at the tile's first row and the block's first step, read in place.
    a: *const T,
    rsa: isize,
    csa: isize,
    b: *const T,
    c: *mut T,
    rsc: isize,
    csc: isize,
    mr: usize,
    nr: usize,
    /// Start from C's values (else from 0).
    load: bool,
}

/// A tile of `C`: in place when it is whole and its rows contiguous, else through a buffer
/// holding its valid part (the rest is computed from the zero padding and dropped).
#[inline(always)]
unsafe fn micro<V: Lanes, const MR: usize, const FUSED: bool>(t: &Tile<V::E>) {
    let nr = NV * V::W;
    if t.mr == MR && t.nr == nr && t.csc == 1 {
        // SAFETY: the whole tile lies in C.
        unsafe { registers::<V, MR, FUSED>(t, t.c, t.rsc) };
        return;
    }
    let mut tile = TileBuf([V::E::ZERO; MAX_TILE]);
    let buf = &mut tile.0;
    let cell = |r: usize, j: usize| r as isize * t.rsc + j as isize * t.csc;
    if t.load {
        for r in 0..t.mr {
            for j in 0..t.nr {
                // SAFETY: a valid cell of the tile.
                buf[r * nr + j] = unsafe { *t.c.offset(cell(r, j)) };
            }
        }
    }
    // SAFETY: the buffer holds MR × nr cells.
    unsafe { registers::<V, MR, FUSED>(t, buf.as_mut_ptr(), nr as isize) };
    for r in 0..t.mr {
        for j in 0..t.nr {
            // SAFETY: a valid cell of the tile.
            unsafe { *t.c.offset(cell(r, j)) = buf[r * nr + j] };
        }
    }
}

/// The register tile: `MR × NV` vectors of accumulators over the tile's `kc` steps, into `c`
/// (rows `rsc` apart, contiguous). `A`'s rows past the tile's valid ones repeat its last valid
/// row: their results are dropped, and every read stays inside `A`.
#[inline(always)]
unsafe fn registers<V: Lanes, const MR: usize, const FUSED: bool>(
    t: &Tile<V::E>,
    c: *mut V::E,
    rsc: isize,
) {
    let nr = NV * V::W;
    // SAFETY (whole function): `A`'s valid rows and the panel's `kc` steps of `nr` values are
    // readable, C's tile is writable (the caller's contract).
    unsafe {
        let rows: [*const V::E; MR] =
            std::array::from_fn(|r| t.a.offset(r.min(t.mr - 1) as isize * t.rsa));
        let mut acc = [[V::zero(); NV]; MR];
        if t.load {
            for (r, row) in acc.iter_mut().enumerate() {
                let src = c.offset(r as isize * rsc);
                for (v, x) in row.iter_mut().enumerate() {
                    *x = V::load(src.add(v * V::W));
                }
            }
        }
        for p in 0..t.kc {
            let (off, bp) = (p as isize * t.csa, t.b.add(p * nr));
            let mut bv = [V::zero(); NV];
            for (v, x) in bv.iter_mut().enumerate() {
                *x = V::load(bp.add(v * V::W));
            }
            for (row, a) in acc.iter_mut().zip(&rows) {
                let av = V::splat(*a.offset(off));
                for (x, &bx) in row.iter_mut().zip(&bv) {
                    *x = if FUSED { V::fma(av, bx, *x) } else { V::mul_add_rounded(av, bx, *x) };
                }
            }
        }
        for (r, row) in acc.iter().enumerate() {
            let dst = c.offset(r as isize * rsc);
            for (v, x) in row.iter().enumerate() {
                x.store(dst.add(v * V::W));
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kernels::test_values as values;

    /// The nest the kernel replaces, cell by cell in reduction order.
    fn reference<T: Elem>(g: &Gemm<T>) {
        for i in 0..g.m as isize {
            for j in 0..g.n as isize {
                let c = unsafe { g.c.offset(i * g.rsc + j * g.csc) };
                let mut t = if g.accumulate { unsafe { *c } } else { T::ZERO };
                for p in 0..g.k as isize {
                    let a = unsafe { *g.a.offset(i * g.rsa + p * g.csa) };
                    let b = unsafe { *g.b.offset(p * g.rsb + j * g.csb) };
                    t = if g.fused { T::fma(a, b, t) } else { t + a * b };
                }
                unsafe { *c = t };
            }
        }
    }

    #[allow(clippy::too_many_arguments)]
    fn check<T: Kernels + PartialEq + std::fmt::Debug>(
        from: fn(f64) -> T,
        (m, n, k): (usize, usize, usize),
        a_t: bool,
        b_t: bool,
        c_t: bool,
        accumulate: bool,
        fused: bool,
        isa: Isa,
    ) {
        let a: Vec<T> = values(m * k, 1).into_iter().map(from).collect();
        let b: Vec<T> = values(k * n, 2).into_iter().map(from).collect();
        let c0: Vec<T> = values(m * n, 3).into_iter().map(from).collect();
        let (rsa, csa) = if a_t { (1, m as isize) } else { (k as isize, 1) };
        let (rsb, csb) = if b_t { (1, k as isize) } else { (n as isize, 1) };
        let (rsc, csc) = if c_t { (1, m as isize) } else { (n as isize, 1) };
        let (mut want, mut got) = (c0.clone(), c0);
        let mk = |c: *mut T| Gemm {
            rsa,
            csa,
            rsb,
            csb,
            rsc,
            csc,
            accumulate,
            fused,
            ..Gemm::row_major(m, k, n, a.as_ptr(), b.as_ptr(), c)
        };
        reference(&mk(want.as_mut_ptr()));
        unsafe { gemm(&mk(got.as_mut_ptr()), isa) };
        assert_eq!(got, want, "{isa:?} {m}x{n}x{k} aT={a_t} bT={b_t} cT={c_t} acc={accumulate}");
    }

    #[test]
    fn every_kernel_computes_the_nests_bits() {
        // Sizes below, at and across every tile and block edge, including 1 and primes.
        let sizes = [
            (1, 1, 1),
            (1, 17, 3),
            (7, 1, 5),
            (8, 32, 1),
            (13, 37, 29),
            (6, 16, 256),
            (97, 33, 257),
            (100, 1030, 7),
            (3, 5, 0),
        ];
        for isa in Isa::available() {
            for &size in &sizes {
                for (a_t, b_t, c_t) in
                    [(false, false, false), (true, true, true), (false, true, false)]
                {
                    for (accumulate, fused) in [(false, true), (true, true), (false, false)] {
                        check::<f32>(|x| x as f32, size, a_t, b_t, c_t, accumulate, fused, isa);
                        check::<f64>(|x| x, size, a_t, b_t, c_t, accumulate, fused, isa);
                    }
                }
            }
        }
    }

    #[test]
    fn packed_transposed_left_operands_give_the_nests_bits() {
        // `A` stored transposed with rows more than `PACK_A_STEP` bytes apart: its blocks are
        // packed. Several blocks of rows and of steps, a last panel of 3 rows, a row of `C`
        // narrower than a tile.
        for isa in Isa::available() {
            for (m, n, k) in [(603, 70, 300), (520, 5, 17), (1100, 33, 9)] {
                assert!(m * size_of::<f32>() > PACK_A_STEP);
                for (accumulate, fused) in [(false, true), (true, true), (false, false)] {
                    check::<f32>(
                        |x| x as f32,
                        (m, n, k),
                        true,
                        false,
                        false,
                        accumulate,
                        fused,
                        isa,
                    );
                    check::<f32>(|x| x as f32, (m, n, k), true, true, true, accumulate, fused, isa);
                }
            }
            let (m, n, k) = (259, 41, 200);
            assert!(m * size_of::<f64>() > PACK_A_STEP);
            check::<f64>(|x| x, (m, n, k), true, false, false, true, true, isa);
            check::<f64>(|x| x, (m, n, k), true, true, false, false, false, isa);
        }
    }

    #[test]
    fn broadcast_operands_have_stride_zero() {
        // A row vector broadcast over the rows of A (`rsa = 0`).
        for isa in Isa::available() {
            let (m, n, k) = (9, 20, 11);
            let a: Vec<f32> = values(k, 4).into_iter().map(|x| x as f32).collect();
            let b: Vec<f32> = values(k * n, 5).into_iter().map(|x| x as f32).collect();
            let mk = |c: *mut f32| Gemm {
                rsa: 0,
                fused: true,
                ..Gemm::row_major(m, k, n, a.as_ptr(), b.as_ptr(), c)
            };
            let (mut want, mut got) = (vec![0f32; m * n], vec![0f32; m * n]);
            reference(&mk(want.as_mut_ptr()));
            unsafe { gemm(&mk(got.as_mut_ptr()), isa) };
            assert_eq!(got, want);
            assert!(got.chunks(n).all(|r| r == &got[..n]));
        }
    }

    #[test]
    fn special_values_propagate_as_in_the_nest() {
        let mut a = values(4 * 5, 6);
        a[3] = f64::INFINITY;
        a[7] = f64::NAN;
        a[11] = -0.0;
        let b = values(5 * 6, 7);
        for isa in Isa::available() {
            let mk = |c: *mut f64| Gemm::row_major(4, 5, 6, a.as_ptr(), b.as_ptr(), c);
            let (mut want, mut got) = (vec![0f64; 24], vec![0f64; 24]);
            reference(&mk(want.as_mut_ptr()));
            unsafe { gemm(&mk(got.as_mut_ptr()), isa) };
            let bits = |v: &[f64]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
            assert_eq!(bits(&got), bits(&want));
        }
    }

    /// The test epilogue: `bufs` = [C (f32, rows of `syms[0]` cells), a copy, visit counts];
    /// copies each cell it is given and counts the visit.
    unsafe extern "C" fn copy_cells(
        bufs: *mut *mut u8,
        syms: *const i64,
        r0: i64,
        r1: i64,
        _err: *mut u8,
        c0: i64,
        c1: i64,
    ) {
        unsafe {
            let n = *syms;
            let (c, copy, count) =
                (*bufs as *const f32, *bufs.add(1) as *mut f32, *bufs.add(2) as *mut u32);
            for i in r0..r1 {
                for j in c0..c1 {
                    let at = (i * n + j) as usize;
                    *copy.add(at) = *c.add(at);
                    *count.add(at) += 1;
                }
            }
        }
    }

    #[test]
    fn the_epilogue_sees_every_cell_once_and_final() {
        // Edge sizes, several blocks of columns (`NC`) and of steps (`KC`), an empty reduction;
        // the whole product and two blocks of rows through the entry point.
        for (m, n, k) in [(1, 1, 1), (37, 70, 300), (200, 1100, 3), (9, 33, 0), (130, 64, 513)] {
            let a: Vec<f32> = values(m * k, 1).into_iter().map(|x| x as f32).collect();
            let b: Vec<f32> = values(k * n, 2).into_iter().map(|x| x as f32).collect();
            for isa in Isa::available() {
                for blocks in [1, 2] {
                    let per = m.div_ceil(blocks);
                    let mut c = vec![f32::NAN; m * n];
                    let mut copy = vec![0f32; m * n];
                    let mut count = vec![0u32; m * n];
                    let mut bufs: [*mut u8; 3] = [
                        c.as_mut_ptr().cast(),
                        copy.as_mut_ptr().cast(),
                        count.as_mut_ptr().cast(),
                    ];
                    let syms = [n as i64];
                    for block in 0..blocks {
                        let d = super::super::GemmDesc {
                            rsc: n as i64,
                            csc: 1,
                            rsa: k as i64,
                            csa: 1,
                            rsb: n as i64,
                            csb: 1,
                            row_start: (block * per) as i64,
                            row_count: per as i64,
                            m: m as i64,
                            m_dyn: -1,
                            n: n as i64,
                            n_dyn: -1,
                            k: k as i64,
                            k_dyn: -1,
                            flags: super::super::GEMM_FUSED,
                        };
                        // SAFETY: the descriptor addresses the vectors above.
                        unsafe {
                            let Some(mut g) =
                                d.product(bufs[0].cast::<f32>(), a.as_ptr(), b.as_ptr())
                            else {
                                continue;
                            };
                            let row0 = d.clip().3 as i64;
                            g.epilogue = Some(EpilogueCall {
                                f: copy_cells,
                                bufs: bufs.as_mut_ptr(),
                                syms: syms.as_ptr(),
                                err: std::ptr::null_mut(),
                                row0,
                            });
                            gemm(&g, isa);
                        }
                    }
                    assert!(count.iter().all(|&x| x == 1), "{m}x{n}x{k} {isa:?} {blocks}");
                    let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
                    assert_eq!(bits(&copy), bits(&c), "{m}x{n}x{k} {isa:?} {blocks}");
                }
            }
        }
    }
}

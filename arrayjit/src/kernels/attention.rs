//! Fused scaled dot-product attention on the CPU: softmax(scale · Q·Kᵀ, masked)·V without the
//! score tensor.
//!
//! The composite attention (a product for the scores, then mask, maximum, exponentials, sum and
//! division, then a product with the values, and the gradients of each) writes and reads
//! `batch × heads × queries × keys` cells several times in each direction: at a context of 256
//! that is tens of MiB a layer, and causally half of it is masked work. These kernels keep the
//! scores of one block of queries at a time: per (batch, head) pair, the scores of a block of
//! query rows against the keys its last query sees fill a buffer the second-level cache holds
//! (causally, the keys past the block are never computed), the softmax runs over it in place,
//! and every product is a call of the library's matrix product ([`super::gemm()`]), whose strides
//! read the queries, keys and values where they lie — heads interleaved, keys transposed — with
//! no copy.
//!
//! - [`forward`] writes the output and the log-sum-exp of each row's scaled scores, which is
//!   all the backward pass needs to recompute a row's probabilities exactly as the forward pass
//!   had them.
//! - [`backward`] accumulates the gradients of the queries, keys and values (any of them may be
//!   absent) from the output's gradient, the output and the log-sum-exp, block by block:
//!   `D = Σₑ dO·O`, `P = exp(scale·Q·Kᵀ - lse)`, `dP = dO·Vᵀ`, `dS = P·(dP - D)·scale`, then
//!   `dV += Pᵀ·dO`, `dQ += dS·K` and `dK += dSᵀ·Q`.
//!
//! Both run over a range of (batch, head) pairs, so that a caller may split the pairs across
//! threads: distinct pairs read and write disjoint cells. Every tensor is dense and row-major:
//! `q` is `[batch, queries, heads, depth]`, `k` is `[batch, keys, heads, depth]`, `v` is
//! `[batch, keys, heads, width]`, the output `[batch, queries, heads, width]` and the
//! log-sum-exp `[batch, queries, heads]` (the layouts of the library's attention tensors,
//! positions in the batch row and heads in the output row).
//!
//! A masked key (`t > s`, causal) has probability exactly 0, as in the composite; a block's
//! earlier rows multiply the keys past them by that 0, so a later key's non-finite value reaches
//! them as `0 · ∞` does anywhere (NaN), while finite values, however large, leave them unchanged
//! to the bit. The exponential and logarithm are the library's ([`crate::math`]), so the kernels
//! compute what every backend computes for them; the sums run in another order than the
//! composite's nests, so the results agree with the composite to rounding, not bit for bit.

use std::cell::RefCell;
use std::ops::Range;

use super::Isa;
use super::gemm::{Gemm, gemm};
use crate::math::{exp_f32, log_f32};

/// The sizes of one attention call.
#[derive(Copy, Clone, Debug, PartialEq)]
pub struct Attention {
    /// Leading batch cells (every batch axis but the positions, flattened).
    pub batch: usize,
    /// Query positions `s`.
    pub queries: usize,
    /// Key (and value) positions `t`.
    pub keys: usize,
    /// Heads.
    pub heads: usize,
    /// Width of a query and a key (the scores' reduction).
    pub depth: usize,
    /// Width of a value and of the output.
    pub width: usize,
    /// Whether query `s` sees only the keys `t ≤ s`.
    pub causal: bool,
    /// The factor of the scores (`1/√depth` for the usual attention).
    pub scale: f32,
}

impl Attention {
    /// The (batch, head) pairs: the range a whole call runs over.
    pub fn pairs(&self) -> usize {
        self.batch * self.heads
    }

    /// The keys query `s` sees.
    fn seen(&self, s: usize) -> usize {
        if self.causal { (s + 1).min(self.keys) } else { self.keys }
    }

    /// Query rows per block: at most 64, fewer when the keys are many, so that a block of
    /// scores stays within 64 KiB (two such blocks, scores and their gradients, stay in L2);
    /// a multiple of the product's 8-row register tile.
    fn block_rows(&self) -> usize {
        (16384 / self.keys.max(1)).clamp(8, 64) / 8 * 8
    }
}

/// The pointers of a forward call.
#[derive(Copy, Clone, Debug)]
pub struct Forward {
    /// Queries.
    pub q: *const f32,
    /// Keys.
    pub k: *const f32,
    /// Values.
    pub v: *const f32,
    /// The output, written.
    pub out: *mut f32,
    /// The log-sum-exp of each row's scaled scores, written.
    pub lse: *mut f32,
}

/// The pointers of a backward call; a null gradient is not computed.
#[derive(Copy, Clone, Debug)]
pub struct Backward {
    /// Queries.
    pub q: *const f32,
    /// Keys.
    pub k: *const f32,
    /// Values.
    pub v: *const f32,
    /// The forward output.
    pub out: *const f32,
    /// The forward log-sum-exp.
    pub lse: *const f32,
    /// The output's gradient.
    pub d_out: *const f32,
    /// The queries' gradient, accumulated onto (or null).
    pub d_q: *mut f32,
    /// The keys' gradient, accumulated onto (or null).
    pub d_k: *mut f32,
    /// The values' gradient, accumulated onto (or null).
    pub d_v: *mut f32,
}

/// Per-thread scratch: a block's probabilities and its score gradients.
#[derive(Default)]
struct Scratch {
    probs: Vec<f32>,
    grads: Vec<f32>,
}

thread_local! {
    static SCRATCH: RefCell<Scratch> = RefCell::new(Scratch::default());
}

/// Whether the products fuse each multiply-add: where the instruction set has it (the generic
/// build would call the C library's `fmaf`).
trait Madd {
    const FUSED: bool;
}

struct Fused;
struct Plain;

impl Madd for Fused {
    const FUSED: bool = true;
}

impl Madd for Plain {
    const FUSED: bool = false;
}

/// Runs `f` with the host's best instruction set enabled (the softmax rows' loops, and the
/// library's exponential inlined into them, are compiled for it).
macro_rules! dispatch {
    ($isa:expr, $body:ident($a:expr, $p:ident: $ptrs:ty, $pairs:expr)) => {
        match $isa {
            #[cfg(target_arch = "x86_64")]
            Isa::Avx512 => {
                #[target_feature(enable = "avx512f,avx2,fma")]
                unsafe fn go(a: &Attention, p: $ptrs, pairs: Range<usize>) {
                    // SAFETY: the caller's contract.
                    unsafe { $body::<Fused>(a, p, pairs, Isa::Avx512) }
                }
                // SAFETY: the caller's contract; the host has the features.
                unsafe { go($a, $p, $pairs) }
            }
            #[cfg(target_arch = "x86_64")]
            Isa::Avx2 => {
                #[target_feature(enable = "avx2,fma")]
                unsafe fn go(a: &Attention, p: $ptrs, pairs: Range<usize>) {
                    // SAFETY: the caller's contract.
                    unsafe { $body::<Fused>(a, p, pairs, Isa::Avx2) }
                }
                // SAFETY: the caller's contract; the host has the features.
                unsafe { go($a, $p, $pairs) }
            }
            // SAFETY: the caller's contract.
            _ => unsafe { $body::<Plain>($a, $p, $pairs, Isa::Generic) },
        }
    };
}

/// Writes the output and log-sum-exp of the pairs `pairs` (each `batch · heads + head`).
///
/// # Safety
/// Every pointer must address a dense tensor of the layout the module describes for `a`'s
/// sizes; the output and log-sum-exp must not overlap the inputs; `pairs` within
/// `0..a.pairs()`. Calls over disjoint ranges of pairs may run at the same time.
pub unsafe fn forward(a: &Attention, f: Forward, pairs: Range<usize>, isa: Isa) {
    dispatch!(isa, forward_pairs(a, f: Forward, pairs))
}

/// Accumulates the gradients of the pairs `pairs`.
///
/// # Safety
/// As [`forward`]; the gradients (those not null) must not overlap any input or each other.
pub unsafe fn backward(a: &Attention, b: Backward, pairs: Range<usize>, isa: Isa) {
    dispatch!(isa, backward_pairs(a, b: Backward, pairs))
}

/// The number of `i64` words of a call's descriptor (see [`rc_attention_f32`]).
pub const DESC_LEN: usize = 10;

/// The pointers a call takes, in order: `q, k, v, out, lse, d_out, d_q, d_k, d_v` (the
/// forward pass reads the first five).
pub const POINTERS: usize = 9;

impl Attention {
    /// The descriptor words of a call of `pair` ([`rc_attention_f32`]).
    pub fn descriptor(&self, backward: bool, pair: usize) -> [i64; DESC_LEN] {
        [
            backward as i64,
            self.batch as i64,
            self.queries as i64,
            self.keys as i64,
            self.heads as i64,
            self.depth as i64,
            self.width as i64,
            self.causal as i64,
            self.scale.to_bits() as i64,
            pair as i64,
        ]
    }

    /// The sizes, the pass (backward or not) and the pair of a descriptor.
    pub fn from_descriptor(d: &[i64; DESC_LEN]) -> (Attention, bool, usize) {
        let a = Attention {
            batch: d[1] as usize,
            queries: d[2] as usize,
            keys: d[3] as usize,
            heads: d[4] as usize,
            depth: d[5] as usize,
            width: d[6] as usize,
            causal: d[7] != 0,
            scale: f32::from_bits(d[8] as u32),
        };
        (a, d[0] != 0, d[9] as usize)
    }
}

/// The signature generated code calls [`rc_attention_f32`] with: `(pointers, descriptor)`.
pub type AttentionFn = unsafe extern "C" fn(*const *mut f32, *const i64);

/// The entry point generated code calls (through the run table), with the host's best
/// instruction set: the forward or backward pass of one (batch, head) pair, as the
/// descriptor's words say ([`Attention::descriptor`]); the pointers in the order of
/// [`POINTERS`], null for a gradient not wanted.
///
/// # Safety
/// `desc` must point at [`DESC_LEN`] words and `ptrs` at [`POINTERS`] pointers; the tensors
/// as [`forward`] and [`backward`] require.
pub unsafe extern "C" fn rc_attention_f32(ptrs: *const *mut f32, desc: *const i64) {
    // SAFETY: the caller's contract.
    let (d, p) =
        unsafe { (&*desc.cast::<[i64; DESC_LEN]>(), &*ptrs.cast::<[*mut f32; POINTERS]>()) };
    let (a, backward_pass, pair) = Attention::from_descriptor(d);
    let isa = Isa::host();
    if backward_pass {
        let b = Backward {
            q: p[0],
            k: p[1],
            v: p[2],
            out: p[3],
            lse: p[4],
            d_out: p[5],
            d_q: p[6],
            d_k: p[7],
            d_v: p[8],
        };
        // SAFETY: the caller's contract.
        unsafe { backward(&a, b, pair..pair + 1, isa) }
    } else {
        let f = Forward { q: p[0], k: p[1], v: p[2], out: p[3], lse: p[4] };
        // SAFETY: the caller's contract.
        unsafe { forward(&a, f, pair..pair + 1, isa) }
    }
}

const _: AttentionFn = rc_attention_f32;

/// A (batch, head) pair, and where its rows lie in the tensors.
#[derive(Copy, Clone)]
struct Pair {
    /// The batch cell.
    b: usize,
    /// The head.
    head: usize,
}

impl Pair {
    /// The flat (batch, query, head) cell of query `i`.
    fn cell(self, a: &Attention, i: usize) -> usize {
        (self.b * a.queries + i) * a.heads + self.head
    }

    /// The flat (batch, key, head) cell of key 0.
    fn key0(self, a: &Attention) -> usize {
        self.b * a.keys * a.heads + self.head
    }
}

/// A product `C (+)= A·B` of strided `f32` operands (steps in elements).
#[inline(always)]
unsafe fn product<M: Madd>(
    (m, k, n): (usize, usize, usize),
    (a, rsa, csa): (*const f32, usize, usize),
    (b, rsb, csb): (*const f32, usize, usize),
    (c, rsc): (*mut f32, usize),
    accumulate: bool,
    isa: Isa,
) {
    let g = Gemm {
        m,
        n,
        k,
        a,
        rsa: rsa as isize,
        csa: csa as isize,
        b,
        rsb: rsb as isize,
        csb: csb as isize,
        c,
        rsc: rsc as isize,
        csc: 1,
        accumulate,
        fused: M::FUSED,
        epilogue: None,
    };
    // SAFETY: the caller's contract.
    unsafe { gemm(&g, isa) }
}

/// The scores `S = Q·Kᵀ` of query rows `i0..i0 + rows` against keys `0..keys`, unscaled, into
/// `dst` (`rows × keys`, dense).
///
/// # Safety
/// As [`forward`]; `dst` holds the block.
#[inline(always)]
unsafe fn block_scores<M: Madd>(
    a: &Attention,
    (q, k): (*const f32, *const f32),
    pr: Pair,
    (i0, rows, keys): (usize, usize, usize),
    dst: &mut [f32],
    isa: Isa,
) {
    let (hd, d) = (a.heads * a.depth, a.depth);
    // SAFETY: the pair's rows; `Kᵀ`'s rows are the keys' columns (step 1 along the depth,
    // one key apart between columns).
    unsafe {
        let qa = q.add(pr.cell(a, i0) * d);
        let kb = k.add(pr.key0(a) * d);
        product::<M>(
            (rows, d, keys),
            (qa, hd, 1),
            (kb, 1, hd),
            (dst.as_mut_ptr(), keys),
            false,
            isa,
        );
    }
}

/// Softmax of one row of scores in place: the first `n` (seen) cells become
/// `exp(scale·x - m) / l` (`m` their maximum, `l` the sum of the exponentials), the others 0;
/// returns the log-sum-exp `m + log l` of the scaled scores. Each pass is its own loop over the
/// whole row, the masked cells `-inf` until their exponential makes them 0 (selected by
/// position, not by a shorter loop: a causal row's seen cells are rarely a whole number of
/// vectors, and a loop's remainder runs one cell at a time), the maximum and the sum over `L`
/// partial results, so that every loop is vectorized (a loop carrying one running sum stays
/// scalar, and so would the exponential inside it).
#[inline(always)]
fn softmax_row(row: &mut [f32], n: usize, scale: f32) -> f32 {
    for (t, x) in row.iter_mut().enumerate() {
        *x = if t < n { *x * scale } else { f32::NEG_INFINITY };
    }
    let m = max_of(row);
    for x in row.iter_mut() {
        *x = exp_f32(*x - m);
    }
    let l = sum_of(row);
    let r = 1.0 / l;
    for x in row.iter_mut() {
        *x *= r;
    }
    m + log_f32(l)
}

/// Lanes of the partial results of [`max_of`] and [`sum_of`]: a fixed-size array the compiler
/// keeps in vector registers. The chunks are taken as `&[f32; L]`: indexed through a slice,
/// each lane keeps its bounds check and the loop stays scalar.
const L: usize = 16;

/// The largest of `xs` (`-inf` when empty), over `L` partial maxima.
#[inline(always)]
fn max_of(xs: &[f32]) -> f32 {
    let mut part = [f32::NEG_INFINITY; L];
    let chunks = xs.chunks_exact(L);
    let rest = chunks.remainder();
    for c in chunks {
        let c: &[f32; L] = c.try_into().expect("a whole chunk");
        for j in 0..L {
            part[j] = if c[j] > part[j] { c[j] } else { part[j] };
        }
    }
    halve(&mut part, |a, b| if b > a { b } else { a });
    rest.iter().fold(part[0], |m, &x| if x > m { x } else { m })
}

/// Folds `L` partial results into `part[0]` by halves (eight pairs, then four, two, one: each
/// step one vector operation), instead of one lane after another.
#[inline(always)]
fn halve(part: &mut [f32; L], f: impl Fn(f32, f32) -> f32) {
    let mut w = L;
    while w > 1 {
        w /= 2;
        for j in 0..w {
            part[j] = f(part[j], part[j + w]);
        }
    }
}

/// The sum of `xs`, over `L` partial sums.
#[inline(always)]
fn sum_of(xs: &[f32]) -> f32 {
    let mut part = [0.0f32; L];
    let chunks = xs.chunks_exact(L);
    let rest = chunks.remainder();
    for c in chunks {
        let c: &[f32; L] = c.try_into().expect("a whole chunk");
        for j in 0..L {
            part[j] += c[j];
        }
    }
    halve(&mut part, |a, b| a + b);
    rest.iter().fold(part[0], |s, &x| s + x)
}

/// The forward pass over `pairs`.
///
/// # Safety
/// As [`forward`].
#[inline(always)]
unsafe fn forward_pairs<M: Madd>(a: &Attention, p: Forward, pairs: Range<usize>, isa: Isa) {
    let (h, e) = (a.heads, a.width);
    // Taken out of the thread-local: code inside a closure would be compiled without the
    // caller's target features.
    let mut s = SCRATCH.with(RefCell::take);
    let qb = a.block_rows();
    for pair in pairs {
        let pr = Pair { b: pair / h, head: pair % h };
        for i0 in (0..a.queries).step_by(qb) {
            let rows = qb.min(a.queries - i0);
            let keys = a.seen(i0 + rows - 1);
            s.probs.resize(rows * keys, 0.0);
            // SAFETY (whole block): the caller's contract; offsets of this pair's cells.
            unsafe {
                block_scores::<M>(a, (p.q, p.k), pr, (i0, rows, keys), &mut s.probs, isa);
                for (r, row) in s.probs.chunks_exact_mut(keys.max(1)).take(rows).enumerate() {
                    let cell = pr.cell(a, i0 + r);
                    *p.lse.add(cell) = softmax_row(row, a.seen(i0 + r), a.scale);
                }
                let v0 = p.v.add(pr.key0(a) * e);
                let out = p.out.add(pr.cell(a, i0) * e);
                let dims = (rows, keys, e);
                product::<M>(
                    dims,
                    (s.probs.as_ptr(), keys, 1),
                    (v0, h * e, 1),
                    (out, h * e),
                    false,
                    isa,
                );
            }
        }
    }
    SCRATCH.with(|c| c.replace(s));
}

/// The backward pass over `pairs`.
///
/// # Safety
/// As [`backward`].
#[inline(always)]
unsafe fn backward_pairs<M: Madd>(a: &Attention, p: Backward, pairs: Range<usize>, isa: Isa) {
    // Taken out of the thread-local: code inside a closure would be compiled without the
    // caller's target features.
    let mut s = SCRATCH.with(RefCell::take);
    let qb = a.block_rows();
    for pair in pairs {
        let pr = Pair { b: pair / a.heads, head: pair % a.heads };
        for i0 in (0..a.queries).step_by(qb) {
            let rows = qb.min(a.queries - i0);
            // SAFETY: the caller's contract.
            unsafe { backward_block::<M>(a, p, pr, (i0, rows), &mut s, isa) };
        }
    }
    SCRATCH.with(|c| c.replace(s));
}

/// The gradients one block of query rows contributes: its probabilities recomputed from the
/// log-sum-exp, its score gradients, then the three products.
///
/// # Safety
/// As [`backward`].
#[inline(always)]
unsafe fn backward_block<M: Madd>(
    a: &Attention,
    p: Backward,
    pr: Pair,
    (i0, rows): (usize, usize),
    s: &mut Scratch,
    isa: Isa,
) {
    let (h, d, e) = (a.heads, a.depth, a.width);
    let keys = a.seen(i0 + rows - 1);
    s.probs.resize(rows * keys, 0.0);
    s.grads.resize(rows * keys, 0.0);
    // SAFETY (whole function): the caller's contract; offsets of this pair's cells.
    unsafe {
        let (q0, d_out0) = (pr.cell(a, i0) * d, pr.cell(a, i0) * e);
        let (k0, v0) = (pr.key0(a) * d, pr.key0(a) * e);
        block_scores::<M>(a, (p.q, p.k), pr, (i0, rows, keys), &mut s.probs, isa);
        // dP = dO·Vᵀ.
        let g = (p.d_out.add(d_out0), h * e, 1);
        product::<M>(
            (rows, e, keys),
            g,
            (p.v.add(v0), 1, h * e),
            (s.grads.as_mut_ptr(), keys),
            false,
            isa,
        );
        let width = keys.max(1);
        let rows_of = s.probs.chunks_exact_mut(width).zip(s.grads.chunks_exact_mut(width));
        for (r, (pr_row, dp_row)) in rows_of.take(rows).enumerate() {
            let cell = pr.cell(a, i0 + r);
            let o = std::slice::from_raw_parts(p.out.add(cell * e), e);
            let go = std::slice::from_raw_parts(p.d_out.add(cell * e), e);
            let big_d = go.iter().zip(o).fold(0.0f32, |acc, (&g, &o)| acc + g * o);
            score_grads(pr_row, dp_row, a.seen(i0 + r), (*p.lse.add(cell), big_d), a.scale);
        }
        let (probs, grads) = (s.probs.as_ptr(), s.grads.as_ptr());
        if !p.d_v.is_null() {
            // dV += Pᵀ·dO.
            let dst = (p.d_v.add(v0), h * e);
            product::<M>((keys, rows, e), (probs, 1, keys), g, dst, true, isa);
        }
        if !p.d_q.is_null() {
            // dQ += dS·K.
            let dst = (p.d_q.add(q0), h * d);
            product::<M>(
                (rows, keys, d),
                (grads, keys, 1),
                (p.k.add(k0), h * d, 1),
                dst,
                true,
                isa,
            );
        }
        if !p.d_k.is_null() {
            // dK += dSᵀ·Q.
            let dst = (p.d_k.add(k0), h * d);
            product::<M>(
                (keys, rows, d),
                (grads, 1, keys),
                (p.q.add(q0), h * d, 1),
                dst,
                true,
                isa,
            );
        }
    }
}

/// One row's probabilities and score gradients in place: the first `n` (seen) cells of `pr`
/// (scores) become `P = exp(scale·x - lse)` and of `dp` (`dO·vₜ`) become
/// `dS = P·(dP - D)·scale`; the masked cells become 0 in both (selected by position over the
/// whole row, so that the loop is vectorized to its end, as in [`softmax_row`]).
#[inline(always)]
fn score_grads(pr: &mut [f32], dp: &mut [f32], n: usize, (lse, big_d): (f32, f32), scale: f32) {
    for (t, (x, g)) in pr.iter_mut().zip(dp.iter_mut()).enumerate() {
        let seen = t < n;
        *x = exp_f32(if seen { *x * scale - lse } else { f32::NEG_INFINITY });
        *g = if seen { *x * (*g - big_d) * scale } else { 0.0 };
    }
}

#[cfg(test)]
mod tests;

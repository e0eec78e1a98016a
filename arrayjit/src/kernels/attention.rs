//! Fused scaled dot-product attention on the CPU: softmax(scale · Q·Kᵀ, masked)·V without the
//! score tensor.
//!
//! The composite attention (a product for the scores, then mask, maximum, exponentials, sum and
//! division, then a product with the values, and the gradients of each) writes and reads
//! `batch × heads × queries × keys` cells several times in each direction: at a context of 256
//! that is tens of MiB a layer, and causally half of it is masked work. These kernels never
//! keep more than a block of scores: per (batch, head) pair they transpose the keys (and, for
//! the gradient, the values) into a block the first-level cache holds, then compute only the
//! scores of the keys each query may see (`t ≤ s` when causal: the keys past a query are
//! skipped, not masked).
//!
//! - [`forward`] writes the output and the log-sum-exp of each row's scaled scores, which is
//!   all the backward pass needs to recompute a row's probabilities exactly as the forward pass
//!   had them.
//! - [`backward`] accumulates the gradients of the queries, keys and values (any of them may be
//!   absent) from the output's gradient, the output and the log-sum-exp, by blocks of keys:
//!   `D = Σₑ dO·O`, `P = exp(scale·q·k - lse)`, `dP = dO·Vᵀ`, `dS = P·(dP - D)·scale`, then
//!   `dQ += dS·K`, and the block's `dK += dSᵀ·Q` and `dV += Pᵀ·dO` as sums of outer products
//!   kept in registers.
//!
//! Both run over a range of (batch, head) pairs, so that a caller may split the pairs across
//! threads: distinct pairs read and write disjoint cells. Every tensor is dense and row-major:
//! `q` is `[batch, queries, heads, depth]`, `k` is `[batch, keys, heads, depth]`, `v` is
//! `[batch, keys, heads, width]`, the output `[batch, queries, heads, width]` and the
//! log-sum-exp `[batch, queries, heads]` (the layouts of the library's attention tensors,
//! positions in the batch row and heads in the output row).
//!
//! The exponential and logarithm are the library's ([`crate::math`]), so the kernels compute
//! what every backend computes for them; the sums run in another order than the composite's
//! nests, so the results agree with the composite to rounding, not bit for bit.

use std::cell::RefCell;
use std::ops::Range;

use super::Isa;
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

/// Per-thread scratch: the transposed keys and values of one pair and the rows of scores.
#[derive(Default)]
struct Scratch {
    kt: Vec<f32>,
    vt: Vec<f32>,
    row: Vec<f32>,
    row2: Vec<f32>,
    rows: Vec<f32>,
    acc: Vec<f32>,
}

thread_local! {
    static SCRATCH: RefCell<Scratch> = RefCell::new(Scratch::default());
}

/// `a·b + c`, fused where the instruction set has it (the generic build would call the C
/// library's `fmaf`).
trait Madd {
    fn madd(a: f32, b: f32, c: f32) -> f32;
}

struct Fused;
struct Plain;

impl Madd for Fused {
    #[inline(always)]
    fn madd(a: f32, b: f32, c: f32) -> f32 {
        a.mul_add(b, c)
    }
}

impl Madd for Plain {
    #[inline(always)]
    fn madd(a: f32, b: f32, c: f32) -> f32 {
        a * b + c
    }
}

/// Runs `f` with the host's best instruction set enabled.
macro_rules! dispatch {
    ($isa:expr, $body:ident($a:expr, $p:ident: $ptrs:ty, $pairs:expr)) => {
        match $isa {
            #[cfg(target_arch = "x86_64")]
            Isa::Avx512 => {
                #[target_feature(enable = "avx512f,avx2,fma")]
                unsafe fn go(a: &Attention, p: $ptrs, pairs: Range<usize>) {
                    // SAFETY: the caller's contract.
                    unsafe { $body::<Fused>(a, p, pairs) }
                }
                // SAFETY: the caller's contract; the host has the features.
                unsafe { go($a, $p, $pairs) }
            }
            #[cfg(target_arch = "x86_64")]
            Isa::Avx2 => {
                #[target_feature(enable = "avx2,fma")]
                unsafe fn go(a: &Attention, p: $ptrs, pairs: Range<usize>) {
                    // SAFETY: the caller's contract.
                    unsafe { $body::<Fused>(a, p, pairs) }
                }
                // SAFETY: the caller's contract; the host has the features.
                unsafe { go($a, $p, $pairs) }
            }
            // SAFETY: the caller's contract.
            _ => unsafe { $body::<Plain>($a, $p, $pairs) },
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

/// The transposed block `dst[j][t] = src[t][j]` of one pair: `rows` positions `step` apart,
/// `cols` values each.
///
/// # Safety
/// `src` addresses the pair's rows.
#[inline(always)]
unsafe fn transpose(src: *const f32, step: usize, rows: usize, cols: usize, dst: &mut Vec<f32>) {
    dst.clear();
    dst.resize(rows * cols, 0.0);
    for t in 0..rows {
        // SAFETY: row `t` of the pair.
        let row = unsafe { std::slice::from_raw_parts(src.add(t * step), cols) };
        for (j, &x) in row.iter().enumerate() {
            dst[j * rows + t] = x;
        }
    }
}

/// Lanes of the register blocks the loops below are written in: a fixed-size array the
/// compiler keeps in one or two vector registers (a loop carrying its sums through memory would
/// wait on each store). The rows they read are taken as `&[f32; L]`: indexed through a slice,
/// each lane keeps its bounds check and the loop stays scalar.
const L: usize = 16;

/// Independent sums [`weighted_rows`] keeps in flight: a fused multiply-add waits for the one
/// before it on the same sum, so one sum would run at the instruction's latency instead of its
/// throughput.
const CHAINS: usize = 4;

/// `row[t] = scale · Σ_d q[d]·kt[d][t]` for the `n` keys a query sees, `L` keys at a time.
#[inline(always)]
fn scores<M: Madd>(q: &[f32], kt: &[f32], keys: usize, n: usize, scale: f32, row: &mut [f32]) {
    for t0 in (0..n).step_by(L) {
        let w = L.min(n - t0);
        let mut acc = [0.0f32; L];
        for (d, &qd) in q.iter().enumerate() {
            let kd = &kt[d * keys + t0..];
            if w == L {
                let kd: &[f32; L] = kd[..L].try_into().expect("a whole block");
                for j in 0..L {
                    acc[j] = M::madd(qd, kd[j], acc[j]);
                }
            } else {
                for j in 0..w {
                    acc[j] = M::madd(qd, kd[j], acc[j]);
                }
            }
        }
        for j in 0..w {
            row[t0 + j] = acc[j] * scale;
        }
    }
}

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
    rest.iter().chain(&part).fold(f32::NEG_INFINITY, |m, &x| if x > m { x } else { m })
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
    rest.iter().chain(&part).sum()
}

/// `out[j] = Σ_t w[t]·rows[t][j]` for rows `step` apart, `L` columns at a time in registers,
/// over `CHAINS` partial sums (rows taken `CHAINS` at a time, the rest onto the first sum).
///
/// # Safety
/// `rows` addresses `w.len()` rows of `out.len()` values, `step` apart.
#[inline(always)]
unsafe fn weighted_rows<M: Madd>(w: &[f32], rows: *const f32, step: usize, out: &mut [f32]) {
    let cols = out.len();
    // SAFETY (both closures): row `t`, `L` columns from `j0` (whole blocks only).
    let row = |t: usize, j0: usize| -> [f32; L] {
        let r = unsafe { std::slice::from_raw_parts(rows.add(t * step + j0), L) };
        r.try_into().expect("a whole block")
    };
    let madd_row = |sums: &mut [f32; L], x: f32, r: &[f32; L]| {
        for j in 0..L {
            sums[j] = M::madd(x, r[j], sums[j]);
        }
    };
    let whole = cols / L * L;
    let grouped = w.len() / CHAINS * CHAINS;
    for j0 in (0..whole).step_by(L) {
        let mut acc = [[0.0f32; L]; CHAINS];
        for t in (0..grouped).step_by(CHAINS) {
            let [a0, a1, a2, a3] = &mut acc;
            madd_row(a0, w[t], &row(t, j0));
            madd_row(a1, w[t + 1], &row(t + 1, j0));
            madd_row(a2, w[t + 2], &row(t + 2, j0));
            madd_row(a3, w[t + 3], &row(t + 3, j0));
        }
        for (t, &wt) in w.iter().enumerate().skip(grouped) {
            madd_row(&mut acc[0], wt, &row(t, j0));
        }
        for j in 0..L {
            out[j0 + j] = (acc[0][j] + acc[1][j]) + (acc[2][j] + acc[3][j]);
        }
    }
    for (j, o) in out.iter_mut().enumerate().skip(whole) {
        let mut sum = 0.0;
        for (t, &wt) in w.iter().enumerate() {
            // SAFETY: row `t`, column `j`.
            sum = M::madd(wt, unsafe { *rows.add(t * step + j) }, sum);
        }
        *o = sum;
    }
}

/// The forward pass over `pairs`.
///
/// # Safety
/// As [`forward`].
#[inline(always)]
unsafe fn forward_pairs<M: Madd>(a: &Attention, p: Forward, pairs: Range<usize>) {
    let (h, d, e) = (a.heads, a.depth, a.width);
    // Taken out of the thread-local: code inside a closure would be compiled without the
    // caller's target features.
    let mut scratch = SCRATCH.with(RefCell::take);
    {
        let s = &mut scratch;
        s.row.resize(a.keys, 0.0);
        s.acc.resize(e, 0.0);
        for pair in pairs {
            let (b, head) = (pair / h, pair % h);
            // SAFETY (whole loop): offsets of this pair's cells in the dense tensors.
            unsafe {
                let k0 = p.k.add((b * a.keys * h + head) * d);
                let v0 = p.v.add((b * a.keys * h + head) * e);
                transpose(k0, h * d, a.keys, d, &mut s.kt);
                for i in 0..a.queries {
                    let n = a.seen(i);
                    let cell = (b * a.queries + i) * h + head;
                    let q = std::slice::from_raw_parts(p.q.add(cell * d), d);
                    scores::<M>(q, &s.kt, a.keys, n, a.scale, &mut s.row);
                    let row = &mut s.row[..n];
                    let m = max_of(row);
                    for x in row.iter_mut() {
                        *x = exp_f32(*x - m);
                    }
                    let l = sum_of(row);
                    weighted_rows::<M>(row, v0, h * e, &mut s.acc);
                    let out = std::slice::from_raw_parts_mut(p.out.add(cell * e), e);
                    for (o, &x) in out.iter_mut().zip(&s.acc) {
                        *o = x / l;
                    }
                    *p.lse.add(cell) = m + log_f32(l);
                }
            }
        }
    }
    SCRATCH.with(|c| c.replace(scratch));
}

/// The backward pass over `pairs`.
///
/// # Safety
/// As [`backward`].
#[inline(always)]
unsafe fn backward_pairs<M: Madd>(a: &Attention, p: Backward, pairs: Range<usize>) {
    // Taken out of the thread-local: code inside a closure would be compiled without the
    // caller's target features.
    let mut scratch = SCRATCH.with(RefCell::take);
    for pair in pairs {
        // SAFETY: the caller's contract.
        unsafe { backward_pair::<M>(a, p, pair / a.heads, pair % a.heads, &mut scratch) };
    }
    SCRATCH.with(|c| c.replace(scratch));
}

/// The gradients of one (batch, head) pair, by blocks of `L` keys: for each block, the
/// probabilities and score gradients of every query that sees it (`L` lanes a row, zero where
/// the query does not see the key), then the block's key and value gradients as sums over
/// those rows of outer products ([`outer_sums`]), in registers rather than a row update in
/// memory for every (query, key) pair.
///
/// # Safety
/// As [`backward`].
#[inline(always)]
unsafe fn backward_pair<M: Madd>(
    a: &Attention,
    p: Backward,
    b: usize,
    head: usize,
    s: &mut Scratch,
) {
    let (h, d, e) = (a.heads, a.depth, a.width);
    let cell = |i: usize| (b * a.queries + i) * h + head;
    let (k0, v0) = ((b * a.keys * h + head) * d, (b * a.keys * h + head) * e);
    // SAFETY (whole function): offsets of this pair's cells in the dense tensors.
    unsafe {
        transpose(p.k.add(k0), h * d, a.keys, d, &mut s.kt);
        transpose(p.v.add(v0), h * e, a.keys, e, &mut s.vt);
        // D = Σₑ dO·O for every query.
        s.row2.clear();
        for i in 0..a.queries {
            let g = std::slice::from_raw_parts(p.d_out.add(cell(i) * e), e);
            let o = std::slice::from_raw_parts(p.out.add(cell(i) * e), e);
            s.row2.push(g.iter().zip(o).fold(0.0, |acc, (&g, &o)| M::madd(g, o, acc)));
        }
        s.acc.resize(d, 0.0);
        for t0 in (0..a.keys).step_by(L) {
            let nb = L.min(a.keys - t0);
            // Causally, the queries before the block see none of its keys.
            let first = if a.causal { t0 } else { 0 };
            if first >= a.queries {
                break;
            }
            let rows = a.queries - first;
            s.row.resize(rows * L, 0.0);
            s.rows.resize(rows * L, 0.0);
            for i in first..a.queries {
                let w = if a.causal { nb.min(i + 1 - t0) } else { nb };
                let r = (i - first) * L;
                let (pr, sr) = (&mut s.row[r..r + L], &mut s.rows[r..r + L]);
                let q = std::slice::from_raw_parts(p.q.add(cell(i) * d), d);
                let g = std::slice::from_raw_parts(p.d_out.add(cell(i) * e), e);
                block_row::<M>(
                    a,
                    (q, g),
                    (&s.kt[t0..], &s.vt[t0..]),
                    w,
                    (*p.lse.add(cell(i)), s.row2[i]),
                    pr,
                    sr,
                );
                if !p.d_q.is_null() {
                    weighted_rows::<M>(&sr[..w], p.k.add(k0 + t0 * h * d), h * d, &mut s.acc);
                    let dq = std::slice::from_raw_parts_mut(p.d_q.add(cell(i) * d), d);
                    for (x, &y) in dq.iter_mut().zip(&s.acc) {
                        *x += y;
                    }
                }
            }
            let at = |ptr: *mut f32, width: usize, base: usize| ptr.add(base + t0 * h * width);
            if !p.d_v.is_null() {
                let src = (p.d_out.add(cell(first) * e), h * e);
                outer_sums::<M>(&s.row, rows, src, e, nb, (at(p.d_v, e, v0), h * e));
            }
            if !p.d_k.is_null() {
                let src = (p.q.add(cell(first) * d), h * d);
                outer_sums::<M>(&s.rows, rows, src, d, nb, (at(p.d_k, d, k0), h * d));
            }
        }
    }
}

/// One query's row of a key block: the probabilities `pr[j] = exp(scale·q·kⱼ - lse)` and the
/// score gradients `sr[j] = pr[j]·(dO·vⱼ - D)·scale` of the block's `w` keys it sees, zero in
/// the other lanes. `kt` and `vt` are the transposed keys and values from the block's first key.
#[inline(always)]
fn block_row<M: Madd>(
    a: &Attention,
    (q, g): (&[f32], &[f32]),
    (kt, vt): (&[f32], &[f32]),
    w: usize,
    (lse, big_d): (f32, f32),
    pr: &mut [f32],
    sr: &mut [f32],
) {
    pr.fill(0.0);
    sr.fill(0.0);
    scores::<M>(q, kt, a.keys, w, 1.0, pr);
    scores::<M>(g, vt, a.keys, w, 1.0, sr);
    let lane = |p: &mut f32, s: &mut f32| {
        *p = exp_f32(*p * a.scale - lse);
        *s = *p * (*s - big_d) * a.scale;
    };
    if w == L {
        // Whole blocks as arrays: one vector per lane row (see [`L`]).
        let pr: &mut [f32; L] = pr.try_into().expect("a lane row");
        let sr: &mut [f32; L] = sr.try_into().expect("a lane row");
        for j in 0..L {
            lane(&mut pr[j], &mut sr[j]);
        }
    } else {
        for j in 0..w {
            lane(&mut pr[j], &mut sr[j]);
        }
    }
}

/// `dst[j][c] += Σᵢ coef[i][j]·src[i][c]` for the block's `nb` keys `j`: `coef` holds `rows`
/// rows of `L` lanes, `src` as many rows of `cols` values (`(pointer, step)`), `dst` the block's
/// rows (`(pointer, step)`). Four keys' sums of `L` columns are kept in registers over all the
/// rows.
///
/// # Safety
/// The pointers address those rows.
#[inline(always)]
unsafe fn outer_sums<M: Madd>(
    coef: &[f32],
    rows: usize,
    (src, step): (*const f32, usize),
    cols: usize,
    nb: usize,
    (dst, dst_step): (*mut f32, usize),
) {
    const G: usize = 4;
    for c0 in (0..cols).step_by(L) {
        let width = L.min(cols - c0);
        for j0 in (0..nb).step_by(G) {
            let mut acc = [[0.0f32; L]; G];
            for i in 0..rows {
                // SAFETY: row `i`, columns `c0..c0 + width`.
                let row = unsafe { std::slice::from_raw_parts(src.add(i * step + c0), width) };
                let v: [f32; L] = match row.try_into() {
                    Ok(whole) => whole,
                    Err(_) => {
                        let mut v = [0.0f32; L];
                        v[..width].copy_from_slice(row);
                        v
                    }
                };
                let cf: &[f32; L] = coef[i * L..i * L + L].try_into().expect("a lane row");
                for (g, sums) in acc.iter_mut().enumerate() {
                    let x = cf[j0 + g];
                    for c in 0..L {
                        sums[c] = M::madd(x, v[c], sums[c]);
                    }
                }
            }
            for (g, sums) in acc.iter().enumerate().take(nb - j0) {
                // SAFETY: key `j0 + g` of the block, columns `c0..c0 + width`.
                let out = unsafe {
                    std::slice::from_raw_parts_mut(dst.add((j0 + g) * dst_step + c0), width)
                };
                for (o, &x) in out.iter_mut().zip(sums) {
                    *o += x;
                }
            }
        }
    }
}

#[cfg(test)]
mod tests;

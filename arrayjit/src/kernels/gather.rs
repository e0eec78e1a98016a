//! Table lookups by integer ids (an embedding) and the gradient that adds rows back.
//!
//! A lookup written as a product with a one-hot tensor costs tokens × rows × vocabulary
//! multiply-adds forward and again for the table's gradient, and a one-hot tensor of tokens ×
//! vocabulary cells; a gather costs tokens × rows copies. Loop nests cannot say it (their
//! indices are affine in loop variables, never read from a tensor), so the native backend calls
//! this kernel and every other backend runs the expansion in [`crate::low_level::gather`].
//!
//! - forward: `out[t, r] = table[r, ids[t]]` for the tokens `t` of the call;
//! - backward: `d_table[r, ids[t]] += d_out[t, r]` for the rows `r` of the call, tokens in
//!   order, so each cell of the table's gradient sums its tokens in the order the expansion
//!   (and a one-hot product) does. Distinct calls own distinct rows: the pool may split rows.
//!
//! An id that is not an integer in `0..vocab` (ids in f32: a fraction, a NaN, a negative or too
//! large value) selects nothing: its output row is `−0` and it adds nothing to the gradient.
//! That is what the expansion's `Σ_v where(id = v, table[r, v], −0)`, summed from `−0`, gives,
//! bit for bit: `−0` is the sum's identity, so the one selected term comes out unchanged
//! (a `−0` in the table included) and no other cell of the table is ever read into the sum.

/// The number of `i64` words of a call's descriptor (see [`Gather::descriptor`]).
pub const DESC_LEN: usize = 10;

/// The pointers a call takes, in order: the table (its gradient backward), the ids, the
/// output (its gradient backward).
pub const POINTERS: usize = 3;

/// The sizes and layout of a lookup.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub struct Gather {
    /// Ids (the output's rows of cells).
    pub tokens: usize,
    /// Cells per id: the table's cells for one id.
    pub rows: usize,
    /// Ids in range: `0..vocab`.
    pub vocab: usize,
    /// The table's step between rows `r` (elements).
    pub row_step: usize,
    /// The table's step between ids (elements).
    pub vocab_step: usize,
    /// The ids are `f32` values (else `u32`).
    pub ids_f32: bool,
}

impl Gather {
    /// The descriptor words of a call: the pass, the sizes, the part (`start..start + count`:
    /// tokens forward, rows backward) and the number of tokens to use (a dynamic batch's).
    pub fn descriptor(&self, backward: bool, start: usize, count: usize) -> [i64; DESC_LEN] {
        [
            backward as i64,
            self.ids_f32 as i64,
            self.tokens as i64,
            self.rows as i64,
            self.vocab as i64,
            self.row_step as i64,
            self.vocab_step as i64,
            start as i64,
            count as i64,
            self.tokens as i64,
        ]
    }

    /// The sizes, the pass, the part and the tokens in use of a descriptor.
    pub fn from_descriptor(d: &[i64; DESC_LEN]) -> (Gather, bool, usize, usize, usize) {
        let g = Gather {
            ids_f32: d[1] != 0,
            tokens: d[2].max(0) as usize,
            rows: d[3].max(0) as usize,
            vocab: d[4].max(0) as usize,
            row_step: d[5].max(0) as usize,
            vocab_step: d[6].max(0) as usize,
        };
        let used = (d[9].max(0) as usize).min(g.tokens);
        (g, d[0] != 0, d[7].max(0) as usize, d[8].max(0) as usize, used)
    }

    /// Token `t`'s id, if it is an integer in `0..vocab`.
    ///
    /// # Safety
    /// `ids` must hold `t + 1` ids of the layout's type.
    #[inline]
    unsafe fn id(&self, ids: *const u8, t: usize) -> Option<usize> {
        let id = if self.ids_f32 {
            // SAFETY: the caller's contract.
            let x = unsafe { *ids.cast::<f32>().add(t) };
            // `x as usize` saturates; only an exact integer in range is an id.
            (x >= 0.0 && x.fract() == 0.0).then_some(x as usize)?
        } else {
            // SAFETY: the caller's contract.
            unsafe { *ids.cast::<u32>().add(t) as usize }
        };
        (id < self.vocab).then_some(id)
    }

    /// `out[t, r] = table[r, ids[t]]` for the tokens `start..start + count` below `used`.
    ///
    /// # Safety
    /// The table must hold every cell the layout addresses, `ids` `tokens` ids and `out`
    /// `tokens × rows` cells.
    pub unsafe fn forward(
        &self,
        table: *const f32,
        ids: *const u8,
        out: *mut f32,
        start: usize,
        count: usize,
        used: usize,
    ) {
        for t in start..(start + count).min(used) {
            // SAFETY: token `t`'s output row lies in `out`.
            let row = unsafe { std::slice::from_raw_parts_mut(out.add(t * self.rows), self.rows) };
            // SAFETY: `t` < tokens.
            match unsafe { self.id(ids, t) } {
                None => row.fill(-0.0),
                Some(id) if self.row_step == 1 => {
                    // SAFETY: the id's cells are contiguous in the table.
                    let src = unsafe { table.add(id * self.vocab_step) };
                    unsafe { std::ptr::copy_nonoverlapping(src, row.as_mut_ptr(), self.rows) };
                }
                Some(id) => {
                    // SAFETY: cells of the table.
                    let src = unsafe { table.add(id * self.vocab_step) };
                    for (r, x) in row.iter_mut().enumerate() {
                        *x = unsafe { *src.add(r * self.row_step) };
                    }
                }
            }
        }
    }

    /// `d_table[r, ids[t]] += d_out[t, r]` for the rows `start..start + count`, over the
    /// tokens below `used` in order.
    ///
    /// # Safety
    /// As [`Gather::forward`], `d_table` in the table's layout, `d_out` in the output's.
    pub unsafe fn backward(
        &self,
        d_table: *mut f32,
        ids: *const u8,
        d_out: *const f32,
        start: usize,
        count: usize,
        used: usize,
    ) {
        let rows = start..(start + count).min(self.rows);
        for t in 0..used {
            // SAFETY: `t` < tokens.
            let Some(id) = (unsafe { self.id(ids, t) }) else { continue };
            // SAFETY: the id's cells of the table's gradient, token `t`'s row of `d_out`.
            let (dst, src) =
                unsafe { (d_table.add(id * self.vocab_step), d_out.add(t * self.rows)) };
            for r in rows.clone() {
                // SAFETY: as above.
                unsafe { *dst.add(r * self.row_step) += *src.add(r) };
            }
        }
    }
}

/// The signature generated code calls [`rc_gather_f32`] with: `(pointers, descriptor)`.
pub type GatherFn = unsafe extern "C" fn(*const *mut f32, *const i64);

/// The entry point generated code calls (through the run table): one part of a lookup or of
/// its gradient, as the descriptor's words say ([`Gather::descriptor`]); the pointers in the
/// order of [`POINTERS`] (the ids' pointer cast to `float *`, whatever their type).
///
/// # Safety
/// `desc` must point at [`DESC_LEN`] words and `ptrs` at [`POINTERS`] pointers; the tensors as
/// [`Gather::forward`] and [`Gather::backward`] require.
pub unsafe extern "C" fn rc_gather_f32(ptrs: *const *mut f32, desc: *const i64) {
    // SAFETY: the caller's contract.
    let (d, p) =
        unsafe { (&*desc.cast::<[i64; DESC_LEN]>(), &*ptrs.cast::<[*mut f32; POINTERS]>()) };
    let (g, backward, start, count, used) = Gather::from_descriptor(d);
    let ids = p[1].cast_const().cast::<u8>();
    // SAFETY: the caller's contract.
    unsafe {
        if backward {
            g.backward(p[0], ids, p[2], start, count, used);
        } else {
            g.forward(p[0], ids, p[2], start, count, used);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A 3-row table over 5 ids stored `[rows, vocab]`, and its cell `(r, v)`.
    fn table() -> (Vec<f32>, Gather) {
        let t: Vec<f32> = (0..15).map(|i| i as f32 * 0.5 - 3.0).collect();
        let g = Gather { tokens: 4, rows: 3, vocab: 5, row_step: 5, vocab_step: 1, ids_f32: false };
        (t, g)
    }

    #[test]
    fn forward_copies_rows_and_zeroes_invalid_ids() {
        let (t, g) = table();
        let ids: [u32; 4] = [4, 0, 7, 2];
        let mut out = vec![9.0f32; 12];
        unsafe { g.forward(t.as_ptr(), ids.as_ptr().cast(), out.as_mut_ptr(), 0, 4, 4) };
        let cell = |r: usize, v: usize| t[r * 5 + v];
        let want = [cell(0, 4), cell(1, 4), cell(2, 4), cell(0, 0), cell(1, 0), cell(2, 0)];
        assert_eq!(&out[..6], &want);
        assert!(out[6..9].iter().all(|x| *x == 0.0 && x.is_sign_negative()), "{out:?}");
        assert_eq!(&out[9..], &[cell(0, 2), cell(1, 2), cell(2, 2)]);
    }

    #[test]
    fn f32_ids_must_be_exact_integers_in_range() {
        let (t, g) = table();
        let g = Gather { ids_f32: true, ..g };
        let ids: [f32; 4] = [1.0, 1.5, f32::NAN, -1.0];
        let mut out = vec![9.0f32; 12];
        unsafe { g.forward(t.as_ptr(), ids.as_ptr().cast(), out.as_mut_ptr(), 0, 4, 4) };
        assert_eq!(&out[..3], &[t[1], t[6], t[11]]);
        assert!(out[3..].iter().all(|x| *x == 0.0 && x.is_sign_negative()), "{out:?}");
    }

    #[test]
    fn backward_adds_rows_in_token_order_and_stops_at_the_used_tokens() {
        let (_, g) = table();
        let ids: [u32; 4] = [2, 2, 9, 2];
        let d_out: Vec<f32> = vec![1.0, 2.0, 3.0, 1e8, 1e8, 1e8, 5.0, 5.0, 5.0, 7.0, 7.0, 7.0];
        let mut d_table = vec![1.0f32; 15];
        // Rows 1..3 only, and only the first three tokens.
        unsafe { g.backward(d_table.as_mut_ptr(), ids.as_ptr().cast(), d_out.as_ptr(), 1, 2, 3) };
        let mut want = vec![1.0f32; 15];
        for r in 1..3 {
            want[r * 5 + 2] = (1.0 + d_out[r]) + d_out[3 + r];
        }
        assert_eq!(d_table, want);
    }

    #[test]
    fn the_descriptor_round_trips() {
        let (_, g) = table();
        let mut d = g.descriptor(true, 2, 7);
        d[9] = 3;
        assert_eq!(Gather::from_descriptor(&d), (g, true, 2, 7, 3));
    }
}

//! Where a call's cells are: odometers over axes, chunks of up to [`CHUNK`] consecutive cells
//! with every operand's offsets, and the reads and writes of a chunk's lanes.

use super::{CHUNK, MAX_AXES, MAX_INPUTS, MapAxisDesc, MapElem, Offs};

/// The offsets of every point of some axes, row-major, starting from a base: an odometer
/// (no recursion and no closure, so that everything inlines into the instruction set's
/// function).
pub(super) struct Odometer<'a> {
    pub(super) axes: &'a [MapAxisDesc],
    pub(super) idx: [usize; MAX_AXES],
    pub(super) offs: Offs,
    pub(super) done: bool,
}

impl<'a> Odometer<'a> {
    #[inline(always)]
    pub(super) fn new(axes: &'a [MapAxisDesc], base: Offs) -> Self {
        Odometer { axes, idx: [0; MAX_AXES], offs: base, done: axes.iter().any(|a| a.n == 0) }
    }

    #[inline(always)]
    pub(super) fn next(&mut self) -> Option<Offs> {
        if self.done {
            return None;
        }
        let cur = self.offs;
        for k in (0..self.axes.len()).rev() {
            let a = &self.axes[k];
            self.idx[k] += 1;
            self.offs[0] += a.out;
            for (x, s) in self.offs[1..].iter_mut().zip(&a.steps) {
                *x += s;
            }
            if self.idx[k] < a.n {
                return Some(cur);
            }
            let n = a.n as isize;
            self.offs[0] -= n * a.out;
            for (x, s) in self.offs[1..].iter_mut().zip(&a.steps) {
                *x -= n * s;
            }
            self.idx[k] = 0;
        }
        self.done = true;
        Some(cur)
    }
}

/// Where one operand's cells of a chunk are: `start + l·step` for lane `l`, or anywhere (the
/// chunk's offset table).
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub(super) enum Lanes {
    Strided(isize, isize),
    Table,
}

/// Up to [`CHUNK`] cells, consecutive in the row-major order of the cell axes (so a chunk is
/// full whatever the axes' lengths), with every operand's offset for each lane.
pub(super) struct Chunk {
    pub(super) w: usize,
    pub(super) offs: [[isize; CHUNK]; 1 + MAX_INPUTS],
    pub(super) lanes: [Lanes; 1 + MAX_INPUTS],
}

/// The cells of a call, chunk by chunk: an odometer over the cell axes but the last, and a
/// position along the last.
pub(super) struct Cells<'a> {
    pub(super) outer: Odometer<'a>,
    pub(super) last: MapAxisDesc,
    pub(super) base: Option<Offs>,
    pub(super) j: usize,
    pub(super) operands: usize,
}

impl<'a> Cells<'a> {
    #[inline(always)]
    pub(super) fn new(cells: &'a [MapAxisDesc], operands: usize) -> Self {
        let (outer, last) = match cells.split_last() {
            Some((l, o)) => (o, *l),
            None => (cells, MapAxisDesc { n: 1, ..Default::default() }),
        };
        let mut outer = Odometer::new(outer, [0; 1 + MAX_INPUTS]);
        let base = if last.n == 0 { None } else { outer.next() };
        Cells { outer, last, base, j: 0, operands }
    }

    /// Fills the next chunk; `false` when no cell is left.
    #[inline(always)]
    pub(super) fn next(&mut self, c: &mut Chunk) -> bool {
        let Some(base) = self.base else { return false };
        // A run of the last axis that fills the chunk: its operands are strided, no table.
        let run = (self.last.n - self.j).min(CHUNK);
        if run == CHUNK || self.j + run == self.last.n && self.outer.done {
            for (k, b) in base.iter().enumerate().take(self.operands) {
                let step = if k == 0 { self.last.out } else { self.last.steps[k - 1] };
                c.lanes[k] = Lanes::Strided(b + self.j as isize * step, step);
            }
            c.w = run;
            self.j += run;
            if self.j == self.last.n {
                self.j = 0;
                self.base = self.outer.next();
            }
            return true;
        }
        let mut l = 0;
        while l < CHUNK {
            let Some(base) = self.base else { break };
            let run = (self.last.n - self.j).min(CHUNK - l);
            for (k, b) in base.iter().enumerate().take(self.operands) {
                let step = if k == 0 { self.last.out } else { self.last.steps[k - 1] };
                let first = b + self.j as isize * step;
                for (r, o) in c.offs[k][l..l + run].iter_mut().enumerate() {
                    *o = first + r as isize * step;
                }
            }
            l += run;
            self.j += run;
            if self.j == self.last.n {
                self.j = 0;
                self.base = self.outer.next();
            }
        }
        c.w = l;
        for k in 0..self.operands {
            let o = &c.offs[k];
            let step = if l > 1 { o[1] - o[0] } else { 1 };
            let strided = (1..l).all(|i| o[i] - o[i - 1] == step);
            c.lanes[k] = if strided { Lanes::Strided(o[0], step) } else { Lanes::Table };
        }
        l > 0
    }
}

/// Reads an operand's `w` lanes, each moved by `delta`.
#[inline(always)]
pub(super) unsafe fn get<T: MapElem>(
    p: *const T,
    lanes: Lanes,
    table: &[isize; CHUNK],
    delta: isize,
    buf: &mut [T; CHUNK],
    w: usize,
) {
    // SAFETY: the caller's contract.
    unsafe {
        match lanes {
            Lanes::Strided(start, step) => load(p.offset(start + delta), step, buf, w),
            Lanes::Table => {
                for (x, o) in buf[..w].iter_mut().zip(&table[..w]) {
                    *x = *p.offset(o + delta);
                }
            }
        }
    }
}

/// Writes `w` lanes of the result.
#[inline(always)]
pub(super) unsafe fn put<T: MapElem>(
    p: *mut T,
    lanes: Lanes,
    table: &[isize; CHUNK],
    buf: &[T; CHUNK],
    w: usize,
) {
    // SAFETY: the caller's contract.
    unsafe {
        match lanes {
            Lanes::Strided(start, step) => store(p.offset(start), step, buf, w),
            Lanes::Table => {
                for (x, o) in buf[..w].iter().zip(&table[..w]) {
                    *p.offset(*o) = *x;
                }
            }
        }
    }
}

/// Reads `w` values `step` apart.
#[inline(always)]
pub(super) unsafe fn load<T: MapElem>(p: *const T, step: isize, buf: &mut [T; CHUNK], w: usize) {
    // SAFETY: the caller's contract.
    unsafe {
        match step {
            1 if w == CHUNK => *buf = std::ptr::read_unaligned(p as *const [T; CHUNK]),
            1 => {
                for (l, x) in buf[..w].iter_mut().enumerate() {
                    *x = *p.add(l);
                }
            }
            0 => buf[..w].fill(*p),
            _ => {
                for (l, x) in buf[..w].iter_mut().enumerate() {
                    *x = *p.offset(l as isize * step);
                }
            }
        }
    }
}

/// Writes `w` values `step` apart (the last one wins where the step is 0).
#[inline(always)]
pub(super) unsafe fn store<T: MapElem>(p: *mut T, step: isize, buf: &[T; CHUNK], w: usize) {
    // SAFETY: the caller's contract.
    unsafe {
        match step {
            1 if w == CHUNK => std::ptr::write_unaligned(p as *mut [T; CHUNK], *buf),
            1 => {
                for (l, x) in buf[..w].iter().enumerate() {
                    *p.add(l) = *x;
                }
            }
            _ => {
                for (l, x) in buf[..w].iter().enumerate() {
                    *p.offset(l as isize * step) = *x;
                }
            }
        }
    }
}

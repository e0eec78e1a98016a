//! The map kernel: pointwise maps and reductions over strided tensors, written once.
//!
//! After products, what a training step's routine holds is many small nests of a few shapes:
//! layout copies (`bhqd → bqhd`), broadcasts and bias adds, activations, the row maxima and
//! sums of a softmax, the means of a layer norm, bias gradients. Each was a loop nest with
//! constant trip counts that GCC unrolled, vectorized and permuted at `-O3` — a few
//! milliseconds of compile time apiece, for code that runs in microseconds. This kernel runs
//! all of them: the nest's sizes, steps and expression arrive as one descriptor of `i64`
//! words, built by the CPU schedule ([`crate::low_level::Map`]) and passed by the generated
//! routine.
//!
//! What one call computes, cell by cell (cells: every point of the cell axes):
//!
//! ```text
//! no reduction:   out[cell] := e(inputs at cell)
//! reduction ⊕:    t := neutral (or out[cell]); for each point, in row-major order:
//!                     t := t ⊕ e(inputs at cell, point);
//!                 out[cell] := t
//! ```
//!
//! `e` is a postfix program over the inputs ([`MapCode`]), every operation rounded to the
//! precision `T` exactly as the interpreter and generated code round it (the op table's one
//! definition, [`crate::ops`]). So a call gives the bits of the nest it replaces. The kernel
//! vectorizes across cells: up to 128 cells, consecutive in the row-major order of the cell
//! axes (the axis whose operands are closest to contiguous put innermost), are evaluated
//! together operation by operation, and each point is folded into their 128 accumulators in
//! turn; an operand's cells in a chunk are one strided run, or any cells through a table of
//! offsets. With fewer than 8 cells (a whole-tensor sum), it evaluates `e` for up to 128
//! consecutive points of one cell and folds them into `t` left to right. Neither changes any
//! cell's operations or their order.

use super::Isa;
use crate::ops::{BinOp, Real, TernOp, UnOp};

/// The most cell axes, and the most point axes, of one call.
pub const MAX_AXES: usize = 6;
/// The most distinct input reads of one call.
pub const MAX_INPUTS: usize = 6;
/// The deepest evaluation stack a program may need.
pub const MAX_STACK: usize = 6;
/// The most instructions of one program.
pub const MAX_CODE: usize = 48;
/// Words before the axes: cell axes, point axes, inputs, the reduction (`-1` or the
/// operator's position in [`BinOp::ALL`]), whether it accumulates onto the cells' values,
/// instructions.
pub const MAP_HEADER: usize = 6;
/// The count word of an axis without one (a count may be negative: no iterations).
pub const NO_COUNT: i64 = i64::MIN;
/// Cells (or points) evaluated together.
const CHUNK: usize = 128;
/// Points of a row read together where each cell's points are contiguous (`fold_block`).
const ROW_RUN: usize = 16;
/// Cells below which the kernel evaluates points together instead (one cell at a time).
const MIN_VECTOR_CELLS: usize = 8;

/// One instruction of a map's expression, in postfix order.
#[derive(Copy, Clone, Debug, PartialEq)]
pub enum MapCode {
    /// Pushes input `i` at the current cell and point.
    Input(usize),
    /// Pushes a constant (rounded to the precision).
    Const(f64),
    /// Replaces the top with `op(top)`.
    Un(UnOp),
    /// Pops `b`, replaces the top `a` with `op(a, b)`.
    Bin(BinOp),
    /// Pops `c` and `b`, replaces the top `a` with `op(a, b, c)`.
    Tern(TernOp),
}

impl MapCode {
    /// The instruction's two descriptor words.
    pub fn words(self) -> [i64; 2] {
        let pos = |found: Option<usize>| found.map_or(-1, |p| p as i64);
        match self {
            MapCode::Input(i) => [0, i as i64],
            MapCode::Const(c) => [1, c.to_bits() as i64],
            MapCode::Un(op) => [2, pos(UnOp::ALL.iter().position(|o| *o == op))],
            MapCode::Bin(op) => [3, pos(BinOp::ALL.iter().position(|o| *o == op))],
            MapCode::Tern(op) => [4, pos(TernOp::ALL.iter().position(|o| *o == op))],
        }
    }

    /// The instruction of two descriptor words.
    pub fn from_words(tag: i64, arg: i64) -> Option<MapCode> {
        let at = |n: usize| usize::try_from(arg).ok().filter(|a| *a < n);
        Some(match tag {
            0 => MapCode::Input(at(MAX_INPUTS)?),
            1 => MapCode::Const(f64::from_bits(arg as u64)),
            2 => MapCode::Un(UnOp::ALL[at(UnOp::ALL.len())?]),
            3 => MapCode::Bin(BinOp::ALL[at(BinOp::ALL.len())?]),
            4 => MapCode::Tern(TernOp::ALL[at(TernOp::ALL.len())?]),
            _ => return None,
        })
    }

    /// The change in stack depth.
    pub fn depth_change(self) -> isize {
        match self {
            MapCode::Input(_) | MapCode::Const(_) => 1,
            MapCode::Un(_) => 0,
            MapCode::Bin(_) => -1,
            MapCode::Tern(_) => -2,
        }
    }
}

/// One axis of a call: its size (clipped to a dynamic count) and the flat steps of the
/// result and of each input along it.
#[derive(Copy, Clone, Debug, Default, PartialEq, Eq)]
pub struct MapAxisDesc {
    /// Iterations.
    pub n: usize,
    /// The result's step (0 for a point axis).
    pub out: isize,
    /// Each input's step.
    pub steps: [isize; MAX_INPUTS],
}

/// A descriptor decoded.
#[derive(Clone, Debug, PartialEq)]
pub struct MapDesc {
    /// Cell axes, outermost first.
    pub cells: Vec<MapAxisDesc>,
    /// Point axes, outermost first.
    pub points: Vec<MapAxisDesc>,
    /// Input reads.
    pub inputs: usize,
    /// The reduction's operator.
    pub reduce: Option<BinOp>,
    /// The reduction starts from the cells' values (else from the neutral element).
    pub accumulate: bool,
    /// The expression.
    pub code: Vec<MapCode>,
}

impl MapDesc {
    /// Decodes the words the schedule wrote (`crate::low_level::Map::descriptor`); `None`
    /// for words no schedule writes.
    pub fn decode(w: &[i64]) -> Option<MapDesc> {
        let head = w.get(..MAP_HEADER)?;
        let count = |x: i64, most: usize| usize::try_from(x).ok().filter(|n| *n <= most);
        let (nc, np) = (count(head[0], MAX_AXES)?, count(head[1], MAX_AXES)?);
        let inputs = count(head[2], MAX_INPUTS)?;
        let reduce = match head[3] {
            -1 => None,
            r => Some(BinOp::ALL[count(r, BinOp::ALL.len() - 1)?]),
        };
        let ncode = count(head[5], MAX_CODE)?;
        let mut at = MAP_HEADER;
        let mut axis = |with_out: bool| -> Option<MapAxisDesc> {
            let words = 3 + usize::from(with_out) + inputs;
            let a = w.get(at..at + words)?;
            at += words;
            let (extent, size, per) = (a[0].max(0), a[1], a[2].max(1));
            let n =
                if size == NO_COUNT { extent } else { extent.min((size + per - 1) / per).max(0) };
            let mut steps = [0isize; MAX_INPUTS];
            let rest = &a[3 + usize::from(with_out)..];
            for (s, x) in steps.iter_mut().zip(rest) {
                *s = *x as isize;
            }
            Some(MapAxisDesc {
                n: n as usize,
                out: if with_out { a[3] as isize } else { 0 },
                steps,
            })
        };
        let cells = (0..nc).map(|_| axis(true)).collect::<Option<Vec<_>>>()?;
        let points = (0..np).map(|_| axis(false)).collect::<Option<Vec<_>>>()?;
        let code_words = w.get(at..at + 2 * ncode)?;
        let code = code_words
            .chunks(2)
            .map(|c| MapCode::from_words(c[0], c[1]))
            .collect::<Option<Vec<_>>>()?;
        let d = MapDesc { cells, points, inputs, reduce, accumulate: head[4] != 0, code };
        d.well_formed().then_some(d)
    }

    /// The descriptor's words (the inverse of [`MapDesc::decode`]; no axis has a dynamic
    /// count): for benchmarks and tests that call the kernel directly.
    pub fn encode(&self) -> Vec<i64> {
        let reduce = self
            .reduce
            .map_or(-1, |r| BinOp::ALL.iter().position(|o| *o == r).map_or(-1, |p| p as i64));
        let mut w = vec![
            self.cells.len() as i64,
            self.points.len() as i64,
            self.inputs as i64,
            reduce,
            i64::from(self.accumulate),
            self.code.len() as i64,
        ];
        for (a, with_out) in
            self.cells.iter().map(|a| (a, true)).chain(self.points.iter().map(|a| (a, false)))
        {
            w.extend([a.n as i64, NO_COUNT, 1]);
            if with_out {
                w.push(a.out as i64);
            }
            w.extend(a.steps[..self.inputs].iter().map(|s| *s as i64));
        }
        for c in &self.code {
            w.extend(c.words());
        }
        w
    }

    /// The program reads only declared inputs, never needs more than [`MAX_STACK`] values and
    /// leaves exactly one; only a reduction has points, and its operator a neutral element.
    fn well_formed(&self) -> bool {
        let mut depth = 0isize;
        for c in &self.code {
            if let MapCode::Input(i) = c
                && *i >= self.inputs
            {
                return false;
            }
            let need = match c {
                MapCode::Bin(_) => 2,
                MapCode::Tern(_) => 3,
                MapCode::Un(_) => 1,
                _ => 0,
            };
            if depth < need {
                return false;
            }
            depth += c.depth_change();
            if depth > MAX_STACK as isize {
                return false;
            }
        }
        // Points belong to reductions; a reduction's operator has a neutral element.
        depth == 1
            && (self.reduce.is_some() || self.points.is_empty())
            && self.reduce.is_none_or(|r| r.is_reorderable() && r.neutral().is_some())
    }
}

/// The signature generated code calls [`rc_map_f32`] and [`rc_map_f64`] with: the result's
/// first cell, then each input's, and the descriptor's words.
pub type MapFn<T> = unsafe extern "C" fn(*const *mut T, *const i64);

/// The element types the map kernel computes in.
pub(crate) trait MapElem: Real + Default + 'static {
    fn of(x: f64) -> Self;
}

impl MapElem for f32 {
    #[inline(always)]
    fn of(x: f64) -> f32 {
        x as f32
    }
}

impl MapElem for f64 {
    #[inline(always)]
    fn of(x: f64) -> f64 {
        x
    }
}

/// Flat offsets of the result (first) and of each input.
type Offs = [isize; 1 + MAX_INPUTS];

/// Runs a call on the host's best instruction set.
///
/// # Safety
/// `ptrs` holds `1 + d.inputs` pointers; every cell the descriptor addresses from them must be
/// valid for the access (reads of inputs, reads and writes of the result), and the result's
/// cells may overlap an input's only where that input is read at the cell being written.
pub(crate) unsafe fn map<T: MapElem>(ptrs: &[*mut T], d: &MapDesc) {
    match Isa::host() {
        #[cfg(target_arch = "x86_64")]
        Isa::Avx512 => {
            #[target_feature(enable = "avx512f,avx2,fma")]
            unsafe fn go<T: MapElem>(ptrs: &[*mut T], d: &MapDesc) {
                // SAFETY: the caller's contract.
                unsafe { run(ptrs, d) }
            }
            // SAFETY: the caller's contract; the host has the features.
            unsafe { go(ptrs, d) }
        }
        #[cfg(target_arch = "x86_64")]
        Isa::Avx2 => {
            #[target_feature(enable = "avx2,fma")]
            unsafe fn go<T: MapElem>(ptrs: &[*mut T], d: &MapDesc) {
                // SAFETY: the caller's contract.
                unsafe { run(ptrs, d) }
            }
            // SAFETY: the caller's contract; the host has the features.
            unsafe { go(ptrs, d) }
        }
        // SAFETY: the caller's contract.
        _ => unsafe { run(ptrs, d) },
    }
}

/// The offsets of every point of some axes, row-major, starting from a base: an odometer
/// (no recursion and no closure, so that everything inlines into the instruction set's
/// function).
struct Odometer<'a> {
    axes: &'a [MapAxisDesc],
    idx: [usize; MAX_AXES],
    offs: Offs,
    done: bool,
}

impl<'a> Odometer<'a> {
    #[inline(always)]
    fn new(axes: &'a [MapAxisDesc], base: Offs) -> Self {
        Odometer { axes, idx: [0; MAX_AXES], offs: base, done: axes.iter().any(|a| a.n == 0) }
    }

    #[inline(always)]
    fn next(&mut self) -> Option<Offs> {
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
enum Lanes {
    Strided(isize, isize),
    Table,
}

/// Up to [`CHUNK`] cells, consecutive in the row-major order of the cell axes (so a chunk is
/// full whatever the axes' lengths), with every operand's offset for each lane.
struct Chunk {
    w: usize,
    offs: [[isize; CHUNK]; 1 + MAX_INPUTS],
    lanes: [Lanes; 1 + MAX_INPUTS],
}

/// The cells of a call, chunk by chunk: an odometer over the cell axes but the last, and a
/// position along the last.
struct Cells<'a> {
    outer: Odometer<'a>,
    last: MapAxisDesc,
    base: Option<Offs>,
    j: usize,
    operands: usize,
}

impl<'a> Cells<'a> {
    #[inline(always)]
    fn new(cells: &'a [MapAxisDesc], operands: usize) -> Self {
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
    fn next(&mut self, c: &mut Chunk) -> bool {
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

#[inline(always)]
unsafe fn run<T: MapElem>(ptrs: &[*mut T], d: &MapDesc) {
    let total: usize = d.cells.iter().map(|a| a.n).product();
    if total == 0 {
        return;
    }
    let mut ev = Eval::<T> { stack: [[T::default(); CHUNK]; MAX_STACK] };
    let neutral = d.reduce.and_then(|r| r.neutral()).map_or(T::default(), T::of);
    let out = ptrs[0];
    if total >= MIN_VECTOR_CELLS || d.points.is_empty() {
        // Cells together, each cell's points in order.
        let mut chunk = Chunk {
            w: 0,
            offs: [[0; CHUNK]; 1 + MAX_INPUTS],
            lanes: [Lanes::Table; 1 + MAX_INPUTS],
        };
        // The axis whose operands are closest to contiguous goes innermost (the order of the
        // cells changes no cell's value), so that a chunk is one strided run where it can be.
        let mut order = [MapAxisDesc::default(); MAX_AXES];
        let nc = d.cells.len();
        order[..nc].copy_from_slice(&d.cells);
        let far = |s: isize| usize::from(s.unsigned_abs() != 1);
        let cost = |a: &MapAxisDesc| {
            2 * far(a.out) + a.steps[..d.inputs].iter().map(|s| far(*s)).sum::<usize>()
        };
        if let Some(best) = (0..nc)
            .filter(|&k| order[k].n >= MIN_VECTOR_CELLS)
            .min_by_key(|&k| (cost(&order[k]), nc - k))
        {
            order[best..nc].rotate_left(1);
        }
        let mut cells = Cells::new(&order[..nc], 1 + d.inputs);
        let mut acc = [T::default(); CHUNK];
        // A reduction of one plain read folds straight from memory ([`fold_block`]).
        let plain = d.code == [MapCode::Input(0)];
        while cells.next(&mut chunk) {
            let w = chunk.w;
            // SAFETY: the caller's contract covers every cell and point.
            unsafe {
                let Some(r) = d.reduce else {
                    ev.eval(d, ptrs, &chunk, &[0; 1 + MAX_INPUTS]);
                    put(out, chunk.lanes[0], &chunk.offs[0], &ev.stack[0], w);
                    continue;
                };
                if d.accumulate {
                    get(out, chunk.lanes[0], &chunk.offs[0], 0, &mut acc, w);
                } else {
                    acc[..w].fill(neutral);
                }
                if plain {
                    // Blocks of cells whose accumulators stay in registers across the points.
                    let mut l0 = 0;
                    while l0 < w {
                        let n = match w - l0 {
                            rest if rest >= 64 => 64,
                            rest if rest >= 16 => 16,
                            _ => 1,
                        };
                        let lanes = match chunk.lanes[1] {
                            Lanes::Strided(start, step) => {
                                Lanes::Strided(start + l0 as isize * step, step)
                            }
                            Lanes::Table => Lanes::Table,
                        };
                        let (acc, table) = (&mut acc[l0..l0 + n], &chunk.offs[1][l0..l0 + n]);
                        let q = ptrs[1] as *const T;
                        match n {
                            64 => fold_block::<T, 64>(r, acc, q, lanes, table, &d.points),
                            16 => fold_block::<T, 16>(r, acc, q, lanes, table, &d.points),
                            _ => fold_block::<T, 1>(r, acc, q, lanes, table, &d.points),
                        }
                        l0 += n;
                    }
                } else {
                    // The points: an odometer over all axes but the last, a counted loop
                    // along it.
                    let (outer, last) = split_points(&d.points);
                    let mut points = Odometer::new(outer, [0; 1 + MAX_INPUTS]);
                    while let Some(base) = points.next() {
                        let mut p = base;
                        for _ in 0..last.n {
                            ev.eval(d, ptrs, &chunk, &p);
                            fold_lanes(r, &mut acc, &ev.stack[0], w);
                            for (x, s) in p[1..=d.inputs].iter_mut().zip(&last.steps) {
                                *x += s;
                            }
                        }
                    }
                }
                put(out, chunk.lanes[0], &chunk.offs[0], &acc, w);
            }
        }
        return;
    }
    // A few cells with many points each: `e` for runs of the innermost point axis, folded in
    // order.
    let (outer, last) = match d.points.split_last() {
        Some((l, o)) => (o, *l),
        None => (&d.points[..0], MapAxisDesc { n: 1, ..Default::default() }),
    };
    let mut chunk =
        Chunk { w: 0, offs: [[0; CHUNK]; 1 + MAX_INPUTS], lanes: [Lanes::Table; 1 + MAX_INPUTS] };
    let mut cells = Odometer::new(&d.cells, [0; 1 + MAX_INPUTS]);
    while let Some(cell) = cells.next() {
        // SAFETY: the caller's contract covers every cell and point.
        unsafe {
            let o = out.offset(cell[0]);
            let Some(r) = d.reduce else { unreachable!("maps have cells") };
            let mut t = if d.accumulate { *o } else { neutral };
            let mut points = Odometer::new(outer, cell);
            while let Some(p) = points.next() {
                let mut start = 0;
                while start < last.n {
                    let w = CHUNK.min(last.n - start);
                    chunk.w = w;
                    for (k, pk) in p.iter().enumerate().take(1 + d.inputs).skip(1) {
                        let step = last.steps[k - 1];
                        chunk.lanes[k] = Lanes::Strided(pk + start as isize * step, step);
                    }
                    ev.eval(d, ptrs, &chunk, &[0; 1 + MAX_INPUTS]);
                    t = fold_in_order(r, t, &ev.stack[0], w);
                    start += w;
                }
            }
            *o = t;
        }
    }
}

/// The point axes as the outer ones and the last (a one-point axis when there is none).
#[inline(always)]
fn split_points(points: &[MapAxisDesc]) -> (&[MapAxisDesc], MapAxisDesc) {
    match points.split_last() {
        Some((l, o)) => (o, *l),
        None => (points, MapAxisDesc { n: 1, ..Default::default() }),
    }
}

/// `acc[l] := acc[l] ⊕ x(point)` for `B` cells over every point in order, `x` one read: the
/// `B` accumulators are a fixed-size array, which the compiler keeps in registers across the
/// points (one vector of the host per 16 f32 cells).
#[inline(always)]
unsafe fn fold_block<T: MapElem, const B: usize>(
    r: BinOp,
    acc: &mut [T],
    p: *const T,
    lanes: Lanes,
    table: &[isize],
    points: &[MapAxisDesc],
) {
    let (outer, last) = split_points(points);
    let step = last.steps[0];
    macro_rules! blocks {
        ($($op:ident),*) => {
            match r {
                $(BinOp::$op => {
                    let mut a = [T::default(); B];
                    a.copy_from_slice(&acc[..B]);
                    let mut pts = Odometer::new(outer, [0; 1 + MAX_INPUTS]);
                    while let Some(base) = pts.next() {
                        // SAFETY: the caller's contract covers every cell and point.
                        unsafe {
                            match lanes {
                                Lanes::Strided(start, 1) => {
                                    let mut q = p.offset(start + base[1]);
                                    for _ in 0..last.n {
                                        for (l, x) in a.iter_mut().enumerate() {
                                            *x = BinOp::$op.compute(*x, *q.add(l));
                                        }
                                        q = q.offset(step);
                                    }
                                }
                                Lanes::Strided(start, s) => {
                                    let mut q = p.offset(start + base[1]);
                                    let mut left = last.n;
                                    // Each cell's points contiguous (row sums): read them by
                                    // rows, 16 points at a time, into a transposed block, and
                                    // fold its columns — still each cell's points in order.
                                    if step == 1 && B > 1 {
                                        let mut block = [[T::default(); B]; ROW_RUN];
                                        while left >= ROW_RUN {
                                            for l in 0..B {
                                                let row = q.offset(l as isize * s);
                                                for (k, r) in block.iter_mut().enumerate() {
                                                    r[l] = *row.add(k);
                                                }
                                            }
                                            for r in &block {
                                                for (x, y) in a.iter_mut().zip(r) {
                                                    *x = BinOp::$op.compute(*x, *y);
                                                }
                                            }
                                            q = q.add(ROW_RUN);
                                            left -= ROW_RUN;
                                        }
                                    }
                                    for _ in 0..left {
                                        for (l, x) in a.iter_mut().enumerate() {
                                            *x = BinOp::$op.compute(*x, *q.offset(l as isize * s));
                                        }
                                        q = q.offset(step);
                                    }
                                }
                                Lanes::Table => {
                                    let mut q = p.offset(base[1]);
                                    for _ in 0..last.n {
                                        for (x, o) in a.iter_mut().zip(&table[..B]) {
                                            *x = BinOp::$op.compute(*x, *q.offset(*o));
                                        }
                                        q = q.offset(step);
                                    }
                                }
                            }
                        }
                    }
                    acc[..B].copy_from_slice(&a);
                })*
                _ => unreachable!("the reductions' operators are these"),
            }
        };
    }
    blocks!(Add, Mul, Max, Min)
}

/// Reads an operand's `w` lanes, each moved by `delta`.
#[inline(always)]
unsafe fn get<T: MapElem>(
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
unsafe fn put<T: MapElem>(
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
unsafe fn load<T: MapElem>(p: *const T, step: isize, buf: &mut [T; CHUNK], w: usize) {
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
unsafe fn store<T: MapElem>(p: *mut T, step: isize, buf: &[T; CHUNK], w: usize) {
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

/// `acc[l] := acc[l] ⊕ v[l]` for each lane (each lane its own cell).
#[inline(always)]
fn fold_lanes<T: MapElem>(r: BinOp, acc: &mut [T; CHUNK], v: &[T; CHUNK], w: usize) {
    macro_rules! lanes {
        ($($op:ident),*) => {
            match r {
                $(BinOp::$op => {
                    for (a, x) in acc[..w].iter_mut().zip(&v[..w]) {
                        *a = BinOp::$op.compute(*a, *x);
                    }
                })*
                _ => {
                    for (a, x) in acc[..w].iter_mut().zip(&v[..w]) {
                        *a = r.compute(*a, *x);
                    }
                }
            }
        };
    }
    lanes!(Add, Mul, Max, Min)
}

/// `t := t ⊕ v[0] ⊕ v[1] ⊕ …`, left to right (one cell's consecutive points).
#[inline(always)]
fn fold_in_order<T: MapElem>(r: BinOp, mut t: T, v: &[T; CHUNK], w: usize) -> T {
    macro_rules! chain {
        ($($op:ident),*) => {
            match r {
                $(BinOp::$op => {
                    for x in &v[..w] {
                        t = BinOp::$op.compute(t, *x);
                    }
                })*
                _ => {
                    for x in &v[..w] {
                        t = r.compute(t, *x);
                    }
                }
            }
        };
    }
    chain!(Add, Mul, Max, Min);
    t
}

/// The evaluation stack: one chunk of lanes per level.
struct Eval<T> {
    stack: [[T; CHUNK]; MAX_STACK],
}

impl<T: MapElem> Eval<T> {
    /// Evaluates the program for the chunk's lanes, each input read at its lane's offset moved
    /// by the point's `delta`; the result is left in `stack[0]`.
    #[inline(always)]
    unsafe fn eval(&mut self, d: &MapDesc, ptrs: &[*mut T], c: &Chunk, delta: &Offs) {
        let w = c.w;
        let mut sp = 0usize;
        for code in &d.code {
            match *code {
                MapCode::Input(i) => {
                    // SAFETY: the caller's contract.
                    unsafe {
                        get(
                            ptrs[1 + i],
                            c.lanes[1 + i],
                            &c.offs[1 + i],
                            delta[1 + i],
                            &mut self.stack[sp],
                            w,
                        )
                    };
                    sp += 1;
                }
                MapCode::Const(x) => {
                    self.stack[sp][..w].fill(T::of(x));
                    sp += 1;
                }
                MapCode::Un(op) => unary(op, &mut self.stack[sp - 1], w),
                MapCode::Bin(op) => {
                    let (lo, hi) = self.stack.split_at_mut(sp - 1);
                    binary(op, &mut lo[sp - 2], &hi[0], w);
                    sp -= 1;
                }
                MapCode::Tern(op) => {
                    let (lo, hi) = self.stack.split_at_mut(sp - 2);
                    let (b, c) = hi.split_at(1);
                    ternary(op, &mut lo[sp - 3], &b[0], &c[0], w);
                    sp -= 2;
                }
            }
        }
    }
}

#[inline(always)]
fn unary<T: MapElem>(op: UnOp, a: &mut [T; CHUNK], w: usize) {
    macro_rules! each {
        ($($op:ident),*) => {
            match op {
                $(UnOp::$op => {
                    for x in &mut a[..w] {
                        *x = UnOp::$op.compute(*x);
                    }
                })*
            }
        };
    }
    each!(
        Identity, Neg, Relu, Sat01, Exp, Log, Exp2, Log2, Sqrt, Recip, Sin, Cos, Tanh, Erf,
        Sigmoid, Abs, Not
    )
}

#[inline(always)]
fn binary<T: MapElem>(op: BinOp, a: &mut [T; CHUNK], b: &[T; CHUNK], w: usize) {
    macro_rules! each {
        ($($op:ident),*) => {
            match op {
                $(BinOp::$op => {
                    for (x, y) in a[..w].iter_mut().zip(&b[..w]) {
                        *x = BinOp::$op.compute(*x, *y);
                    }
                })*
            }
        };
    }
    each!(Add, Sub, Mul, Div, Pow, Max, Min, Lt, Le, Gt, Eq, Ne, Second)
}

#[inline(always)]
fn ternary<T: MapElem>(op: TernOp, a: &mut [T; CHUNK], b: &[T; CHUNK], c: &[T; CHUNK], w: usize) {
    macro_rules! each {
        ($($op:ident),*) => {
            match op {
                $(TernOp::$op => {
                    for ((x, y), z) in a[..w].iter_mut().zip(&b[..w]).zip(&c[..w]) {
                        *x = TernOp::$op.compute(*x, *y, *z);
                    }
                })*
            }
        };
    }
    each!(Where, Fma)
}

macro_rules! entry {
    ($name:ident, $t:ty) => {
        /// The entry point generated code calls (through the run table): the map or reduction
        /// the descriptor's words describe.
        ///
        /// # Safety
        /// `words` must be a descriptor the schedule built, and `ptrs` hold the result's and
        /// each input's first cell, every cell the descriptor addresses valid for the access
        /// (see the module documentation). A descriptor that does not decode is a defect of
        /// the schedule: the call then aborts rather than guess.
        pub unsafe extern "C" fn $name(ptrs: *const *mut $t, words: *const i64) {
            // SAFETY: the caller's contract: the header, then the words it counts.
            let d = unsafe {
                let head = std::slice::from_raw_parts(words, MAP_HEADER);
                let len = desc_len(head);
                MapDesc::decode(std::slice::from_raw_parts(words, len))
            };
            let Some(d) = d else { std::process::abort() };
            // SAFETY: the caller's contract.
            let ptrs = unsafe { std::slice::from_raw_parts(ptrs, 1 + d.inputs) };
            // SAFETY: the caller's contract.
            unsafe { map::<$t>(ptrs, &d) }
        }
    };
}

/// The number of words of a descriptor, from its header.
pub fn desc_len(head: &[i64]) -> usize {
    let c = |x: i64, most: usize| usize::try_from(x).unwrap_or(0).min(most);
    let (nc, np, ni) = (c(head[0], MAX_AXES), c(head[1], MAX_AXES), c(head[2], MAX_INPUTS));
    MAP_HEADER + nc * (4 + ni) + np * (3 + ni) + 2 * c(head[5], MAX_CODE)
}

entry!(rc_map_f32, f32);
entry!(rc_map_f64, f64);

#[cfg(test)]
mod tests {
    use super::*;

    /// The descriptor of a call, as `crate::low_level::Map::descriptor` lays it out.
    fn words(
        cells: &[(i64, i64, &[i64])],
        points: &[(i64, &[i64])],
        reduce: Option<BinOp>,
        accumulate: bool,
        code: &[MapCode],
    ) -> Vec<i64> {
        let inputs = cells.first().map_or_else(|| points[0].1.len(), |c| c.2.len());
        let r = reduce.map_or(-1, |r| BinOp::ALL.iter().position(|o| *o == r).unwrap() as i64);
        let mut w = vec![
            cells.len() as i64,
            points.len() as i64,
            inputs as i64,
            r,
            i64::from(accumulate),
            code.len() as i64,
        ];
        for (n, out, steps) in cells {
            w.extend([*n, NO_COUNT, 1, *out]);
            w.extend(*steps);
        }
        for (n, steps) in points {
            w.extend([*n, NO_COUNT, 1]);
            w.extend(*steps);
        }
        for c in code {
            w.extend(c.words());
        }
        assert_eq!(w.len(), desc_len(&w[..MAP_HEADER]));
        w
    }

    fn data(n: usize, seed: u32) -> Vec<f32> {
        (0..n)
            .map(|i| {
                ((i as u32).wrapping_mul(2654435761).wrapping_add(seed) % 1000) as f32 / 250.0 - 2.0
            })
            .collect()
    }

    #[test]
    fn instructions_round_trip_through_their_words() {
        let code = [
            MapCode::Input(3),
            MapCode::Const(-0.1),
            MapCode::Un(UnOp::Tanh),
            MapCode::Bin(BinOp::Pow),
            MapCode::Tern(TernOp::Where),
        ];
        for c in code {
            let [t, a] = c.words();
            assert_eq!(MapCode::from_words(t, a), Some(c));
        }
        assert_eq!(MapCode::from_words(0, MAX_INPUTS as i64), None);
        assert_eq!(MapCode::from_words(7, 0), None);
        // A program that needs an operand it was not given does not decode.
        let bad = words(
            &[(4, 1, &[1])],
            &[],
            None,
            false,
            &[MapCode::Input(0), MapCode::Bin(BinOp::Add)],
        );
        assert_eq!(MapDesc::decode(&bad), None);
    }

    /// `out[i, j] := where(a[i, j] > b[j], exp(a[i, j] − b[j]), fma(a, 0.5, b))` over a 3 × 200
    /// box (the row broadcast by a step of 0; a chunk and a remainder along `j`), against the
    /// op table cell by cell.
    #[test]
    fn a_pointwise_map_computes_each_cell_as_the_op_table_does() {
        let (m, n) = (3usize, 200usize);
        let a = data(m * n, 1);
        let b = data(n, 2);
        let code = [
            MapCode::Input(0),
            MapCode::Input(1),
            MapCode::Bin(BinOp::Gt),
            MapCode::Input(0),
            MapCode::Input(1),
            MapCode::Bin(BinOp::Sub),
            MapCode::Un(UnOp::Exp),
            MapCode::Input(0),
            MapCode::Const(0.5),
            MapCode::Input(1),
            MapCode::Tern(TernOp::Fma),
            MapCode::Tern(TernOp::Where),
        ];
        let w = words(
            &[(m as i64, n as i64, &[n as i64, 0]), (n as i64, 1, &[1, 1])],
            &[],
            None,
            false,
            &code,
        );
        let d = MapDesc::decode(&w).unwrap();
        let mut out = vec![0f32; m * n];
        let ptrs = [out.as_mut_ptr(), a.as_ptr() as *mut f32, b.as_ptr() as *mut f32];
        // SAFETY: the descriptor addresses `m × n` cells of `out` and `a`, `n` of `b`.
        unsafe { map(&ptrs, &d) };
        for i in 0..m {
            for j in 0..n {
                let (x, y) = (a[i * n + j], b[j]);
                let want = TernOp::Where.apply_f32(
                    BinOp::Gt.apply_f32(x, y),
                    UnOp::Exp.apply_f32(x - y),
                    TernOp::Fma.apply_f32(x, 0.5, y),
                );
                assert_eq!(out[i * n + j].to_bits(), want.to_bits(), "cell {i}, {j}");
            }
        }
    }

    /// Sums of rows (no long cell axis: points in runs, folded in order) and of columns
    /// (cells together), onto old values, give the sequential sums' bits.
    #[test]
    fn reductions_fold_each_cells_points_in_order() {
        let (m, n) = (5usize, 300usize);
        let a = data(m * n, 3);
        let old = data(n.max(m), 4);
        let sum = |xs: &mut dyn Iterator<Item = f32>, t: f32| xs.fold(t, |t, x| t + x);
        // Rows: out[i] += Σ_j a[i, j].
        let w = words(
            &[(m as i64, 1, &[n as i64])],
            &[(n as i64, &[1])],
            Some(BinOp::Add),
            true,
            &[MapCode::Input(0)],
        );
        let mut out = old[..m].to_vec();
        // SAFETY: `m` cells of `out`, `m × n` of `a`.
        unsafe { map(&[out.as_mut_ptr(), a.as_ptr() as *mut f32], &MapDesc::decode(&w).unwrap()) };
        for i in 0..m {
            let want = sum(&mut a[i * n..(i + 1) * n].iter().copied(), old[i]);
            assert_eq!(out[i].to_bits(), want.to_bits(), "row {i}");
        }
        // Columns: out[j] := max_i a[i, j].
        let w = words(
            &[(n as i64, 1, &[1])],
            &[(m as i64, &[n as i64])],
            Some(BinOp::Max),
            false,
            &[MapCode::Input(0)],
        );
        let mut out = vec![0f32; n];
        // SAFETY: `n` cells of `out`, `m × n` of `a`.
        unsafe { map(&[out.as_mut_ptr(), a.as_ptr() as *mut f32], &MapDesc::decode(&w).unwrap()) };
        for j in 0..n {
            let want = (0..m).fold(f32::NEG_INFINITY, |t, i| BinOp::Max.apply_f32(t, a[i * n + j]));
            assert_eq!(out[j].to_bits(), want.to_bits(), "column {j}");
        }
    }

    /// Rows read 16 points at a time into a transposed block (cells' points contiguous):
    /// 83 rows (blocks of 64, 16 and single cells) of 53 points (three runs of 16 and 5 more),
    /// every operator, each row's fold in order.
    #[test]
    fn row_reductions_read_by_runs_fold_in_order() {
        let (m, n) = (83usize, 53usize);
        let a = data(m * n, 5);
        for op in [BinOp::Add, BinOp::Mul, BinOp::Max, BinOp::Min] {
            let w = words(
                &[(m as i64, 1, &[n as i64])],
                &[(n as i64, &[1])],
                Some(op),
                false,
                &[MapCode::Input(0)],
            );
            let mut out = vec![0f32; m];
            // SAFETY: `m` cells of `out`, `m × n` of `a`.
            unsafe {
                map(&[out.as_mut_ptr(), a.as_ptr() as *mut f32], &MapDesc::decode(&w).unwrap())
            };
            for i in 0..m {
                let t0 = op.neutral().unwrap() as f32;
                let want = a[i * n..(i + 1) * n].iter().fold(t0, |t, x| op.apply_f32(t, *x));
                assert_eq!(out[i].to_bits(), want.to_bits(), "{} row {i}", op.name());
            }
        }
    }

    #[test]
    fn encoding_then_decoding_gives_the_descriptor_back() {
        let w = words(
            &[(3, 40, &[40, 0]), (40, 1, &[1, 1])],
            &[(7, &[120, 0])],
            Some(BinOp::Max),
            true,
            &[
                MapCode::Input(0),
                MapCode::Input(1),
                MapCode::Un(UnOp::Exp),
                MapCode::Bin(BinOp::Mul),
            ],
        );
        let d = MapDesc::decode(&w).unwrap();
        assert_eq!(d.encode(), w);
        assert_eq!(MapDesc::decode(&d.encode()), Some(d));
    }

    #[test]
    fn a_dynamic_count_clips_an_axis_and_never_goes_below_zero() {
        let mut w = words(&[(10, 1, &[1])], &[], None, false, &[MapCode::Input(0)]);
        w[MAP_HEADER + 1] = 4; // 4 of the 10 cells
        assert_eq!(MapDesc::decode(&w).unwrap().cells[0].n, 4);
        w[MAP_HEADER + 1] = -6;
        assert_eq!(MapDesc::decode(&w).unwrap().cells[0].n, 0, "a block past a dynamic size");
        w[MAP_HEADER + 1] = 0;
        assert_eq!(MapDesc::decode(&w).unwrap().cells[0].n, 0);
    }
}

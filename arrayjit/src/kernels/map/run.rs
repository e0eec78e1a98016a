//! One call's loops: cells together chunk by chunk, each cell's points in order, or for a few
//! cells with many points, runs of points folded left to right.

use super::cells::{Cells, Chunk, Lanes, Odometer, get, put};
use super::eval::Eval;
use super::{
    CHUNK, MAX_AXES, MAX_INPUTS, MAX_STACK, MIN_VECTOR_CELLS, MapAxisDesc, MapCode, MapDesc,
    MapElem, ROW_RUN,
};
use crate::ops::BinOp;

/// Runs one call: cells together ([`by_cells`]) unless there are only a few cells with points
/// to reduce ([`by_points`]).
#[inline(always)]
pub(super) unsafe fn run<T: MapElem>(ptrs: &[*mut T], d: &MapDesc) {
    let total: usize = d.cells.iter().map(|a| a.n).product();
    if total == 0 {
        return;
    }
    let mut ev = Eval::<T> { stack: [[T::default(); CHUNK]; MAX_STACK] };
    // SAFETY: the caller's contract.
    unsafe {
        if total >= MIN_VECTOR_CELLS || d.points.is_empty() {
            by_cells(ptrs, d, &mut ev);
        } else {
            by_points(ptrs, d, &mut ev);
        }
    }
}

/// An empty chunk.
#[inline(always)]
fn empty_chunk() -> Chunk {
    Chunk { w: 0, offs: [[0; CHUNK]; 1 + MAX_INPUTS], lanes: [Lanes::Table; 1 + MAX_INPUTS] }
}

/// The reduction's starting value: its operator's neutral element (zero for a plain map).
#[inline(always)]
fn neutral<T: MapElem>(d: &MapDesc) -> T {
    d.reduce.and_then(|r| r.neutral()).map_or(T::default(), T::of)
}

/// The cell axes in the order the chunks walk them: the axis whose operands are closest to
/// contiguous goes innermost (the order of the cells changes no cell's value), so that a chunk
/// is one strided run where it can be.
#[inline(always)]
fn cell_order(d: &MapDesc) -> [MapAxisDesc; MAX_AXES] {
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
    order
}

/// Cells together, chunk by chunk, each cell's points in order.
#[inline(always)]
unsafe fn by_cells<T: MapElem>(ptrs: &[*mut T], d: &MapDesc, ev: &mut Eval<T>) {
    let out = ptrs[0];
    let mut chunk = empty_chunk();
    let order = cell_order(d);
    let mut cells = Cells::new(&order[..d.cells.len()], 1 + d.inputs);
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
                acc[..w].fill(neutral(d));
            }
            if plain {
                fold_plain(r, ptrs[1], d, &chunk, &mut acc);
            } else {
                fold_points(r, ptrs, d, &chunk, ev, &mut acc);
            }
            put(out, chunk.lanes[0], &chunk.offs[0], &acc, w);
        }
    }
}

/// A chunk's reduction of one plain read of `input`, in blocks of cells whose accumulators
/// stay in registers across the points.
#[inline(always)]
unsafe fn fold_plain<T: MapElem>(
    r: BinOp,
    input: *mut T,
    d: &MapDesc,
    chunk: &Chunk,
    acc: &mut [T; CHUNK],
) {
    let w = chunk.w;
    let mut l0 = 0;
    while l0 < w {
        let n = match w - l0 {
            rest if rest >= 64 => 64,
            rest if rest >= 16 => 16,
            _ => 1,
        };
        let lanes = match chunk.lanes[1] {
            Lanes::Strided(start, step) => Lanes::Strided(start + l0 as isize * step, step),
            Lanes::Table => Lanes::Table,
        };
        let (acc, table) = (&mut acc[l0..l0 + n], &chunk.offs[1][l0..l0 + n]);
        let q = input as *const T;
        // SAFETY: the caller's contract covers every cell and point.
        unsafe {
            match n {
                64 => fold_block::<T, 64>(r, acc, q, lanes, table, &d.points),
                16 => fold_block::<T, 16>(r, acc, q, lanes, table, &d.points),
                _ => fold_block::<T, 1>(r, acc, q, lanes, table, &d.points),
            }
        }
        l0 += n;
    }
}

/// A chunk's reduction of the program's values: an odometer over all point axes but the
/// last, a counted loop along it.
#[inline(always)]
unsafe fn fold_points<T: MapElem>(
    r: BinOp,
    ptrs: &[*mut T],
    d: &MapDesc,
    chunk: &Chunk,
    ev: &mut Eval<T>,
    acc: &mut [T; CHUNK],
) {
    let (outer, last) = split_points(&d.points);
    let mut points = Odometer::new(outer, [0; 1 + MAX_INPUTS]);
    while let Some(base) = points.next() {
        let mut p = base;
        for _ in 0..last.n {
            // SAFETY: the caller's contract covers every cell and point.
            unsafe { ev.eval(d, ptrs, chunk, &p) };
            fold_lanes(r, acc, &ev.stack[0], chunk.w);
            for (x, s) in p[1..=d.inputs].iter_mut().zip(&last.steps) {
                *x += s;
            }
        }
    }
}

/// A few cells with many points each: the program for runs of the innermost point axis,
/// folded in order.
#[inline(always)]
unsafe fn by_points<T: MapElem>(ptrs: &[*mut T], d: &MapDesc, ev: &mut Eval<T>) {
    let (outer, last) = match d.points.split_last() {
        Some((l, o)) => (o, *l),
        None => (&d.points[..0], MapAxisDesc { n: 1, ..Default::default() }),
    };
    let mut chunk = empty_chunk();
    let mut cells = Odometer::new(&d.cells, [0; 1 + MAX_INPUTS]);
    while let Some(cell) = cells.next() {
        // SAFETY: the caller's contract covers every cell and point.
        unsafe {
            let o = ptrs[0].offset(cell[0]);
            let Some(r) = d.reduce else { unreachable!("maps have cells") };
            let mut t = if d.accumulate { *o } else { neutral(d) };
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
pub(super) fn split_points(points: &[MapAxisDesc]) -> (&[MapAxisDesc], MapAxisDesc) {
    match points.split_last() {
        Some((l, o)) => (o, *l),
        None => (points, MapAxisDesc { n: 1, ..Default::default() }),
    }
}

/// `acc[l] := acc[l] ⊕ x(point)` for `B` cells over every point in order, `x` one read: the
/// `B` accumulators are a fixed-size array, which the compiler keeps in registers across the
/// points (one vector of the host per 16 f32 cells).
#[inline(always)]
pub(super) unsafe fn fold_block<T: MapElem, const B: usize>(
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

/// `acc[l] := acc[l] ⊕ v[l]` for each lane (each lane its own cell).
#[inline(always)]
pub(super) fn fold_lanes<T: MapElem>(r: BinOp, acc: &mut [T; CHUNK], v: &[T; CHUNK], w: usize) {
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
pub(super) fn fold_in_order<T: MapElem>(r: BinOp, mut t: T, v: &[T; CHUNK], w: usize) -> T {
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

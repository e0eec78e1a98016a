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

mod cells;
mod eval;
mod run;

use super::Isa;
use crate::ops::{BinOp, Real, TernOp, UnOp};
use run::run;

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
mod tests;

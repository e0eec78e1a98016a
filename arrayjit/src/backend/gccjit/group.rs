//! Parallel groups: consecutive parallel steps that the pool runs as one job.
//!
//! A small model's training step is hundreds of parallel nests of a few microseconds each
//! (char_gpt's is 363), and every job of the pool costs its publication, the claims of its
//! chunks and a wait for the slowest thread: on a two-core guest that was a quarter of the
//! step. Most of those nests run over the same rows — the batch — one after the other: a zero
//! fill, the product accumulated into it, its conversion to bf16, the activation. When each of
//! them touches, for row `v`, only bytes that no other row of any of them touches, they can run
//! as one job: each chunk of rows runs every nest of the group in order, and nothing waits in
//! between. Within a chunk the order of the nests is kept, so every value is the one the nests
//! would compute one job at a time.
//!
//! The condition is checked on bytes, not tensors, because intermediates share the routine's
//! arena ([`crate::low_level::memory`]): for every access of a nest, the bytes it can touch at
//! row `v` are `[B·v + lo, B·v + hi)` (`B` the row's bytes, `lo` and `hi` from the ranges of
//! the inner loops). Two accesses of different nests of a group, one of them a write, that can
//! touch the same buffer must both stay within their own row (`hi − lo ≤ B`) with the same `B`,
//! and row `v` of one must not reach row `v ± 1` of the other — then rows in different chunks
//! never share a byte, whichever thread runs them and in whatever order. A nest whose accesses
//! cannot be bounded (a runtime symbol in an index, a product with an epilogue) runs alone, as
//! do nests of different trip counts. Nests with different dynamic limits (a batch's rows, or
//! all rows) may share a job: each stops at its own limit, and the job runs over the rows of
//! the one that needs the most.

use rustc_hash::FxHashMap;

use super::step::StepKind;
use crate::low_level::{Expr, Gemm, IdxVar, Index, Program, Stmt, Var};
use crate::tnode::NodeId;

/// Most steps in one group (the runner keeps a group's functions in a fixed array).
pub const MAX_GROUP: usize = 32;

/// For each step, the end (exclusive) of the group that starts there: consecutive parallel
/// steps whose accesses allow running them chunk by chunk (see the module documentation). A
/// step that starts no group of two or more has `k + 1`; steps inside a group are skipped by
/// the runner, their entries are the group's end too.
pub fn group_ends(prog: &Program, steps: &[(Vec<Stmt>, StepKind)]) -> Vec<usize> {
    let footprints: Vec<Option<Vec<Access>>> = steps
        .iter()
        .map(|(body, kind)| match (kind, body.as_slice()) {
            (StepKind::Parallel { .. }, [s]) => footprint(prog, s),
            _ => None,
        })
        .collect();
    let mut ends = vec![0; steps.len()];
    let mut k = 0;
    while k < steps.len() {
        let mut end = k + 1;
        if let Some(first) = &footprints[k] {
            let mut members: Vec<&[Access]> = vec![first];
            while end < steps.len()
                && end - k < MAX_GROUP
                && extent(&steps[end].1) == extent(&steps[k].1)
            {
                let Some(next) = &footprints[end] else { break };
                if !members.iter().all(|m| compatible(m, next)) {
                    break;
                }
                members.push(next);
                end += 1;
            }
        }
        ends[k..end].iter_mut().for_each(|e| *e = end);
        k = end;
    }
    ends
}

/// A parallel step's trip count (its dynamic limit aside: a step stops at its own limit, and
/// the rows past it may be run or not, see [`crate::low_level::Limit`]).
fn extent(kind: &StepKind) -> Option<i64> {
    match kind {
        StepKind::Parallel { extent, .. } => Some(*extent),
        StepKind::Serial => None,
    }
}

/// Where an access's bytes are: the routine's arena, or a buffer of the node's own.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
enum Space {
    Arena,
    Own(NodeId),
}

/// What one access of a parallel nest can touch, in bytes of its space.
#[derive(Copy, Clone, Debug)]
struct Access {
    space: Space,
    write: bool,
    /// Bytes per row of the parallel loop (0: the same bytes for every row).
    row: i64,
    /// At row `v`, the bytes `[row·v + lo, row·v + hi)`.
    lo: i64,
    hi: i64,
    /// The trip count of the parallel loop.
    rows: i64,
}

impl Access {
    /// Every byte it can touch over all rows.
    fn span(&self) -> (i64, i64) {
        let last = self.row * (self.rows - 1);
        (self.lo + last.min(0), self.hi + last.max(0))
    }

    /// Row `v`'s bytes lie in a block of `row` bytes that no other row's reach.
    fn within_row(&self) -> bool {
        self.row > 0 && self.hi - self.lo <= self.row
    }
}

/// Whether a nest with accesses `b` may run after the nests with accesses `a` chunk by chunk.
fn compatible(a: &[Access], b: &[Access]) -> bool {
    a.iter().all(|x| {
        b.iter().all(|y| {
            if x.space != y.space || !(x.write || y.write) {
                return true;
            }
            let ((xl, xh), (yl, yh)) = (x.span(), y.span());
            if xh <= yl || yh <= xl {
                return true;
            }
            x.within_row()
                && y.within_row()
                && x.row == y.row
                && x.hi - y.lo <= x.row
                && y.hi - x.lo <= x.row
        })
    })
}

/// The accesses of the parallel nest `s`, or `None` when one cannot be bounded.
fn footprint(prog: &Program, s: &Stmt) -> Option<Vec<Access>> {
    let Stmt::For { var, extent, parallel: true, body, .. } = s else { return None };
    let mut walk = Walk {
        prog,
        row_var: *var,
        rows: *extent as i64,
        extents: FxHashMap::default(),
        out: Vec::new(),
    };
    walk.extents.insert(*var, *extent);
    for s in body {
        walk.stmt(s)?;
    }
    Some(walk.out)
}

struct Walk<'a> {
    prog: &'a Program,
    row_var: Var,
    rows: i64,
    /// The trip counts of the loops in scope.
    extents: FxHashMap<Var, usize>,
    out: Vec<Access>,
}

impl Walk<'_> {
    fn stmt(&mut self, s: &Stmt) -> Option<()> {
        match s {
            Stmt::Comment(_) => {}
            Stmt::For { var, extent, body, .. } => {
                self.extents.insert(*var, *extent);
                for s in body {
                    self.stmt(s)?;
                }
                self.extents.remove(var);
            }
            Stmt::If { body, .. } => {
                for s in body {
                    self.stmt(s)?;
                }
            }
            Stmt::Set { node, idx, value } => {
                let flat = self.flat(*node, idx)?;
                self.access(*node, true, &flat, &[])?;
                self.expr(value)?;
            }
            Stmt::SetLocal { value, .. } => self.expr(value)?,
            Stmt::Gemm(g) => self.gemm(g)?,
            // Its cells are not a function of one row: it joins no group.
            Stmt::Call(_) => return None,
            Stmt::Map(m) => {
                let axes: Vec<_> = m.cells.iter().chain(&m.points).collect();
                let out: Vec<(i64, usize)> = axes.iter().map(|a| (a.out, a.extent)).collect();
                self.access(m.out.node, true, &m.out.offset, &out)?;
                for (k, input) in m.inputs.iter().enumerate() {
                    let steps: Vec<(i64, usize)> =
                        axes.iter().map(|a| (a.steps[k], a.extent)).collect();
                    self.access(input.node, false, &input.offset, &steps)?;
                }
                if m.accumulate || m.reduce.is_some() {
                    self.access(m.out.node, false, &m.out.offset, &out)?;
                }
            }
        }
        Some(())
    }

    fn gemm(&mut self, g: &Gemm) -> Option<()> {
        // The epilogue's loops stand for all of the product's rows: not bounded per row here.
        if g.epilogue.is_some() {
            return None;
        }
        let (m, n, k) = (g.rows_per_call(), g.n.extent, g.k.extent);
        let block = |o: &crate::low_level::GemmOperand| match g.rows {
            Some((v, per)) => {
                let mut terms = o.offset.terms.clone();
                terms.push((per as i64 * o.rows, IdxVar::Loop(v)));
                Index::new(terms, o.offset.offset)
            }
            None => o.offset.clone(),
        };
        let c = [(g.c.rows, m), (g.c.cols, n)];
        self.access(g.c.node, true, &block(&g.c), &c)?;
        self.access(g.c.node, false, &block(&g.c), &c)?;
        self.access(g.a.node, false, &block(&g.a), &[(g.a.rows, m), (g.a.cols, k)])?;
        self.access(g.b.node, false, &g.b.offset, &[(g.b.rows, k), (g.b.cols, n)])
    }

    fn expr(&mut self, e: &Expr) -> Option<()> {
        let mut reads = Vec::new();
        e.visit(&mut |e| {
            if let Expr::Get(n, idx) = e {
                reads.push((*n, idx.clone()));
            }
        });
        for (n, idx) in reads {
            let flat = self.flat(n, &idx)?;
            self.access(n, false, &flat, &[])?;
        }
        Some(())
    }

    /// The row-major flat offset of `node[idx]` (`None` for an unknown node: the step runs
    /// alone).
    fn flat(&self, node: NodeId, idx: &[Index]) -> Option<Index> {
        let dims = &self.prog.nodes.get(&node)?.dims;
        let mut stride = 1i64;
        let mut terms = Vec::new();
        let mut offset = 0i64;
        for (i, d) in idx.iter().zip(dims).rev() {
            terms.extend(i.terms.iter().map(|&(c, x)| (c * stride, x)));
            offset += i.offset * stride;
            stride *= *d as i64;
        }
        Some(Index::new(terms, offset))
    }

    /// Records the access to `node` at flat offsets `offset + Σ i·step` over `i` in
    /// `0..extent` for each `(step, extent)` of `extra`.
    fn access(
        &mut self,
        node: NodeId,
        write: bool,
        offset: &Index,
        extra: &[(i64, usize)],
    ) -> Option<()> {
        // A per-thread buffer is on the stack of the step that uses it.
        let scratch = self.prog.scratch_of(node);
        if scratch.is_some_and(|s| s.per_thread) {
            return Some(());
        }
        let t = self.prog.nodes.get(&node)?;
        let size = t.prec.size_in_bytes() as i64;
        let (space, base) = match self.prog.arena.slots.iter().find(|s| s.node == node) {
            Some(slot) if scratch.is_none() => (Space::Arena, slot.offset as i64),
            _ => (Space::Own(node), 0),
        };
        let per_row = offset.coeff(self.row_var);
        let rest = Index::new(
            offset
                .terms
                .iter()
                .filter(|(_, x)| *x != IdxVar::Loop(self.row_var))
                .copied()
                .collect(),
            offset.offset,
        );
        let (mut lo, mut hi) = rest.range(&|v| self.extents.get(&v).copied())?;
        for &(step, extent) in extra {
            let top = step.checked_mul(extent.checked_sub(1)? as i64)?;
            if top < 0 {
                lo += top;
            } else {
                hi += top;
            }
        }
        self.out.push(Access {
            space,
            write,
            row: per_row * size,
            lo: base + lo * size,
            hi: base + (hi + 1) * size,
            rows: self.rows,
        });
        Some(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn acc(write: bool, row: i64, lo: i64, hi: i64) -> Access {
        Access { space: Space::Arena, write, row, lo, hi, rows: 8 }
    }

    #[test]
    fn rows_that_stay_in_their_blocks_run_together() {
        // Step one writes row v's 64 bytes, step two reads them back.
        assert!(compatible(&[acc(true, 64, 0, 64)], &[acc(false, 64, 0, 64)]));
        // The second reads the next row too: a chunk would read what another has not written.
        assert!(!compatible(&[acc(true, 64, 0, 64)], &[acc(false, 64, 0, 128)]));
        // A different row size: rows of different chunks meet.
        assert!(!compatible(&[acc(true, 64, 0, 64)], &[acc(false, 32, 0, 32)]));
        // Shifted by half a row: row v of one reaches row v + 1 of the other.
        assert!(!compatible(&[acc(true, 64, 0, 64)], &[acc(false, 64, 32, 96)]));
        // Reads of a buffer nobody writes, and disjoint bytes, never clash.
        assert!(compatible(&[acc(false, 0, 0, 4096)], &[acc(false, 64, 0, 64)]));
        assert!(compatible(&[acc(true, 64, 0, 64)], &[acc(true, 64, 512, 576)]));
        // A whole-buffer read of what the group writes.
        assert!(!compatible(&[acc(true, 64, 0, 64)], &[acc(false, 0, 0, 512)]));
    }
}

//! Calls of the map kernel in the IR: a pointwise map or a reduction over strided tensors,
//! run by [`crate::kernels::map`] instead of a generated loop nest.
//!
//! The CPU schedule introduces them ([`super::schedule`]); backends pass the operands' first
//! cells and [`Map::descriptor`]'s words, and the interpreter runs the call as the nest it
//! stands for. Offsets are affine in the loops around the call (a parallel loop the routine
//! splits across threads) and in runtime symbols; sizes may be clipped to dynamic counts.

use std::fmt;

use super::Index;
use crate::kernels::map::{MAP_HEADER, MapCode};
use crate::ops::{BinOp, Prec};
use crate::tnode::NodeId;

/// `out[cell] := e(inputs)` for every cell, or, with a reduction `⊕`, `out[cell] := (neutral
/// or out[cell]) ⊕ e(point 0) ⊕ e(point 1) ⊕ …` in row-major order of the points — exactly the
/// nest it replaces (see [`crate::kernels::map`]).
#[derive(Clone, Debug, PartialEq)]
pub struct Map {
    /// The result's and every input's precision (f32 or f64), and the arithmetic's.
    pub prec: Prec,
    /// The result.
    pub out: MapOperand,
    /// The distinct reads of the expression.
    pub inputs: Vec<MapOperand>,
    /// Cell axes, outermost first.
    pub cells: Vec<MapAxis>,
    /// Reduction axes, outermost first (none for a pointwise map).
    pub points: Vec<MapAxis>,
    /// The reduction's operator.
    pub reduce: Option<BinOp>,
    /// The reduction starts from the cells' values (else from the neutral element).
    pub accumulate: bool,
    /// The expression, postfix.
    pub code: Vec<MapCode>,
}

/// A tensor of a [`Map`]: the flat offset of its cell at every axis' 0.
#[derive(Clone, Debug, PartialEq)]
pub struct MapOperand {
    /// The tensor.
    pub node: NodeId,
    /// The first cell's flat offset.
    pub offset: Index,
}

/// An axis of a [`Map`]: its extent, a dynamic count, and the flat steps along it.
#[derive(Clone, Debug, PartialEq)]
pub struct MapAxis {
    /// The extent.
    pub extent: usize,
    /// A count known when running: `ceil(size / per)` iterations when less than the extent
    /// (`size` affine in runtime symbols — a dynamic batch — and the loops around the call — the
    /// rows left for the last block of a parallel loop).
    pub count: Option<(Index, usize)>,
    /// The result's step (0 on a reduction axis).
    pub out: i64,
    /// Each input's step.
    pub steps: Vec<i64>,
}

impl Map {
    /// Every operand, the result first.
    pub fn operands(&self) -> impl Iterator<Item = &MapOperand> {
        std::iter::once(&self.out).chain(&self.inputs)
    }

    /// The operands, mutably.
    pub fn operands_mut(&mut self) -> impl Iterator<Item = &mut MapOperand> {
        std::iter::once(&mut self.out).chain(&mut self.inputs)
    }

    /// Cells × points at full extents.
    pub fn points_total(&self) -> usize {
        self.cells.iter().chain(&self.points).map(|a| a.extent).product()
    }

    /// The descriptor's words, as indices over the enclosing loops and runtime symbols
    /// (constants but for dynamic counts): the layout [`crate::kernels::map::MapDesc::decode`]
    /// reads.
    pub fn descriptor(&self) -> Vec<Index> {
        let c = Index::fixed;
        let mut w = Vec::with_capacity(MAP_HEADER + 8 * (self.cells.len() + self.points.len()));
        let reduce = self
            .reduce
            .map_or(-1, |r| BinOp::ALL.iter().position(|o| *o == r).map_or(-1, |p| p as i64));
        w.extend([
            c(self.cells.len() as i64),
            c(self.points.len() as i64),
            c(self.inputs.len() as i64),
            c(reduce),
            c(i64::from(self.accumulate)),
            c(self.code.len() as i64),
        ]);
        for (a, with_out) in
            self.cells.iter().map(|a| (a, true)).chain(self.points.iter().map(|a| (a, false)))
        {
            w.push(c(a.extent as i64));
            match &a.count {
                Some((size, per)) => {
                    w.push(size.clone());
                    w.push(c(*per as i64));
                }
                None => w.extend([c(crate::kernels::map::NO_COUNT), c(1)]),
            }
            if with_out {
                w.push(c(a.out));
            }
            w.extend(a.steps.iter().map(|s| c(*s)));
        }
        for code in &self.code {
            w.extend(code.words().map(c));
        }
        w
    }

    /// Floating-point operations per point, counted as [`super::flops`] counts the expression
    /// it stands for (and one for the reduction's operator).
    pub fn flops_per_point(&self) -> u64 {
        use crate::ops::{TernOp, UnOp};
        let op = |c: &MapCode| match c {
            MapCode::Un(UnOp::Identity | UnOp::Not) => 0,
            MapCode::Un(_) => 1,
            MapCode::Bin(
                BinOp::Lt | BinOp::Le | BinOp::Gt | BinOp::Eq | BinOp::Ne | BinOp::Second,
            ) => 0,
            MapCode::Bin(_) => 1,
            MapCode::Tern(TernOp::Fma) => 2,
            _ => 0,
        };
        self.code.iter().map(op).sum::<u64>() + u64::from(self.reduce.is_some())
    }

    /// Every index of the call (the operands' offsets and the axes' counts).
    pub fn indices(&self) -> Vec<Index> {
        let counts = self.cells.iter().chain(&self.points).filter_map(|a| a.count.as_ref());
        self.operands().map(|o| o.offset.clone()).chain(counts.map(|(i, _)| i.clone())).collect()
    }
}

impl fmt::Display for MapOperand {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}[@{}]", self.node, self.offset)
    }
}

impl fmt::Display for Map {
    /// `map f32 n5[@64*v0] max= (in0) cells [16: 1 | 27] points [27: 0 | 1]; in0 = n4[@1728*v0]`:
    /// each axis as `extent: result step | input steps`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut stack: Vec<String> = Vec::new();
        for c in &self.code {
            let s = match *c {
                MapCode::Input(i) => format!("in{i}"),
                MapCode::Const(x) => crate::assignments::fmt_f64(x),
                MapCode::Un(op) => format!("{}({})", op.name(), stack.pop().unwrap_or_default()),
                MapCode::Bin(op) => {
                    let b = stack.pop().unwrap_or_default();
                    format!("{}({}, {b})", op.name(), stack.pop().unwrap_or_default())
                }
                MapCode::Tern(op) => {
                    let c = stack.pop().unwrap_or_default();
                    let b = stack.pop().unwrap_or_default();
                    format!("{}({}, {b}, {c})", op.name(), stack.pop().unwrap_or_default())
                }
            };
            stack.push(s);
        }
        let assign = match (self.reduce, self.accumulate) {
            (None, _) => ":=".to_string(),
            (Some(r), false) => format!("{}:=", r.name()),
            (Some(r), true) => format!("{}=", r.name()),
        };
        let axes = |axes: &[MapAxis]| {
            axes.iter()
                .map(|a| {
                    let limit = match &a.count {
                        Some((size, 1)) => format!(" to {size}"),
                        Some((size, per)) => format!(" to ({size})/{per}"),
                        None => String::new(),
                    };
                    let steps: Vec<String> = a.steps.iter().map(|s| s.to_string()).collect();
                    format!("[{}{limit}: {} | {}]", a.extent, a.out, steps.join(" "))
                })
                .collect::<Vec<_>>()
                .join(" ")
        };
        write!(
            f,
            "map {} {} {assign} {} cells {} points {}",
            self.prec.name(),
            self.out,
            stack.pop().unwrap_or_default(),
            axes(&self.cells),
            axes(&self.points)
        )?;
        for (i, o) in self.inputs.iter().enumerate() {
            write!(f, "; in{i} = {o}")?;
        }
        Ok(())
    }
}

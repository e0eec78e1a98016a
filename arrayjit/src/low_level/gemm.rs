//! The call of the shape-generic matrix product that the CPU schedule puts in place of a
//! reduction nest, and its fused pointwise epilogue.

use std::fmt;

use super::{IdxVar, Index, Stmt, Var};
use crate::indexing::Symbol;
use crate::ops::Prec;
use crate::tnode::NodeId;

/// `c (+)= a·b` by the shape-generic kernel ([`crate::kernels::gemm()`]): for each cell
/// `(i, j)` of an `m × n` product, `t := 0` (or `c[i, j]`), then for each `p` of `k` in order
/// `t := fma(a[i, p], b[p, j], t)` (or `t := t + a·b` with the product rounded), stored in `c`
/// — exactly the reduction nest it replaces.
#[derive(Clone, Debug, PartialEq)]
pub struct Gemm {
    /// The result: rows along `m`, columns along `n`.
    pub c: GemmOperand,
    /// The left operand: rows along `m`, columns along `k`.
    pub a: GemmOperand,
    /// The right operand: rows along `k`, columns along `n`.
    pub b: GemmOperand,
    /// The rows.
    pub m: GemmAxis,
    /// The columns.
    pub n: GemmAxis,
    /// The reduction.
    pub k: GemmAxis,
    /// When the call sits in a loop over blocks of rows: the loop's variable and the rows per
    /// block; the call computes rows `var·per ..` up to `per` of them (fewer in the last block).
    pub rows: Option<(Var, usize)>,
    /// The cells start from their values (else from 0).
    pub accumulate: bool,
    /// Each step is one fused multiply-add.
    pub fused: bool,
    /// The result's precision, and the factors' where they have no other (f32 or f64; bf16
    /// only with `bf16_pairs`).
    pub prec: Prec,
    /// bf16 factors into an f32 result — or a bf16 one, each cell's f32 sum rounded once when
    /// stored — by the pairwise product of [`crate::kernels::bf16`] (the host's bf16 dot
    /// products), not the nest's sequential one.
    pub bf16_pairs: bool,
    /// A pointwise nest run on the result's cells as the kernel finishes them.
    pub epilogue: Option<Epilogue>,
}

/// A pointwise nest fused into a [`Gemm`]: the kernel runs `body` on every cell `(i, j)` of the
/// call's rows and columns once that cell is final, strip by strip while the strip is still in
/// the first-level cache, instead of a separate pass over the whole result afterwards (a bias,
/// an activation, a scaling, or a buffer a later product reads).
///
/// The row `i` stands for the variables `rows` (outermost first, `i = Σ v·(extents inside
/// v)`), the column `j` for `cols`; the body reads and writes tensors only through them (and
/// runtime symbols), its cells distinct for distinct `(i, j)`, and it reads the product's
/// result only at cell `(i, j)`. The cells are run in no particular order.
#[derive(Clone, Debug, PartialEq)]
pub struct Epilogue {
    /// The row's variables and extents, outermost first.
    pub rows: Vec<(Var, usize)>,
    /// The column's variables and extents, outermost first.
    pub cols: Vec<(Var, usize)>,
    /// What each cell runs.
    pub body: Vec<Stmt>,
}

impl Epilogue {
    /// The same work as an ordinary nest over every row and column: what the verifier checks
    /// and what the epilogue stands for.
    pub fn nest(&self) -> Vec<Stmt> {
        let mut body = self.body.clone();
        for &(var, extent) in self.rows.iter().chain(&self.cols).rev() {
            body = vec![Stmt::For { var, extent, limit: None, parallel: false, body }];
        }
        body
    }
}

/// A tensor as an operand of a [`Gemm`]: the flat offset of the cell at row 0, column 0
/// (affine in the enclosing loops), and the flat steps between rows and between columns.
#[derive(Clone, Debug, PartialEq)]
pub struct GemmOperand {
    /// The tensor.
    pub node: NodeId,
    /// The first cell's flat offset.
    pub offset: Index,
    /// The step between rows.
    pub rows: i64,
    /// The step between columns.
    pub cols: i64,
}

/// An axis of a [`Gemm`]: its extent and, for a dynamic size, the runtime symbol and cells
/// per unit of it (`min(extent, size·per)` are needed).
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub struct GemmAxis {
    /// The extent.
    pub extent: usize,
    /// A dynamic size: its symbol and the cells per unit.
    pub limit: Option<(Symbol, usize)>,
}

impl Gemm {
    /// The three operands, result first.
    pub fn operands(&self) -> [&GemmOperand; 3] {
        [&self.c, &self.a, &self.b]
    }

    /// The operands, mutably.
    pub fn operands_mut(&mut self) -> [&mut GemmOperand; 3] {
        [&mut self.c, &mut self.a, &mut self.b]
    }

    /// Every index of the call: the operands' offsets, and the row block's variable.
    pub fn indices(&self) -> Vec<Index> {
        let mut out: Vec<Index> = self.operands().iter().map(|o| o.offset.clone()).collect();
        out.extend(self.rows.map(|(v, _)| Index::var(v)));
        out
    }

    /// The number of multiply-adds at the axes' full extents.
    pub fn steps(&self) -> usize {
        self.m.extent.saturating_mul(self.n.extent).saturating_mul(self.k.extent)
    }

    /// The call's [`crate::kernels::GemmDesc`], field by field, as indices over the enclosing
    /// loops and runtime symbols (most of them constants).
    pub fn descriptor(&self) -> [Index; crate::kernels::GEMM_DESC_LEN] {
        let c = |x: i64| Index::fixed(x);
        let dynamic = |a: &GemmAxis| match a.limit {
            Some((s, per)) => Index::new(vec![(per as i64, IdxVar::Sym(s))], 0),
            None => c(-1),
        };
        let (start, count) = match self.rows {
            Some((v, per)) => (Index::new(vec![(per as i64, IdxVar::Loop(v))], 0), c(per as i64)),
            None => (c(0), c(self.m.extent as i64)),
        };
        let flags = if self.accumulate { crate::kernels::GEMM_ACCUMULATE } else { 0 }
            | if self.fused { crate::kernels::GEMM_FUSED } else { 0 }
            | if self.bf16_pairs && self.prec == Prec::Bf16 {
                crate::kernels::GEMM_BF16_RESULT
            } else {
                0
            };
        [
            c(self.c.rows),
            c(self.c.cols),
            c(self.a.rows),
            c(self.a.cols),
            c(self.b.rows),
            c(self.b.cols),
            start,
            count,
            c(self.m.extent as i64),
            dynamic(&self.m),
            c(self.n.extent as i64),
            dynamic(&self.n),
            c(self.k.extent as i64),
            dynamic(&self.k),
            c(flags),
        ]
    }

    /// Rows per call: the block's, or all of them.
    pub fn rows_per_call(&self) -> usize {
        self.rows.map_or(self.m.extent, |(_, per)| per.min(self.m.extent))
    }
}

impl fmt::Display for GemmOperand {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}[@{}; {}, {}]", self.node, self.offset, self.rows, self.cols)
    }
}

impl fmt::Display for GemmAxis {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.extent)?;
        match self.limit {
            Some((s, 1)) => write!(f, " to {s}"),
            Some((s, per)) => write!(f, " to {s}*{per}"),
            None => Ok(()),
        }
    }
}

impl fmt::Display for Gemm {
    /// `gemm f32 fma n4[@0; 256, 1] := n3[@0; 784, 1] · n2[@0; 1, 784] (m 128 in blocks v5*64, n 256, k 784)`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let step = match (self.bf16_pairs, self.fused) {
            (true, _) => "bf16-pairs",
            (false, true) => "fma",
            (false, false) => "mul-add",
        };
        let assign = if self.accumulate { "+=" } else { ":=" };
        let rows = self.rows.map_or(String::new(), |(v, per)| format!(" in blocks {v}*{per}"));
        write!(
            f,
            "gemm {} {step} {} {assign} {} · {} (m {}{rows}, n {}, k {})",
            self.prec.name(),
            self.c,
            self.a,
            self.b,
            self.m,
            self.n,
            self.k
        )
    }
}

//! The low-level IR: loop nests over scalar statements, what every backend consumes.
//!
//! Lowering ([`crate::lower`]) turns assignments into this form; the passes listed in
//! [`optimize::optimize`] rewrite it; backends render it (C, CUDA C), build it (libgccjit) or
//! interpret it. It is deliberately small:
//!
//! - loops `for v in 0..extent` (marked parallel when distinct iterations write distinct cells
//!   and read nothing another iteration writes),
//! - guards `if 0 <= index < bound` (padded convolutions),
//! - stores to a tensor cell `n[idx] = expr` or to a scalar local `t = expr`,
//! - expressions over tensor reads, locals, constants, index values and the operation table.
//!
//! Indices are affine in loop variables ([`Var`], printed `v3`) and runtime symbols
//! ([`Symbol`], printed `i3`), so bounds analysis, substitution during virtualization and
//! tiling stay exact. The printer is stable and is the snapshot format of lowered code.

pub mod cse;
pub mod dse;
pub mod estimate;
pub mod map;
pub mod memory;
pub mod optimize;
pub mod schedule;
pub mod simplify;
pub mod trace;
pub mod verify;
pub mod virtualize;

use std::fmt::{self, Write as _};

use rustc_hash::FxHashMap;

use crate::assignments::fmt_f64;
use crate::indexing::Symbol;
use crate::ops::{BinOp, Prec, TernOp, UnOp};
use crate::tnode::{NodeId, TensorNode};

pub use map::{Map, MapAxis, MapOperand};

/// A loop variable, printed `v{n}`.
#[derive(Copy, Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Var(pub u32);

impl fmt::Display for Var {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "v{}", self.0)
    }
}

/// A scalar local variable, printed `t{n}`.
#[derive(Copy, Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct LocalId(pub u32);

impl fmt::Display for LocalId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "t{}", self.0)
    }
}

/// What an index term multiplies: a loop variable or a runtime symbol.
#[derive(Copy, Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum IdxVar {
    /// A loop variable.
    Loop(Var),
    /// A symbol bound when the routine runs.
    Sym(Symbol),
}

impl fmt::Display for IdxVar {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            IdxVar::Loop(v) => write!(f, "{v}"),
            IdxVar::Sym(s) => write!(f, "{s}"),
        }
    }
}

/// An affine index `offset + Σ coeff·var`. Terms have distinct variables and non-zero
/// coefficients (kept so by [`Index::new`]).
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Index {
    /// The terms.
    pub terms: Vec<(i64, IdxVar)>,
    /// The constant part.
    pub offset: i64,
}

impl Index {
    /// Builds a normalized index (repeated variables merged, zero terms dropped).
    ///
    /// ```
    /// use rocannl_arrayjit::low_level::{IdxVar, Index, Var};
    /// let v = IdxVar::Loop(Var(0));
    /// let i = Index::new(vec![(2, v), (1, v), (0, IdxVar::Loop(Var(1)))], -1);
    /// assert_eq!(i.to_string(), "3*v0 - 1");
    /// ```
    pub fn new(terms: Vec<(i64, IdxVar)>, offset: i64) -> Index {
        let mut merged: Vec<(i64, IdxVar)> = Vec::with_capacity(terms.len());
        for (c, v) in terms {
            match merged.iter_mut().find(|(_, v2)| *v2 == v) {
                Some((c2, _)) => *c2 += c,
                None => merged.push((c, v)),
            }
        }
        merged.retain(|(c, _)| *c != 0);
        Index { terms: merged, offset }
    }

    /// A constant index.
    pub fn fixed(i: i64) -> Index {
        Index { terms: vec![], offset: i }
    }

    /// The index `v`.
    pub fn var(v: Var) -> Index {
        Index { terms: vec![(1, IdxVar::Loop(v))], offset: 0 }
    }

    /// The single loop variable if this index is exactly `v`.
    pub fn as_var(&self) -> Option<Var> {
        match self.terms.as_slice() {
            [(1, IdxVar::Loop(v))] if self.offset == 0 => Some(*v),
            _ => None,
        }
    }

    /// Whether the index mentions `v`.
    pub fn uses(&self, v: Var) -> bool {
        self.terms.iter().any(|(_, x)| *x == IdxVar::Loop(v))
    }

    /// The coefficient of `v` (0 when absent).
    pub fn coeff(&self, v: Var) -> i64 {
        self.terms.iter().find(|(_, x)| *x == IdxVar::Loop(v)).map_or(0, |(c, _)| *c)
    }

    /// Replaces loop variables by indices.
    pub fn subst(&self, f: &impl Fn(Var) -> Option<Index>) -> Index {
        let mut terms = Vec::new();
        let mut offset = self.offset;
        for &(c, x) in &self.terms {
            match x {
                IdxVar::Loop(v) => match f(v) {
                    Some(idx) => {
                        offset += c * idx.offset;
                        terms.extend(idx.terms.iter().map(|&(c2, x2)| (c * c2, x2)));
                    }
                    None => terms.push((c, x)),
                },
                IdxVar::Sym(_) => terms.push((c, x)),
            }
        }
        Index::new(terms, offset)
    }

    /// The range `[min, max]` taken over loop variables in `0..extent` (`extent(v)`), or `None`
    /// when the index involves runtime symbols or an unknown variable.
    pub fn range(&self, extent: &impl Fn(Var) -> Option<usize>) -> Option<(i64, i64)> {
        let (mut lo, mut hi) = (self.offset, self.offset);
        for &(c, x) in &self.terms {
            let IdxVar::Loop(v) = x else { return None };
            let top = extent(v)? as i64 - 1;
            if top < 0 {
                return None;
            }
            if c > 0 {
                hi += c * top;
            } else {
                lo += c * top;
            }
        }
        Some((lo, hi))
    }
}

impl fmt::Display for Index {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.terms.is_empty() {
            return write!(f, "{}", self.offset);
        }
        for (n, (c, x)) in self.terms.iter().enumerate() {
            match (n, *c) {
                (0, 1) => write!(f, "{x}")?,
                (0, -1) => write!(f, "-{x}")?,
                (0, c) => write!(f, "{c}*{x}")?,
                (_, 1) => write!(f, " + {x}")?,
                (_, -1) => write!(f, " - {x}")?,
                (_, c) if c < 0 => write!(f, " - {}*{x}", -c)?,
                (_, c) => write!(f, " + {c}*{x}")?,
            }
        }
        match self.offset {
            0 => Ok(()),
            o if o > 0 => write!(f, " + {o}"),
            o => write!(f, " - {}", -o),
        }
    }
}

/// A scalar expression.
#[derive(Clone, Debug, PartialEq)]
pub enum Expr {
    /// A constant.
    Const(f64),
    /// A tensor cell.
    Get(NodeId, Vec<Index>),
    /// A scalar local.
    Local(LocalId),
    /// The value of an index, as a float (iota, embedded symbols).
    IndexValue(Index),
    /// [`crate::ops::uniform`]`(seed, offset)`.
    Uniform {
        /// The seed.
        seed: u64,
        /// The counter.
        offset: Index,
    },
    /// A unary operation.
    Unop(UnOp, Box<Expr>),
    /// A binary operation.
    Binop(BinOp, Box<Expr>, Box<Expr>),
    /// A ternary operation.
    Ternop(TernOp, Box<Expr>, Box<Expr>, Box<Expr>),
}

impl Expr {
    /// `op(a, b)`.
    pub fn bin(op: BinOp, a: Expr, b: Expr) -> Expr {
        Expr::Binop(op, Box::new(a), Box::new(b))
    }

    /// Calls `f` on this expression and every subexpression, parents first.
    pub fn visit<'a>(&'a self, f: &mut impl FnMut(&'a Expr)) {
        f(self);
        match self {
            Expr::Unop(_, a) => a.visit(f),
            Expr::Binop(_, a, b) => {
                a.visit(f);
                b.visit(f);
            }
            Expr::Ternop(_, a, b, c) => {
                a.visit(f);
                b.visit(f);
                c.visit(f);
            }
            _ => {}
        }
    }

    /// Rebuilds the expression bottom-up, applying `f` to every node after its children.
    pub fn rewrite(self, f: &mut impl FnMut(Expr) -> Expr) -> Expr {
        let e = match self {
            Expr::Unop(op, a) => Expr::Unop(op, Box::new(a.rewrite(f))),
            Expr::Binop(op, a, b) => {
                Expr::Binop(op, Box::new(a.rewrite(f)), Box::new(b.rewrite(f)))
            }
            Expr::Ternop(op, a, b, c) => Expr::Ternop(
                op,
                Box::new(a.rewrite(f)),
                Box::new(b.rewrite(f)),
                Box::new(c.rewrite(f)),
            ),
            e => e,
        };
        f(e)
    }

    /// Every index in the expression (tensor reads, index values, random counters).
    pub fn indices(&self) -> Vec<&Index> {
        let mut out = Vec::new();
        self.visit(&mut |e| match e {
            Expr::Get(_, idx) => out.extend(idx.iter()),
            Expr::IndexValue(i) | Expr::Uniform { offset: i, .. } => out.push(i),
            _ => {}
        });
        out
    }

    /// Replaces loop variables in every index.
    pub fn subst(self, f: &impl Fn(Var) -> Option<Index>) -> Expr {
        self.rewrite(&mut |e| match e {
            Expr::Get(n, idx) => Expr::Get(n, idx.iter().map(|i| i.subst(f)).collect()),
            Expr::IndexValue(i) => Expr::IndexValue(i.subst(f)),
            Expr::Uniform { seed, offset } => Expr::Uniform { seed, offset: offset.subst(f) },
            e => e,
        })
    }

    /// Whether the expression reads tensor `n`.
    pub fn reads(&self, n: NodeId) -> bool {
        let mut found = false;
        self.visit(&mut |e| found |= matches!(e, Expr::Get(m, _) if *m == n));
        found
    }

    /// The number of operation and read nodes, weighted by the operation table's cost.
    pub fn cost(&self) -> u32 {
        let mut c = 0;
        self.visit(&mut |e| {
            c += match e {
                Expr::Const(_) | Expr::Local(_) => 0,
                Expr::Get(..) | Expr::IndexValue(_) => 1,
                Expr::Uniform { .. } => 8,
                Expr::Unop(op, _) => op.facts().cost,
                Expr::Binop(op, ..) => op.facts().cost,
                Expr::Ternop(op, ..) => op.facts().cost,
            }
        });
        c
    }
}

impl fmt::Display for Expr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Expr::Const(c) => write!(f, "{}", fmt_f64(*c)),
            Expr::Get(n, idx) => write!(f, "{n}{}", fmt_indices(idx)),
            Expr::Local(l) => write!(f, "{l}"),
            Expr::IndexValue(i) => write!(f, "index({i})"),
            Expr::Uniform { seed, offset } => write!(f, "uniform({seed}, {offset})"),
            Expr::Unop(op, a) => write!(f, "{}({a})", op.name()),
            Expr::Binop(op, a, b) => write!(f, "{}({a}, {b})", op.name()),
            Expr::Ternop(op, a, b, c) => write!(f, "{}({a}, {b}, {c})", op.name()),
        }
    }
}

/// Prints `[i, j]`.
pub fn fmt_indices(idx: &[Index]) -> String {
    let parts: Vec<String> = idx.iter().map(|i| i.to_string()).collect();
    format!("[{}]", parts.join(", "))
}

/// A bounds condition `0 <= index < bound`.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Guard {
    /// The guarded index.
    pub index: Index,
    /// The exclusive upper bound.
    pub bound: usize,
}

/// A statement.
#[derive(Clone, Debug, PartialEq)]
pub enum Stmt {
    /// A comment, kept in dumps and generated source.
    Comment(String),
    /// `for var in 0..extent { body }`.
    For {
        /// The loop variable.
        var: Var,
        /// The trip count.
        extent: usize,
        /// A dynamic batch's loop over the rows of its result: the iterations from the limit's
        /// value up to `extent` compute only rows past the batch, which nothing reads, so a
        /// backend may stop there (or run them all: both are correct).
        limit: Option<Limit>,
        /// Distinct iterations write distinct cells and read nothing another iteration
        /// writes: the loop may be split across threads or GPU threads.
        parallel: bool,
        /// The body.
        body: Vec<Stmt>,
    },
    /// Runs `body` only when every guard holds.
    If {
        /// The conditions.
        guards: Vec<Guard>,
        /// The body.
        body: Vec<Stmt>,
    },
    /// `node[idx] = value`, rounding to the node's precision.
    Set {
        /// The written node.
        node: NodeId,
        /// The cell.
        idx: Vec<Index>,
        /// The value.
        value: Expr,
    },
    /// `local = value`, rounding to the local's precision.
    SetLocal {
        /// The local.
        local: LocalId,
        /// The value.
        value: Expr,
    },
    /// A call of the shape-generic matrix product (introduced by the CPU schedule).
    Gemm(Box<Gemm>),
    /// A call of the map kernel: a pointwise map or a reduction (introduced by the CPU
    /// schedule).
    Map(Box<Map>),
}

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

impl Stmt {
    /// Calls `f` on every statement, parents first (a product's epilogue is a child of the
    /// call).
    pub fn visit(&self, f: &mut impl FnMut(&Stmt)) {
        f(self);
        match self {
            Stmt::For { body, .. } | Stmt::If { body, .. } => body.iter().for_each(|s| s.visit(f)),
            Stmt::Gemm(g) => {
                if let Some(e) = &g.epilogue {
                    e.body.iter().for_each(|s| s.visit(f));
                }
            }
            _ => {}
        }
    }

    /// Calls `f` on every expression of this statement and its children.
    pub fn visit_exprs(&self, f: &mut impl FnMut(&Expr)) {
        self.visit(&mut |s| match s {
            Stmt::Set { value, .. } | Stmt::SetLocal { value, .. } => f(value),
            _ => {}
        });
    }
}

/// How far a loop needs to run: `ceil(size / per)` iterations, `size` the runtime value of a
/// dynamic size (at most the loop's extent times `per`, checked when running).
#[derive(Copy, Clone, Debug, PartialEq, Eq, Hash)]
pub struct Limit {
    /// The runtime symbol holding the size.
    pub size: Symbol,
    /// Rows per iteration (1, or a block of rows).
    pub per: usize,
}

impl fmt::Display for Limit {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.per {
            1 => write!(f, "{}", self.size),
            per => write!(f, "ceil({}/{per})", self.size),
        }
    }
}

/// A routine in the low-level IR, with everything a backend needs to know about it.
#[derive(Clone, Debug)]
pub struct Program {
    /// The routine's name.
    pub name: String,
    /// The statements.
    pub body: Vec<Stmt>,
    /// The precision of each local, indexed by [`LocalId`].
    pub locals: Vec<Prec>,
    /// The next fresh loop variable number.
    pub next_var: u32,
    /// The nodes the routine refers to.
    pub nodes: FxHashMap<NodeId, TensorNode>,
    /// The nodes the optimizer removed (no buffer needed for this routine).
    pub virtual_nodes: Vec<NodeId>,
    /// Runtime symbols, in slot order (the order bindings are passed to backends).
    pub runtime_symbols: Vec<Symbol>,
    /// Range checks for indices that depend on runtime symbols, checked when running.
    pub runtime_checks: Vec<RuntimeCheck>,
    /// Buffers introduced by the CPU schedule ([`schedule`]): not tensors of the context, owned
    /// by the compiled routine. Empty before scheduling.
    pub scratch: Vec<Scratch>,
    /// Where the materialized intermediates live: one arena per routine, shared by
    /// intermediates whose lifetimes do not overlap ([`memory`]). Empty until planned.
    pub arena: Arena,
}

/// The memory plan of a routine's intermediates: each occupies `bytes` of one arena from its
/// offset, only between its first and last top-level statement.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Arena {
    /// The arena's size: the peak of the intermediates' memory over the routine.
    pub bytes: usize,
    /// One slot per intermediate, sorted by node.
    pub slots: Vec<ArenaSlot>,
}

/// Where one intermediate lives in its routine's arena.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub struct ArenaSlot {
    /// The node.
    pub node: NodeId,
    /// Its byte offset in the arena (a multiple of 64).
    pub offset: usize,
    /// Its lifetime: the first and the last top-level statement touching it.
    pub live: (usize, usize),
}

impl Arena {
    /// The byte offset of a node in the arena, if it lives there.
    pub fn offset_of(&self, node: NodeId) -> Option<usize> {
        let k = self.slots.binary_search_by_key(&node, |s| s.node).ok()?;
        Some(self.slots[k].offset)
    }
}

/// A buffer the CPU schedule introduced: a packed copy of an operand, or partial sums.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Scratch {
    /// The node (in [`Program::nodes`]).
    pub node: NodeId,
    /// Each thread needs its own copy, and its values do not outlive one call of the step that
    /// uses it: a small array on the stack of the generated function. Otherwise one buffer of
    /// the routine, shared by its steps and threads.
    pub per_thread: bool,
}

/// A bounds condition that depends on runtime symbols: for every value of the loop
/// variables, `lo + Σ c·sym >= 0` and `hi + Σ c·sym < bound`.
#[derive(Clone, Debug, PartialEq)]
pub struct RuntimeCheck {
    /// The indexed node.
    pub node: NodeId,
    /// The axis.
    pub axis: usize,
    /// The symbol terms.
    pub sym_terms: Vec<(i64, Symbol)>,
    /// The smallest value of the loop-variable part plus the offset.
    pub lo: i64,
    /// The largest value of the loop-variable part plus the offset.
    pub hi: i64,
    /// The axis' size.
    pub bound: usize,
}

impl Program {
    /// The precision an expression storing to a `target` tensor is computed in: the target's
    /// compute precision ([`Prec::compute`]: `f32` for `f16`, `bf16` and `f32`), or `f64` when
    /// the expression reads an `f64` tensor or local. A rule of the IR that every backend
    /// follows, so that they all round at the same places.
    pub fn compute_prec(&self, e: &Expr, target: Prec) -> Prec {
        let mut p = target.compute();
        e.visit(&mut |e| match e {
            Expr::Get(n, _) if self.nodes.get(n).is_some_and(|n| n.prec == Prec::F64) => {
                p = Prec::F64;
            }
            Expr::Local(l) if self.locals.get(l.0 as usize) == Some(&Prec::F64) => p = Prec::F64,
            _ => {}
        });
        p
    }

    /// A fresh loop variable.
    pub fn fresh_var(&mut self) -> Var {
        let v = Var(self.next_var);
        self.next_var += 1;
        v
    }

    /// A fresh local of precision `prec`.
    pub fn fresh_local(&mut self, prec: Prec) -> LocalId {
        self.locals.push(prec);
        LocalId(self.locals.len() as u32 - 1)
    }

    /// The nodes that need a buffer: those the routine reads or writes after optimization.
    pub fn materialized_nodes(&self) -> Vec<NodeId> {
        nodes_of(&self.body)
    }

    /// Whether `n` is a scratch buffer of the schedule, and which kind.
    pub fn scratch_of(&self, n: NodeId) -> Option<Scratch> {
        self.scratch.iter().find(|s| s.node == n).copied()
    }

    /// A fresh node id: one above every node the program knows.
    pub fn fresh_node_id(&self) -> NodeId {
        NodeId(self.nodes.keys().map(|n| n.0 + 1).max().unwrap_or(0))
    }

    /// Loops over every cell of `dims`, with the body built from the index of each axis: a
    /// loop variable, or the constant 0 for an axis of size 1 (which gets no loop: a tensor of
    /// a hundred thousand size-1 axes is one cell, not a nest of a hundred thousand loops).
    pub fn fill_loops(&mut self, dims: &[usize], body: impl FnOnce(&[Index]) -> Stmt) -> Stmt {
        let vars: Vec<Option<Var>> =
            dims.iter().map(|&d| (d != 1).then(|| self.fresh_var())).collect();
        let idx: Vec<Index> =
            vars.iter().map(|v| v.map_or_else(|| Index::fixed(0), Index::var)).collect();
        let mut stmt = body(&idx);
        for (v, &d) in vars.iter().zip(dims).rev() {
            if let Some(v) = v {
                stmt =
                    Stmt::For { var: *v, extent: d, limit: None, parallel: true, body: vec![stmt] };
            }
        }
        stmt
    }

    /// Sets every cell of `node` to `value`.
    pub fn fill_const(&mut self, node: &TensorNode, value: f64) -> Stmt {
        self.fill_loops(&node.dims, |idx| Stmt::Set {
            node: node.id,
            idx: idx.to_vec(),
            value: Expr::Const(value),
        })
    }

    /// The slot of a runtime symbol.
    pub fn symbol_slot(&self, s: Symbol) -> Option<usize> {
        self.runtime_symbols.iter().position(|x| *x == s)
    }
}

impl fmt::Display for Program {
    /// The stable text form: one statement per line, loops and guards as indented blocks.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut out = String::new();
        for s in &self.body {
            print_stmt(&mut out, s, 0);
        }
        if !self.arena.slots.is_empty() {
            let _ = writeln!(out, "# arena of {} bytes:", self.arena.bytes);
            for a in &self.arena.slots {
                let (first, last) = a.live;
                let _ =
                    writeln!(out, "#   {} at {} for statements {first}..={last}", a.node, a.offset);
            }
        }
        f.write_str(&out)
    }
}

/// Prints one statement at `depth`, as the program's printer does.
pub fn print_stmt(out: &mut String, s: &Stmt, depth: usize) {
    let pad = "  ".repeat(depth);
    match s {
        Stmt::Comment(c) => {
            let _ = writeln!(out, "{pad}# {c}");
        }
        Stmt::For { var, extent, limit, parallel, body } => {
            let par = if *parallel { " par" } else { "" };
            let lim = limit.map_or(String::new(), |l| format!(" to {l}"));
            let _ = writeln!(out, "{pad}for {var} in 0..{extent}{lim}{par} {{");
            body.iter().for_each(|s| print_stmt(out, s, depth + 1));
            let _ = writeln!(out, "{pad}}}");
        }
        Stmt::If { guards, body } => {
            let conds: Vec<String> =
                guards.iter().map(|g| format!("0 <= {} < {}", g.index, g.bound)).collect();
            let _ = writeln!(out, "{pad}if {} {{", conds.join(" && "));
            body.iter().for_each(|s| print_stmt(out, s, depth + 1));
            let _ = writeln!(out, "{pad}}}");
        }
        Stmt::Set { node, idx, value } => {
            let _ = writeln!(out, "{pad}{node}{} := {value}", fmt_indices(idx));
        }
        Stmt::SetLocal { local, value } => {
            let _ = writeln!(out, "{pad}{local} := {value}");
        }
        Stmt::Gemm(g) => match &g.epilogue {
            None => {
                let _ = writeln!(out, "{pad}{g}");
            }
            Some(e) => {
                let vars = |axis: &[(Var, usize)]| {
                    let v: Vec<String> = axis.iter().map(|(v, e)| format!("{v} < {e}")).collect();
                    v.join(", ")
                };
                let _ = writeln!(
                    out,
                    "{pad}{g} then per cell ({}; {}) {{",
                    vars(&e.rows),
                    vars(&e.cols)
                );
                e.body.iter().for_each(|s| print_stmt(out, s, depth + 1));
                let _ = writeln!(out, "{pad}}}");
            }
        },
        Stmt::Map(m) => {
            let _ = writeln!(out, "{pad}{m}");
        }
    }
}

/// Every node the statements read or write, sorted, each once.
pub fn nodes_of(body: &[Stmt]) -> Vec<NodeId> {
    let mut out = Vec::new();
    for s in body {
        s.visit(&mut |s| match s {
            Stmt::Set { node, .. } => out.push(*node),
            Stmt::Gemm(g) => out.extend(g.operands().map(|o| o.node)),
            Stmt::Map(m) => out.extend(m.operands().map(|o| o.node)),
            _ => {}
        });
        s.visit_exprs(&mut |e| {
            e.visit(&mut |e| {
                if let Expr::Get(n, _) = e {
                    out.push(*n);
                }
            })
        });
    }
    out.sort();
    out.dedup();
    out
}

/// Removes loops and guards whose bodies became empty (after passes delete statements).
pub fn prune_empty(body: Vec<Stmt>) -> Vec<Stmt> {
    body.into_iter()
        .filter_map(|s| match s {
            Stmt::For { var, extent, limit, parallel, body } => {
                let body = prune_empty(body);
                let has_work = body.iter().any(|s| !matches!(s, Stmt::Comment(_)));
                (has_work && extent > 0).then_some(Stmt::For { var, extent, limit, parallel, body })
            }
            Stmt::If { guards, body } => {
                let body = prune_empty(body);
                let has_work = body.iter().any(|s| !matches!(s, Stmt::Comment(_)));
                has_work.then_some(Stmt::If { guards, body })
            }
            s => Some(s),
        })
        .collect()
}

/// Where the top-level statements may be cut into separate functions: `cuts[i]` says whether
/// a step may end just before statement `i` (`cuts[len]` is the end). Locals live in one
/// function, so a cut is allowed only where no local assigned before it is read at or after
/// it — a local's live range can span many statements (a scalar loaded once and used by
/// several later nests), not only the next one. One pass over the statements.
pub fn cut_points(body: &[Stmt]) -> Vec<bool> {
    let mut last_use: FxHashMap<LocalId, usize> = FxHashMap::default();
    let mut assigned: Vec<Vec<LocalId>> = Vec::with_capacity(body.len());
    for (i, s) in body.iter().enumerate() {
        let mut set = Vec::new();
        s.visit(&mut |s| {
            if let Stmt::SetLocal { local, .. } = s {
                set.push(*local);
                last_use.entry(*local).or_insert(i);
            }
        });
        s.visit_exprs(&mut |e| {
            e.visit(&mut |e| {
                if let Expr::Local(l) = e {
                    last_use.insert(*l, i);
                }
            })
        });
        assigned.push(set);
    }
    // The last statement reading a local assigned so far; a cut before `i` is allowed when
    // every such statement comes before `i`.
    let mut live_until: Option<usize> = None;
    let mut cuts = Vec::with_capacity(body.len() + 1);
    for (i, set) in assigned.iter().enumerate() {
        cuts.push(live_until.is_none_or(|last| last < i));
        for l in set {
            let last = last_use.get(l).copied().unwrap_or(i);
            live_until = Some(live_until.map_or(last, |u| u.max(last)));
        }
    }
    cuts.push(true);
    cuts
}

/// Floating-point operations of one run of a program, as `rocannl bench` reports them: every
/// arithmetic operation executed (`+ - * /`, `pow`, `max`, `min` and the unary functions: 1;
/// `fma`: 2), times the iterations of its enclosing loops. Comparisons, selections, loads and
/// stores are not counted.
pub fn flops(prog: &Program) -> u64 {
    fn expr_flops(e: &Expr) -> u64 {
        let mut n = 0;
        e.visit(&mut |e| {
            n += match e {
                Expr::Unop(UnOp::Identity | UnOp::Not, _) => 0,
                Expr::Unop(..) => 1,
                Expr::Binop(BinOp::Lt | BinOp::Le | BinOp::Gt | BinOp::Eq | BinOp::Ne, ..) => 0,
                Expr::Binop(BinOp::Second, ..) => 0,
                Expr::Binop(..) => 1,
                Expr::Ternop(TernOp::Fma, ..) => 2,
                _ => 0,
            }
        });
        n
    }
    fn go(s: &Stmt, mult: u64) -> u64 {
        match s {
            Stmt::For { extent, body, .. } => {
                body.iter().map(|b| go(b, mult.saturating_mul(*extent as u64))).sum()
            }
            Stmt::If { body, .. } => body.iter().map(|b| go(b, mult)).sum(),
            Stmt::Set { value, .. } | Stmt::SetLocal { value, .. } => {
                mult.saturating_mul(expr_flops(value))
            }
            // Per call: its rows (a block's share of them) × columns × reduction, two each.
            Stmt::Gemm(g) => {
                let cells = (g.rows_per_call() * g.n.extent) as u64;
                let epilogue = g.epilogue.as_ref().map_or(0, |e| {
                    e.body.iter().map(|b| go(b, mult.saturating_mul(cells))).sum::<u64>()
                });
                mult.saturating_mul(2 * cells.saturating_mul(g.k.extent as u64))
                    .saturating_add(epilogue)
            }
            Stmt::Map(m) => {
                mult.saturating_mul(m.points_total() as u64).saturating_mul(m.flops_per_point())
            }
            Stmt::Comment(_) => 0,
        }
    }
    prog.body.iter().map(|s| go(s, 1)).sum()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn set_local(l: u32, value: Expr) -> Stmt {
        Stmt::SetLocal { local: LocalId(l), value }
    }

    fn store(n: u32, value: Expr) -> Stmt {
        Stmt::Set { node: NodeId(n), idx: vec![], value }
    }

    #[test]
    fn cuts_avoid_every_live_range_of_a_local() {
        // t0 is assigned first and read three statements later: no cut inside that range, even
        // though the statements between do not read it.
        let body = vec![
            set_local(0, Expr::Const(1.0)),
            store(1, Expr::Const(2.0)),
            store(2, Expr::Const(3.0)),
            store(3, Expr::Local(LocalId(0))),
            store(4, Expr::Const(4.0)),
            Stmt::For {
                var: Var(0),
                extent: 4,
                limit: None,
                parallel: false,
                body: vec![set_local(1, Expr::Const(0.0)), store(5, Expr::Local(LocalId(1)))],
            },
            store(6, Expr::Const(5.0)),
        ];
        let cuts = cut_points(&body);
        assert_eq!(cuts, vec![true, false, false, false, true, true, true, true]);
    }
}

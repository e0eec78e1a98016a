//! Statements: loops, guards, stores and kernel calls, with the traversals that every pass
//! uses to walk or rebuild a nest without restating each statement's fields.

use std::fmt;

use super::{Call, Expr, Gemm, Index, LocalId, Map, Var};
use crate::indexing::Symbol;
use crate::tnode::NodeId;

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
    /// A kernel call: one (batch, head) pair of a fused attention, one part of a table lookup
    /// (introduced by lowering; expanded into ordinary nests for every backend but the native
    /// one, [`super::call`]).
    Call(Box<Call>),
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

    /// This loop or guard with `f` applied to its body, every other field (variable, extent,
    /// limit and parallel flag; guards) kept; any other statement is returned unchanged. Passes
    /// that only rewrite bodies use it instead of restating each block's fields.
    pub fn map_body(self, f: impl FnOnce(Vec<Stmt>) -> Vec<Stmt>) -> Stmt {
        match self {
            Stmt::For { var, extent, limit, parallel, body } => {
                Stmt::For { var, extent, limit, parallel, body: f(body) }
            }
            Stmt::If { guards, body } => Stmt::If { guards, body: f(body) },
            s => s,
        }
    }

    /// A loop or guard with this one's fields around a new `body` (the old body is not
    /// cloned); any other statement is cloned unchanged, `body` dropped.
    pub fn with_body(&self, body: Vec<Stmt>) -> Stmt {
        match self {
            Stmt::For { var, extent, limit, parallel, .. } => {
                Stmt::For { var: *var, extent: *extent, limit: *limit, parallel: *parallel, body }
            }
            Stmt::If { guards, .. } => Stmt::If { guards: guards.clone(), body },
            s => s.clone(),
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

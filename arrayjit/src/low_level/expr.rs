//! Scalar expressions: what a statement stores, with the traversals and rewrites the passes
//! share.

use std::fmt;

use super::{Index, LocalId, Var};
use crate::assignments::fmt_f64;
use crate::ops::{BinOp, TernOp, UnOp};
use crate::tnode::NodeId;

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

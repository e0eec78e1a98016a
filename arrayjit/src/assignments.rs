//! The assignments IR: what the tensor layer hands to the compiler.
//!
//! One [`Asgn::Accum`] is `lhs (accum)= expr(rhs...)` evaluated at every point of the product
//! space of its [`Projections`]; a [`ScalarExpr`] tree (not a single operation) lets a gradient
//! such as relu's `x.grad += g * (0 < x)` be one assignment. [`Asgn::Fetch`] fills a node from a
//! source that is not another tensor (a constant, `iota`, a runtime symbol, counter-based random
//! numbers). A whole training step is a [`Asgn::Seq`] of these, compiled into one routine.
//!
//! The printer ([`fmt::Display`]) is stable: snapshots and debug dumps rely on it.

use std::fmt;
use std::sync::Arc;

use crate::indexing::{AxisIndex, Projections, Symbol};
use crate::ops::{BinOp, TernOp, UnOp};
use crate::tnode::NodeId;

/// The right-hand side of one assignment, evaluated at each product-space point.
#[derive(Clone, Debug, PartialEq)]
pub enum ScalarExpr {
    /// The `i`-th argument tensor, read at its projection `project_rhs[i]`.
    Arg(usize),
    /// A constant.
    Const(f64),
    /// The value of a runtime symbol (the size of a dynamic axis, in a mean over it).
    Symbol(Symbol),
    /// A unary operation.
    Unop(UnOp, Box<ScalarExpr>),
    /// A binary operation.
    Binop(BinOp, Box<ScalarExpr>, Box<ScalarExpr>),
    /// A ternary operation.
    Ternop(TernOp, Box<ScalarExpr>, Box<ScalarExpr>, Box<ScalarExpr>),
}

impl ScalarExpr {
    /// `op(a)`.
    pub fn un(op: UnOp, a: ScalarExpr) -> ScalarExpr {
        ScalarExpr::Unop(op, Box::new(a))
    }

    /// `op(a, b)`.
    pub fn bin(op: BinOp, a: ScalarExpr, b: ScalarExpr) -> ScalarExpr {
        ScalarExpr::Binop(op, Box::new(a), Box::new(b))
    }

    /// `op(a, b, c)`.
    pub fn tern(op: TernOp, a: ScalarExpr, b: ScalarExpr, c: ScalarExpr) -> ScalarExpr {
        ScalarExpr::Ternop(op, Box::new(a), Box::new(b), Box::new(c))
    }

    /// The largest argument position used, if any.
    pub fn max_arg(&self) -> Option<usize> {
        match self {
            ScalarExpr::Arg(i) => Some(*i),
            ScalarExpr::Const(_) | ScalarExpr::Symbol(_) => None,
            ScalarExpr::Unop(_, a) => a.max_arg(),
            ScalarExpr::Binop(_, a, b) => a.max_arg().max(b.max_arg()),
            ScalarExpr::Ternop(_, a, b, c) => a.max_arg().max(b.max_arg()).max(c.max_arg()),
        }
    }

    /// Calls `f` on every runtime symbol the expression reads.
    pub fn symbols(&self, f: &mut impl FnMut(Symbol)) {
        match self {
            ScalarExpr::Symbol(s) => f(*s),
            ScalarExpr::Arg(_) | ScalarExpr::Const(_) => {}
            ScalarExpr::Unop(_, a) => a.symbols(f),
            ScalarExpr::Binop(_, a, b) => {
                a.symbols(f);
                b.symbols(f);
            }
            ScalarExpr::Ternop(_, a, b, c) => {
                a.symbols(f);
                b.symbols(f);
                c.symbols(f);
            }
        }
    }

    fn fmt_with(&self, f: &mut fmt::Formatter<'_>, arg: &dyn Fn(usize) -> String) -> fmt::Result {
        match self {
            ScalarExpr::Arg(i) => f.write_str(&arg(*i)),
            ScalarExpr::Const(c) => write!(f, "{}", fmt_f64(*c)),
            ScalarExpr::Symbol(s) => write!(f, "{s}"),
            ScalarExpr::Unop(op, a) => {
                write!(f, "{}(", op.name())?;
                a.fmt_with(f, arg)?;
                write!(f, ")")
            }
            ScalarExpr::Binop(op, a, b) => {
                write!(f, "{}(", op.name())?;
                a.fmt_with(f, arg)?;
                write!(f, ", ")?;
                b.fmt_with(f, arg)?;
                write!(f, ")")
            }
            ScalarExpr::Ternop(op, a, b, c) => {
                write!(f, "{}(", op.name())?;
                a.fmt_with(f, arg)?;
                write!(f, ", ")?;
                b.fmt_with(f, arg)?;
                write!(f, ", ")?;
                c.fmt_with(f, arg)?;
                write!(f, ")")
            }
        }
    }
}

/// Prints a float so that it reads back exactly and integers stay short (`1`, `-0.5`, `inf`).
pub fn fmt_f64(c: f64) -> String {
    if c.is_nan() {
        "nan".to_string()
    } else if c.is_infinite() {
        if c > 0.0 { "inf".to_string() } else { "-inf".to_string() }
    } else {
        format!("{c:?}").trim_end_matches(".0").to_string()
    }
}

/// A source that fills a node without reading other tensors.
#[derive(Clone, Debug, PartialEq)]
pub enum FetchOp {
    /// Every cell holds this constant.
    Constant(f64),
    /// Every cell holds its row-major offset.
    Iota,
    /// Every cell holds the runtime value of a symbol.
    EmbedSymbol(Symbol),
    /// Counter-based random numbers in `[0, 1)`: cell `o` holds
    /// [`crate::ops::uniform`]`(seed, o + n·salt)` (SplitMix64; `n` the node's number of cells,
    /// `salt` the runtime value of the salt symbol or 0), identical on every backend. A salt such
    /// as a step counter draws fresh numbers on every run (dropout masks).
    Uniform {
        /// The generator's seed.
        seed: u64,
        /// A runtime symbol selecting a fresh block of the sequence.
        salt: Option<Symbol>,
    },
}

impl fmt::Display for FetchOp {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            FetchOp::Constant(c) => write!(f, "constant({})", fmt_f64(*c)),
            FetchOp::Iota => write!(f, "iota"),
            FetchOp::EmbedSymbol(s) => write!(f, "symbol({s})"),
            FetchOp::Uniform { seed, salt: None } => write!(f, "uniform(seed={seed})"),
            FetchOp::Uniform { seed, salt: Some(s) } => write!(f, "uniform(seed={seed}, salt={s})"),
        }
    }
}

/// The assignments IR.
///
/// ```
/// use std::sync::Arc;
/// use rocannl_arrayjit::assignments::{Asgn, ScalarExpr};
/// use rocannl_arrayjit::indexing::{Projections, SymbolGen};
/// use rocannl_arrayjit::ops::{BinOp, UnOp};
/// use rocannl_arrayjit::tnode::NodeId;
/// let proj = Arc::new(Projections::identity(&[3], 1, &mut SymbolGen::default()));
/// let a = Asgn::Seq(vec![
///     Asgn::Comment("forward".into()),
///     Asgn::Accum {
///         lhs: NodeId(1),
///         accum: None,
///         rhs: vec![NodeId(0)],
///         expr: ScalarExpr::un(UnOp::Relu, ScalarExpr::Arg(0)),
///         projections: proj,
///         initialize_neutral: false,
///     },
/// ]);
/// assert_eq!(a.to_string(), "# forward\nn1[i0] = relu(n0[i0])  over [i0:3]\n");
/// ```
#[derive(Clone, Debug, PartialEq)]
pub enum Asgn {
    /// Nothing.
    Noop,
    /// In order.
    Seq(Vec<Asgn>),
    /// A comment, kept in dumps.
    Comment(String),
    /// `lhs (accum)= expr(rhs...)` over the product space of `projections`.
    Accum {
        /// The assigned node.
        lhs: NodeId,
        /// `None`: plain assignment `=`; `Some(op)`: `lhs = lhs op expr`.
        accum: Option<BinOp>,
        /// The argument nodes; `ScalarExpr::Arg(i)` reads `rhs[i]`.
        rhs: Vec<NodeId>,
        /// The value at each point.
        expr: ScalarExpr,
        /// The indexing; `rhs_dims`/`project_rhs` have one entry per element of `rhs`.
        projections: Arc<Projections>,
        /// Fill the lhs with the accumulation's neutral element (0 for `=`) first.
        initialize_neutral: bool,
    },
    /// Fill a node from a [`FetchOp`].
    Fetch {
        /// The filled node.
        lhs: NodeId,
        /// The source.
        fetch: FetchOp,
    },
    /// Scaled dot-product attention, forward or backward, as one operation
    /// ([`AttentionAsgn`]).
    Attention(Box<AttentionAsgn>),
    /// A table lookup by integer ids, or its gradient ([`GatherAsgn`]).
    Gather(Box<GatherAsgn>),
}

/// A lookup of a table's cells by integer ids (an embedding): `out[t…, r…] = table[r…,
/// ids[t…]]`, or backward `table[r…, ids[t…]] += out[t…, r…]` (then `table` is the table's
/// gradient and `out` the output's). The table's axes are `[r…, vocab]` or `[vocab, r…]`
/// (`vocab_first`), the ids' `[t…]`, the output's `[t…, r…]`. An id that is not an integer in
/// `0..vocab` selects nothing (its output cells are `−0`; backward it adds nothing). The native
/// CPU backend calls a kernel ([`crate::kernels::gather`]); the others compute it as loop
/// nests over the vocabulary ([`crate::low_level::gather`]).
#[derive(Clone, Debug, PartialEq)]
pub struct GatherAsgn {
    /// The table (its gradient, backward).
    pub table: NodeId,
    /// The ids.
    pub ids: NodeId,
    /// The output (its gradient, backward).
    pub out: NodeId,
    /// The table's first axis is the vocabulary (else its last).
    pub vocab_first: bool,
    /// The gradient: `table += scatter(out)`.
    pub backward: bool,
    /// A dynamic size of the ids' first axis: its runtime symbol (the tokens past it are not
    /// looked up, and add nothing backward).
    pub batch_limit: Option<Symbol>,
}

impl GatherAsgn {
    /// The node written: the output, or the table's gradient.
    pub fn written(&self) -> NodeId {
        if self.backward { self.table } else { self.out }
    }

    /// The nodes read (the gradient backward, onto which it accumulates, included).
    pub fn read(&self) -> Vec<NodeId> {
        if self.backward {
            vec![self.ids, self.out, self.table]
        } else {
            vec![self.table, self.ids]
        }
    }
}

impl fmt::Display for GatherAsgn {
    /// `n3 := gather(n1, n2)`, or `n5 += gather_grad(n2, n4)`; `vocab first` and the batch's
    /// symbol after a semicolon when they apply.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut opts = Vec::new();
        if self.vocab_first {
            opts.push("vocab first".to_string());
        }
        if let Some(s) = self.batch_limit {
            opts.push(format!("batch to {s}"));
        }
        let opts = if opts.is_empty() { String::new() } else { format!("; {}", opts.join(", ")) };
        match self.backward {
            false => write!(f, "{} := gather({}, {}{opts})", self.out, self.table, self.ids),
            true => write!(f, "{} += gather_grad({}, {}{opts})", self.table, self.ids, self.out),
        }
    }
}

/// Scaled dot-product attention over (batch, head) pairs: `out = softmax(scale·q·kᵀ)·v` per
/// pair, the softmax over the keys each query sees, with the log-sum-exp of each row's scaled
/// scores kept in `lse` for the gradient. The tensors' axes are `q` `[batch…, s, h, d]`, `k`
/// `[batch…, t, h, d]`, `v` `[batch…, t, h, e]`, `out` `[batch…, s, h, e]` and `lse`
/// `[batch…, s, h]` (the batch axes equal). The native CPU backend calls a fused kernel
/// ([`crate::kernels::attention`]); the others compute it as loop nests over the scores.
#[derive(Clone, Debug, PartialEq)]
pub struct AttentionAsgn {
    /// Queries.
    pub q: NodeId,
    /// Keys.
    pub k: NodeId,
    /// Values.
    pub v: NodeId,
    /// The output (written by the forward pass).
    pub out: NodeId,
    /// Each row's log-sum-exp (written by the forward pass).
    pub lse: NodeId,
    /// Query `s` sees the keys `t ≤ s` only.
    pub causal: bool,
    /// The scores' factor.
    pub scale: f64,
    /// `None`: the forward pass. Otherwise the backward pass, accumulating onto these.
    pub grads: Option<AttentionGrads>,
    /// A dynamic size of the first batch axis: its runtime symbol (the pairs past it are not
    /// computed).
    pub batch_limit: Option<Symbol>,
}

/// The gradients a backward [`AttentionAsgn`] reads and accumulates onto.
#[derive(Clone, Debug, PartialEq)]
pub struct AttentionGrads {
    /// The output's gradient.
    pub d_out: NodeId,
    /// The queries' gradient, if wanted.
    pub d_q: Option<NodeId>,
    /// The keys' gradient, if wanted.
    pub d_k: Option<NodeId>,
    /// The values' gradient, if wanted.
    pub d_v: Option<NodeId>,
}

impl AttentionAsgn {
    /// The nodes written: the output and log-sum-exp forward, the gradients backward.
    pub fn written(&self) -> Vec<NodeId> {
        match &self.grads {
            None => vec![self.out, self.lse],
            Some(g) => [g.d_q, g.d_k, g.d_v].into_iter().flatten().collect(),
        }
    }

    /// The nodes read.
    pub fn read(&self) -> Vec<NodeId> {
        let mut out = vec![self.q, self.k, self.v];
        if let Some(g) = &self.grads {
            out.extend([self.out, self.lse, g.d_out]);
            out.extend([g.d_q, g.d_k, g.d_v].into_iter().flatten());
        }
        out
    }
}

impl fmt::Display for AttentionAsgn {
    /// `n5, n6 := attention(n1, n2, n3; causal, scale=0.25)`, or
    /// `n7, n8, n9 += attention_grad(n1, n2, n3, n5, n6, n10; causal, scale=0.25)`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let names = |ns: &[NodeId]| ns.iter().map(|n| n.to_string()).collect::<Vec<_>>().join(", ");
        let opts = format!(
            "{}scale={}{}",
            if self.causal { "causal, " } else { "" },
            fmt_f64(self.scale),
            self.batch_limit.map_or(String::new(), |s| format!(", batch to {s}"))
        );
        let inputs = [self.q, self.k, self.v];
        match &self.grads {
            None => {
                write!(f, "{} := attention({}; {opts})", names(&self.written()), names(&inputs))
            }
            Some(g) => {
                let read = [self.q, self.k, self.v, self.out, self.lse, g.d_out];
                write!(f, "{} += attention_grad({}; {opts})", names(&self.written()), names(&read))
            }
        }
    }
}

impl Asgn {
    /// Every node written.
    pub fn nodes_written(&self) -> Vec<NodeId> {
        let mut out = Vec::new();
        self.visit(&mut |a| match a {
            Asgn::Accum { lhs, .. } | Asgn::Fetch { lhs, .. } => out.push(*lhs),
            Asgn::Attention(a) => out.extend(a.written()),
            Asgn::Gather(g) => out.push(g.written()),
            _ => {}
        });
        out.sort();
        out.dedup();
        out
    }

    /// Every node read or written.
    pub fn nodes(&self) -> Vec<NodeId> {
        let mut out = Vec::new();
        self.visit(&mut |a| match a {
            Asgn::Accum { lhs, rhs, .. } => {
                out.push(*lhs);
                out.extend(rhs.iter().copied());
            }
            Asgn::Fetch { lhs, .. } => out.push(*lhs),
            Asgn::Attention(a) => {
                out.extend(a.written());
                out.extend(a.read());
            }
            Asgn::Gather(g) => {
                out.push(g.written());
                out.extend(g.read());
            }
            _ => {}
        });
        out.sort();
        out.dedup();
        out
    }

    /// Calls `f` on every assignment, in order (sequences first, then their elements).
    pub fn visit(&self, f: &mut impl FnMut(&Asgn)) {
        f(self);
        if let Asgn::Seq(items) = self {
            for a in items {
                a.visit(f);
            }
        }
    }

    fn fmt_indented(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Asgn::Noop => Ok(()),
            Asgn::Seq(items) => items.iter().try_for_each(|a| a.fmt_indented(f)),
            Asgn::Comment(c) => writeln!(f, "# {c}"),
            Asgn::Accum { lhs, accum, rhs, expr, projections, initialize_neutral } => {
                write!(f, "{lhs}")?;
                write_idx(f, &projections.project_lhs)?;
                match accum {
                    None => write!(f, " = ")?,
                    Some(op) => write!(f, " {}= ", op.name())?,
                }
                let arg = |i: usize| match (rhs.get(i), projections.project_rhs.get(i)) {
                    (Some(n), Some(idx)) => format!("{n}{}", idx_string(idx)),
                    _ => format!("<arg{i}?>"),
                };
                expr.fmt_with(f, &arg)?;
                write!(f, "  over [")?;
                let space = projections.product_iterators.iter().zip(&projections.product_space);
                for (n, (s, d)) in space.enumerate() {
                    write!(f, "{}{s}:{d}", if n > 0 { ", " } else { "" })?;
                }
                write!(f, "]")?;
                if *initialize_neutral {
                    write!(f, "  init")?;
                }
                writeln!(f)
            }
            Asgn::Fetch { lhs, fetch } => writeln!(f, "{lhs} := {fetch}"),
            Asgn::Attention(a) => writeln!(f, "{a}"),
            Asgn::Gather(g) => writeln!(f, "{g}"),
        }
    }
}

fn idx_string(idx: &[AxisIndex]) -> String {
    let parts: Vec<String> = idx.iter().map(|i| i.to_string()).collect();
    format!("[{}]", parts.join(", "))
}

fn write_idx(f: &mut fmt::Formatter<'_>, idx: &[AxisIndex]) -> fmt::Result {
    f.write_str(&idx_string(idx))
}

impl fmt::Display for Asgn {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.fmt_indented(f)
    }
}

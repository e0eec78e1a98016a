//! The table lookup in loop nests: calls of the gather kernel, and their expansion into
//! ordinary nests.
//!
//! Lowering turns a [`GatherAsgn`] into a parallel loop over parts of the lookup around one
//! [`GatherCall`] each: forward, parts of the tokens (each writes its own output rows);
//! backward, parts of the table's rows (each adds into its own cells of the table's gradient,
//! reading every token in order, so no two threads add into one cell and every cell sums its
//! tokens in token order). The native backend calls [`crate::kernels::gather`] for each.
//!
//! Every other backend gets ordinary nests from [`super::expand_calls`], which read the ids
//! with an equality, since an index of this IR cannot be read from a tensor:
//!
//! ```text
//! forward:  out[t…, r…] = Σ_v where(ids[t…] = v, table[r…, v], −0)          from −0
//! backward: table[r…, v] = table[r…, v] + Σ_t where(ids[t…] = v, out[t…, r…], −0)
//! ```
//!
//! `−0` is the identity of floating-point addition (`x + −0 = x` for every `x`, `+0` and `−0`
//! included), so each sum is its one selected term, unchanged, or `−0` when nothing is selected
//! (an id that is not an integer in `0..vocab`), and backward each cell adds its tokens' terms
//! in token order: the kernel's bits exactly. The nests cost a factor of the vocabulary more
//! than the kernel (what a one-hot product costs everywhere).

use std::fmt;

use super::{Expr, Index, Limit, Program, Stmt, Var};
use crate::assignments::GatherAsgn;
use crate::indexing::Symbol;
use crate::kernels::gather::{DESC_LEN, Gather};
use crate::ops::{BinOp, TernOp};
use crate::tnode::NodeId;

/// One part of a lookup (tokens forward, rows of the table backward): the kernel call the
/// native backend makes.
#[derive(Clone, Debug, PartialEq)]
pub struct GatherCall {
    /// The tensors and flags.
    pub asgn: GatherAsgn,
    /// The sizes and the table's layout (the ids' and the rows' axes flattened).
    pub sizes: Gather,
    /// The ids' axes, outermost first (their product is `sizes.tokens`).
    pub token_dims: Vec<usize>,
    /// The table's axes other than the vocabulary, outermost first.
    pub row_dims: Vec<usize>,
    /// The part's first token (forward) or row (backward), affine in the enclosing loops.
    pub start: Index,
    /// Tokens or rows per part.
    pub count: usize,
}

impl GatherCall {
    /// Every node the call reads or writes.
    pub fn nodes(&self) -> Vec<NodeId> {
        let a = &self.asgn;
        let mut out = vec![a.table, a.ids, a.out];
        out.sort();
        out.dedup();
        out
    }

    /// The call with every node renamed by `f`.
    pub fn map_nodes(&self, mut f: impl FnMut(NodeId) -> NodeId) -> GatherCall {
        let mut c = self.clone();
        for n in [&mut c.asgn.table, &mut c.asgn.ids, &mut c.asgn.out] {
            *n = f(*n);
        }
        c
    }

    /// The pointers the kernel takes, in its order: table, ids, output (their gradients
    /// backward, the ids read as they are).
    pub fn pointers(&self) -> [NodeId; 3] {
        [self.asgn.table, self.asgn.ids, self.asgn.out]
    }

    /// The tokens the lookup uses: all, or the first axis's dynamic size times the tokens per
    /// index of that axis.
    fn used_tokens(&self) -> Index {
        match self.asgn.batch_limit {
            Some(s) => {
                let per = self.sizes.tokens / self.token_dims.first().copied().unwrap_or(1).max(1);
                Index::new(vec![(per as i64, super::IdxVar::Sym(s))], 0)
            }
            None => Index::fixed(self.sizes.tokens as i64),
        }
    }

    /// The descriptor words ([`Gather::descriptor`]), the part's start affine in the enclosing
    /// loops, the tokens in use in the runtime symbols.
    pub fn descriptor(&self) -> [Index; DESC_LEN] {
        let words = self.sizes.descriptor(self.asgn.backward, 0, self.count);
        std::array::from_fn(|k| match k {
            7 => self.start.clone(),
            9 => self.used_tokens(),
            _ => Index::fixed(words[k]),
        })
    }

    /// Cells copied (forward) or added (backward) by one call.
    pub fn steps(&self) -> usize {
        let s = &self.sizes;
        match self.asgn.backward {
            false => self.count.min(s.tokens).saturating_mul(s.rows),
            true => self.count.min(s.rows).saturating_mul(s.tokens),
        }
    }
}

impl fmt::Display for GatherCall {
    /// The assignment's text and the part, its first token (row, backward) and length:
    /// `n3 := gather(n1, n2) part 16*v0, 16 long`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} part {}, {} long", self.asgn, self.start, self.count)
    }
}

/// The parts a lookup of `sizes` is cut into: `(parts, count)` for the tokens forward, the
/// rows backward (at most 64 parts, so that the pool has a few per thread to balance).
pub fn parts(sizes: &Gather, backward: bool) -> (usize, usize) {
    let n = if backward { sizes.rows } else { sizes.tokens }.max(1);
    let count = n.div_ceil(64).max(1);
    (n.div_ceil(count), count)
}

/// A loop of an expansion: its variable, extent and dynamic limit.
type Loop = (Var, usize, Option<Limit>);

/// Fresh loops over `dims` (the first limited by `limit`), and their indices.
fn fresh_loops(
    prog: &mut Program,
    dims: &[usize],
    limit: Option<Limit>,
) -> (Vec<Loop>, Vec<Index>) {
    let loops: Vec<Loop> = dims
        .iter()
        .enumerate()
        .map(|(k, &d)| (prog.fresh_var(), d, if k == 0 { limit } else { None }))
        .collect();
    let idx = loops.iter().map(|(v, ..)| Index::var(*v)).collect();
    (loops, idx)
}

/// `body` inside `loops`, outermost first.
fn nest(loops: &[Loop], parallel: bool, body: Vec<Stmt>) -> Vec<Stmt> {
    loops.iter().rev().fold(body, |body, &(var, extent, limit)| {
        vec![Stmt::For { var, extent, limit, parallel, body }]
    })
}

/// The ordinary nests of one lookup (see the module documentation).
pub(super) fn expand(prog: &mut Program, call: &GatherCall) -> Vec<Stmt> {
    let a = &call.asgn;
    let compute = prog.nodes[&a.table].prec.compute();
    let limit = a.batch_limit.map(|size: Symbol| Limit { size, per: 1 });
    let (t_loops, t) = fresh_loops(prog, &call.token_dims, limit);
    let (r_loops, r) = fresh_loops(prog, &call.row_dims, None);
    let (v_loop, v) = fresh_loops(prog, &[call.sizes.vocab], None);
    let v = &v[0];
    let table_cell: Vec<Index> = match a.vocab_first {
        true => std::iter::once(v.clone()).chain(r.iter().cloned()).collect(),
        false => r.iter().cloned().chain(std::iter::once(v.clone())).collect(),
    };
    let out_cell: Vec<Index> = t.iter().chain(&r).cloned().collect();
    let acc = prog.fresh_local(compute);
    // `acc := acc + where(ids[t…] = v, value, −0)`.
    let selects = Expr::bin(BinOp::Eq, Expr::Get(a.ids, t), Expr::IndexValue(v.clone()));
    let term = |value: Expr| {
        let step = Expr::Ternop(
            TernOp::Where,
            Box::new(selects),
            Box::new(value),
            Box::new(Expr::Const(-0.0)),
        );
        Stmt::SetLocal { local: acc, value: Expr::bin(BinOp::Add, Expr::Local(acc), step) }
    };
    let (outer, init, sum, store) = match a.backward {
        false => (
            [t_loops, r_loops].concat(),
            Expr::Const(-0.0),
            nest(&v_loop, false, vec![term(Expr::Get(a.table, table_cell.clone()))]),
            Stmt::Set { node: a.out, idx: out_cell, value: Expr::Local(acc) },
        ),
        true => (
            [r_loops, v_loop].concat(),
            Expr::Get(a.table, table_cell.clone()),
            nest(&t_loops, false, vec![term(Expr::Get(a.out, out_cell))]),
            Stmt::Set { node: a.table, idx: table_cell, value: Expr::Local(acc) },
        ),
    };
    let mut body = vec![Stmt::SetLocal { local: acc, value: init }];
    body.extend(sum);
    body.push(store);
    let mut out = vec![Stmt::Comment(a.to_string())];
    out.extend(nest(&outer, true, body));
    out
}

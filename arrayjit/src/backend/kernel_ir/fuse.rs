//! Fusion: consecutive parallel nests over the same cells as one kernel, when no thread would
//! touch a cell another thread writes.

use super::{Kernel, kernel};
use crate::low_level::{Expr, Index, Limit, Program, Stmt, Var};
use crate::tnode::NodeId;

pub(super) fn flush_fused(kernels: &mut Vec<Kernel>, fused: &mut Option<Fused>) {
    if let Some(g) = fused.take() {
        kernels.push(g.kernel(kernels.len()));
    }
}

/// A nest's leading parallel loops: variable, extent, dynamic limit.
type Prefix = Vec<(Var, usize, Option<Limit>)>;

/// The leading parallel loops of a nest and what they hold.
fn prefix_of(s: &Stmt) -> (Prefix, &[Stmt]) {
    let mut prefix = Vec::new();
    let mut inner = std::slice::from_ref(s);
    while let [Stmt::For { var, extent, limit, parallel: true, body }] = inner {
        prefix.push((*var, *extent, *limit));
        inner = body;
    }
    (prefix, inner)
}

/// Parallel nests over the same cells, fused into one kernel: their bodies one after the other
/// in each thread, the later nests' cell variables renamed to the first's.
pub(super) struct Fused {
    first: Stmt,
    prefix: Prefix,
    inner: Vec<Stmt>,
    nests: usize,
}

impl Fused {
    pub(super) fn new(s: &Stmt) -> Fused {
        let (prefix, inner) = prefix_of(s);
        Fused { first: s.clone(), prefix, inner: inner.to_vec(), nests: 1 }
    }

    /// Adds a nest when it runs over the same cells and no thread would touch a cell another
    /// thread writes: every tensor both sides touch, and one of them writes, is accessed at one
    /// index everywhere, and that index names each cell variable as an axis of its own; and no
    /// intermediate of one side shares arena bytes with one of the other (the memory plan lets
    /// tensors of consecutive statements share bytes, since statements run one after another:
    /// fused, they no longer do).
    pub(super) fn absorb(&mut self, prog: &Program, s: &Stmt) -> bool {
        let (prefix, inner) = prefix_of(s);
        if prefix.len() != self.prefix.len()
            || prefix.iter().zip(&self.prefix).any(|(a, b)| a.1 != b.1 || a.2 != b.2)
        {
            return false;
        }
        let to =
            |v: Var| prefix.iter().position(|p| p.0 == v).map(|k| Index::var(self.prefix[k].0));
        let renamed: Vec<Stmt> = inner
            .iter()
            .cloned()
            .map(|st| crate::low_level::schedule::subst_stmt(st, &to))
            .collect();
        let vars: Vec<Var> = self.prefix.iter().map(|p| p.0).collect();
        let (a, b) = (accesses(&self.inner), accesses(&renamed));
        if shares_arena_bytes(prog, &a, &b) {
            return false;
        }
        let written = |n: NodeId| a.iter().chain(&b).any(|x| x.0 == n && x.2);
        for (n, idx, _) in a.iter().chain(&b) {
            let shared = a.iter().any(|x| x.0 == *n) && b.iter().any(|x| x.0 == *n);
            if !shared || !written(*n) {
                continue;
            }
            let own = vars.iter().all(|v| idx.iter().any(|i| i.as_var() == Some(*v)));
            let one_index = a.iter().chain(&b).filter(|x| x.0 == *n).all(|x| &x.1 == idx);
            if !own || !one_index {
                return false;
            }
        }
        self.inner.extend(renamed);
        self.nests += 1;
        true
    }

    fn kernel(self, k: usize) -> Kernel {
        if self.nests == 1 {
            return kernel(k, std::slice::from_ref(&self.first));
        }
        // The first nest's loops around every body.
        let mut s = self.inner;
        for (var, extent, limit) in self.prefix.iter().rev() {
            s = vec![Stmt::For {
                var: *var,
                extent: *extent,
                limit: *limit,
                parallel: true,
                body: s,
            }];
        }
        kernel(k, &s)
    }
}

/// Whether a node one side touches and a different node the other side touches occupy
/// overlapping bytes of the routine's arena.
fn shares_arena_bytes(
    prog: &Program,
    a: &[(NodeId, Vec<Index>, bool)],
    b: &[(NodeId, Vec<Index>, bool)],
) -> bool {
    let bytes = |n: NodeId| {
        let slot = prog.arena.slots.iter().find(|s| s.node == n)?;
        let t = prog.nodes.get(&n)?;
        Some(slot.offset..slot.offset + t.num_elements() * t.prec.size_in_bytes())
    };
    a.iter().filter_map(|x| bytes(x.0).map(|r| (x.0, r))).any(|(na, ra)| {
        b.iter()
            .filter(|y| y.0 != na)
            .filter_map(|y| bytes(y.0))
            .any(|rb| ra.start < rb.end && rb.start < ra.end)
    })
}

/// Every tensor access of some statements: the node, the index, whether it writes.
fn accesses(stmts: &[Stmt]) -> Vec<(NodeId, Vec<Index>, bool)> {
    let mut out = Vec::new();
    for s in stmts {
        s.visit(&mut |s| {
            if let Stmt::Set { node, idx, .. } = s {
                out.push((*node, idx.clone(), true));
            }
        });
        s.visit_exprs(&mut |e| {
            e.visit(&mut |e| {
                if let Expr::Get(n, idx) = e {
                    out.push((*n, idx.clone(), false));
                }
            })
        });
    }
    out
}

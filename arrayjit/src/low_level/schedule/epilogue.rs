//! Epilogues: a pointwise nest that reads a product's result cell by cell becomes work the
//! product's call does on each strip of its result as the strip becomes final
//! ([`crate::low_level::Epilogue`]).
//!
//! A layer is a product followed by pointwise work on its result: the bias and the activation
//! (`relu(x·W + b)`, which the next layer's product reads through a buffer of its own), a
//! scaling (`q·kᵀ / √d`), the loss's difference. Run after the product, that work is one more
//! pass over the whole result, read back from the second-level cache or from memory; run by the
//! product on each strip of `MC` rows × 128 columns right after the strip's last reduction
//! step, it reads cells still in the first-level cache, and its code is the nest's own
//! (generated, vectorized by GCC), called through a function pointer.
//!
//! Moving a nest into a call that runs earlier must not change what anything computes. The
//! nest is taken only when:
//!
//! - it is pointwise: parallel loops without dynamic limits around one store, no locals;
//! - it reads the product's result only at the cell its loops stand for, and its loops cover
//!   the product's rows and columns exactly (each loop one row or column axis of the result);
//! - the product is a whole call (no batch loops around it; a parallel loop over blocks of
//!   rows is fine), of fixed size, not the bf16 pair kernel;
//! - no statement between the call and the nest writes what the nest reads, or reads or writes
//!   what it writes, and none of the nest's tensors shares bytes of the routine's arena with a
//!   tensor of those statements or of the call (the memory plan was made for the old order);
//! - an epilogue the call already has neither reads what the nest writes nor writes what it
//!   touches, and splits rows and columns the same way.

use rustc_hash::FxHashSet;

use super::flat_stride;
use crate::low_level::{Epilogue, Expr, Gemm, IdxVar, Index, Program, Stmt, Var};
use crate::tnode::NodeId;

/// Top-level statements looked through, back from a nest, for the product it can join.
const MAX_DISTANCE: usize = 32;

/// Runs the pointwise nest `s` as the epilogue of a product call among `prior` (the statements
/// that run before it) when that is allowed (see the module documentation). Returns whether it
/// did; `prior` then holds the nest inside the call, and `s` must be dropped.
pub(crate) fn attach(prog: &Program, prior: &mut [Stmt], s: &Stmt) -> bool {
    let Some((loops, set)) = pointwise(s) else { return false };
    let Stmt::Set { value, .. } = set else { return false };
    let mut uses_local = false;
    value.visit(&mut |e| uses_local |= matches!(e, Expr::Local(_)));
    if uses_local {
        return false;
    }
    let mine = Access::of(std::slice::from_ref(s));
    // A per-thread buffer lives on the calling step's stack, which the epilogue cannot see.
    if mine.nodes().any(|n| prog.scratch_of(n).is_some_and(|s| s.per_thread)) {
        return false;
    }
    let start = prior.len().saturating_sub(MAX_DISTANCE);
    for t in (start..prior.len()).rev() {
        if matches!(prior[t], Stmt::Comment(_)) {
            continue;
        }
        let call = product(&mut prior[t]).map(|g| (*g).clone());
        let theirs = Access::of(std::slice::from_ref(&prior[t]));
        if let Some(g) = call.filter(|g| mine.reads.contains(&g.c.node)) {
            let Some(epilogue) = fit(prog, &g, &loops, set) else { return false };
            if !joins(prog, &theirs, g.c.node, &mine) {
                return false;
            }
            return product(&mut prior[t]).is_some_and(|g| join(g, epilogue));
        }
        if clash(&theirs, &mine) || shares_bytes(prog, &theirs, &mine) {
            return false;
        }
    }
    false
}

/// A pointwise nest: parallel loops of fixed extent around one store. The loops and the store.
fn pointwise(s: &Stmt) -> Option<(Vec<(Var, usize)>, &Stmt)> {
    let mut loops = Vec::new();
    let mut cur = s;
    loop {
        match cur {
            Stmt::For { var, extent, limit: None, parallel: true, body } => {
                loops.push((*var, *extent));
                let [inner] = body.as_slice() else { return None };
                cur = inner;
            }
            Stmt::Set { .. } if !loops.is_empty() => return Some((loops, cur)),
            _ => return None,
        }
    }
}

/// The product call of a top-level statement: the call itself, or the parallel loop over its
/// blocks of rows around it; a whole product of fixed size, not the bf16 pair kernel.
fn product(s: &mut Stmt) -> Option<&mut Gemm> {
    let g = match s {
        Stmt::Gemm(g) if g.rows.is_none() => g,
        Stmt::For { var, limit: None, parallel: true, body, .. } => match body.as_mut_slice() {
            [Stmt::Gemm(g)] if g.rows.is_some_and(|(v, _)| v == *var) => g,
            _ => return None,
        },
        _ => return None,
    };
    let whole = g.c.offset.terms.is_empty()
        && !g.bf16_pairs
        && g.m.limit.is_none()
        && g.n.limit.is_none()
        && g.k.limit.is_none();
    whole.then_some(&mut **g)
}

/// The nest as an epilogue of `g`: its loops split into the result's row and column axes by
/// their steps through the result, which it must read at exactly that cell.
fn fit(prog: &Program, g: &Gemm, loops: &[(Var, usize)], set: &Stmt) -> Option<Epilogue> {
    let Stmt::Set { node, value, .. } = set else { return None };
    let c = g.c.node;
    if [g.a.node, g.b.node, c].contains(node) {
        return None;
    }
    // Every read of the result at one index, without runtime symbols.
    let mut idx: Option<&Vec<Index>> = None;
    let mut same = true;
    value.visit(&mut |e| {
        if let Expr::Get(n, i) = e
            && *n == c
        {
            same &= idx.is_none_or(|first| first == i);
            idx = Some(i);
        }
    });
    let idx = idx.filter(|_| same)?;
    if idx.iter().any(|i| i.terms.iter().any(|(_, x)| matches!(x, IdxVar::Sym(_)))) {
        return None;
    }
    let strides = crate::tnode::row_major_strides(&prog.nodes.get(&c)?.dims);
    let first: i64 = idx.iter().zip(&strides).map(|(i, s)| i.offset * *s as i64).sum();
    if first != g.c.offset.offset {
        return None;
    }
    let steps: Vec<i64> = loops.iter().map(|(v, _)| flat_stride(prog, c, idx, *v)).collect();
    let mut used = vec![false; loops.len()];
    // Loops of one cell go with the rows (their variable is always 0).
    let mut rows: Vec<(Var, usize)> = Vec::new();
    for (k, l) in loops.iter().enumerate() {
        if l.1 == 1 {
            used[k] = true;
            rows.push(*l);
        }
    }
    let mut axis = |step: i64, extent: usize| -> Option<Vec<(Var, usize)>> {
        let (mut out, mut need, mut step) = (Vec::new(), extent, step);
        while need > 1 {
            let k = (0..loops.len()).find(|&k| {
                !used[k] && steps[k] == step && loops[k].1 > 1 && need.is_multiple_of(loops[k].1)
            })?;
            used[k] = true;
            out.insert(0, loops[k]);
            need /= loops[k].1;
            step *= loops[k].1 as i64;
        }
        Some(out)
    };
    let inner_rows = axis(g.c.rows, g.m.extent)?;
    let cols = axis(g.c.cols, g.n.extent)?;
    if used.contains(&false) {
        return None;
    }
    rows.extend(inner_rows);
    Some(Epilogue { rows, cols, body: vec![set.clone()] })
}

/// Adds `e` to the call's epilogue: as it is, or after one the call already has, with its
/// variables renamed to that one's (which must split rows and columns the same way).
fn join(g: &mut Gemm, e: Epilogue) -> bool {
    let Some(old) = &mut g.epilogue else {
        g.epilogue = Some(e);
        return true;
    };
    let extents = |a: &[(Var, usize)]| a.iter().map(|x| x.1).collect::<Vec<_>>();
    if extents(&old.rows) != extents(&e.rows) || extents(&old.cols) != extents(&e.cols) {
        return false;
    }
    let pairs: Vec<(Var, Var)> = e
        .rows
        .iter()
        .zip(&old.rows)
        .chain(e.cols.iter().zip(&old.cols))
        .map(|(new, old)| (new.0, old.0))
        .collect();
    let sub = |v: Var| pairs.iter().find(|p| p.0 == v).map(|p| Index::var(p.1));
    for s in e.body {
        let Stmt::Set { node, idx, value } = s else { return false };
        old.body.push(Stmt::Set {
            node,
            idx: idx.iter().map(|i| i.subst(&sub)).collect(),
            value: value.subst(&sub),
        });
    }
    true
}

/// Whether the nest (`mine`) may run inside a call touching `call` whose result is `c`: it
/// reads the result (at the cell being finished: the reason it joins) but does not write it,
/// and is otherwise independent of the call's operands and of the call's present epilogue.
fn joins(prog: &Program, call: &Access, c: NodeId, mine: &Access) -> bool {
    if mine.writes.contains(&c) {
        return false;
    }
    let (mut theirs, mut rest) = (call.clone(), mine.clone());
    theirs.writes.remove(&c);
    theirs.reads.remove(&c);
    rest.reads.remove(&c);
    !clash(&theirs, &rest) && !shares_bytes(prog, call, mine)
}

/// The tensors some statements read and write.
#[derive(Clone, Debug, Default)]
struct Access {
    reads: FxHashSet<NodeId>,
    writes: FxHashSet<NodeId>,
}

impl Access {
    fn of(stmts: &[Stmt]) -> Access {
        let mut a = Access::default();
        for s in stmts {
            s.visit(&mut |s| match s {
                Stmt::Set { node, .. } => {
                    a.writes.insert(*node);
                }
                Stmt::Gemm(g) => {
                    a.writes.insert(g.c.node);
                    a.reads.extend([g.a.node, g.b.node, g.c.node]);
                }
                Stmt::Map(m) => {
                    a.writes.insert(m.out.node);
                    a.reads.extend(m.operands().map(|o| o.node));
                }
                Stmt::Call(c) => {
                    a.writes.extend(c.written());
                    a.reads.extend(c.nodes());
                }
                _ => {}
            });
            s.visit_exprs(&mut |e| {
                e.visit(&mut |e| {
                    if let Expr::Get(n, _) = e {
                        a.reads.insert(*n);
                    }
                })
            });
        }
        a
    }

    fn nodes(&self) -> impl Iterator<Item = NodeId> + '_ {
        self.reads.iter().chain(&self.writes).copied()
    }
}

/// Whether the nest (`mine`) may not move before statements that touch `theirs`: one writes
/// what the other touches.
fn clash(theirs: &Access, mine: &Access) -> bool {
    theirs.writes.iter().any(|n| mine.reads.contains(n) || mine.writes.contains(n))
        || mine.writes.iter().any(|n| theirs.reads.contains(n))
}

/// Whether a tensor of `a` and a different tensor of `b` overlap in the routine's arena (the
/// memory plan was made for the statements' old order).
fn shares_bytes(prog: &Program, a: &Access, b: &Access) -> bool {
    let bytes = |n: NodeId| {
        let slot = prog.arena.slots.iter().find(|s| s.node == n)?;
        let t = prog.nodes.get(&n)?;
        Some(slot.offset..slot.offset + t.num_elements() * t.prec.size_in_bytes())
    };
    let theirs: Vec<(NodeId, std::ops::Range<usize>)> =
        a.nodes().filter_map(|n| bytes(n).map(|r| (n, r))).collect();
    b.nodes().any(|n| {
        bytes(n).is_some_and(|r| {
            theirs.iter().any(|(m, q)| *m != n && r.start < q.end && q.start < r.end)
        })
    })
}

//! Common-subexpression elimination within a statement.
//!
//! Virtualization inlines a definition at every read, so `y = x * x` with a cheap `x = a + b`
//! becomes `mul(add(a, b), add(a, b))`. This pass computes each repeated subexpression once
//! into a fresh scalar local placed just before the statement (`t3 := add(a, b)`;
//! `y := mul(t3, t3)`), largest first, until no subexpression repeats.

use std::hash::{Hash, Hasher};

use std::cmp::Reverse;
use std::collections::BinaryHeap;

use rustc_hash::{FxHashMap, FxHasher};

use super::{Expr, LocalId, Program, Stmt};
use crate::ops::Prec;

/// Eliminates repeated subexpressions in every statement.
pub fn eliminate_common_subexprs(prog: &mut Program) {
    let body = std::mem::take(&mut prog.body);
    prog.body = cse_block(prog, body);
}

fn cse_block(prog: &mut Program, body: Vec<Stmt>) -> Vec<Stmt> {
    let mut out = Vec::with_capacity(body.len());
    for s in body {
        match s {
            s @ (Stmt::For { .. } | Stmt::If { .. }) => {
                out.push(s.map_body(|body| cse_block(prog, body)));
            }
            Stmt::Set { node, idx, value } => {
                let prec = prog.nodes.get(&node).map_or(Prec::F64, |n| n.prec.compute());
                let value = extract(prog, value, prec, &mut out);
                out.push(Stmt::Set { node, idx, value });
            }
            Stmt::SetLocal { local, value } => {
                let prec = prog.locals[local.0 as usize].compute();
                let value = extract(prog, value, prec, &mut out);
                out.push(Stmt::SetLocal { local, value });
            }
            s => out.push(s),
        }
    }
    out
}

/// Extracts repeated subexpressions of `value`, the largest (by cost) first — among equals, the
/// one occurring first, parents before children — each into a local defined before the
/// statement, until nothing worth sharing repeats.
///
/// One walk numbers the subexpressions in pre-order and groups equal ones (structural hash,
/// confirmed by comparison). Extracting one removes its occurrences' inner subexpressions from
/// the counts (each node is removed at most once), so the next choice needs no new walk; the
/// statement and the locals' definitions are rebuilt once at the end. Taking the largest
/// repeated subexpression first means none of its ancestors repeats, so no new repeat can
/// appear when it is replaced: the counts stay exact.
fn extract(prog: &mut Program, value: Expr, prec: Prec, out: &mut Vec<Stmt>) -> Expr {
    let mut nodes: Vec<(&Expr, u64, u32)> = Vec::new();
    let mut ends: Vec<usize> = Vec::new();
    summarize(&value, &mut nodes, &mut ends);
    let n = nodes.len();
    // Equal subexpressions share an id; `positions[id]` lists their pre-order positions.
    let mut id_of = vec![0usize; n];
    let mut positions: Vec<Vec<usize>> = Vec::new();
    let mut by_hash: FxHashMap<u64, Vec<usize>> = FxHashMap::default();
    for (i, &(e, h, _)) in nodes.iter().enumerate() {
        let ids = by_hash.entry(h).or_default();
        let id = match ids.iter().copied().find(|&id| nodes[positions[id][0]].0 == e) {
            Some(id) => id,
            None => {
                positions.push(Vec::new());
                ids.push(positions.len() - 1);
                positions.len() - 1
            }
        };
        id_of[i] = id;
        positions[id].push(i);
    }
    let mut live: Vec<usize> = positions.iter().map(Vec::len).collect();
    let mut next_live = vec![0usize; positions.len()];
    let mut alive = vec![true; n];
    let first_live = |id: usize, next: &mut [usize], alive: &[bool], positions: &[Vec<usize>]| {
        while next[id] < positions[id].len() && !alive[positions[id][next[id]]] {
            next[id] += 1;
        }
        positions[id].get(next[id]).copied()
    };
    let mut heap: BinaryHeap<(u32, Reverse<usize>, usize)> = positions
        .iter()
        .enumerate()
        .filter(|(_, ps)| ps.len() >= 2 && worth_sharing(nodes[ps[0]].0))
        .map(|(id, ps)| (nodes[ps[0]].2, Reverse(ps[0]), id))
        .collect();
    // Extracted occurrences: position -> local; and the extractions in order.
    let mut local_at: FxHashMap<usize, LocalId> = FxHashMap::default();
    let mut extracted: Vec<(LocalId, usize)> = Vec::new();
    while let Some((cost, Reverse(first), id)) = heap.pop() {
        if live[id] < 2 {
            continue;
        }
        let Some(now_first) = first_live(id, &mut next_live, &alive, &positions) else { continue };
        if now_first != first {
            heap.push((cost, Reverse(now_first), id));
            continue;
        }
        let t = prog.fresh_local(prec);
        extracted.push((t, first));
        let occurrences: Vec<usize> = positions[id].iter().copied().filter(|&p| alive[p]).collect();
        for p in occurrences {
            local_at.insert(p, t);
            for j in p..ends[p] {
                if alive[j] {
                    alive[j] = false;
                    live[id_of[j]] -= 1;
                }
            }
        }
    }
    if extracted.is_empty() {
        return value;
    }
    for (t, p) in &extracted {
        let mut pos = *p;
        let def = rebuild(&nodes, &ends, &local_at, &mut pos, true);
        out.push(Stmt::SetLocal { local: *t, value: def });
    }
    let mut pos = 0;
    rebuild(&nodes, &ends, &local_at, &mut pos, false)
}

/// The subexpression at pre-order position `*pos`, with every extracted occurrence inside it
/// read from its local (`keep_root`: the root itself is rebuilt even if it is extracted, for its
/// local's definition); advances `*pos` past it.
fn rebuild(
    nodes: &[(&Expr, u64, u32)],
    ends: &[usize],
    local_at: &FxHashMap<usize, LocalId>,
    pos: &mut usize,
    keep_root: bool,
) -> Expr {
    let here = *pos;
    if !keep_root && let Some(t) = local_at.get(&here) {
        *pos = ends[here];
        return Expr::Local(*t);
    }
    *pos += 1;
    let child = |pos: &mut usize| Box::new(rebuild(nodes, ends, local_at, pos, false));
    match nodes[here].0 {
        Expr::Unop(op, _) => Expr::Unop(*op, child(pos)),
        Expr::Binop(op, _, _) => {
            let a = child(pos);
            let b = child(pos);
            Expr::Binop(*op, a, b)
        }
        Expr::Ternop(op, _, _, _) => {
            let a = child(pos);
            let b = child(pos);
            let c = child(pos);
            Expr::Ternop(*op, a, b, c)
        }
        leaf => leaf.clone(),
    }
}

fn worth_sharing(e: &Expr) -> bool {
    matches!(e, Expr::Get(..) | Expr::Unop(..) | Expr::Binop(..) | Expr::Ternop(..))
        || matches!(e, Expr::Uniform { .. })
}

/// Lists every subexpression parents first with its structural hash and its cost
/// ([`Expr::cost`]), and where each one's subtree ends (`ends[i]`: one past its last
/// descendant); returns the expression's own hash and cost.
fn summarize<'a>(
    e: &'a Expr,
    out: &mut Vec<(&'a Expr, u64, u32)>,
    ends: &mut Vec<usize>,
) -> (u64, u32) {
    let slot = out.len();
    out.push((e, 0, 0));
    ends.push(0);
    let mut h = FxHasher::default();
    std::mem::discriminant(e).hash(&mut h);
    let cost = match e {
        Expr::Const(c) => {
            c.to_bits().hash(&mut h);
            0
        }
        Expr::Local(l) => {
            l.hash(&mut h);
            0
        }
        Expr::Get(n, idx) => {
            (n, idx).hash(&mut h);
            1
        }
        Expr::IndexValue(i) => {
            i.hash(&mut h);
            1
        }
        Expr::Uniform { seed, offset } => {
            (seed, offset).hash(&mut h);
            8
        }
        Expr::Unop(op, a) => {
            op.hash(&mut h);
            let (ha, ca) = summarize(a, out, ends);
            ha.hash(&mut h);
            op.facts().cost + ca
        }
        Expr::Binop(op, a, b) => {
            op.hash(&mut h);
            let (ha, ca) = summarize(a, out, ends);
            let (hb, cb) = summarize(b, out, ends);
            (ha, hb).hash(&mut h);
            op.facts().cost + ca + cb
        }
        Expr::Ternop(op, a, b, c) => {
            op.hash(&mut h);
            let (ha, ca) = summarize(a, out, ends);
            let (hb, cb) = summarize(b, out, ends);
            let (hc, cc) = summarize(c, out, ends);
            (ha, hb, hc).hash(&mut h);
            op.facts().cost + ca + cb + cc
        }
    };
    let hash = h.finish();
    out[slot].1 = hash;
    out[slot].2 = cost;
    ends[slot] = out.len();
    (hash, cost)
}

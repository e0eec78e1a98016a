//! Virtualization: inline tensors into their consumers so they need no buffer.
//!
//! A node whose memory mode allows it (`Virtual`) is inlined when it is defined by exactly one
//! pointwise statement — `n[v0, v1] := expr` inside loops over exactly its cells, no guards, no
//! locals — and either
//! - it is read at one site that touches each cell once (computed once, read once), or
//! - its definition is cheap (a few operations), so recomputing it at every read costs less
//!   than a round trip through memory.
//!
//! Every read `n[idx]` becomes `expr` with the definition's loop variables replaced by `idx`;
//! the definition disappears and the node is reported virtual. The pass repeats until nothing
//! changes, so chains of pointwise operations collapse into their last consumer.

use rustc_hash::FxHashMap;

use super::trace::{NodeUse, trace};
use super::{Expr, Index, Program, Stmt, Var, prune_empty};
use crate::tnode::NodeId;

/// Definitions costing at most this much are inlined at every read.
pub const CHEAP: u32 = 4;

struct Def {
    pos: usize,
    /// The loop variable indexing each axis (`None` for a size-1 axis indexed by 0).
    axis_vars: Vec<Option<Var>>,
    value: Expr,
}

/// Inlines every eligible node; returns the inlined nodes in the order they were removed.
pub fn run(prog: &mut Program) -> Vec<NodeId> {
    let mut inlined = Vec::new();
    loop {
        let uses = trace(prog);
        let defs = find_defs(prog);
        let mut order: Vec<(&NodeId, &Def)> = defs.iter().collect();
        order.sort_by_key(|(_, d)| d.pos);
        let pick = order
            .into_iter()
            .find(|(n, d)| eligible(prog, **n, d, &uses))
            .map(|(n, d)| (*n, d.axis_vars.clone(), d.value.clone()));
        let Some((node, axis_vars, value)) = pick else { break };
        let body = std::mem::take(&mut prog.body);
        let body: Vec<Stmt> =
            body.into_iter().map(|s| inline(s, node, &axis_vars, &value)).collect();
        prog.body = prune_empty(remove_def(body, node));
        inlined.push(node);
        prog.virtual_nodes.push(node);
    }
    inlined
}

fn eligible(prog: &Program, n: NodeId, d: &Def, uses: &FxHashMap<NodeId, NodeUse>) -> bool {
    let Some(node) = prog.nodes.get(&n) else { return false };
    let Some(u) = uses.get(&n) else { return false };
    if !node.memory.may_virtualize() || u.write_sites != 1 || u.read_sites == 0 {
        return false;
    }
    if u.read_positions.iter().any(|&p| p <= d.pos) || d.value.reads(n) {
        return false;
    }
    let mut ok = true;
    d.value.visit(&mut |e| match e {
        Expr::Local(_) => ok = false,
        Expr::Get(m, _) => {
            if let Some(mu) = uses.get(m) {
                ok &= mu.write_positions.iter().all(|&p| p < d.pos);
            }
        }
        _ => {}
    });
    ok && ((u.read_sites == 1 && u.reads_once_per_cell) || d.value.cost() <= CHEAP)
}

fn find_defs(prog: &Program) -> FxHashMap<NodeId, Def> {
    let mut defs = FxHashMap::default();
    let mut pos = 0;
    let mut loops = Vec::new();
    for s in &prog.body {
        collect(prog, s, &mut loops, false, &mut pos, &mut defs);
    }
    defs
}

fn collect(
    prog: &Program,
    s: &Stmt,
    loops: &mut Vec<(Var, usize)>,
    in_if: bool,
    pos: &mut usize,
    defs: &mut FxHashMap<NodeId, Def>,
) {
    match s {
        Stmt::Comment(_) => {}
        Stmt::For { var, extent, body, .. } => {
            loops.push((*var, *extent));
            body.iter().for_each(|s| collect(prog, s, loops, in_if, pos, defs));
            loops.pop();
        }
        Stmt::If { body, .. } => body.iter().for_each(|s| collect(prog, s, loops, true, pos, defs)),
        Stmt::SetLocal { .. } => *pos += 1,
        Stmt::Set { node, idx, value } => {
            *pos += 1;
            if in_if {
                return;
            }
            if let Some(axis_vars) = pointwise_def(prog, *node, idx, loops) {
                defs.insert(*node, Def { pos: *pos, axis_vars, value: value.clone() });
            }
        }
    }
}

/// The loop variable of each axis when `node[idx]` inside `loops` visits every cell once.
fn pointwise_def(
    prog: &Program,
    node: NodeId,
    idx: &[Index],
    loops: &[(Var, usize)],
) -> Option<Vec<Option<Var>>> {
    let dims = &prog.nodes.get(&node)?.dims;
    let mut axis_vars = Vec::with_capacity(idx.len());
    for (i, &d) in idx.iter().zip(dims) {
        if let Some(v) = i.as_var() {
            let &(_, extent) = loops.iter().find(|(lv, _)| *lv == v)?;
            if extent != d || axis_vars.contains(&Some(v)) {
                return None;
            }
            axis_vars.push(Some(v));
        } else if d == 1 && i.terms.is_empty() && i.offset == 0 {
            axis_vars.push(None);
        } else {
            return None;
        }
    }
    let all_loops_used = loops.iter().all(|(v, _)| axis_vars.contains(&Some(*v)));
    all_loops_used.then_some(axis_vars)
}

fn inline(s: Stmt, node: NodeId, axis_vars: &[Option<Var>], def: &Expr) -> Stmt {
    let sub = |e: Expr| -> Expr {
        e.rewrite(&mut |e| match e {
            Expr::Get(n, idx) if n == node => def
                .clone()
                .subst(&|v| axis_vars.iter().position(|av| *av == Some(v)).map(|a| idx[a].clone())),
            e => e,
        })
    };
    match s {
        Stmt::For { var, extent, parallel, body } => Stmt::For {
            var,
            extent,
            parallel,
            body: body.into_iter().map(|s| inline(s, node, axis_vars, def)).collect(),
        },
        Stmt::If { guards, body } => Stmt::If {
            guards,
            body: body.into_iter().map(|s| inline(s, node, axis_vars, def)).collect(),
        },
        Stmt::Set { node: n, idx, value } => Stmt::Set { node: n, idx, value: sub(value) },
        Stmt::SetLocal { local, value } => Stmt::SetLocal { local, value: sub(value) },
        s => s,
    }
}

/// Removes every statement writing `node`.
pub fn remove_def(body: Vec<Stmt>, node: NodeId) -> Vec<Stmt> {
    body.into_iter()
        .filter_map(|s| match s {
            Stmt::Set { node: n, .. } if n == node => None,
            Stmt::For { var, extent, parallel, body } => {
                Some(Stmt::For { var, extent, parallel, body: remove_def(body, node) })
            }
            Stmt::If { guards, body } => Some(Stmt::If { guards, body: remove_def(body, node) }),
            s => Some(s),
        })
        .collect()
}

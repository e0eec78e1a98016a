//! Virtualization: inline tensors into their consumers so they need no buffer.
//!
//! A node whose memory mode allows it (`Virtual`) is inlined when it is defined by exactly one
//! pointwise statement — `n[v0, v1] := expr` inside loops over exactly its cells, no guards, no
//! locals — and either
//! - it is read at one site that touches each cell once (computed once, read once), or
//! - its definition is cheap (a few operations), so recomputing it at every read costs less
//!   than a round trip through memory,
//!
//! and no reading expression would grow beyond [`MAX_INLINED_COST`].
//!
//! Every read `n[idx]` becomes `expr` with the definition's loop variables replaced by `idx`;
//! the definition disappears and the node is reported virtual. Chains of pointwise operations
//! collapse into their last consumer.
//!
//! The pass is linear in the program (plus the size of what it inlines): the program is walked
//! once into a table of its statements — each with its place in the tree, its enclosing loops and
//! its position in program order — and of every node's accesses. Definitions are then taken in
//! program order from a queue; inlining one rewrites only the statements that read it, and the
//! access counts are updated from those statements alone (subtracting what they read before,
//! adding what they read after), instead of re-tracing the whole program after every inline.
//! A node the inlined definition read is queued again, since its reads moved.

use std::cmp::Reverse;
use std::collections::BinaryHeap;

use rustc_hash::{FxHashMap, FxHashSet};

use super::trace::once_per_cell;
use super::{Expr, Program, Stmt, Var, prune_empty};
use crate::tnode::NodeId;

/// Definitions costing at most this much are inlined at every read.
pub const CHEAP: u32 = 4;

/// No inlining makes an expression cost more than this ([`Expr::cost`]): the definition stays
/// a tensor of its own. GCC's time on one huge expression grows faster than linearly (a sum
/// of 4000 named tensors took 10 s), while many moderate statements of one shape are the same
/// code, compiled once by the gccjit backend; the extra memory traffic is that of one
/// intermediate per 256 operations.
pub const MAX_INLINED_COST: u32 = 256;

/// A statement assigning a node or a local, in program order.
struct Site {
    /// Child indices from the program body down to the statement.
    path: Vec<usize>,
    /// The enclosing loops, outermost first.
    loops: Vec<(Var, usize)>,
}

/// A pointwise definition `node[axis vars] := value`.
struct Def {
    /// The defining statement's position (an index into the site table).
    pos: usize,
    /// The loop variable indexing each axis (`None` for a size-1 axis indexed by 0).
    axis_vars: Vec<Option<Var>>,
}

/// The accesses of one node, kept up to date as definitions are inlined.
#[derive(Default)]
struct Uses {
    write_sites: usize,
    /// Positions of the writing statements.
    write_positions: Vec<usize>,
    /// One entry per `Get` of the node: the position of the reading statement.
    read_positions: Vec<usize>,
    /// Read sites that may touch a cell more than once over their loops.
    multi_reads: usize,
    /// Touched by a statement that needs its buffer (a [`super::Gemm`] call).
    pinned: bool,
}

struct Table {
    sites: Vec<Site>,
    /// The cost of each site's value, kept up to date as definitions are inlined.
    costs: Vec<u32>,
    defs: FxHashMap<NodeId, Def>,
    uses: FxHashMap<NodeId, Uses>,
}

/// Inlines every eligible node; returns the inlined nodes in the order they were removed.
pub fn inline_virtual_nodes(prog: &mut Program) -> Vec<NodeId> {
    let mut table = Table {
        sites: Vec::new(),
        costs: Vec::new(),
        defs: FxHashMap::default(),
        uses: FxHashMap::default(),
    };
    let mut loops = Vec::new();
    let mut path = Vec::new();
    for (k, s) in prog.body.iter().enumerate() {
        path.push(k);
        collect(prog, s, &mut path, &mut loops, false, &mut table);
        path.pop();
    }
    let mut queue: BinaryHeap<Reverse<(usize, NodeId)>> =
        table.defs.iter().map(|(n, d)| Reverse((d.pos, *n))).collect();
    let mut inlined = Vec::new();
    let mut removed: FxHashSet<usize> = FxHashSet::default();
    while let Some(Reverse((_, node))) = queue.pop() {
        if !table.defs.contains_key(&node) || !eligible(prog, &table, node) {
            continue;
        }
        let Some(def) = table.defs.remove(&node) else { continue };
        for m in inline(prog, &mut table, node, &def) {
            if let Some(d) = table.defs.get(&m) {
                queue.push(Reverse((d.pos, m)));
            }
        }
        removed.insert(def.pos);
        inlined.push(node);
        prog.virtual_nodes.push(node);
    }
    if !removed.is_empty() {
        let body = std::mem::take(&mut prog.body);
        let mut pos = 0;
        prog.body = prune_empty(drop_sites(body, &removed, &mut pos));
    }
    inlined
}

fn collect(
    prog: &Program,
    s: &Stmt,
    path: &mut Vec<usize>,
    loops: &mut Vec<(Var, usize)>,
    in_if: bool,
    t: &mut Table,
) {
    match s {
        Stmt::Comment(_) => {}
        Stmt::For { var, extent, body, .. } => {
            loops.push((*var, *extent));
            for (k, s) in body.iter().enumerate() {
                path.push(k);
                collect(prog, s, path, loops, in_if, t);
                path.pop();
            }
            loops.pop();
        }
        Stmt::If { body, .. } => {
            for (k, s) in body.iter().enumerate() {
                path.push(k);
                collect(prog, s, path, loops, true, t);
                path.pop();
            }
        }
        Stmt::Gemm(g) => {
            for o in g.operands() {
                t.uses.entry(o.node).or_default().pinned = true;
            }
        }
        Stmt::Map(m) => {
            for o in m.operands() {
                t.uses.entry(o.node).or_default().pinned = true;
            }
        }
        Stmt::Call(c) => {
            for n in c.nodes() {
                t.uses.entry(n).or_default().pinned = true;
            }
        }
        Stmt::SetLocal { value, .. } => {
            let pos = t.sites.len();
            t.sites.push(Site { path: path.clone(), loops: loops.clone() });
            t.costs.push(value.cost());
            add_reads(&mut t.uses, value, &t.sites[pos].loops, pos);
        }
        Stmt::Set { node, idx, value } => {
            let pos = t.sites.len();
            t.sites.push(Site { path: path.clone(), loops: loops.clone() });
            t.costs.push(value.cost());
            add_reads(&mut t.uses, value, &t.sites[pos].loops, pos);
            let u = t.uses.entry(*node).or_default();
            u.write_sites += 1;
            u.write_positions.push(pos);
            if in_if {
                return;
            }
            if let Some(axis_vars) = pointwise_def(prog, *node, idx, loops) {
                // A second write makes the node ineligible (`write_sites`); the first is kept.
                t.defs.entry(*node).or_insert(Def { pos, axis_vars });
            }
        }
    }
}

/// Counts the reads of `value`, a statement at `pos` inside `loops`.
fn add_reads(uses: &mut FxHashMap<NodeId, Uses>, value: &Expr, loops: &[(Var, usize)], pos: usize) {
    value.visit(&mut |e| {
        if let Expr::Get(n, idx) = e {
            let u = uses.entry(*n).or_default();
            u.read_positions.push(pos);
            if !once_per_cell(idx, loops) {
                u.multi_reads += 1;
            }
        }
    });
}

/// Forgets the reads of `value`, a statement at `pos` inside `loops`.
fn remove_reads(
    uses: &mut FxHashMap<NodeId, Uses>,
    value: &Expr,
    loops: &[(Var, usize)],
    pos: usize,
) {
    value.visit(&mut |e| {
        if let Expr::Get(n, idx) = e
            && let Some(u) = uses.get_mut(n)
        {
            if let Some(k) = u.read_positions.iter().position(|p| *p == pos) {
                u.read_positions.swap_remove(k);
            }
            if !once_per_cell(idx, loops) {
                u.multi_reads -= 1;
            }
        }
    });
}

fn eligible(prog: &Program, t: &Table, n: NodeId) -> bool {
    let (Some(node), Some(u), Some(d)) = (prog.nodes.get(&n), t.uses.get(&n), t.defs.get(&n))
    else {
        return false;
    };
    if !node.memory.may_virtualize()
        || u.pinned
        || u.write_sites != 1
        || u.read_positions.is_empty()
    {
        return false;
    }
    if u.read_positions.iter().any(|&p| p <= d.pos) {
        return false;
    }
    let value = site_value(&prog.body, &t.sites[d.pos].path);
    if value.reads(n) {
        return false;
    }
    let mut ok = true;
    value.visit(&mut |e| match e {
        Expr::Local(_) => ok = false,
        Expr::Get(m, _) => {
            if let Some(mu) = t.uses.get(m) {
                ok &= mu.write_positions.iter().all(|&p| p < d.pos);
            }
        }
        _ => {}
    });
    let cost = value.cost();
    // Every reading site stays within the cost cap once each of its reads is replaced.
    let mut readers = u.read_positions.clone();
    readers.sort_unstable();
    let fits = readers.chunk_by(|a, b| a == b).all(|reads| {
        let grown = t.costs[reads[0]] as u64 + reads.len() as u64 * cost as u64;
        grown <= MAX_INLINED_COST as u64
    });
    ok && fits && ((u.read_positions.len() == 1 && u.multi_reads == 0) || cost <= CHEAP)
}

/// Replaces every read of `node` by its definition, updating the access counts from the
/// rewritten statements; returns the nodes the definition read.
fn inline(prog: &mut Program, t: &mut Table, node: NodeId, def: &Def) -> Vec<NodeId> {
    let value = site_value(&prog.body, &t.sites[def.pos].path).clone();
    remove_reads(&mut t.uses, &value, &t.sites[def.pos].loops, def.pos);
    if let Some(u) = t.uses.get_mut(&node) {
        u.write_sites = 0;
        u.write_positions.clear();
    }
    let mut readers = t.uses.get(&node).map_or_else(Vec::new, |u| u.read_positions.clone());
    readers.sort_unstable();
    readers.dedup();
    for r in readers {
        let site = &t.sites[r];
        let slot = site_value_mut(&mut prog.body, &site.path);
        let old = std::mem::replace(slot, Expr::Const(0.0));
        remove_reads(&mut t.uses, &old, &site.loops, r);
        let axis_vars = &def.axis_vars;
        let new = old.rewrite(&mut |e| match e {
            Expr::Get(n, idx) if n == node => value
                .clone()
                .subst(&|v| axis_vars.iter().position(|av| *av == Some(v)).map(|a| idx[a].clone())),
            e => e,
        });
        add_reads(&mut t.uses, &new, &site.loops, r);
        t.costs[r] = new.cost();
        *slot = new;
    }
    let mut read = Vec::new();
    value.visit(&mut |e| {
        if let Expr::Get(m, _) = e {
            read.push(*m);
        }
    });
    read.sort_unstable();
    read.dedup();
    read
}

fn site_stmt<'a>(body: &'a [Stmt], path: &[usize]) -> &'a Stmt {
    let (first, rest) = path.split_first().expect("a site has a path");
    let s = &body[*first];
    match s {
        Stmt::For { body, .. } | Stmt::If { body, .. } if !rest.is_empty() => site_stmt(body, rest),
        s => s,
    }
}

fn site_value<'a>(body: &'a [Stmt], path: &[usize]) -> &'a Expr {
    match site_stmt(body, path) {
        Stmt::Set { value, .. } | Stmt::SetLocal { value, .. } => value,
        _ => unreachable!("a site is an assignment"),
    }
}

fn site_value_mut<'a>(body: &'a mut [Stmt], path: &[usize]) -> &'a mut Expr {
    let (first, rest) = path.split_first().expect("a site has a path");
    match &mut body[*first] {
        Stmt::For { body, .. } | Stmt::If { body, .. } => site_value_mut(body, rest),
        Stmt::Set { value, .. } | Stmt::SetLocal { value, .. } => value,
        Stmt::Comment(_) | Stmt::Gemm(_) | Stmt::Map(_) | Stmt::Call(_) => {
            unreachable!("a site is an assignment")
        }
    }
}

/// Drops the assignments at the given positions (counted as [`collect`] counts them).
fn drop_sites(body: Vec<Stmt>, removed: &FxHashSet<usize>, pos: &mut usize) -> Vec<Stmt> {
    body.into_iter()
        .filter_map(|s| match s {
            s @ (Stmt::For { .. } | Stmt::If { .. }) => {
                Some(s.map_body(|body| drop_sites(body, removed, pos)))
            }
            s @ (Stmt::Set { .. } | Stmt::SetLocal { .. }) => {
                *pos += 1;
                (!removed.contains(&(*pos - 1))).then_some(s)
            }
            s => Some(s),
        })
        .collect()
}

/// The loop variable of each axis when `node[idx]` inside `loops` visits every cell once.
fn pointwise_def(
    prog: &Program,
    node: NodeId,
    idx: &[super::Index],
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

/// Removes every statement writing `node`.
pub fn remove_def(body: Vec<Stmt>, node: NodeId) -> Vec<Stmt> {
    body.into_iter()
        .filter_map(|s| match s {
            Stmt::Set { node: n, .. } if n == node => None,
            s => Some(s.map_body(|body| remove_def(body, node))),
        })
        .collect()
}

//! The verifier: invariants every pass must preserve, checked between passes in debug builds.
//!
//! - every loop variable used in an index is bound by an enclosing loop, and no loop rebinds a
//!   variable of an enclosing loop;
//! - every runtime symbol (in an index or a loop limit) is registered in the program's slot
//!   list;
//! - every tensor access names a node of the program that is not virtual, with one index per
//!   axis;
//! - every local exists and is assigned somewhere before (in program order) it is read;
//! - every matrix-product call ([`super::Gemm`]) is in f32 or f64 on operands of its
//!   precision, and every cell it can address lies inside its tensor; its epilogue covers its
//!   rows and columns and uses neither loop variables nor locals from outside the call.

use rustc_hash::FxHashSet;

use super::{Expr, IdxVar, Index, LocalId, Program, Stmt, Var};
use crate::error::Error;
use crate::ops::Prec;
use crate::tnode::NodeId;

/// Checks the invariants; `pass` names the pass that just ran, for the error message.
pub fn verify(prog: &Program, pass: &'static str) -> Result<(), Error> {
    let mut v =
        Verifier { prog, bound: Vec::new(), extents: Vec::new(), assigned: FxHashSet::default() };
    v.block(&prog.body).map_err(|reason| Error::Verify { pass, reason })
}

struct Verifier<'a> {
    prog: &'a Program,
    bound: Vec<Var>,
    /// The extent of each bound loop.
    extents: Vec<usize>,
    assigned: FxHashSet<LocalId>,
}

impl Verifier<'_> {
    fn block(&mut self, body: &[Stmt]) -> Result<(), String> {
        body.iter().try_for_each(|s| self.stmt(s))
    }

    fn stmt(&mut self, s: &Stmt) -> Result<(), String> {
        match s {
            Stmt::Comment(_) => Ok(()),
            Stmt::For { var, extent, limit, body, .. } => {
                if self.bound.contains(var) {
                    return Err(format!("loop variable {var} rebound inside its own loop"));
                }
                if let Some(l) = limit {
                    if !self.prog.runtime_symbols.contains(&l.size) {
                        return Err(format!("loop limit {} not registered", l.size));
                    }
                    if l.per == 0 {
                        return Err(format!("loop limit {l} has no rows per iteration"));
                    }
                }
                self.bound.push(*var);
                self.extents.push(*extent);
                let r = self.block(body);
                self.bound.pop();
                self.extents.pop();
                r
            }
            Stmt::If { guards, body } => {
                guards.iter().try_for_each(|g| self.index(&g.index))?;
                self.block(body)
            }
            Stmt::Set { node, idx, value } => {
                self.expr(value)?;
                self.access(*node, idx)
            }
            Stmt::SetLocal { local, value } => {
                self.expr(value)?;
                if local.0 as usize >= self.prog.locals.len() {
                    return Err(format!("local {local} not declared"));
                }
                self.assigned.insert(*local);
                Ok(())
            }
            Stmt::Gemm(g) => {
                self.gemm(g)?;
                g.epilogue.as_ref().map_or(Ok(()), |e| self.epilogue(g, e))
            }
            Stmt::Map(m) => self.map(m),
            Stmt::Call(c) => self.call(c),
        }
    }

    /// An epilogue's variables cover the product's rows and columns, and its body, checked as
    /// the nest it stands for, uses no variable of the loops around the call (it runs in a
    /// function of its own).
    fn epilogue(&mut self, g: &super::Gemm, e: &super::Epilogue) -> Result<(), String> {
        let size = |axis: &[(Var, usize)]| axis.iter().map(|(_, e)| *e).product::<usize>();
        if size(&e.rows) != g.m.extent || size(&e.cols) != g.n.extent {
            return Err(format!(
                "epilogue over {}x{} cells of a {}x{} product",
                size(&e.rows),
                size(&e.cols),
                g.m.extent,
                g.n.extent
            ));
        }
        if g.bf16_pairs || g.m.limit.is_some() || g.n.limit.is_some() {
            return Err("epilogue on a bf16-pairs or dynamically sized product".to_string());
        }
        // Its rows and columns are the whole product's: no batch loop moves the result.
        if !g.c.offset.terms.is_empty() {
            return Err(format!("epilogue on a product whose result moves with loops: {g}"));
        }
        let bound = std::mem::take(&mut self.bound);
        let extents = std::mem::take(&mut self.extents);
        let assigned = std::mem::take(&mut self.assigned);
        let r = self.block(&e.nest());
        (self.bound, self.extents, self.assigned) = (bound, extents, assigned);
        r
    }

    fn gemm(&self, g: &super::Gemm) -> Result<(), String> {
        if !(matches!(g.prec, Prec::F32 | Prec::F64) || g.bf16_pairs && g.prec == Prec::Bf16) {
            return Err(format!("gemm in {}", g.prec.name()));
        }
        for axis in [&g.m, &g.n, &g.k] {
            if let Some((s, _)) = axis.limit
                && !self.prog.runtime_symbols.contains(&s)
            {
                return Err(format!("gemm limit {s} not registered"));
            }
        }
        g.indices().iter().try_for_each(|i| self.index(i))?;
        let extent = |v: Var| self.bound.iter().position(|b| *b == v).map(|k| self.extents[k]);
        let (m, n, k) = (g.m.extent as i64, g.n.extent as i64, g.k.extent as i64);
        for (o, rows, cols) in [(&g.c, m, n), (&g.a, m, k), (&g.b, k, n)] {
            let Some(node) = self.prog.nodes.get(&o.node) else {
                return Err(format!("gemm on unknown node {}", o.node));
            };
            if self.prog.virtual_nodes.contains(&o.node) {
                return Err(format!("gemm on virtualized node {}", o.node));
            }
            let want = if g.bf16_pairs && o.node != g.c.node { Prec::Bf16 } else { g.prec };
            if g.bf16_pairs && !matches!(g.prec, Prec::F32 | Prec::Bf16) {
                return Err(format!("bf16 pairs into {}", g.prec.name()));
            }
            if node.prec != want {
                return Err(format!(
                    "gemm {} on {} node {}",
                    g.prec.name(),
                    node.prec.name(),
                    o.node
                ));
            }
            // Offsets with runtime symbols are checked when running.
            let Some((lo, hi)) = o.offset.range(&extent) else { continue };
            let span = |step: i64, len: i64| (step * (len - 1)).min(0)..=(step * (len - 1)).max(0);
            let (r, c) = (span(o.rows, rows.max(1)), span(o.cols, cols.max(1)));
            let (first, last) = (lo + r.start() + c.start(), hi + r.end() + c.end());
            if rows * cols > 0 && (first < 0 || last >= node.num_elements() as i64) {
                return Err(format!(
                    "gemm reaches cells {first}..={last} of {} ({} cells)",
                    o.node,
                    node.num_elements()
                ));
            }
        }
        Ok(())
    }

    /// Every tensor of a kernel call is a known, materialized node; its own index uses
    /// the loops around it. (Any precision: a call not on `f32` is expanded into nests before a
    /// backend sees it.)
    fn call(&self, c: &super::Call) -> Result<(), String> {
        for n in c.nodes() {
            if !self.prog.nodes.contains_key(&n) {
                return Err(format!("kernel call on unknown node {n}: {c}"));
            }
            if self.prog.virtual_nodes.contains(&n) {
                return Err(format!("kernel call on virtualized node {n}: {c}"));
            }
        }
        self.index(c.index())
    }

    /// Checks a map call: its precision, descriptor, axes and operands, then that it stays
    /// inside every operand for every value of the loops around it.
    fn map(&self, m: &super::Map) -> Result<(), String> {
        if !matches!(m.prec, Prec::F32 | Prec::F64) {
            return Err(format!("map in {}", m.prec.name()));
        }
        let words: Vec<i64> =
            m.descriptor().iter().map(|i| if i.terms.is_empty() { i.offset } else { 0 }).collect();
        if crate::kernels::map::MapDesc::decode(&words).is_none() {
            return Err(format!("map with a malformed program or too many axes: {m}"));
        }
        for a in m.cells.iter().chain(&m.points) {
            if a.steps.len() != m.inputs.len() {
                return Err(format!(
                    "map axis with {} steps for {} inputs",
                    a.steps.len(),
                    m.inputs.len()
                ));
            }
        }
        self.map_operands(m)?;
        m.indices().iter().try_for_each(|i| self.index(i))?;
        self.map_bounds(m)
    }

    /// Every operand of a map call is a known, materialized node of the map's precision.
    fn map_operands(&self, m: &super::Map) -> Result<(), String> {
        for o in m.operands() {
            let Some(node) = self.prog.nodes.get(&o.node) else {
                return Err(format!("map on unknown node {}", o.node));
            };
            if self.prog.virtual_nodes.contains(&o.node) {
                return Err(format!("map on virtualized node {}", o.node));
            }
            if node.prec != m.prec {
                return Err(format!(
                    "map {} on {} node {}",
                    m.prec.name(),
                    node.prec.name(),
                    o.node
                ));
            }
        }
        Ok(())
    }

    /// Every cell the call reaches, for every value of the loops its offsets and counts depend
    /// on (a parallel loop's blocks: few); with runtime symbols, checked when running.
    fn map_bounds(&self, m: &super::Map) -> Result<(), String> {
        let indices = m.indices();
        if indices.iter().any(|i| i.terms.iter().any(|(_, x)| matches!(x, IdxVar::Sym(_)))) {
            return Ok(());
        }
        let mut vars: Vec<(Var, usize)> = Vec::new();
        for i in &indices {
            for (_, x) in &i.terms {
                if let IdxVar::Loop(v) = x
                    && !vars.iter().any(|(w, _)| w == v)
                {
                    let k = self.bound.iter().position(|b| b == v).unwrap_or(0);
                    vars.push((*v, self.extents.get(k).copied().unwrap_or(1)));
                }
            }
        }
        if vars.iter().map(|(_, e)| *e).product::<usize>() > 4096 {
            return Ok(());
        }
        let mut at = vec![0usize; vars.len()];
        loop {
            self.map_reach_at(m, &vars, &at)?;
            // The next assignment of the loops.
            let mut k = 0;
            while k < at.len() {
                at[k] += 1;
                if at[k] < vars[k].1 {
                    break;
                }
                at[k] = 0;
                k += 1;
            }
            if k == at.len() {
                return Ok(());
            }
        }
    }

    /// The cells a map call reaches with the loops `vars` at `at` lie inside every operand.
    fn map_reach_at(
        &self,
        m: &super::Map,
        vars: &[(Var, usize)],
        at: &[usize],
    ) -> Result<(), String> {
        let value = |i: &Index| {
            i.offset
                + i.terms
                    .iter()
                    .map(|(c, x)| match x {
                        IdxVar::Loop(v) => {
                            c * vars.iter().position(|(w, _)| w == v).map_or(0, |k| at[k]) as i64
                        }
                        IdxVar::Sym(_) => 0,
                    })
                    .sum::<i64>()
        };
        let count = |a: &super::MapAxis| match &a.count {
            Some((size, per)) => {
                (a.extent as i64).min((value(size) + *per as i64 - 1) / *per as i64).max(0)
            }
            None => a.extent as i64,
        };
        let axes: Vec<(i64, &super::MapAxis)> =
            m.cells.iter().chain(&m.points).map(|a| (count(a), a)).collect();
        if !axes.iter().all(|(n, _)| *n > 0) {
            return Ok(());
        }
        for (k, o) in m.operands().enumerate() {
            let node = &self.prog.nodes[&o.node];
            let (mut first, mut last) = (value(&o.offset), value(&o.offset));
            for (n, a) in &axes {
                let step = if k == 0 { a.out } else { a.steps[k - 1] };
                first += (step * (n - 1)).min(0);
                last += (step * (n - 1)).max(0);
            }
            if first < 0 || last >= node.num_elements() as i64 {
                return Err(format!(
                    "map reaches cells {first}..={last} of {} ({} cells)",
                    o.node,
                    node.num_elements()
                ));
            }
        }
        Ok(())
    }

    fn index(&self, i: &Index) -> Result<(), String> {
        for (_, x) in &i.terms {
            match x {
                IdxVar::Loop(v) if !self.bound.contains(v) => {
                    return Err(format!("loop variable {v} used outside its loop in `{i}`"));
                }
                IdxVar::Sym(s) if !self.prog.runtime_symbols.contains(s) => {
                    return Err(format!("runtime symbol {s} not registered"));
                }
                _ => {}
            }
        }
        Ok(())
    }

    fn access(&self, node: NodeId, idx: &[Index]) -> Result<(), String> {
        let Some(n) = self.prog.nodes.get(&node) else {
            return Err(format!("access to unknown node {node}"));
        };
        if self.prog.virtual_nodes.contains(&node) {
            return Err(format!("access to virtualized node {node}"));
        }
        if n.dims.len() != idx.len() {
            return Err(format!("{node} has {} axes, accessed with {}", n.dims.len(), idx.len()));
        }
        idx.iter().try_for_each(|i| self.index(i))
    }

    fn expr(&self, e: &Expr) -> Result<(), String> {
        let mut res = Ok(());
        e.visit(&mut |e| {
            if res.is_err() {
                return;
            }
            res = match e {
                Expr::Get(n, idx) => self.access(*n, idx),
                Expr::IndexValue(i) | Expr::Uniform { offset: i, .. } => self.index(i),
                Expr::Local(l) if !self.assigned.contains(l) => {
                    Err(format!("local {l} read before any assignment"))
                }
                _ => Ok(()),
            };
        });
        res
    }
}

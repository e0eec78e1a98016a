//! Interleaved reductions: cells of a short reduction computed side by side.
//!
//! A reduction nest that no kernel takes — a layer norm's variance `t := fma(d·d, 1/64, t)`
//! over the 64 features of each row, with `d` a local — runs as one chain of dependent
//! operations per cell: every step waits for the one before (4 cycles of an `fma` on a Zen 5),
//! whatever else the core could do meanwhile. Taking [`R`] consecutive cells of the innermost
//! cell loop `j` together — the cell's body copied `R` times with its locals renamed, and the
//! copies' steps interleaved inside the reduction loops ("unroll and jam") — runs `R`
//! independent chains side by side, while every cell still sees its own steps in the nest's
//! order, so the bits are the nest's (and the interpreter's):
//!
//! ```text
//! for <cell loops but j> { [for j in ..] {           for <cell loops but j> { for j0 in 0..J/R {
//!   t := init                                          t_r := init(j = R·j0 + r)         r < R
//!   for <reduction loops> {                   →        for <reduction loops> {
//!     <locals>; t := t ⊕ e                               <locals_r>; t_r := t_r ⊕ e_r    r < R
//!   }                                                  }
//!   c[.., j, ..] := t                                  c[.., R·j0 + r, ..] := t_r        r < R
//! } }                                                } }
//! ```
//!
//! Conditions: no guards; `j` has no dynamic limit, is a multiple of `R` long
//! and indexes one axis of `c` alone (so the `R` cells differ); the reduction body only sets
//! locals and does not read `c` (which the copies write only at the end); the body is small
//! ([`MAX_BODY_COST`]), since it is compiled `R` times; the nest is not tiny ([`MIN_WORK`]).

use rustc_hash::FxHashMap;

use super::{Cell, Loop, wrap};
use crate::low_level::{Expr, IdxVar, Index, LocalId, Program, Stmt, Var};

/// Cells computed together.
pub const R: usize = 8;

/// Cells × reduction steps below which a nest stays as it is: interleaving the tiny nests of
/// the W3 moons step (a batch of 32, 16 hidden units) made the step 6 % slower (1.02–1.08 µs
/// against 0.95–0.99), for no gain on chains that short.
pub const MIN_WORK: usize = 4096;

/// The most a reduction body may cost ([`Expr::cost`], summed over its statements): its `R`
/// copies are compiled, and GCC's time grows with them.
pub const MAX_BODY_COST: u32 = 24;

/// Peels the loops around a single statement (no guards): the loops, outermost first, and the
/// statements inside the innermost.
pub(super) fn loops_of(s: &Stmt) -> (Vec<Loop>, &[Stmt]) {
    let mut loops = vec![];
    let mut cur = std::slice::from_ref(s);
    while let [Stmt::For { var, extent, limit, parallel, body }] = cur {
        loops.push(Loop { var: *var, extent: *extent, limit: *limit, parallel: *parallel });
        cur = body;
    }
    (loops, cur)
}

/// The nest with `R` cells of its innermost cell loop at a time, or `None` when it does not
/// have the form and conditions of the module documentation.
pub(crate) fn rewrite(prog: &mut Program, s: &Stmt) -> Option<Vec<Stmt>> {
    let (cells, block) = loops_of(s);
    let (&j, outer) = cells.split_last()?;
    if j.limit.is_some() || j.extent < R || !j.extent.is_multiple_of(R) {
        return None;
    }
    let Cell { local, start, red, node, idx } = Cell::of(block)?;
    let t = &local;
    // `j` alone indexes one axis of the cell: distinct `j`, distinct cells.
    if idx.iter().filter(|i| i.uses(j.var)).count() != 1
        || !idx.iter().any(|i| i.as_var() == Some(j.var))
    {
        return None;
    }
    match start {
        Expr::Const(_) => {}
        Expr::Get(n, i) if n == node && i == idx => {}
        _ => return None,
    }
    let (reds, body) = loops_of(red);
    if reds.is_empty() || reds.iter().any(|l| l.parallel) || body.is_empty() {
        return None;
    }
    if cells.iter().chain(&reds).map(|l| l.extent).product::<usize>() < MIN_WORK {
        return None;
    }
    // The body: locals only, the accumulator's update last, no read of `c`, small.
    let mut defined = vec![];
    let mut cost = 0;
    for b in body {
        let Stmt::SetLocal { local, value } = b else { return None };
        if value.reads(*node) {
            return None;
        }
        cost += value.cost();
        defined.push(*local);
    }
    if defined.last() != Some(t) || defined[..defined.len() - 1].contains(t) || cost > MAX_BODY_COST
    {
        return None;
    }
    defined.sort_by_key(|l| l.0);
    defined.dedup();
    let j0 = prog.fresh_var();
    let at = |r: usize| {
        let i = Index::new(vec![(R as i64, IdxVar::Loop(j0))], r as i64);
        move |v: Var| (v == j.var).then(|| i.clone())
    };
    // Each copy's locals: fresh ones of the same precisions.
    let renames: Vec<FxHashMap<LocalId, LocalId>> = (0..R)
        .map(|_| {
            defined
                .iter()
                .map(|l| {
                    let prec = prog.locals[l.0 as usize];
                    (*l, prog.fresh_local(prec))
                })
                .collect()
        })
        .collect();
    let copy = |e: &Expr, r: usize| -> Expr {
        e.clone().subst(&at(r)).rewrite(&mut |x| match x {
            Expr::Local(l) => Expr::Local(renames[r].get(&l).copied().unwrap_or(l)),
            x => x,
        })
    };
    let cell = |r: usize| -> Vec<Index> { idx.iter().map(|i| i.subst(&at(r))).collect() };
    let mut out: Vec<Stmt> =
        (0..R).map(|r| Stmt::SetLocal { local: renames[r][t], value: copy(start, r) }).collect();
    let mut jammed = Vec::with_capacity(R * body.len());
    for (r, rename) in renames.iter().enumerate() {
        for b in body {
            if let Stmt::SetLocal { local, value } = b {
                jammed.push(Stmt::SetLocal { local: rename[local], value: copy(value, r) });
            }
        }
    }
    out.extend(wrap(&reds, jammed));
    out.extend((0..R).map(|r| Stmt::Set {
        node: *node,
        idx: cell(r),
        value: Expr::Local(renames[r][t]),
    }));
    // Blocks of cells are as independent as the cells were.
    let blocks = Loop { var: j0, extent: j.extent / R, limit: None, parallel: j.parallel };
    Some(wrap(outer, wrap(&[blocks], out)))
}

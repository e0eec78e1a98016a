//! The in-place kernel: `c` accumulates with a contiguous column loop innermost.
//!
//! For a [`Nest`] with a column variable `j` (an lhs loop of at least [`MIN_COLUMNS`] along
//! which `c` is contiguous, in no guard), a row variable `i` (an lhs loop that alone indexes an
//! axis of `c`, in no guard) and an unrolled reduction variable `k` (the innermost reduction
//! loop in no guard) — `i` and `k` optional — the nest becomes:
//!
//! ```text
//! c := neutral                                   (a separate nest, when cells start neutral
//!                                                 and the first block cannot start from it)
//! b.packed := ...                                (operands not contiguous along j: see pack)
//! for <lhs loops but j, with i replaced by its chunks ic> {     the first one parallel
//!   for j0 {                                     tiles of NC columns
//!     for <reduction loops but k> { if <guards> {
//!       for k0 {                                 tiles of KC reduction steps
//!         for i0 { for k1 {                      MR rows × KU steps: i = MC*ic + MR*i0 + r,
//!           t_rq := <parts of e not depending on j>                    k = KC*k0 + KU*k1 + q
//!           for j1 { c[i_r, j] := c[i_r, j] ⊕ e_r0 ⊕ ... ⊕ e_r(KU-1)   for r < MR }
//! }}}}}}}
//! ```
//!
//! The column loop is contiguous in `c` and in every operand that depends on `j`, so GCC
//! vectorizes it; MR rows × KU steps per iteration keep the FMA units busier than the
//! load/store ports. Guards (padding of convolutions) depend on neither `i`, `j` nor `k`, so
//! they are tested once per block of work instead of once per point. Each cell still receives
//! its contributions in the original order of the reduction loops. Tile sizes divide the
//! extents exactly (no remainder loops). When `i` is the outermost loop, its chunks are small
//! enough that the pool gets at least four of them.
//!
//! Cells that start neutral are not filled first when the reduction is one tile with no other
//! reduction loops, guards or dynamic limit: the first `k1` block is peeled and starts from
//! the neutral element as a constant, the rest run `k1 + 1` — the same bits, one pass over `c`
//! fewer.

use super::{
    KC, KU, Loop, MC, MIN_COLUMNS, MR, NC, Nest, dot, flat_stride, largest_divisor, lin, pack,
    sole_axis, subst_stmt, uses_var, wrap,
};
use crate::low_level::{Expr, Index, Limit, LocalId, Program, Scratch, Stmt, Var};
use crate::ops::Prec;
use crate::tnode::{MemoryMode, TensorNode};

/// The rewritten statements, or `None` when the nest has no suitable column loop or an operand
/// cannot be packed.
pub(super) fn rewrite(prog: &mut Program, nest: &Nest) -> Option<Vec<Stmt>> {
    let j = nest.lhs.iter().rev().find(|l| {
        l.extent >= MIN_COLUMNS
            && !nest.guarded(l.var)
            && flat_stride(prog, nest.node, &nest.idx, l.var) == 1
    });
    match j {
        Some(j) => in_place(prog, nest, *j),
        None => packed_output(prog, nest),
    }
}

/// When `c` is contiguous along none of its loops but short ones (a convolution's kernel
/// gradient with one input channel, `dk[d, kh, kw, 0]`; a contiguous loop of 8 to 15 goes to
/// the lane kernel instead), the cells accumulate in a packed copy whose last axis is
/// a wide lhs loop, copied in before and out after:
///
/// ```text
/// c.packed[.., j] := c[idx]        (or the neutral element)
/// <the in-place kernel on c.packed>
/// c[idx] := c.packed[.., j]
/// ```
///
/// Only for cells indexed one loop per axis (constants elsewhere), without cell guards, and
/// enough reduction work per cell to pay for two copies.
fn packed_output(prog: &mut Program, nest: &Nest) -> Option<Vec<Stmt>> {
    let work: usize = nest.red.iter().map(|l| l.extent).product();
    let contiguous = |l: &Loop| {
        l.extent >= MIN_COLUMNS / 2 && flat_stride(prog, nest.node, &nest.idx, l.var) == 1
    };
    if nest.lhs.iter().any(contiguous)
        || !nest.cell_guards.is_empty()
        || work < MIN_COLUMNS
        || !nest.lhs.iter().all(|l| sole_axis(nest, l.var))
        || !nest.idx.iter().all(|x| x.terms.is_empty() || x.as_var().is_some())
    {
        return None;
    }
    let j = *nest.lhs.iter().rev().find(|l| l.extent >= MIN_COLUMNS && !nest.guarded(l.var))?;
    let mut order: Vec<Loop> = nest.lhs.iter().copied().filter(|l| l.var != j.var).collect();
    order.push(j);
    let id = prog.fresh_node_id();
    let dims: Vec<usize> = order.iter().map(|l| l.extent).collect();
    let label = format!("{}.packed", prog.nodes[&nest.node].label);
    prog.nodes.insert(id, TensorNode::new(id, &label, &dims, nest.prec, MemoryMode::Local));
    prog.scratch.push(Scratch { node: id, per_thread: false });
    let cidx: Vec<Index> = order.iter().map(|l| Index::var(l.var)).collect();
    let start = match nest.init {
        Some(c) => Expr::Const(c),
        None => Expr::Get(nest.node, nest.idx.clone()),
    };
    let copy_in = wrap(&nest.lhs, vec![Stmt::Set { node: id, idx: cidx.clone(), value: start }]);
    let inner = Nest { node: id, idx: cidx.clone(), init: None, ..nest.clone() };
    let body = in_place(prog, &inner, j)?;
    let copy_out = wrap(
        &nest.lhs,
        vec![Stmt::Set { node: nest.node, idx: nest.idx.clone(), value: Expr::Get(id, cidx) }],
    );
    Some(copy_in.into_iter().chain(body).chain(copy_out).collect())
}

/// The kernel of the module documentation, with column loop `j`.
fn in_place(prog: &mut Program, nest: &Nest, j: Loop) -> Option<Vec<Stmt>> {
    if pack::needed(prog, nest, j.var) && dot::use_for_transposed(prog, nest) {
        return None;
    }
    let mut update = nest.update.clone();
    let packs = pack::pack_operands(prog, nest, j.var, &mut update)?;
    let t = Tiling::choose(nest, j);
    let [ic, j0, k0, i0, k1, j1] = [(); 6].map(|_| prog.fresh_var());
    let vars = TileVars { ic, j0, k0, i0, k1, j1 };
    let mut hoisted: Vec<(Expr, LocalId)> = Vec::new();
    let rows = row_updates(prog, nest, &update, &t, &vars, &mut hoisted);
    let rows = share_across_rows(prog, rows, nest.node, j1, nest.prec);
    let mut body: Vec<Stmt> =
        hoisted.into_iter().map(|(e, l)| Stmt::SetLocal { local: l, value: e }).collect();
    body.push(Stmt::For { var: j1, extent: t.nc, limit: None, parallel: true, body: rows });
    let guards = nest.guards();
    let other_red: Vec<Loop> = nest
        .red
        .iter()
        .filter(|l| t.k.is_none_or(|k| k.var != l.var))
        .map(|l| Loop { parallel: false, ..*l })
        .collect();
    // Cells that start from the neutral element: the first block of reduction steps starts
    // from it instead of reading `c`, and `c` needs no fill (one reduction tile, no other
    // reduction loops, guards or dynamic limits on the reduction: the first block is then the
    // first `ku` steps of every cell). The same bits: the fill stored the neutral element
    // (exact in every precision), which the first block read back.
    // Not for products (`1 * x`, which GCC folds to `x`: a signalling NaN would stay
    // signalling where the read neutral element quieted it); sums keep `0 + x`, and `max`/`min`
    // against an infinity only compare.
    let folds_safely = nest.update.combine_op() != crate::ops::BinOp::Mul;
    let first_block = match (nest.init, t.k) {
        (Some(init), Some(k))
            if k.limit.is_none() && t.kx == t.kc && other_red.is_empty() && folds_safely =>
        {
            guards.is_empty().then_some(init)
        }
        _ => None,
    };
    if let Some(init) = first_block {
        body = peel_first_block(body, nest.node, init, k1, t.kc / t.ku);
    }
    let inner = t.inner_loops(&vars, first_block.is_none());
    let mut nest_body = wrap(&inner, body);
    if !guards.is_empty() {
        nest_body = vec![Stmt::If { guards, body: nest_body }];
    }
    nest_body = wrap(&other_red, nest_body);
    let loops = t.outer_loops(&vars);
    let mut out: Vec<Stmt> =
        if first_block.is_some() { vec![] } else { nest.fill().into_iter().collect() };
    out.extend(packs);
    out.extend(wrap(&loops, nest_body));
    Some(out)
}

/// The loops and tile sizes of the in-place kernel for one nest.
struct Tiling {
    /// The column loop.
    j: Loop,
    /// The row loop: an unguarded loop alone indexing an axis of `c`.
    i: Option<Loop>,
    /// The unrolled reduction loop: the innermost one in no guard.
    k: Option<Loop>,
    /// The extents of the row, reduction and column loops (1 when absent).
    mx: usize,
    kx: usize,
    nx: usize,
    /// Rows per iteration (MR), reduction steps per iteration (KU), reduction steps per tile
    /// (KC), columns per tile (NC) and rows per chunk (MC), each dividing its extent.
    mr: usize,
    ku: usize,
    kc: usize,
    nc: usize,
    mc: usize,
    /// The lhs loops but the column loop, outermost first.
    outer: Vec<Loop>,
}

/// The fresh loop variables of the kernel: row chunks `ic`, column tiles `j0`, reduction tiles
/// `k0`, row blocks `i0`, reduction blocks `k1` and columns within a tile `j1`.
struct TileVars {
    ic: Var,
    j0: Var,
    k0: Var,
    i0: Var,
    k1: Var,
    j1: Var,
}

impl Tiling {
    /// Chooses the row and reduction loops and the tile sizes.
    fn choose(nest: &Nest, j: Loop) -> Tiling {
        // Rows: an unguarded loop alone indexing an axis; one whose extent MR divides first.
        let rows: Vec<Loop> = nest
            .lhs
            .iter()
            .rev()
            .copied()
            .filter(|l| l.var != j.var && !nest.guarded(l.var) && sole_axis(nest, l.var))
            .collect();
        let i = rows.iter().copied().find(|l| l.extent % MR == 0).or_else(|| rows.first().copied());
        let k = nest.red.iter().rev().copied().find(|l| !nest.guarded(l.var));
        let (mx, kx, nx) = (i.map_or(1, |l| l.extent), k.map_or(1, |l| l.extent), j.extent);
        let mr = [MR, 2, 1].into_iter().find(|m| mx % m == 0).unwrap_or(1);
        let ku = [KU, 2, 1].into_iter().find(|u| kx % u == 0).unwrap_or(1);
        let kc = if kx > KC { largest_divisor(kx, KC, ku) } else { kx };
        let nc = if nx > NC { largest_divisor(nx, NC, MIN_COLUMNS) } else { nx };
        let outer: Vec<Loop> = nest.lhs.iter().copied().filter(|l| l.var != j.var).collect();
        let i_outermost = i.is_some_and(|i| outer.first().is_some_and(|o| o.var == i.var));
        let mc_limit =
            if i_outermost && i.is_some_and(|l| l.parallel) { (mx / 4).max(mr) } else { MC };
        let mc = largest_divisor(mx, MC.min(mc_limit).max(mr), mr);
        Tiling { j, i, k, mx, kx, nx, mr, ku, kc, nc, mc, outer }
    }

    /// The loops inside the reduction loops and guards: reduction tiles, row blocks and (unless
    /// the first block was peeled) reduction blocks.
    fn inner_loops(&self, v: &TileVars, with_k1: bool) -> Vec<Loop> {
        let mut inner = Vec::new();
        if let Some(k) = self.k {
            // Tiles wholly past a dynamic batch add nothing (their contributions are selected).
            let limit = k.limit.map(|m| Limit { size: m.size, per: m.per * self.kc });
            inner.push(Loop { var: v.k0, extent: self.kx / self.kc, limit, parallel: false });
        }
        if self.i.is_some() {
            inner.push(Loop { var: v.i0, extent: self.mc / self.mr, limit: None, parallel: false });
        }
        if let Some(k) = self.k.filter(|_| with_k1) {
            // With a single tile, the steps of `ku` wholly past a dynamic batch add nothing
            // either.
            let one_tile = self.kx == self.kc;
            let limit =
                k.limit.filter(|_| one_tile).map(|m| Limit { size: m.size, per: m.per * self.ku });
            inner.push(Loop { var: v.k1, extent: self.kc / self.ku, limit, parallel: false });
        }
        inner
    }

    /// The outer loops: the lhs loops but `j`, the row loop replaced by its chunks, then the
    /// column tiles; only the outermost one parallel.
    fn outer_loops(&self, v: &TileVars) -> Vec<Loop> {
        let mut loops: Vec<Loop> = self
            .outer
            .iter()
            .map(|l| match self.i {
                // Chunks of `mc` rows: those wholly past a dynamic batch can be skipped.
                Some(i) if i.var == l.var => Loop {
                    var: v.ic,
                    extent: self.mx / self.mc,
                    limit: l.limit.map(|m| Limit { size: m.size, per: m.per * self.mc }),
                    parallel: l.parallel,
                },
                _ => *l,
            })
            .collect();
        loops.push(Loop {
            var: v.j0,
            extent: self.nx / self.nc,
            limit: None,
            parallel: self.j.parallel,
        });
        // Only the outermost loop is split across threads; the others run in order.
        for l in loops.iter_mut().skip(1) {
            l.parallel = false;
        }
        loops
    }
}

/// The stores of one block: for each of the `mr` rows, the cell accumulates `ku` steps of the
/// update, the parts not depending on the column loop hoisted into locals.
fn row_updates(
    prog: &mut Program,
    nest: &Nest,
    update: &super::Update,
    t: &Tiling,
    v: &TileVars,
    hoisted: &mut Vec<(Expr, LocalId)>,
) -> Vec<Stmt> {
    let (i, k) = (t.i, t.k);
    let j_idx = lin(&[(t.nc, v.j0), (1, v.j1)], 0);
    let k_at = |q: usize| lin(&[(t.kc, v.k0), (t.ku, v.k1)], q);
    let i_at = |r: usize| lin(&[(t.mc, v.ic), (t.mr, v.i0)], r);
    let mut rows = Vec::new();
    for r in 0..t.mr {
        let sub_r = |w: Var| {
            if w == t.j.var {
                Some(j_idx.clone())
            } else if i.is_some_and(|l| l.var == w) {
                Some(i_at(r))
            } else {
                None
            }
        };
        let cell: Vec<Index> = nest.idx.iter().map(|x| x.subst(&sub_r)).collect();
        let mut acc = Expr::Get(nest.node, cell.clone());
        for q in 0..t.ku {
            let sub = |w: Var| {
                if k.is_some_and(|l| l.var == w) { Some(k_at(q)) } else { sub_r(w) }
            };
            let step = update.subst(&sub);
            acc = step.apply(acc, &|e| e.clone());
            acc = hoist_in(prog, acc, v.j1, nest.prec, hoisted);
        }
        rows.push(Stmt::Set { node: nest.node, idx: cell, value: acc });
    }
    rows
}

/// The block body with its first block of reduction steps peeled: that block reads the
/// neutral element `init` as a constant instead of `node`, and the remaining `steps - 1`
/// blocks run in a loop over `k1`.
fn peel_first_block(
    body: Vec<Stmt>,
    node: crate::tnode::NodeId,
    init: f64,
    k1: Var,
    steps: usize,
) -> Vec<Stmt> {
    let mut first: Vec<Stmt> = body
        .iter()
        .cloned()
        .map(|s| subst_stmt(s, &|v| (v == k1).then(|| Index::fixed(0))))
        .map(|s| super::reads_as_const(s, node, init))
        .collect();
    let rest: Vec<Stmt> = body
        .into_iter()
        .map(|s| subst_stmt(s, &|v| (v == k1).then(|| lin(&[(1, k1)], 1))))
        .collect();
    if steps > 1 {
        first.push(Stmt::For {
            var: k1,
            extent: steps - 1,
            limit: None,
            parallel: false,
            body: rest,
        });
    }
    first
}

/// Replaces, in the contributions of a row's expression, the maximal subexpressions that do
/// not depend on `j` by locals computed before the `j` loop (the row's own cell stays).
fn hoist_in(
    prog: &mut Program,
    acc: Expr,
    j: Var,
    prec: Prec,
    hoisted: &mut Vec<(Expr, LocalId)>,
) -> Expr {
    // The accumulator chain is `op(acc, e)` or `fma(x, y, acc)`; hoist inside `e` / `x`, `y`.
    match acc {
        Expr::Binop(op, a, e) => Expr::bin(op, *a, hoist(prog, *e, j, prec, hoisted)),
        Expr::Ternop(op, x, y, a) => {
            let x = hoist(prog, *x, j, prec, hoisted);
            let y = hoist(prog, *y, j, prec, hoisted);
            Expr::Ternop(op, Box::new(x), Box::new(y), a)
        }
        e => e,
    }
}

/// Computes the values several rows of a column iteration read (a `b[k, j]` every row
/// multiplies) once per iteration, into locals at the top of the column loop. Without this,
/// GCC must assume each row's store to `c` may change `b` (the buffers come from a table, so
/// nothing tells it they are distinct) and loads `b` again for every row: twice the loads, and
/// a load-bound kernel.
fn share_across_rows(
    prog: &mut Program,
    rows: Vec<Stmt>,
    node: crate::tnode::NodeId,
    j: Var,
    prec: Prec,
) -> Vec<Stmt> {
    // Candidate subexpressions: depend on `j`, do not read `c`, occur in two rows or more.
    let values: Vec<&Expr> = rows
        .iter()
        .filter_map(|s| match s {
            Stmt::Set { value, .. } => Some(value),
            _ => None,
        })
        .collect();
    let mut shared: Vec<Expr> = Vec::new();
    for (r, v) in values.iter().enumerate() {
        v.visit(&mut |e| {
            if matches!(e, Expr::Const(_) | Expr::Local(_))
                || !uses_var(e, j)
                || e.reads(node)
                || shared.contains(e)
                || shared.iter().any(|s| contains(s, e))
            {
                return;
            }
            if values.iter().skip(r + 1).any(|o| contains(o, e)) {
                shared.retain(|s| !contains(e, s));
                shared.push(e.clone());
            }
        });
    }
    if shared.is_empty() {
        return rows;
    }
    let mut out = Vec::new();
    let mut locals = Vec::new();
    for e in &shared {
        let l = prog.fresh_local(value_prec(prog, e, prec));
        out.push(Stmt::SetLocal { local: l, value: e.clone() });
        locals.push(l);
    }
    for s in rows {
        out.push(match s {
            Stmt::Set { node, idx, value } => {
                let value = value.rewrite(&mut |x| match shared.iter().position(|s| *s == x) {
                    Some(p) => Expr::Local(locals[p]),
                    None => x,
                });
                Stmt::Set { node, idx, value }
            }
            s => s,
        });
    }
    out
}

/// Whether `e` occurs in `whole`.
fn contains(whole: &Expr, e: &Expr) -> bool {
    let mut found = false;
    whole.visit(&mut |x| found |= x == e);
    found
}

/// The precision a hoisted value is kept in: f64 when it reads f64.
fn value_prec(prog: &Program, e: &Expr, prec: Prec) -> Prec {
    let mut p = prec;
    e.visit(&mut |e| {
        if let Expr::Get(n, _) = e
            && prog.nodes.get(n).is_some_and(|n| n.prec == Prec::F64)
        {
            p = Prec::F64;
        }
    });
    p
}

/// Replaces the maximal subexpressions of `e` that do not depend on `j` by locals.
fn hoist(
    prog: &mut Program,
    e: Expr,
    j: Var,
    prec: Prec,
    hoisted: &mut Vec<(Expr, LocalId)>,
) -> Expr {
    if !uses_var(&e, j) {
        if matches!(e, Expr::Const(_)) {
            return e;
        }
        if let Some((_, l)) = hoisted.iter().find(|(h, _)| *h == e) {
            return Expr::Local(*l);
        }
        let l = prog.fresh_local(value_prec(prog, &e, prec));
        hoisted.push((e, l));
        return Expr::Local(l);
    }
    match e {
        Expr::Unop(op, a) => Expr::Unop(op, Box::new(hoist(prog, *a, j, prec, hoisted))),
        Expr::Binop(op, a, b) => {
            let a = hoist(prog, *a, j, prec, hoisted);
            Expr::bin(op, a, hoist(prog, *b, j, prec, hoisted))
        }
        Expr::Ternop(op, a, b, c) => {
            let a = hoist(prog, *a, j, prec, hoisted);
            let b = hoist(prog, *b, j, prec, hoisted);
            Expr::Ternop(op, Box::new(a), Box::new(b), Box::new(hoist(prog, *c, j, prec, hoisted)))
        }
        e => e,
    }
}

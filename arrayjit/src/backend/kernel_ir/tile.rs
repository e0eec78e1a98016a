//! Tiled products: a (batched) matrix product as tiles staged in shared memory, each thread
//! with a register tile of its cells.

use super::{KStmt, Kernel, SharedArray, collect_runs};
use crate::low_level::{Expr, Guard, IdxVar, Index, LocalId, Program, Stmt, Var, nodes_of};
use crate::ops::{BinOp, Prec, TernOp};
use crate::tnode::NodeId;

/// Tile side of the contraction kernel: 16 × 16 cells per block of 256 threads.
pub const TILE: usize = 16;
/// Multiply-adds below which a product stays one thread per cell.
pub const MIN_TILED_STEPS: usize = 16 * 1024;

/// `for <parallel batch loops> { for i { for j { t := start; for k { t := fma(a, b, t) }
/// c[.., i, j] := t } } }` (or `t + a·b`), where `a` is a read that depends on `i` and `k` but not
/// `j`, `b` one on `k` and `j` but not `i`: a (batched) matrix product.
pub(super) struct Contraction<'a> {
    batch: Vec<(Var, usize)>,
    i: (Var, usize),
    j: (Var, usize),
    k: (Var, usize),
    local: LocalId,
    start: &'a Expr,
    update: Expr,
    a: (NodeId, Vec<Index>),
    b: (NodeId, Vec<Index>),
    node: NodeId,
    idx: &'a [Index],
}

impl<'a> Contraction<'a> {
    pub(super) fn recognize(prog: &Program, s: &'a Stmt) -> Option<Contraction<'a>> {
        let mut cells = Vec::new();
        let mut cur = std::slice::from_ref(s);
        while let [Stmt::For { var, extent, limit: None, parallel: true, body }] = cur {
            cells.push((*var, *extent));
            cur = body;
        }
        let [
            Stmt::SetLocal { local, value: start },
            Stmt::For { var: kv, extent: ke, limit: None, parallel: false, body: kb },
            Stmt::Set { node, idx, value: Expr::Local(stored) },
        ] = cur
        else {
            return None;
        };
        let [Stmt::SetLocal { local: l2, value: update }] = kb.as_slice() else { return None };
        if cells.len() < 2 || l2 != local || stored != local {
            return None;
        }
        let is_t = |e: &Expr| matches!(e, Expr::Local(l) if l == local);
        let (x, y) = match update {
            Expr::Ternop(TernOp::Fma, x, y, c) if is_t(c) => (x, y),
            Expr::Binop(BinOp::Add, t, p) | Expr::Binop(BinOp::Add, p, t) if is_t(t) => {
                match &**p {
                    Expr::Binop(BinOp::Mul, x, y) => (x, y),
                    _ => return None,
                }
            }
            _ => return None,
        };
        let (Expr::Get(xn, xi), Expr::Get(yn, yi)) = (&**x, &**y) else { return None };
        let start_ok = match start {
            Expr::Const(c) => *c == 0.0,
            Expr::Get(n, i) => n == node && i == idx,
            _ => false,
        };
        let (jv, je) = cells[cells.len() - 1];
        let (iv, ie) = cells[cells.len() - 2];
        let uses = |idx: &[Index], v: Var| idx.iter().any(|i| i.uses(v));
        // `a` reads along i and k, `b` along k and j (either order in the update).
        let ((an, ai), (bn, bi)) = if !uses(xi, jv) && !uses(yi, iv) {
            ((*xn, xi.clone()), (*yn, yi.clone()))
        } else if !uses(yi, jv) && !uses(xi, iv) {
            ((*yn, yi.clone()), (*xn, xi.clone()))
        } else {
            return None;
        };
        let sole = |v: Var| {
            idx.iter().filter(|x| x.uses(v)).count() == 1
                && idx.iter().any(|x| x.as_var() == Some(v))
        };
        let steps = cells.iter().map(|c| c.1).product::<usize>().saturating_mul(*ke);
        let prec = |n: NodeId| prog.nodes.get(&n).map(|t| t.prec);
        // The tiles keep the operands' precision; the arithmetic's must not depend on which
        // node a read names (an f64 operand makes it f64: only with an f64 accumulator).
        let wide = prec(an) == Some(Prec::F64) || prec(bn) == Some(Prec::F64);
        let ok = start_ok
            && an != bn
            && an != *node
            && bn != *node
            && (!wide || prog.locals.get(local.0 as usize) == Some(&Prec::F64))
            && cells.iter().all(|c| sole(c.0) && c.1 > 0)
            && !uses(idx, *kv)
            && uses(&ai, *kv)
            && uses(&bi, *kv)
            && ie >= TILE
            && je >= TILE
            && *ke >= TILE
            && steps >= MIN_TILED_STEPS
            && prog.nodes.contains_key(&an)
            && prog.nodes.contains_key(&bn);
        ok.then(|| Contraction {
            batch: cells[..cells.len() - 2].to_vec(),
            i: (iv, ie),
            j: (jv, je),
            k: (*kv, *ke),
            local: *local,
            start,
            update: update.clone(),
            a: (an, ai),
            b: (bn, bi),
            node: *node,
            idx,
        })
    }
    /// A block of 16 × 16 threads per tile of the result (and batch), each thread computing
    /// `reg × reg` cells (rows `ty + 16·r`, columns `tx + 16·c`: a register tile, so one value
    /// read from shared memory serves `reg` multiply-adds): for each 16-step tile of the
    /// reduction, the threads copy `a`'s `16·reg × 16` tile and `b`'s `16 × 16·reg` tile into
    /// shared arrays, a barrier, then each thread folds the 16 steps into each of its cells in
    /// order (the same operations, in the same order, as one thread per cell: the same bits), a
    /// barrier. `reg` is 4 when both sides of the result have at least 64 cells, else 1.
    pub(super) fn kernel(&self, prog: &Program, k: usize) -> Kernel {
        let tl = TileLayout::new(self, prog);
        let (ni, nj) = (self.i.1.div_ceil(tl.side), self.j.1.div_ceil(tl.side));
        let blocks_per_batch = (ni * nj) as u64;
        let block = (TILE * TILE) as u64;
        let n_batch: u64 = self.batch.iter().map(|b| b.1 as u64).product();
        let mut body = self.block_coords(&tl, (ni, nj), n_batch * blocks_per_batch);
        body.extend(self.init_accumulators(&tl));
        let mut tiles = self.load_tiles(&tl);
        tiles.push(KStmt::Barrier);
        tiles.push(KStmt::Run(self.tile_steps(&tl)));
        tiles.push(KStmt::Barrier);
        body.push(KStmt::Loop { var: tl.q, extent: self.k.1.div_ceil(TILE), body: tiles });
        body.extend(self.store_cells(&tl));
        let mut run: Vec<Stmt> = Vec::new();
        collect_runs(&body, &mut run);
        let (sa, sb) = (tl.sa, tl.sb);
        let buffers: Vec<NodeId> =
            nodes_of(&run).into_iter().filter(|n| *n != sa && *n != sb).collect();
        let shared = |node: NodeId, of: NodeId| SharedArray {
            node,
            prec: prog.nodes[&of].prec,
            len: TILE * tl.side,
        };
        let prec = prog.locals[self.local.0 as usize];
        let locals = if tl.reg == 1 {
            vec![]
        } else {
            tl.cells().iter().map(|&(r, c)| (tl.acc(r, c), prec)).collect()
        };
        Kernel {
            name: format!("k{k}"),
            buffers,
            threads: n_batch * blocks_per_batch * block,
            block: block as u32,
            shared: vec![shared(sa, self.a.0), shared(sb, self.b.0)],
            scratch: vec![],
            locals,
            body,
        }
    }

    /// The thread's position: its thread in the block, row `ty` and column `tx` in the tile,
    /// then the block's batch coordinates and tile `(ti, tj)` of the `ni × nj` tiles.
    fn block_coords(&self, tl: &TileLayout, (ni, nj): (usize, usize), blocks: u64) -> Vec<KStmt> {
        let block = (TILE * TILE) as u64;
        let mut body = vec![
            KStmt::ThreadInBlock { var: tl.tid },
            KStmt::InBlock { var: tl.ty, stride: TILE as u32, extent: TILE as u32 },
            KStmt::InBlock { var: tl.tx, stride: 1, extent: TILE as u32 },
        ];
        let mut stride = blocks;
        for (var, extent) in &self.batch {
            stride /= *extent as u64;
            body.push(KStmt::Coord { var: *var, stride: stride * block, extent: *extent as u64 });
        }
        body.push(KStmt::Coord { var: tl.ti, stride: nj as u64 * block, extent: ni as u64 });
        body.push(KStmt::Coord { var: tl.tj, stride: block, extent: nj as u64 });
        body
    }

    /// Each accumulator starts at 0, or at the cell's old value when the product accumulates
    /// onto it.
    fn init_accumulators(&self, tl: &TileLayout) -> Vec<KStmt> {
        let mut body = Vec::new();
        for (r, c) in tl.cells() {
            body.push(KStmt::Run(Stmt::SetLocal { local: tl.acc(r, c), value: Expr::Const(0.0) }));
            if let Expr::Get(n, i) = self.start {
                body.push(KStmt::Run(Stmt::If {
                    guards: tl.in_cell(r, c),
                    body: vec![Stmt::SetLocal {
                        local: tl.acc(r, c),
                        value: Expr::Get(*n, subst_idx(i, &tl.cell(r, c))),
                    }],
                }));
            }
        }
        body
    }

    /// The copies of one reduction tile into the shared arrays: thread (ty, tx) copies
    /// a[row(r), 16q + tx] to As[ty + 16r][tx] and b[16q + ty, col(c)] to Bs[ty][tx + 16c].
    fn load_tiles(&self, tl: &TileLayout) -> Vec<KStmt> {
        let (t, side_i) = (TILE as i64, tl.side as i64);
        let (kv, ke) = self.k;
        let (an, bn) = (self.a.0, self.b.0);
        let ka = affine(&[(t, tl.q), (1, tl.tx)], 0);
        let kb = affine(&[(t, tl.q), (1, tl.ty)], 0);
        let mut tiles = Vec::new();
        for r in 0..tl.reg {
            let f = tl.cell(r, 0);
            let a_idx = subst_idx(&self.a.1, &|v| if v == kv { Some(ka.clone()) } else { f(v) });
            tiles.push(KStmt::Run(Stmt::If {
                guards: vec![
                    Guard { index: tl.row(r), bound: self.i.1 },
                    Guard { index: ka.clone(), bound: ke },
                ],
                body: vec![Stmt::Set {
                    node: tl.sa,
                    idx: vec![affine(&[(t, tl.ty), (1, tl.tx)], t * t * r as i64)],
                    value: Expr::Get(an, a_idx),
                }],
            }));
        }
        for c in 0..tl.reg {
            let f = tl.cell(0, c);
            let b_idx = subst_idx(&self.b.1, &|v| if v == kv { Some(kb.clone()) } else { f(v) });
            tiles.push(KStmt::Run(Stmt::If {
                guards: vec![
                    Guard { index: kb.clone(), bound: ke },
                    Guard { index: tl.col(c), bound: self.j.1 },
                ],
                body: vec![Stmt::Set {
                    node: tl.sb,
                    idx: vec![affine(&[(side_i, tl.ty), (1, tl.tx)], t * c as i64)],
                    value: Expr::Get(bn, b_idx),
                }],
            }));
        }
        tiles
    }

    /// The 16 steps of one reduction tile folded into each cell's accumulator, reading the
    /// shared arrays (As is [16·reg rows][16], Bs is [16][16·reg columns]).
    fn tile_steps(&self, tl: &TileLayout) -> Stmt {
        let (t, side_i) = (TILE as i64, tl.side as i64);
        let (an, bn) = (self.a.0, self.b.0);
        let (sa, sb, kk) = (tl.sa, tl.sb, tl.kk);
        let mut steps = Vec::new();
        for (r, c) in tl.cells() {
            let a_at = vec![affine(&[(t, tl.ty), (1, kk)], t * t * r as i64)];
            let b_at = vec![affine(&[(side_i, kk), (1, tl.tx)], t * c as i64)];
            let update = replace_reads(self.update.clone(), &|n| {
                if n == an {
                    Some(Expr::Get(sa, a_at.clone()))
                } else if n == bn {
                    Some(Expr::Get(sb, b_at.clone()))
                } else {
                    None
                }
            });
            let update = replace_local(update, self.local, tl.acc(r, c));
            steps.push(Stmt::SetLocal { local: tl.acc(r, c), value: update });
        }
        Stmt::For {
            var: kk,
            extent: TILE,
            limit: None,
            parallel: false,
            body: vec![Stmt::If {
                guards: vec![Guard { index: affine(&[(t, tl.q), (1, kk)], 0), bound: self.k.1 }],
                body: steps,
            }],
        }
    }

    /// Each cell of the register tile stored from its accumulator, inside the result.
    fn store_cells(&self, tl: &TileLayout) -> Vec<KStmt> {
        tl.cells()
            .into_iter()
            .map(|(r, c)| {
                KStmt::Run(Stmt::If {
                    guards: tl.in_cell(r, c),
                    body: vec![Stmt::Set {
                        node: self.node,
                        idx: subst_idx(self.idx, &tl.cell(r, c)),
                        value: Expr::Local(tl.acc(r, c)),
                    }],
                })
            })
            .collect()
    }
}

/// The variables, shared arrays and register tile of a tiled product's kernel.
struct TileLayout {
    /// Cells per thread along each side of the register tile.
    reg: usize,
    /// Cells per block along each side of the result: `TILE · reg`.
    side: usize,
    /// The thread in its block, its row and column in the tile, the tile's row and column,
    /// the reduction tile and the step within it.
    tid: Var,
    ty: Var,
    tx: Var,
    ti: Var,
    tj: Var,
    q: Var,
    kk: Var,
    /// The shared arrays holding a tile of `a` and of `b`.
    sa: NodeId,
    sb: NodeId,
    /// The product's row and column loop variables and extents.
    i: (Var, usize),
    j: (Var, usize),
    /// The program's accumulator, and the first of the kernel's own (for `reg > 1`).
    local: LocalId,
    first_own: u32,
}

impl TileLayout {
    /// Fresh variables and nodes (above the program's) for the product's kernel.
    fn new(p: &Contraction<'_>, prog: &Program) -> TileLayout {
        let reg = if p.i.1 >= 4 * TILE && p.j.1 >= 4 * TILE { 4 } else { 1 };
        let v0 = prog.next_var;
        TileLayout {
            reg,
            side: TILE * reg,
            tid: Var(v0),
            ty: Var(v0 + 1),
            tx: Var(v0 + 2),
            ti: Var(v0 + 3),
            tj: Var(v0 + 4),
            q: Var(v0 + 5),
            kk: Var(v0 + 6),
            sa: prog.fresh_node_id(),
            sb: NodeId(prog.fresh_node_id().0 + 1),
            i: p.i,
            j: p.j,
            local: p.local,
            first_own: prog.locals.len() as u32,
        }
    }

    /// The cells `(r, c)` of the register tile, row by row.
    fn cells(&self) -> Vec<(usize, usize)> {
        let reg = self.reg;
        (0..reg).flat_map(|r| (0..reg).map(move |c| (r, c))).collect()
    }

    /// The thread's r-th row of the result.
    fn row(&self, r: usize) -> Index {
        affine(&[(self.side as i64, self.ti), (1, self.ty)], TILE as i64 * r as i64)
    }

    /// The thread's c-th column of the result.
    fn col(&self, c: usize) -> Index {
        affine(&[(self.side as i64, self.tj), (1, self.tx)], TILE as i64 * c as i64)
    }

    /// The substitution of the product's row and column variables by cell `(r, c)`.
    fn cell(&self, r: usize, c: usize) -> impl Fn(Var) -> Option<Index> + use<> {
        let (ri, ci) = (self.row(r), self.col(c));
        let (iv, jv) = (self.i.0, self.j.0);
        move |v: Var| {
            if v == iv {
                Some(ri.clone())
            } else if v == jv {
                Some(ci.clone())
            } else {
                None
            }
        }
    }

    /// Cell `(r, c)` lies inside the result.
    fn in_cell(&self, r: usize, c: usize) -> Vec<Guard> {
        vec![
            Guard { index: self.row(r), bound: self.i.1 },
            Guard { index: self.col(c), bound: self.j.1 },
        ]
    }

    /// The accumulator of cell `(r, c)`: the program's local for a 1 × 1 tile, locals of the
    /// kernel's own otherwise.
    fn acc(&self, r: usize, c: usize) -> LocalId {
        if self.reg == 1 { self.local } else { LocalId(self.first_own + (r * self.reg + c) as u32) }
    }
}

/// `offset + Σ coeff·var` over loop variables.
fn affine(terms: &[(i64, Var)], off: i64) -> Index {
    Index::new(terms.iter().map(|&(c, v)| (c, IdxVar::Loop(v))).collect(), off)
}

/// `idx` with `f` substituted for loop variables.
fn subst_idx(idx: &[Index], f: &dyn Fn(Var) -> Option<Index>) -> Vec<Index> {
    idx.iter().map(|i| i.subst(&|v| f(v))).collect()
}

/// `e` with the local `from` read as `to`.
fn replace_local(e: Expr, from: LocalId, to: LocalId) -> Expr {
    match e {
        Expr::Local(l) if l == from => Expr::Local(to),
        Expr::Unop(op, a) => Expr::Unop(op, Box::new(replace_local(*a, from, to))),
        Expr::Binop(op, a, b) => Expr::Binop(
            op,
            Box::new(replace_local(*a, from, to)),
            Box::new(replace_local(*b, from, to)),
        ),
        Expr::Ternop(op, a, b, c) => Expr::Ternop(
            op,
            Box::new(replace_local(*a, from, to)),
            Box::new(replace_local(*b, from, to)),
            Box::new(replace_local(*c, from, to)),
        ),
        e => e,
    }
}

/// `e` with every read of a node `f` names replaced by what it gives.
fn replace_reads(e: Expr, f: &impl Fn(NodeId) -> Option<Expr>) -> Expr {
    match e {
        Expr::Get(n, i) => f(n).unwrap_or(Expr::Get(n, i)),
        Expr::Unop(op, a) => Expr::Unop(op, Box::new(replace_reads(*a, f))),
        Expr::Binop(op, a, b) => {
            Expr::Binop(op, Box::new(replace_reads(*a, f)), Box::new(replace_reads(*b, f)))
        }
        Expr::Ternop(op, a, b, c) => Expr::Ternop(
            op,
            Box::new(replace_reads(*a, f)),
            Box::new(replace_reads(*b, f)),
            Box::new(replace_reads(*c, f)),
        ),
        e => e,
    }
}

//! Block reductions: a long reduction into few cells as one block (or several, and a second
//! pass) per cell, combined by a tree in shared memory and warp shuffles.

use super::{BLOCK, KCond, KStmt, Kernel, SharedArray, WARP, collect_runs};
use crate::low_level::{Expr, Guard, IdxVar, Index, Limit, LocalId, Program, Stmt, Var, nodes_of};
use crate::ops::{BinOp, Prec, TernOp};
use crate::tnode::NodeId;

/// Blocks that fill an H100 (132 SMs, 8 blocks of 256 threads each): a reduction with fewer
/// cells gets several blocks per cell.
pub const DEVICE_BLOCKS: usize = 132 * 8;
/// Points of the first reduction loop each thread folds at least, before a cell gets another
/// block.
pub const MIN_POINTS_PER_THREAD: usize = 4;
/// Reduction points below which a reduction stays in the thread that owns its cell.
pub const MIN_BLOCK_REDUCTION: usize = 2048;
/// Cells above which a reduction stays one thread per cell (there is parallelism enough).
pub const MAX_BLOCK_REDUCTION_CELLS: usize = 4096;

/// `for <parallel cell loops> { t := start; for r1 { .. t := t ⊕ e .. }; c[idx] := t }` with
/// few cells and a long reduction (the sum of a loss, a bias gradient over a large batch).
pub(super) struct Reduction<'a> {
    cells: Vec<(Var, usize, Option<Limit>)>,
    local: LocalId,
    /// `None`: the neutral element; `Some`: the cell's old value.
    onto: Option<&'a Expr>,
    red_var: Var,
    red_extent: usize,
    red_body: &'a [Stmt],
    op: BinOp,
    node: NodeId,
    idx: &'a [Index],
}

impl<'a> Reduction<'a> {
    pub(super) fn recognize(prog: &Program, stmts: &'a [Stmt]) -> Option<Reduction<'a>> {
        let mut cells = Vec::new();
        let mut cur = stmts;
        while let [Stmt::For { var, extent, limit, parallel: true, body }] = cur {
            cells.push((*var, *extent, *limit));
            cur = body;
        }
        let [
            Stmt::SetLocal { local, value: start },
            red @ Stmt::For { var: red_var, extent, limit: None, parallel: false, body },
            Stmt::Set { node, idx, value: Expr::Local(stored) },
        ] = cur
        else {
            return None;
        };
        if stored != local
            || !matches!(prog.locals.get(local.0 as usize), Some(Prec::F32 | Prec::F64))
        {
            return None;
        }
        // The one update of the local, under loops and guards, and nothing else.
        let mut update = None;
        let mut others = false;
        red.visit(&mut |s| match s {
            Stmt::SetLocal { local: l, value } if l == local && update.is_none() => {
                update = Some(value.clone())
            }
            Stmt::For { .. } | Stmt::If { .. } | Stmt::Comment(_) => {}
            // A term computed into a local of its own first (a long sum accumulating in f64).
            Stmt::SetLocal { local: l, .. } if l != local => {}
            _ => others = true,
        });
        let update = update?;
        let update = &update;
        let is_t = |e: &Expr| matches!(e, Expr::Local(l) if l == local);
        let reads_t = |e: &Expr| {
            let mut found = false;
            e.visit(&mut |x| found |= is_t(x));
            found
        };
        let op = match update {
            Expr::Binop(op, a, b) if op.is_reorderable() && is_t(a) && !reads_t(b) => *op,
            Expr::Binop(op, a, b) if op.is_reorderable() && is_t(b) && !reads_t(a) => *op,
            Expr::Ternop(TernOp::Fma, x, y, c) if is_t(c) && !reads_t(x) && !reads_t(y) => {
                BinOp::Add
            }
            _ => return None,
        };
        let onto = match start {
            Expr::Const(c) if Some(*c) == op.neutral() => None,
            e @ Expr::Get(n, i) if n == node && i == idx => Some(e),
            _ => return None,
        };
        let mut points = 1usize;
        red.visit(&mut |s| {
            if let Stmt::For { extent, .. } = s {
                points = points.saturating_mul(*extent);
            }
        });
        let n_cells: usize = cells.iter().map(|c| c.1).product();
        let worth = n_cells > 0
            && points >= MIN_BLOCK_REDUCTION
            && *extent >= 64
            && n_cells <= MAX_BLOCK_REDUCTION_CELLS
            && cells.iter().all(|c| c.2.is_none_or(|l| l.per == 1));
        (worth && !others).then_some(Reduction {
            cells,
            local: *local,
            onto,
            red_var: *red_var,
            red_extent: *extent,
            red_body: body,
            op,
            node: *node,
            idx,
        })
    }

    /// The kernels of the reduction: one block of [`BLOCK`] threads per cell, or, when there
    /// are too few cells to fill the device, `g` blocks per cell writing partial results that a
    /// second kernel (one block per cell) combines. In a block, thread `t` folds the points
    /// whose first reduction index is its own (`t`, `t + BLOCK·g`, …, offset by its block's
    /// share) into its local; the block's partial results meet in a shared array, halved by a
    /// tree with a barrier after each step down to 64, then the first warp halves once more into
    /// its locals and five warp shuffles finish; thread 0 stores. The kernels use one local more
    /// than the program (the shuffled value).
    pub(super) fn kernels(&self, prog: &Program, k: usize) -> Vec<Kernel> {
        let b = BLOCK as usize;
        let n_cells: usize = self.cells.iter().map(|c| c.1).product();
        let g = DEVICE_BLOCKS
            .div_ceil(n_cells)
            .min(self.red_extent.div_ceil(b * MIN_POINTS_PER_THREAD))
            .clamp(1, b);
        let prec = prog.locals[self.local.0 as usize];
        // Past the ids of the tiles' shared arrays (the first two fresh ids).
        let partial = NodeId(prog.fresh_node_id().0 + 2 + k as u32);
        // The cell's position among the cells (row-major).
        let mut cell_at = Vec::new();
        let mut stride = n_cells as i64;
        for (var, extent, _) in &self.cells {
            stride /= *extent as i64;
            cell_at.push((stride, IdxVar::Loop(*var)));
        }
        let cell_at = Index::new(cell_at, 0);
        let final_store = |value: Expr| {
            let value = match self.onto {
                None => value,
                Some(old) => Expr::bin(self.op, old.clone(), value),
            };
            Stmt::Set { node: self.node, idx: self.idx.to_vec(), value }
        };
        if g == 1 {
            return vec![self.pass(prog, k, 1, None, &final_store)];
        }
        let (tid, gv) = (Var(prog.next_var), Var(prog.next_var + 2));
        // Partial result `j` of this cell: `partial[cell · g + j]`.
        let slot = |j: Var| {
            let mut terms: Vec<(i64, IdxVar)> =
                cell_at.terms.iter().map(|&(c, x)| (c * g as i64, x)).collect();
            terms.push((1, IdxVar::Loop(j)));
            vec![Index::new(terms, cell_at.offset * g as i64)]
        };
        let mut first = self.pass(prog, k, g, Some(gv), &|value: Expr| Stmt::Set {
            node: partial,
            idx: slot(gv),
            value,
        });
        // The second kernel: thread t < g reads partial result t of its cell.
        let load = Stmt::If {
            guards: vec![Guard { index: Index::var(tid), bound: g }],
            body: vec![Stmt::SetLocal { local: self.local, value: Expr::Get(partial, slot(tid)) }],
        };
        let mut second = self.blocks(prog, k + 1, 1, None, vec![load], &final_store);
        let scratch = SharedArray { node: partial, prec, len: n_cells * g };
        first.scratch = vec![scratch.clone()];
        second.scratch = vec![scratch];
        vec![first, second]
    }

    /// A kernel of `g` blocks per cell folding the points into per-block results, each stored
    /// by `store`.
    fn pass(
        &self,
        prog: &Program,
        k: usize,
        g: usize,
        block_var: Option<Var>,
        store: &dyn Fn(Expr) -> Stmt,
    ) -> Kernel {
        let b = BLOCK as usize;
        let tid = Var(prog.next_var);
        let q = Var(prog.next_var + 1);
        // r1 := BLOCK·g·q + BLOCK·(block of the cell) + t
        let mut terms = vec![((b * g) as i64, IdxVar::Loop(q)), (1, IdxVar::Loop(tid))];
        if let Some(gv) = block_var {
            terms.push((b as i64, IdxVar::Loop(gv)));
        }
        let r = Index::new(terms, 0);
        let inner: Vec<Stmt> = self
            .red_body
            .iter()
            .cloned()
            .map(|s| {
                crate::low_level::schedule::subst_stmt(s, &|v| {
                    (v == self.red_var).then(|| r.clone())
                })
            })
            .collect();
        let fold = vec![Stmt::For {
            var: q,
            extent: self.red_extent.div_ceil(b * g),
            limit: None,
            parallel: false,
            body: vec![Stmt::If {
                guards: vec![Guard { index: r, bound: self.red_extent }],
                body: inner,
            }],
        }];
        self.blocks(prog, k, g, block_var, fold, store)
    }

    /// `g` blocks per cell (`block_var` their index within the cell): `fold` leaves each
    /// thread's share in the local, each block combines its threads' and `store`s the result.
    fn blocks(
        &self,
        prog: &Program,
        k: usize,
        g: usize,
        block_var: Option<Var>,
        fold: Vec<Stmt>,
        store: &dyn Fn(Expr) -> Stmt,
    ) -> Kernel {
        let b = BLOCK as usize;
        let tid = Var(prog.next_var);
        let shared = prog.fresh_node_id();
        let prec = prog.locals[self.local.0 as usize];
        let n_cells: usize = self.cells.iter().map(|c| c.1).product();
        let mut body = vec![KStmt::ThreadInBlock { var: tid }];
        if let Some(gv) = block_var {
            body.push(KStmt::Coord { var: gv, stride: u64::from(BLOCK), extent: g as u64 });
        }
        let mut stride = n_cells as u64;
        for (var, extent, limit) in &self.cells {
            stride /= *extent as u64;
            body.push(KStmt::Coord {
                var: *var,
                stride: stride * (g * b) as u64,
                extent: *extent as u64,
            });
            if let Some(l) = limit {
                body.push(KStmt::ExitUnless(KCond::BelowLimit(*var, *l)));
            }
        }
        let neutral = self.op.neutral().unwrap_or(0.0);
        body.push(KStmt::Run(Stmt::SetLocal { local: self.local, value: Expr::Const(neutral) }));
        body.extend(fold.into_iter().map(KStmt::Run));
        let at = |offset: i64| vec![Index::new(vec![(1, IdxVar::Loop(tid))], offset)];
        body.push(KStmt::Run(Stmt::Set {
            node: shared,
            idx: at(0),
            value: Expr::Local(self.local),
        }));
        body.push(KStmt::Barrier);
        // Halvings in shared memory down to two warps' worth, a barrier after each.
        let warp = WARP as usize;
        let mut half = b / 2;
        while half > warp {
            body.push(KStmt::If {
                guards: vec![Guard { index: Index::var(tid), bound: half }],
                body: vec![KStmt::Run(Stmt::Set {
                    node: shared,
                    idx: at(0),
                    value: Expr::bin(
                        self.op,
                        Expr::Get(shared, at(0)),
                        Expr::Get(shared, at(half as i64)),
                    ),
                })],
            });
            body.push(KStmt::Barrier);
            half /= 2;
        }
        // The first warp: one more halving into its locals, then five shuffles (no barrier).
        let other = LocalId(prog.locals.len() as u32);
        let t = Expr::Local(self.local);
        let mut warp0 = vec![KStmt::Run(Stmt::SetLocal {
            local: self.local,
            value: Expr::bin(self.op, Expr::Get(shared, at(0)), Expr::Get(shared, at(warp as i64))),
        })];
        let mut offset = WARP / 2;
        while offset > 0 {
            warp0.push(KStmt::ShuffleDown { dst: other, src: self.local, offset });
            warp0.push(KStmt::Run(Stmt::SetLocal {
                local: self.local,
                value: Expr::bin(self.op, t.clone(), Expr::Local(other)),
            }));
            offset /= 2;
        }
        warp0.push(KStmt::If {
            guards: vec![Guard { index: Index::var(tid), bound: 1 }],
            body: vec![KStmt::Run(store(t))],
        });
        body.push(KStmt::If {
            guards: vec![Guard { index: Index::var(tid), bound: warp }],
            body: warp0,
        });
        let mut run: Vec<Stmt> = Vec::new();
        collect_runs(&body, &mut run);
        let buffers: Vec<NodeId> = nodes_of(&run).into_iter().filter(|n| *n != shared).collect();
        Kernel {
            name: format!("k{k}"),
            buffers,
            threads: (n_cells * b * g) as u64,
            block: BLOCK,
            shared: vec![SharedArray { node: shared, prec, len: b }],
            scratch: vec![],
            locals: vec![(other, prec)],
            body,
        }
    }
}

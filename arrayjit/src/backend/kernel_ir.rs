//! The kernel IR: a program as GPU kernels, between the low-level IR and CUDA C.
//!
//! Everything a launch needs is explicit here — grid and block sizes, how each thread finds its
//! cells, which threads stop, per-block shared arrays, barriers, atomics — so that two
//! consumers can read the same kernels without logic of their own: the CUDA renderer
//! ([`super::cuda::render`]) prints them, and the simulator ([`super::cuda_sim`]) executes them
//! on the CPU with CUDA's semantics, checking what a GPU would not report (races, barriers not
//! reached by every thread, out-of-bounds accesses, shared memory past the per-block limit).
//!
//! A kernel's body is a list of [`KStmt`]: kernel-level statements (thread coordinates, early
//! exits, barriers, conditionals that may contain barriers, atomics) around per-thread
//! low-level statements ([`Stmt`]: loops, guards, stores, scalar locals), which every thread
//! runs on its own. Shared arrays are nodes of the kernel ([`SharedArray`]): the per-thread
//! statements read and write them like tensors, but each block has its own copy.
//!
//! [`lower`] builds the kernels of a program: the leading parallel loops of a top-level nest
//! (iterations writing distinct cells) become one thread per cell on a 1-d grid of blocks of
//! [`BLOCK`] threads, the rest of the nest runs inside each thread; a (batched) matrix product
//! becomes tiles staged in shared memory, each thread with a register tile of its cells; a long reduction into few cells becomes a
//! block per cell, its threads' partial results combined by a tree in shared memory with
//! barriers and warp shuffles; consecutive nests over the same cells whose threads keep to
//! their own cells are fused into one kernel; statements outside parallel loops are grouped into single-thread
//! kernels, in order (as is a parallel nest that reads a local assigned before it: locals do
//! not cross kernels).

use std::fmt;

use crate::low_level::{
    Expr, Guard, IdxVar, Index, Limit, LocalId, Program, Stmt, Var, cut_points, nodes_of,
};
use crate::ops::{BinOp, Prec, TernOp};
use crate::tnode::NodeId;

/// Threads per block.
pub const BLOCK: u32 = 256;

/// Threads per warp.
pub const WARP: u32 = 32;

/// Shared memory one block may use without opting in to more (48 KiB on every CUDA device).
pub const SHARED_LIMIT: usize = 48 * 1024;

/// One kernel.
#[derive(Clone, Debug, PartialEq)]
pub struct Kernel {
    /// The kernel's name.
    pub name: String,
    /// The global buffers it takes, in parameter order (then one `long long` per runtime
    /// symbol slot).
    pub buffers: Vec<NodeId>,
    /// Threads that have work: the launch has `ceil(threads / block)` blocks.
    pub threads: u64,
    /// Threads per block (at most [`BLOCK`]).
    pub block: u32,
    /// Arrays each block has its own copy of.
    pub shared: Vec<SharedArray>,
    /// Global arrays the routine owns, kept between its kernels (the partial results of a
    /// reduction spread over several blocks per cell), allocated once per routine.
    pub scratch: Vec<SharedArray>,
    /// Locals of the kernel's own (numbered after the program's) and their precisions.
    pub locals: Vec<(LocalId, Prec)>,
    /// What every thread runs.
    pub body: Vec<KStmt>,
}

/// A per-block array, read and written by the per-thread statements as node `node` (a node of
/// the program's table, not a tensor of the context: each block has its own copy).
#[derive(Clone, Debug, PartialEq)]
pub struct SharedArray {
    /// Its node id (not a tensor of the program).
    pub node: NodeId,
    /// The element precision.
    pub prec: Prec,
    /// Elements.
    pub len: usize,
}

/// A kernel-level statement.
#[derive(Clone, Debug, PartialEq)]
pub enum KStmt {
    /// `var := (global thread index / stride) % extent`: one coordinate of the thread's cell.
    Coord {
        /// The loop variable it stands for.
        var: Var,
        /// Threads per step of it.
        stride: u64,
        /// Its extent.
        extent: u64,
    },
    /// `var := threadIdx.x`.
    ThreadInBlock {
        /// The variable.
        var: Var,
    },
    /// `var := (threadIdx.x / stride) % extent`: a coordinate inside the block's tile.
    InBlock {
        /// The variable.
        var: Var,
        /// Threads per step of it.
        stride: u32,
        /// Its extent.
        extent: u32,
    },
    /// `for var in 0..extent`, run by the threads together (a uniform trip count), so that
    /// its body may hold barriers: the tiles of a contraction.
    Loop {
        /// The variable.
        var: Var,
        /// Iterations.
        extent: usize,
        /// The statements.
        body: Vec<KStmt>,
    },
    /// The threads for which the condition fails stop here.
    ExitUnless(KCond),
    /// A per-thread statement.
    Run(Stmt),
    /// Every thread of the block waits here until all have arrived (`__syncthreads()`); a
    /// barrier some thread of the block cannot reach is an error.
    Barrier,
    /// Kernel statements for the threads whose guards hold (they may contain barriers).
    If {
        /// `0 <= index < bound`, each.
        guards: Vec<Guard>,
        /// The statements.
        body: Vec<KStmt>,
    },
    /// `dst := src` of the lane `offset` further in the thread's warp of [`WARP`] (its own
    /// `src` past the warp's end): `__shfl_down_sync` over the full warp, so every lane of the
    /// warp must execute it together.
    ShuffleDown {
        /// The local written.
        dst: LocalId,
        /// The local read (in the other lane).
        src: LocalId,
        /// Lanes further.
        offset: u32,
    },
    /// `node[idx] += value`, atomically (`atomicAdd`): concurrent adds are not a race.
    AtomicAdd {
        /// The global tensor.
        node: NodeId,
        /// The cell.
        idx: Vec<Index>,
        /// The value, computed by the thread.
        value: crate::low_level::Expr,
    },
}

/// When a thread goes on.
#[derive(Clone, Debug, PartialEq)]
pub enum KCond {
    /// Its global index is below this.
    GlobalBelow(u64),
    /// It is thread 0 of block 0.
    First,
    /// `var < ceil(size / per)`: a dynamic batch's rows past its size have nothing to compute.
    BelowLimit(Var, Limit),
}

/// The kernels of a program, in launch order.
pub fn lower(prog: &Program) -> Vec<Kernel> {
    let mut kernels = Vec::new();
    let mut serial: Vec<Stmt> = Vec::new();
    let mut fused: Option<Fused> = None;
    let cuts = cut_points(&prog.body);
    let body = &prog.body;
    let mut i = 0;
    'statements: while i < body.len() {
        // A product: tiles staged in shared memory.
        if cuts[i]
            && cuts[i + 1]
            && let Some(c) = Contraction::recognize(prog, &body[i])
        {
            flush_fused(&mut kernels, &mut fused);
            flush(&mut kernels, &mut serial);
            kernels.push(c.kernel(prog, kernels.len()));
            i += 1;
            continue 'statements;
        }
        // A long reduction into few cells: a block per cell.
        for len in [1, 3] {
            if i + len <= body.len()
                && cuts[i]
                && cuts[i + len]
                && let Some(r) = Reduction::recognize(prog, &body[i..i + len])
            {
                flush_fused(&mut kernels, &mut fused);
                flush(&mut kernels, &mut serial);
                let next = r.kernels(prog, kernels.len());
                kernels.extend(next);
                i += len;
                continue 'statements;
            }
        }
        match &body[i] {
            s @ Stmt::For { parallel: true, .. } if cuts[i] && cuts[i + 1] => {
                flush(&mut kernels, &mut serial);
                // Consecutive nests over the same cells, each thread touching only its own
                // cells of what they share: one kernel.
                if !fused.as_mut().is_some_and(|g| g.absorb(s)) {
                    flush_fused(&mut kernels, &mut fused);
                    fused = Some(Fused::new(s));
                }
            }
            s => {
                flush_fused(&mut kernels, &mut fused);
                serial.push(s.clone());
            }
        }
        i += 1;
    }
    flush_fused(&mut kernels, &mut fused);
    flush(&mut kernels, &mut serial);
    kernels
}

fn flush_fused(kernels: &mut Vec<Kernel>, fused: &mut Option<Fused>) {
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
struct Fused {
    first: Stmt,
    prefix: Prefix,
    inner: Vec<Stmt>,
    nests: usize,
}

impl Fused {
    fn new(s: &Stmt) -> Fused {
        let (prefix, inner) = prefix_of(s);
        Fused { first: s.clone(), prefix, inner: inner.to_vec(), nests: 1 }
    }

    /// Adds a nest when it runs over the same cells and no thread would touch a cell another
    /// thread writes: every tensor both sides touch, and one of them writes, is accessed at one
    /// index everywhere, and that index names each cell variable as an axis of its own.
    fn absorb(&mut self, s: &Stmt) -> bool {
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
struct Reduction<'a> {
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
    fn recognize(prog: &Program, stmts: &'a [Stmt]) -> Option<Reduction<'a>> {
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
        let worth = points >= MIN_BLOCK_REDUCTION
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
    fn kernels(&self, prog: &Program, k: usize) -> Vec<Kernel> {
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
            let mut kernel = self.pass(prog, k, 1, None, &final_store);
            kernel.name = format!("k{k}");
            return vec![kernel];
        }
        let tid = Var(prog.next_var);
        let scale = |i: &Index, s: i64| {
            Index::new(i.terms.iter().map(|&(c, x)| (c * s, x)).collect(), i.offset * s)
        };
        let gv = Var(prog.next_var + 2);
        let mut slot = scale(&cell_at, g as i64);
        slot.terms.push((1, IdxVar::Loop(gv)));
        let slot = Index::new(slot.terms, slot.offset);
        let first = self.pass(prog, k, g, Some(gv), &|value: Expr| Stmt::Set {
            node: partial,
            idx: vec![slot.clone()],
            value,
        });
        // The second kernel: thread t < g reads partial result t of its cell.
        let mut own = scale(&cell_at, g as i64);
        own.terms.push((1, IdxVar::Loop(tid)));
        let own = Index::new(own.terms, own.offset);
        let load = Stmt::If {
            guards: vec![Guard { index: Index::var(tid), bound: g }],
            body: vec![Stmt::SetLocal { local: self.local, value: Expr::Get(partial, vec![own]) }],
        };
        let second = self.combine(prog, k + 1, vec![load], &final_store);
        let scratch = SharedArray { node: partial, prec, len: n_cells * g };
        let mut first = first;
        first.name = format!("k{k}");
        first.scratch = vec![scratch.clone()];
        let mut second = second;
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
        let mut kernel = self.combine_blocks(prog, k, g, block_var, fold, store);
        kernel.threads = (self.cells.iter().map(|c| c.1).product::<usize>() * b * g) as u64;
        kernel
    }

    /// One block per cell: `fold` leaves each thread's share in the local, the block combines.
    fn combine(
        &self,
        prog: &Program,
        k: usize,
        fold: Vec<Stmt>,
        store: &dyn Fn(Expr) -> Stmt,
    ) -> Kernel {
        self.combine_blocks(prog, k, 1, None, fold, store)
    }

    fn combine_blocks(
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
            threads: (n_cells * b) as u64,
            block: BLOCK,
            shared: vec![SharedArray { node: shared, prec, len: b }],
            scratch: vec![],
            locals: vec![(other, prec)],
            body,
        }
    }
}

/// Tile side of the contraction kernel: 16 × 16 cells per block of 256 threads.
pub const TILE: usize = 16;
/// Multiply-adds below which a product stays one thread per cell.
pub const MIN_TILED_STEPS: usize = 16 * 1024;

/// `for <parallel batch loops> { for i { for j { t := start; for k { t := fma(a, b, t) }
/// c[.., i, j] := t } } }` (or `t + a·b`), where `a` is a read that depends on `i` and `k` but not
/// `j`, `b` one on `k` and `j` but not `i`: a (batched) matrix product.
struct Contraction<'a> {
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
    fn recognize(prog: &Program, s: &'a Stmt) -> Option<Contraction<'a>> {
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
            && cells.iter().all(|c| sole(c.0))
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
    fn kernel(&self, prog: &Program, k: usize) -> Kernel {
        let reg = if self.i.1 >= 4 * TILE && self.j.1 >= 4 * TILE { 4 } else { 1 };
        let t = TILE as i64;
        let side = TILE * reg;
        let v0 = prog.next_var;
        let (tid, ty, tx, ti, tj, q, kk) =
            (Var(v0), Var(v0 + 1), Var(v0 + 2), Var(v0 + 3), Var(v0 + 4), Var(v0 + 5), Var(v0 + 6));
        let (sa, sb) = (prog.fresh_node_id(), NodeId(prog.fresh_node_id().0 + 1));
        let (ni, nj) = (self.i.1.div_ceil(side), self.j.1.div_ceil(side));
        let blocks_per_batch = (ni * nj) as u64;
        let block = (TILE * TILE) as u64;
        let mut body = vec![
            KStmt::ThreadInBlock { var: tid },
            KStmt::InBlock { var: ty, stride: TILE as u32, extent: TILE as u32 },
            KStmt::InBlock { var: tx, stride: 1, extent: TILE as u32 },
        ];
        let n_batch: u64 = self.batch.iter().map(|b| b.1 as u64).product();
        let mut stride = n_batch * blocks_per_batch;
        for (var, extent) in &self.batch {
            stride /= *extent as u64;
            body.push(KStmt::Coord { var: *var, stride: stride * block, extent: *extent as u64 });
        }
        body.push(KStmt::Coord { var: ti, stride: nj as u64 * block, extent: ni as u64 });
        body.push(KStmt::Coord { var: tj, stride: block, extent: nj as u64 });
        let lin = |terms: &[(i64, Var)], off: i64| {
            Index::new(terms.iter().map(|&(c, v)| (c, IdxVar::Loop(v))).collect(), off)
        };
        let side_i = side as i64;
        // The thread's r-th row and c-th column of the result.
        let row = |r: usize| lin(&[(side_i, ti), (1, ty)], t * r as i64);
        let col = |c: usize| lin(&[(side_i, tj), (1, tx)], t * c as i64);
        let subst_idx = |idx: &[Index], f: &dyn Fn(Var) -> Option<Index>| -> Vec<Index> {
            idx.iter().map(|i| i.subst(&|v| f(v))).collect()
        };
        let cell = |r: usize, c: usize| {
            let (ri, ci) = (row(r), col(c));
            move |v: Var| {
                if v == self.i.0 {
                    Some(ri.clone())
                } else if v == self.j.0 {
                    Some(ci.clone())
                } else {
                    None
                }
            }
        };
        let in_cell = |r: usize, c: usize| {
            vec![Guard { index: row(r), bound: self.i.1 }, Guard { index: col(c), bound: self.j.1 }]
        };
        // One accumulator per cell of the register tile: the program's local for a 1 × 1 tile,
        // locals of the kernel's own otherwise.
        let prec = prog.locals[self.local.0 as usize];
        let first_own = prog.locals.len() as u32;
        let acc = |r: usize, c: usize| {
            if reg == 1 { self.local } else { LocalId(first_own + (r * reg + c) as u32) }
        };
        let cells: Vec<(usize, usize)> =
            (0..reg).flat_map(|r| (0..reg).map(move |c| (r, c))).collect();
        for &(r, c) in &cells {
            body.push(KStmt::Run(Stmt::SetLocal { local: acc(r, c), value: Expr::Const(0.0) }));
            if let Expr::Get(n, i) = self.start {
                body.push(KStmt::Run(Stmt::If {
                    guards: in_cell(r, c),
                    body: vec![Stmt::SetLocal {
                        local: acc(r, c),
                        value: Expr::Get(*n, subst_idx(i, &cell(r, c))),
                    }],
                }));
            }
        }
        let (kv, ke) = self.k;
        let (an, bn) = (self.a.0, self.b.0);
        // Thread (ty, tx) copies a[row(r), 16q + tx] to As[ty + 16r][tx] and
        // b[16q + ty, col(c)] to Bs[ty][tx + 16c].
        let ka = lin(&[(t, q), (1, tx)], 0);
        let kb = lin(&[(t, q), (1, ty)], 0);
        let mut tiles = Vec::new();
        for r in 0..reg {
            let f = cell(r, 0);
            let a_idx = subst_idx(&self.a.1, &|v| if v == kv { Some(ka.clone()) } else { f(v) });
            tiles.push(KStmt::Run(Stmt::If {
                guards: vec![
                    Guard { index: row(r), bound: self.i.1 },
                    Guard { index: ka.clone(), bound: ke },
                ],
                body: vec![Stmt::Set {
                    node: sa,
                    idx: vec![lin(&[(t, ty), (1, tx)], t * t * r as i64)],
                    value: Expr::Get(an, a_idx),
                }],
            }));
        }
        for c in 0..reg {
            let f = cell(0, c);
            let b_idx = subst_idx(&self.b.1, &|v| if v == kv { Some(kb.clone()) } else { f(v) });
            tiles.push(KStmt::Run(Stmt::If {
                guards: vec![
                    Guard { index: kb.clone(), bound: ke },
                    Guard { index: col(c), bound: self.j.1 },
                ],
                body: vec![Stmt::Set {
                    node: sb,
                    idx: vec![lin(&[(side_i, ty), (1, tx)], t * c as i64)],
                    value: Expr::Get(bn, b_idx),
                }],
            }));
        }
        tiles.push(KStmt::Barrier);
        // As is [16·reg rows][16], Bs is [16][16·reg columns].
        let mut steps = Vec::new();
        for &(r, c) in &cells {
            let a_at = vec![lin(&[(t, ty), (1, kk)], t * t * r as i64)];
            let b_at = vec![lin(&[(side_i, kk), (1, tx)], t * c as i64)];
            let update = replace_reads(self.update.clone(), &|n| {
                if n == an {
                    Some(Expr::Get(sa, a_at.clone()))
                } else if n == bn {
                    Some(Expr::Get(sb, b_at.clone()))
                } else {
                    None
                }
            });
            let update = replace_local(update, self.local, acc(r, c));
            steps.push(Stmt::SetLocal { local: acc(r, c), value: update });
        }
        tiles.push(KStmt::Run(Stmt::For {
            var: kk,
            extent: TILE,
            limit: None,
            parallel: false,
            body: vec![Stmt::If {
                guards: vec![Guard { index: lin(&[(t, q), (1, kk)], 0), bound: ke }],
                body: steps,
            }],
        }));
        tiles.push(KStmt::Barrier);
        body.push(KStmt::Loop { var: q, extent: ke.div_ceil(TILE), body: tiles });
        for &(r, c) in &cells {
            body.push(KStmt::Run(Stmt::If {
                guards: in_cell(r, c),
                body: vec![Stmt::Set {
                    node: self.node,
                    idx: subst_idx(self.idx, &cell(r, c)),
                    value: Expr::Local(acc(r, c)),
                }],
            }));
        }
        let mut run: Vec<Stmt> = Vec::new();
        collect_runs(&body, &mut run);
        let buffers: Vec<NodeId> =
            nodes_of(&run).into_iter().filter(|n| *n != sa && *n != sb).collect();
        let shared = |node: NodeId, of: NodeId| SharedArray {
            node,
            prec: prog.nodes[&of].prec,
            len: TILE * side,
        };
        let locals =
            if reg == 1 { vec![] } else { cells.iter().map(|&(r, c)| (acc(r, c), prec)).collect() };
        Kernel {
            name: format!("k{k}"),
            buffers,
            threads: n_batch * blocks_per_batch * block,
            block: block as u32,
            shared: vec![shared(sa, an), shared(sb, bn)],
            scratch: vec![],
            locals,
            body,
        }
    }
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

/// The per-thread statements of a kernel body, in order.
pub fn collect_runs(stmts: &[KStmt], out: &mut Vec<Stmt>) {
    for s in stmts {
        match s {
            KStmt::Run(s) => out.push(s.clone()),
            KStmt::If { body, .. } | KStmt::Loop { body, .. } => collect_runs(body, out),
            _ => {}
        }
    }
}

fn flush(kernels: &mut Vec<Kernel>, serial: &mut Vec<Stmt>) {
    if serial.iter().any(|s| !matches!(s, Stmt::Comment(_))) {
        kernels.push(kernel(kernels.len(), serial));
    }
    serial.clear();
}

/// One thread per cell of the leading parallel loops of `body` (one thread when it has none).
fn kernel(k: usize, body: &[Stmt]) -> Kernel {
    let mut prefix: Vec<(Var, usize, Option<Limit>)> = Vec::new();
    let mut inner = body;
    while let [Stmt::For { var, extent, limit, parallel: true, body }] = inner {
        prefix.push((*var, *extent, *limit));
        inner = body;
    }
    let threads: u64 = prefix.iter().map(|(_, e, _)| *e as u64).product();
    let mut stmts = Vec::new();
    if prefix.is_empty() {
        stmts.push(KStmt::ExitUnless(KCond::First));
    } else {
        stmts.push(KStmt::ExitUnless(KCond::GlobalBelow(threads)));
        let mut stride = threads;
        for (var, extent, limit) in &prefix {
            stride /= *extent as u64;
            stmts.push(KStmt::Coord { var: *var, stride, extent: *extent as u64 });
            if let Some(l) = limit {
                stmts.push(KStmt::ExitUnless(KCond::BelowLimit(*var, *l)));
            }
        }
    }
    stmts.extend(inner.iter().cloned().map(KStmt::Run));
    let threads = threads.max(1);
    Kernel {
        name: format!("k{k}"),
        buffers: nodes_of(body),
        threads,
        block: BLOCK.min(threads as u32),
        shared: Vec::new(),
        scratch: Vec::new(),
        locals: Vec::new(),
        body: stmts,
    }
}

impl SharedArray {
    /// The array as a one-axis tensor node (for printing and simulating).
    pub fn tensor(&self, label: &str) -> crate::tnode::TensorNode {
        crate::tnode::TensorNode::new(
            self.node,
            label,
            &[self.len],
            self.prec,
            crate::tnode::MemoryMode::Local,
        )
    }
}

impl Kernel {
    /// Blocks of the launch.
    pub fn blocks(&self) -> u64 {
        self.threads.div_ceil(u64::from(self.block.max(1))).max(1)
    }

    /// Shared memory per block, in bytes.
    pub fn shared_bytes(&self) -> usize {
        self.shared.iter().map(|s| s.len * s.prec.size_in_bytes()).sum()
    }
}

impl fmt::Display for KCond {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            KCond::GlobalBelow(n) => write!(f, "gid < {n}"),
            KCond::First => write!(f, "first thread"),
            KCond::BelowLimit(v, l) => write!(f, "{v} < ceil({l})"),
        }
    }
}

impl fmt::Display for Kernel {
    /// The stable printer: the launch, shared arrays, then the body.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let bufs: Vec<String> = self.buffers.iter().map(|n| n.to_string()).collect();
        writeln!(
            f,
            "kernel {}({}) threads {} in blocks of {}",
            self.name,
            bufs.join(", "),
            self.threads,
            self.block
        )?;
        for s in &self.shared {
            writeln!(f, "  shared {} {}[{}]", s.prec.name(), s.node, s.len)?;
        }
        for s in &self.scratch {
            writeln!(f, "  scratch {} {}[{}]", s.prec.name(), s.node, s.len)?;
        }
        for (l, p) in &self.locals {
            writeln!(f, "  local {} {l}", p.name())?;
        }
        fmt_body(f, &self.body, 1)
    }
}

fn fmt_body(f: &mut fmt::Formatter<'_>, body: &[KStmt], depth: usize) -> fmt::Result {
    let pad = "  ".repeat(depth);
    for s in body {
        match s {
            KStmt::Coord { var, stride, extent } => {
                writeln!(f, "{pad}{var} := gid / {stride} % {extent}")?
            }
            KStmt::ThreadInBlock { var } => writeln!(f, "{pad}{var} := thread in block")?,
            KStmt::InBlock { var, stride, extent } => {
                writeln!(f, "{pad}{var} := thread in block / {stride} % {extent}")?
            }
            KStmt::Loop { var, extent, body } => {
                writeln!(f, "{pad}for {var} in 0..{extent} together {{")?;
                fmt_body(f, body, depth + 1)?;
                writeln!(f, "{pad}}}")?;
            }
            KStmt::ExitUnless(c) => writeln!(f, "{pad}exit unless {c}")?,
            KStmt::Run(s) => {
                let mut text = String::new();
                crate::low_level::print_stmt(&mut text, s, depth);
                f.write_str(&text)?;
            }
            KStmt::Barrier => writeln!(f, "{pad}barrier")?,
            KStmt::If { guards, body } => {
                let g: Vec<String> =
                    guards.iter().map(|g| format!("0 <= {} < {}", g.index, g.bound)).collect();
                writeln!(f, "{pad}if {} {{", g.join(" && "))?;
                fmt_body(f, body, depth + 1)?;
                writeln!(f, "{pad}}}")?;
            }
            KStmt::AtomicAdd { node, idx, value } => {
                let i: Vec<String> = idx.iter().map(|i| i.to_string()).collect();
                writeln!(f, "{pad}atomic {node}[{}] += {value}", i.join(", "))?;
            }
            KStmt::ShuffleDown { dst, src, offset } => {
                writeln!(f, "{pad}{dst} := shuffle down {offset} of {src}")?
            }
        }
    }
    Ok(())
}

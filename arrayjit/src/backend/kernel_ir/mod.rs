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

mod fuse;
mod reduce;
mod tile;

use crate::low_level::{Guard, Index, Limit, LocalId, Program, Stmt, Var, cut_points, nodes_of};
use crate::ops::Prec;
use crate::tnode::NodeId;

use fuse::{Fused, flush_fused};
use reduce::Reduction;
pub use reduce::{
    DEVICE_BLOCKS, MAX_BLOCK_REDUCTION_CELLS, MIN_BLOCK_REDUCTION, MIN_POINTS_PER_THREAD,
};
use tile::Contraction;
pub use tile::{MIN_TILED_STEPS, TILE};

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
                if !fused.as_mut().is_some_and(|g| g.absorb(prog, s)) {
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
pub(crate) fn kernel(k: usize, body: &[Stmt]) -> Kernel {
    let mut prefix: Vec<(Var, usize, Option<Limit>)> = Vec::new();
    let mut inner = body;
    while let [Stmt::For { var, extent, limit, parallel: true, body }] = inner {
        prefix.push((*var, *extent, *limit));
        inner = body;
    }
    let threads: u64 = prefix.iter().map(|(_, e, _)| *e as u64).product();
    let mut stmts = Vec::new();
    if !prefix.is_empty() && threads == 0 {
        // An empty nest: one thread that stops at once.
        stmts.push(KStmt::ExitUnless(KCond::GlobalBelow(0)));
    } else if prefix.is_empty() {
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

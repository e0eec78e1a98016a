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
//! [`BLOCK`] threads, the rest of the nest runs inside each thread; statements outside parallel
//! loops are grouped into single-thread kernels, in order (as is a parallel nest that reads a
//! local assigned before it: locals do not cross kernels).

use std::fmt;

use crate::low_level::{Guard, Index, Limit, Program, Stmt, Var, cut_points, nodes_of};
use crate::ops::Prec;
use crate::tnode::NodeId;

/// Threads per block.
pub const BLOCK: u32 = 256;

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
    let cuts = cut_points(&prog.body);
    for (i, s) in prog.body.iter().enumerate() {
        match s {
            Stmt::For { parallel: true, .. } if cuts[i] && cuts[i + 1] => {
                flush(&mut kernels, &mut serial);
                kernels.push(kernel(kernels.len(), std::slice::from_ref(s)));
            }
            s => serial.push(s.clone()),
        }
    }
    flush(&mut kernels, &mut serial);
    kernels
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
        body: stmts,
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
        }
    }
    Ok(())
}

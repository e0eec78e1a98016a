//! CUDA C for a program: one kernel per top-level loop nest.
//!
//! The leading parallel loops of a nest (those whose iterations write distinct cells) are
//! flattened into one global thread index, mapped onto a 1-d grid of blocks of
//! [`BLOCK`] threads; the rest of the nest — reduction loops with their scalar accumulators,
//! guards — runs inside each thread. A reduction is therefore computed by the single thread
//! owning its output cell: no two threads write one cell, no atomics, no races. Top-level
//! statements outside parallel loops are grouped into single-thread kernels, in order; so is a
//! parallel nest that reads a local assigned before it (locals do not cross kernels).

use std::fmt::Write as _;

use crate::backend::c_syntax::{CRenderer, Dialect, nodes_of, prelude, storage_ctype};
use crate::low_level::{Limit, Program, Stmt, Var, cut_points};
use crate::tnode::NodeId;

/// Threads per block.
pub const BLOCK: u32 = 256;

/// One kernel of a rendered program.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Kernel {
    /// The kernel's name.
    pub name: String,
    /// The buffer arguments, in order (then one `long long` per runtime symbol slot).
    pub buffers: Vec<NodeId>,
    /// Total threads (the product of the flattened parallel loops' extents; 1 when serial).
    pub threads: u64,
}

/// The CUDA C of a program and its kernels in launch order.
#[derive(Clone, Debug)]
pub struct CudaSource {
    /// The translation unit.
    pub source: String,
    /// The kernels, in the order they are launched.
    pub kernels: Vec<Kernel>,
}

/// Renders a program as CUDA C.
pub fn render(prog: &Program) -> CudaSource {
    let r = CRenderer { prog, dialect: Dialect::Cuda, bounds_check: false };
    let mut out = prelude(Dialect::Cuda);
    let mut kernels = Vec::new();
    let mut serial: Vec<Stmt> = Vec::new();
    // A kernel cannot see another kernel's locals: a parallel nest is a kernel of its own only
    // where no local is live across its boundaries.
    let cuts = cut_points(&prog.body);
    for (i, s) in prog.body.iter().enumerate() {
        match s {
            Stmt::For { parallel: true, .. } if cuts[i] && cuts[i + 1] => {
                flush(&r, &mut out, &mut kernels, &mut serial);
                kernel(&r, &mut out, &mut kernels, std::slice::from_ref(s));
            }
            s => serial.push(s.clone()),
        }
    }
    flush(&r, &mut out, &mut kernels, &mut serial);
    CudaSource { source: out, kernels }
}

fn flush(r: &CRenderer<'_>, out: &mut String, kernels: &mut Vec<Kernel>, serial: &mut Vec<Stmt>) {
    if serial.iter().any(|s| !matches!(s, Stmt::Comment(_))) {
        kernel(r, out, kernels, serial);
    }
    serial.clear();
}

fn kernel(r: &CRenderer<'_>, out: &mut String, kernels: &mut Vec<Kernel>, body: &[Stmt]) {
    let name = format!("k{}", kernels.len());
    let buffers = nodes_of(body);
    // The flattened parallel prefix.
    let mut prefix: Vec<(Var, usize, Option<Limit>)> = Vec::new();
    let mut inner = body;
    while let [Stmt::For { var, extent, limit, parallel: true, body }] = inner {
        prefix.push((*var, *extent, *limit));
        inner = body;
    }
    let mut params: Vec<String> = buffers
        .iter()
        .map(|n| {
            let ty = storage_ctype(r.prog.nodes[n].prec);
            format!("{ty} *__restrict__ {}", CRenderer::ptr_name(*n))
        })
        .collect();
    params.extend((0..r.prog.runtime_symbols.len()).map(|k| format!("long long sym{k}")));
    let _ = writeln!(out, "\nextern \"C\" __global__ void {name}({}) {{", params.join(", "));
    let threads: u64 = prefix.iter().map(|(_, e, _)| *e as u64).product();
    if prefix.is_empty() {
        let _ = writeln!(out, "  if (blockIdx.x != 0 || threadIdx.x != 0) return;");
    } else {
        let _ = writeln!(
            out,
            "  long long gid = (long long)blockIdx.x * blockDim.x + threadIdx.x;\n  if (gid >= {threads}LL) return;"
        );
        let mut stride: u64 = threads;
        for (v, e, limit) in &prefix {
            stride /= *e as u64;
            let _ = writeln!(out, "  long long {v} = (gid / {stride}LL) % {e}LL;");
            // A dynamic batch's threads past its rows have nothing to compute.
            if let Some(l) = limit {
                let slot = r.prog.symbol_slot(l.size).unwrap_or(0);
                let _ = writeln!(
                    out,
                    "  if ({v} >= (sym{slot} + {}LL) / {}LL) return;",
                    l.per - 1,
                    l.per
                );
            }
        }
    }
    r.declarations(out, inner, 1);
    r.stmts(out, inner, 1);
    out.push_str("}\n");
    kernels.push(Kernel { name, buffers, threads: threads.max(1) });
}

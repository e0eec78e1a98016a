//! CUDA C for a program: the kernels of the kernel IR ([`crate::backend::kernel_ir`]),
//! printed.
//!
//! The printer adds no logic: each kernel-level statement has one spelling (a thread's
//! coordinates from its global index, early returns, `__syncthreads()`, `atomicAdd`, shared
//! arrays as `__shared__` arrays), and per-thread statements are printed by the C-family
//! renderer shared with the CPU backends.

use std::fmt::Write as _;

use crate::backend::c_syntax::{CRenderer, Dialect, prelude, storage_ctype};
use crate::backend::kernel_ir::{self, KCond, KStmt, Kernel};
use crate::low_level::{Program, Stmt};
use crate::ops::Prec;

pub use kernel_ir::BLOCK;

/// The CUDA C of a program and its kernels in launch order.
#[derive(Clone, Debug)]
pub struct CudaSource {
    /// The translation unit.
    pub source: String,
    /// The kernels, in the order they are launched.
    pub kernels: Vec<Kernel>,
    /// Where each kernel's text lies in `source` (after the shared prelude, which ends where
    /// the first begins): a unit of any run of kernels is the prelude and their text.
    pub spans: Vec<std::ops::Range<usize>>,
}

impl CudaSource {
    /// The kernels split into translation units of about `bytes` of kernel text each, in
    /// launch order: each unit's source (the prelude and its kernels) and its kernels' indices.
    /// The split depends on the text alone, so the same program always gives the same units
    /// (and the same compile-cache keys) on any machine.
    pub fn units(&self, bytes: usize) -> Vec<(String, std::ops::Range<usize>)> {
        let prelude_end = self.spans.first().map_or(self.source.len(), |r| r.start);
        let prelude = &self.source[..prelude_end];
        let mut units = Vec::new();
        let mut first = 0;
        for (i, span) in self.spans.iter().enumerate() {
            let size = span.end - self.spans[first].start;
            if size >= bytes || i + 1 == self.spans.len() {
                let text = &self.source[self.spans[first].start..span.end];
                units.push((format!("{prelude}{text}"), first..i + 1));
                first = i + 1;
            }
        }
        if units.is_empty() {
            units.push((self.source.clone(), 0..0));
        }
        units
    }
}

/// Renders a program as CUDA C: its kernels ([`kernel_ir::lower`]), printed.
pub fn render(prog: &Program) -> CudaSource {
    render_kernels(prog, kernel_ir::lower(prog))
}

/// Prints kernels over a program's tensors, locals and runtime symbols as CUDA C.
pub fn render_kernels(prog: &Program, kernels: Vec<Kernel>) -> CudaSource {
    // Shared arrays are printed as the per-thread statements print tensors.
    let mut prog = prog.clone();
    for s in kernels.iter().flat_map(|k| k.shared.iter().chain(&k.scratch)) {
        prog.nodes.entry(s.node).or_insert_with(|| s.tensor("shared"));
    }
    let program_locals = prog.locals.len();
    let mut out = prelude(Dialect::Cuda);
    let mut spans = Vec::with_capacity(kernels.len());
    for k in &kernels {
        let start = out.len();
        // A kernel's own locals are printed as the program's are: with their precisions.
        let own = k.locals.iter().map(|(l, _)| l.0 as usize + 1).max().unwrap_or(0);
        if own > prog.locals.len() {
            prog.locals.resize(own, Prec::F64);
        }
        for (l, p) in &k.locals {
            prog.locals[l.0 as usize] = *p;
        }
        let r = CRenderer {
            prog: &prog,
            dialect: Dialect::Cuda,
            bounds_check: false,
            seed_numbers: false,
        };
        kernel(&r, &mut out, k);
        spans.push(start..out.len());
        prog.locals.truncate(program_locals);
    }
    CudaSource { source: out, kernels, spans }
}

fn kernel(r: &CRenderer<'_>, out: &mut String, k: &Kernel) {
    let mut params: Vec<String> = k
        .buffers
        .iter()
        .map(|n| {
            let ty = storage_ctype(r.prog.nodes[n].prec);
            format!("{ty} *__restrict__ {}", CRenderer::ptr_name(*n))
        })
        .collect();
    params.extend((0..r.prog.runtime_symbols.len()).map(|s| format!("long long sym{s}")));
    let _ = writeln!(out, "\nextern \"C\" __global__ void {}({}) {{", k.name, params.join(", "));
    for s in &k.shared {
        let ty = storage_ctype(s.prec);
        let _ = writeln!(out, "  __shared__ {ty} {}[{}];", CRenderer::ptr_name(s.node), s.len);
    }
    let uses_gid = k
        .body
        .iter()
        .any(|s| matches!(s, KStmt::Coord { .. } | KStmt::ExitUnless(KCond::GlobalBelow(_))));
    if uses_gid {
        let _ =
            writeln!(out, "  long long gid = (long long)blockIdx.x * blockDim.x + threadIdx.x;");
    }
    // The thread's coordinates and exits, then every local of its statements declared once,
    // then the rest.
    let first = k
        .body
        .iter()
        .position(|s| !matches!(s, KStmt::Coord { .. } | KStmt::ExitUnless(_)))
        .unwrap_or(k.body.len());
    body(r, out, &k.body[..first], 1);
    let mut runs: Vec<Stmt> = Vec::new();
    kernel_ir::collect_runs(&k.body, &mut runs);
    r.declarations(out, &runs, 1);
    // The kernel's own locals that no statement assigns (a shuffle's destination).
    for (l, p) in &k.locals {
        let assigned = runs.iter().any(|s| {
            let mut found = false;
            s.visit(&mut |s| found |= matches!(s, Stmt::SetLocal { local, .. } if local == l));
            found
        });
        if !assigned {
            let _ = writeln!(out, "  {} {l};", crate::backend::c_syntax::compute_ctype(*p));
        }
    }
    body(r, out, &k.body[first..], 1);
    out.push_str("}\n");
}

fn body(r: &CRenderer<'_>, out: &mut String, stmts: &[KStmt], depth: usize) {
    let pad = "  ".repeat(depth);
    for s in stmts {
        match s {
            KStmt::Coord { var, stride, extent } => {
                let _ = writeln!(out, "{pad}long long {var} = (gid / {stride}LL) % {extent}LL;");
            }
            KStmt::InBlock { var, stride, extent } => {
                let _ =
                    writeln!(out, "{pad}long long {var} = (threadIdx.x / {stride}u) % {extent}u;");
            }
            KStmt::Loop { var, extent, body: inner } => {
                let _ =
                    writeln!(out, "{pad}for (long long {var} = 0; {var} < {extent}; ++{var}) {{");
                body(r, out, inner, depth + 1);
                let _ = writeln!(out, "{pad}}}");
            }
            KStmt::ThreadInBlock { var } => {
                let _ = writeln!(out, "{pad}long long {var} = threadIdx.x;");
            }
            KStmt::ExitUnless(KCond::GlobalBelow(n)) => {
                let _ = writeln!(out, "{pad}if (gid >= {n}LL) return;");
            }
            KStmt::ExitUnless(KCond::First) => {
                let _ = writeln!(out, "{pad}if (blockIdx.x != 0 || threadIdx.x != 0) return;");
            }
            KStmt::ExitUnless(KCond::BelowLimit(v, l)) => {
                let slot = r.prog.symbol_slot(l.size).unwrap_or(0);
                let _ = writeln!(
                    out,
                    "{pad}if ({v} >= (sym{slot} + {}LL) / {}LL) return;",
                    l.per - 1,
                    l.per
                );
            }
            KStmt::Run(s) => r.stmts(out, std::slice::from_ref(s), depth),
            KStmt::Barrier => {
                let _ = writeln!(out, "{pad}__syncthreads();");
            }
            KStmt::If { guards, body: inner } => {
                let conds: Vec<String> = guards
                    .iter()
                    .map(|g| {
                        let i = r.index(&g.index);
                        format!("({i}) >= 0 && ({i}) < {}", g.bound)
                    })
                    .collect();
                let _ = writeln!(out, "{pad}if ({}) {{", conds.join(" && "));
                body(r, out, inner, depth + 1);
                let _ = writeln!(out, "{pad}}}");
            }
            KStmt::ShuffleDown { dst, src, offset } => {
                let _ =
                    writeln!(out, "{pad}{dst} = __shfl_down_sync(0xffffffffu, {src}, {offset});");
            }
            KStmt::AtomicAdd { node, idx, value } => {
                let prec = r.prog.nodes.get(node).map_or(crate::ops::Prec::F32, |n| n.prec);
                let ty = crate::backend::c_syntax::compute_ctype(prec);
                let _ = writeln!(
                    out,
                    "{pad}atomicAdd(&{}, ({ty})({}));",
                    r.cell(*node, idx),
                    r.expr(value, ty)
                );
            }
        }
    }
}

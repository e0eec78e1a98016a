//! The CPU schedule against the interpreter: every kernel of `low_level::schedule` (in-place
//! with packing, lanes) on the layouts training and attention produce — transposed operands,
//! batched products, padded and strided convolutions and both of their gradients, row
//! reductions — at edge sizes (1, primes, sizes no tile divides), in several precisions, with
//! and without threads; plus snapshots of what each kernel looks like.

#[path = "../common/mod.rs"]
mod common;
mod map_calls;
mod products;
mod snapshots;
mod transpose;

use std::sync::Arc;

use common::*;
use expect_test::expect;
use rocannl_arrayjit::assignments::{Asgn, ScalarExpr};
use rocannl_arrayjit::indexing::{AxisIndex, Projections, Symbol};
use rocannl_arrayjit::low_level::Stmt;
use rocannl_arrayjit::low_level::schedule::{CpuSchedule, MapCalls, schedule_cpu};
use rocannl_arrayjit::low_level::verify::verify;
use rocannl_arrayjit::ops::{BinOp, Prec};
use rocannl_arrayjit::tnode::{NodeId, NodeTable};
use rocannl_arrayjit::{BackendKind, CompileOptions, NdArray, compile_program};

/// An axis index written like `2*o + k - 1` over single-letter iterators.
fn ax(s: &str, letters: &str) -> AxisIndex {
    let mut terms = Vec::new();
    let mut offset = 0;
    let s = s.replace(' ', "").replace('-', "+-");
    for part in s.split('+').filter(|p| !p.is_empty()) {
        let (neg, p) = match part.strip_prefix('-') {
            Some(p) => (-1, p),
            None => (1, part),
        };
        let (c, name) = match p.split_once('*') {
            Some((c, n)) => (c.parse::<i64>().unwrap(), n),
            None => (1, p),
        };
        match name.parse::<i64>() {
            Ok(n) => offset += neg * n,
            Err(_) => {
                let pos = letters.find(name).unwrap_or_else(|| panic!("unknown iterator {name}"));
                terms.push((neg * c, Symbol(pos as u32)));
            }
        }
    }
    AxisIndex::affine(terms, offset)
}

/// One tensor of a contraction: dims, index per axis (comma-separated), precision.
struct Arg<'a>(&'a [usize], &'a str, Prec);

/// `out[..] op= Π args[..]` (product of the arguments, or the single argument) over the
/// iterators `letters` with `extents`; `init` starts from the neutral element, otherwise the
/// output's initial values are data too.
fn contraction(
    name: &str,
    letters: &str,
    extents: &[usize],
    out: Arg<'_>,
    args: &[Arg<'_>],
    op: BinOp,
    init: bool,
) -> Case {
    let expr = (1..args.len())
        .fold(ScalarExpr::Arg(0), |e, k| ScalarExpr::bin(BinOp::Mul, e, ScalarExpr::Arg(k)));
    accumulation(name, letters, extents, out, args, expr, op, init)
}

/// `out[..] op= expr(args[..])`, as [`contraction`] for any expression of the arguments.
#[allow(clippy::too_many_arguments)]
fn accumulation(
    name: &str,
    letters: &str,
    extents: &[usize],
    out: Arg<'_>,
    args: &[Arg<'_>],
    expr: ScalarExpr,
    op: BinOp,
    init: bool,
) -> Case {
    let mut nodes = NodeTable::default();
    let idx = |s: &str| s.split(',').map(|a| ax(a, letters)).collect::<Vec<_>>();
    let ids: Vec<NodeId> = args
        .iter()
        .enumerate()
        .map(|(k, a)| host(&mut nodes, &format!("x{k}"), a.0, a.2))
        .collect();
    let y = host(&mut nodes, "y", out.0, out.2);
    let space: Vec<(Symbol, usize)> =
        extents.iter().enumerate().map(|(k, d)| (Symbol(k as u32), *d)).collect();
    let p = Projections {
        product_space: space.iter().map(|(_, d)| *d).collect(),
        product_iterators: space.iter().map(|(s, _)| *s).collect(),
        lhs_dims: out.0.to_vec(),
        rhs_dims: args.iter().map(|a| a.0.to_vec()).collect(),
        project_lhs: idx(out.1),
        project_rhs: args.iter().map(|a| idx(a.1)).collect(),
        debug_info: name.to_string(),
        dynamic: vec![],
    };
    let mut inputs: Vec<(NodeId, Vec<f64>)> = args
        .iter()
        .zip(&ids)
        .enumerate()
        .map(|(k, (a, id))| {
            let n = a.0.iter().product();
            (*id, data(n, 40 + k as u64, -1.0, 1.0).iter().map(|v| a.2.round(*v)).collect())
        })
        .collect();
    if !init {
        let n = out.0.iter().product();
        inputs.push((y, data(n, 99, -1.0, 1.0).iter().map(|v| out.2.round(*v)).collect()));
    }
    Case {
        name: name.to_string(),
        asgn: Asgn::Accum {
            lhs: y,
            accum: Some(op),
            rhs: ids,
            expr,
            projections: Arc::new(p),
            initialize_neutral: init,
        },
        nodes,
        inputs,
        outputs: vec![y],
        bindings: vec![],
        expected: None,
    }
}

/// The optimized program after the CPU schedule (verified).
fn scheduled(case: &Case) -> String {
    let mut prog =
        compile_program(&case.name, &case.asgn, &case.nodes, &CompileOptions::default()).unwrap();
    schedule_cpu(&mut prog, &Default::default());
    verify(&prog, "schedule").unwrap();
    prog.to_string()
}

/// Which kernel the schedule chose: "gemm" (a call of the shape-generic product), "packed" (in
/// place with a packed operand), "lanes", "in place" or "as lowered".
fn kernel(case: &Case) -> &'static str {
    if generated_kernel(case, true) == "gemm" { "gemm" } else { generated_kernel(case, false) }
}

/// The kernel chosen with or without calls of the shape-generic product.
fn generated_kernel(case: &Case, kernel_calls: bool) -> &'static str {
    let mut prog =
        compile_program(&case.name, &case.asgn, &case.nodes, &CompileOptions::default()).unwrap();
    let before = prog.to_string();
    schedule_cpu(&mut prog, &CpuSchedule { threads: 2, kernel_calls, ..CpuSchedule::default() });
    verify(&prog, "schedule").unwrap();
    if prog.body.iter().any(|s| {
        let mut found = false;
        s.visit(&mut |s| found |= matches!(s, Stmt::Gemm(_)));
        found
    }) {
        "gemm"
    } else if prog.scratch.iter().any(|s| s.per_thread) {
        "lanes"
    } else if !prog.scratch.is_empty() {
        "packed"
    } else if prog.to_string() != before {
        "in place"
    } else {
        "as lowered"
    }
}

/// gccjit (default options, one thread, and every nest split across three threads; with the
/// shape-generic product and with generated kernels only) against the interpreter. A product
/// the kernel computes gives the interpreter's bits exactly.
fn check(case: &Case) {
    let want = run_case(BackendKind::Interp, CompileOptions::default(), case);
    let tol = tolerance(case_prec(case)).max(1e-4 * f64::from(case_prec(case) == Prec::F32));
    let exact = kernel(case) == "gemm";
    for kernel_calls in [true, false] {
        for opts in [
            CompileOptions::default(),
            CompileOptions { threads: Some(1), ..CompileOptions::default() },
            CompileOptions { threads: Some(3), min_parallel_work: 1, ..CompileOptions::default() },
        ] {
            let got = run_case(BackendKind::Gccjit, CompileOptions { kernel_calls, ..opts }, case);
            if exact && kernel_calls {
                assert_eq!(bits(&got[0]), bits(&want[0]), "{}", case.name);
            } else {
                assert_close(&case.name, &got[0], &want[0], tol);
            }
        }
    }
}

fn bits(a: &[f64]) -> Vec<u64> {
    a.iter().map(|x| x.to_bits()).collect()
}

/// `c[i,j] = Σ_k a[i,k]·b[j,k]` (weights stored `[out, in]`, attention scores).
fn abt(m: usize, k: usize, n: usize, prec: Prec, init: bool) -> Case {
    contraction(
        &format!("abt_{m}x{k}x{n}_{}_{init}", prec.name()),
        "ijk",
        &[m, n, k],
        Arg(&[m, n], "i,j", prec),
        &[Arg(&[m, k], "i,k", prec), Arg(&[n, k], "j,k", prec)],
        BinOp::Add,
        init,
    )
}

/// `c[i,j] = Σ_k a[k,i]·b[k,j]` (weight gradients: the batch is the reduction).
fn atb(m: usize, k: usize, n: usize, prec: Prec, init: bool) -> Case {
    contraction(
        &format!("atb_{m}x{k}x{n}_{}_{init}", prec.name()),
        "ijk",
        &[m, n, k],
        Arg(&[m, n], "i,j", prec),
        &[Arg(&[k, m], "k,i", prec), Arg(&[k, n], "k,j", prec)],
        BinOp::Add,
        init,
    )
}

/// A padded (`pad`) or valid 2-d convolution with stride `s`, channels last, kernel
/// `[d, kh, kw, c]`.
fn conv2d(b: usize, hw: usize, c: usize, d: usize, s: usize, pad: usize, prec: Prec) -> Case {
    let o = (hw + 2 * pad - 3) / s + 1;
    let h = format!("{s}*h + i - {pad}");
    let w = format!("{s}*w + j - {pad}");
    contraction(
        &format!("conv_b{b}_hw{hw}_c{c}_d{d}_s{s}_p{pad}_{}", prec.name()),
        "nhwdijc",
        &[b, o, o, d, 3, 3, c],
        Arg(&[b, o, o, d], "n,h,w,d", prec),
        &[Arg(&[b, hw, hw, c], &format!("n,{h},{w},c"), prec), Arg(&[d, 3, 3, c], "d,i,j,c", prec)],
        BinOp::Add,
        true,
    )
}

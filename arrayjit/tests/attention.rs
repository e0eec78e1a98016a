//! The fused attention assignment on every path: the native backend's kernel call, and the
//! ordinary nests every other backend runs (the interpreter, the CUDA simulator, native code in
//! bounds-check mode, and any precision but `f32`). Each against a plain `f64` attention and
//! its analytic gradients written here, with one or two batch axes, causal or not, and a
//! dynamic batch that stops short of its maximum.

mod common;

use common::*;
use rocannl_arrayjit::assignments::{Asgn, AttentionAsgn, AttentionGrads, FetchOp};
use rocannl_arrayjit::indexing::Symbol;
use rocannl_arrayjit::ops::Prec;
use rocannl_arrayjit::tnode::{NodeId, NodeTable};
use rocannl_arrayjit::{BackendKind, CompileOptions, Context};

/// The sizes of a case: batch axes, queries, keys, heads, depth, width.
#[derive(Clone, Debug)]
struct Sizes {
    batch: Vec<usize>,
    s: usize,
    t: usize,
    h: usize,
    d: usize,
    e: usize,
    causal: bool,
}

impl Sizes {
    fn dims(&self, tail: &[usize]) -> Vec<usize> {
        self.batch.iter().copied().chain(tail.iter().copied()).collect()
    }
    fn pairs(&self) -> usize {
        self.batch.iter().product::<usize>() * self.h
    }
    fn scale(&self) -> f64 {
        1.0 / (self.d as f64).sqrt()
    }
}

/// Forward and backward of `out = attention(q, k, v)` with the loss `Σ out·w`, in `f64`, per
/// (batch, head) pair: `(out, lse, dq, dk, dv)` in the tensors' layouts.
fn reference(z: &Sizes, q: &[f64], k: &[f64], v: &[f64], w: &[f64]) -> [Vec<f64>; 5] {
    let (s_n, t_n, h, d, e) = (z.s, z.t, z.h, z.d, z.e);
    let nb = z.pairs() / h;
    let mut out = vec![0.0; nb * s_n * h * e];
    let mut lse = vec![0.0; nb * s_n * h];
    let (mut dq, mut dk, mut dv) = (vec![0.0; q.len()], vec![0.0; k.len()], vec![0.0; v.len()]);
    for b in 0..nb {
        for hd in 0..h {
            let qi = |s: usize, j: usize| ((b * s_n + s) * h + hd) * d + j;
            let ki = |t: usize, j: usize| ((b * t_n + t) * h + hd) * d + j;
            let vi = |t: usize, j: usize| ((b * t_n + t) * h + hd) * e + j;
            let oi = |s: usize, j: usize| ((b * s_n + s) * h + hd) * e + j;
            for s in 0..s_n {
                let seen: Vec<usize> = (0..t_n).filter(|&t| !z.causal || t <= s).collect();
                let score =
                    |t: usize| (0..d).map(|j| q[qi(s, j)] * k[ki(t, j)]).sum::<f64>() * z.scale();
                let m = seen.iter().map(|&t| score(t)).fold(f64::MIN, f64::max);
                let l: f64 = seen.iter().map(|&t| (score(t) - m).exp()).sum();
                lse[(b * s_n + s) * h + hd] = m + l.ln();
                let p = |t: usize| (score(t) - m).exp() / l;
                for j in 0..e {
                    out[oi(s, j)] = seen.iter().map(|&t| p(t) * v[vi(t, j)]).sum();
                }
                // dP = w·vᵀ, D = Σ w·out, dS = P·(dP − D)·scale.
                let big_d: f64 = (0..e).map(|j| w[oi(s, j)] * out[oi(s, j)]).sum();
                for &t in &seen {
                    let dp: f64 = (0..e).map(|j| w[oi(s, j)] * v[vi(t, j)]).sum();
                    let ds = p(t) * (dp - big_d) * z.scale();
                    for j in 0..d {
                        dq[qi(s, j)] += ds * k[ki(t, j)];
                        dk[ki(t, j)] += ds * q[qi(s, j)];
                    }
                    for j in 0..e {
                        dv[vi(t, j)] += p(t) * w[oi(s, j)];
                    }
                }
            }
        }
    }
    [out, lse, dq, dk, dv]
}

struct Built {
    nodes: NodeTable,
    asgn: Asgn,
    /// q, k, v, w (the output's gradient).
    inputs: [NodeId; 4],
    /// out, lse, dq, dk, dv.
    outputs: [NodeId; 5],
}

/// The forward pass, the gradients zeroed, then the backward pass, in one routine.
fn build(z: &Sizes, prec: Prec, batch_limit: Option<Symbol>) -> Built {
    let mut nodes = NodeTable::default();
    let (qd, kd, vd, od) = (
        z.dims(&[z.s, z.h, z.d]),
        z.dims(&[z.t, z.h, z.d]),
        z.dims(&[z.t, z.h, z.e]),
        z.dims(&[z.s, z.h, z.e]),
    );
    let q = host(&mut nodes, "q", &qd, prec);
    let k = host(&mut nodes, "k", &kd, prec);
    let v = host(&mut nodes, "v", &vd, prec);
    let w = host(&mut nodes, "w", &od, prec);
    let out = host(&mut nodes, "out", &od, prec);
    let lse = host(&mut nodes, "lse", &z.dims(&[z.s, z.h]), prec);
    let dq = host(&mut nodes, "dq", &qd, prec);
    let dk = host(&mut nodes, "dk", &kd, prec);
    let dv = host(&mut nodes, "dv", &vd, prec);
    let fwd = AttentionAsgn {
        q,
        k,
        v,
        out,
        lse,
        causal: z.causal,
        scale: z.scale(),
        grads: None,
        batch_limit,
    };
    let grads = AttentionGrads { d_out: w, d_q: Some(dq), d_k: Some(dk), d_v: Some(dv) };
    let bwd = AttentionAsgn { grads: Some(grads), ..fwd.clone() };
    let zero = |n| Asgn::Fetch { lhs: n, fetch: FetchOp::Constant(0.0) };
    let asgn = Asgn::Seq(vec![
        Asgn::Attention(Box::new(fwd)),
        zero(dq),
        zero(dk),
        zero(dv),
        Asgn::Attention(Box::new(bwd)),
    ]);
    Built { nodes, asgn, inputs: [q, k, v, w], outputs: [out, lse, dq, dk, dv] }
}

/// Runs the case; the routine's low-level text and the outputs.
fn run(
    kind: BackendKind,
    opts: CompileOptions,
    b: &Built,
    values: &[Vec<f64>; 4],
    bindings: &[(Symbol, i64)],
) -> (String, Vec<Vec<f64>>) {
    let inputs: Vec<(NodeId, &[f64])> =
        b.inputs.iter().zip(values).map(|(&n, v)| (n, v.as_slice())).collect();
    compile_and_run(kind, opts, (&b.asgn, &b.nodes), &inputs, &b.outputs, bindings)
}

fn cases() -> Vec<Sizes> {
    let z = |batch: &[usize], s, t, h, d, e, causal| Sizes {
        batch: batch.to_vec(),
        s,
        t,
        h,
        d,
        e,
        causal,
    };
    vec![
        z(&[2], 5, 5, 2, 3, 4, true),
        z(&[2], 5, 5, 2, 3, 4, false),
        z(&[3, 2], 4, 6, 3, 2, 5, true),
        z(&[], 70, 70, 1, 4, 3, true),
    ]
}

fn inputs(z: &Sizes, seed: u64) -> [Vec<f64>; 4] {
    let n = |tail: &[usize]| z.dims(tail).iter().product::<usize>();
    [
        data(n(&[z.s, z.h, z.d]), seed, -2.0, 2.0),
        data(n(&[z.t, z.h, z.d]), seed + 1, -2.0, 2.0),
        data(n(&[z.t, z.h, z.e]), seed + 2, -1.0, 1.0),
        data(n(&[z.s, z.h, z.e]), seed + 3, -1.0, 1.0),
    ]
}

/// The backends, and whether each calls the kernel.
fn paths() -> Vec<(&'static str, BackendKind, CompileOptions, bool)> {
    let checked = CompileOptions { bounds_check: true, ..CompileOptions::default() };
    vec![
        ("native", BackendKind::Gccjit, CompileOptions::default(), true),
        ("native, bounds-checked", BackendKind::Gccjit, checked, false),
        ("interpreter", BackendKind::Interp, CompileOptions::default(), false),
        ("cuda simulator", BackendKind::CudaSim, CompileOptions::default(), false),
    ]
}

#[test]
fn every_path_computes_the_attention_and_its_gradients() {
    for (n, z) in cases().iter().enumerate() {
        let values = inputs(z, 10 * n as u64);
        let want = reference(z, &values[0], &values[1], &values[2], &values[3]);
        for prec in [Prec::F32, Prec::F64] {
            let b = build(z, prec, None);
            for (name, kind, opts, calls) in paths() {
                let (text, got) = run(kind, opts, &b, &values, &[]);
                let calls = calls && prec == Prec::F32;
                assert_eq!(text.contains("attention("), calls, "{name} {prec:?} {z:?}:\n{text}");
                let tol = if prec == Prec::F32 { 2e-5 } else { 1e-11 };
                for (k, what) in ["out", "lse", "dq", "dk", "dv"].iter().enumerate() {
                    let label = format!("{name} {prec:?} {z:?} {what}");
                    assert_close(&label, &got[k], &want[k], tol);
                }
            }
        }
    }
}

#[test]
fn a_dynamic_batch_computes_only_its_rows() {
    let z = Sizes { batch: vec![3], s: 6, t: 6, h: 2, d: 3, e: 2, causal: true };
    let values = inputs(&z, 5);
    let size = Symbol(900);
    let b = build(&z, Prec::F32, Some(size));
    // The first two batch cells, computed; the third never written (its buffers stay 0).
    let two = Sizes { batch: vec![2], ..z.clone() };
    let cut = |v: &[f64], tail: usize| v[..2 * tail].to_vec();
    let per = |dims: &[usize]| dims.iter().product::<usize>();
    let tails = [z.s * z.h * z.d, z.t * z.h * z.d, z.t * z.h * z.e, z.s * z.h * z.e];
    let head: Vec<Vec<f64>> = values.iter().zip(tails).map(|(v, t)| cut(v, t)).collect();
    let want = reference(&two, &head[0], &head[1], &head[2], &head[3]);
    let out_tails = [per(&[z.s, z.h, z.e]), per(&[z.s, z.h]), tails[0], tails[1], tails[2]];
    for (name, kind, opts, _) in paths() {
        let (_, got) = run(kind, opts, &b, &values, &[(size, 2)]);
        for (k, tail) in out_tails.iter().enumerate() {
            let label = format!("{name} output {k}");
            assert_close(&label, &got[k][..2 * tail], &want[k], 2e-5);
            assert!(got[k][2 * tail..].iter().all(|&x| x == 0.0), "{label}: past the batch");
        }
    }
}

#[test]
fn mismatched_tensors_are_an_error_not_a_crash() {
    let z = cases()[0].clone();
    let mut b = build(&z, Prec::F32, None);
    // Values with one key fewer than the keys.
    let short = b.nodes.add(
        "short",
        &z.dims(&[z.t - 1, z.h, z.e]),
        Prec::F32,
        rocannl_arrayjit::MemoryMode::HostVisible,
    );
    if let Asgn::Seq(items) = &mut b.asgn
        && let Asgn::Attention(a) = &mut items[0]
    {
        a.v = short;
    }
    let mut ctx = Context::new(BackendKind::Interp, CompileOptions::default()).unwrap();
    let err = ctx.compile("attention", &b.asgn, &b.nodes).unwrap_err().to_string();
    assert!(err.contains("attention values of dims"), "{err}");
}

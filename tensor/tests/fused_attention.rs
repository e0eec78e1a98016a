//! `Tensor::attention` (one operation, a fused kernel on the native backend) against the same
//! function written as parts — the scores' einsum, the scale, the causal mask, softmax and the
//! values' einsum — on the native backend and the interpreter, in f32: the values and every
//! gradient agree to rounding.

use rocannl_tensor::nn::attention::causal_mask;
use rocannl_tensor::{
    Axes, BackendKind, Graph, Init, ParamSpec, Prec, Session, SessionOptions, Tensor,
};

/// Deterministic values in `[lo, hi)`.
fn spread(n: usize, lo: f64, hi: f64, seed: u64) -> Vec<f64> {
    (0..n)
        .map(|i| {
            let t = ((i as f64 + 1.0 + seed as f64 * 0.37) * 0.618_033_988_75).fract();
            lo + (hi - lo) * t
        })
        .collect()
}

/// The attention's sizes: batch, queries, keys, heads, depth, width.
type Sizes = (usize, usize, usize, usize, usize, usize);

/// The output and the gradients of `Σ sin(out)` with respect to q, k and v.
fn run(kind: BackendKind, (b, s, t, h, d, e): Sizes, causal: bool, fused: bool) -> Vec<Vec<f64>> {
    let g = Graph::new();
    let p = |name: &str, pos: usize, width: usize, seed: u64| {
        let n = b * pos * h * width;
        g.param(
            name,
            ParamSpec::new(Axes::new().batch(&[b, pos]).output(&[h, width]))
                .init(Init::Values(spread(n, -2.0, 2.0, seed))),
        )
    };
    let (q, k, v) = (p("q", s, d, 1), p("k", t, d, 2), p("v", t, e, 3));
    let scale = 1.0 / (d as f64).sqrt();
    let out =
        if fused { q.attention(&k, &v, causal, scale) } else { parts(&q, &k, &v, causal, scale) };
    let root = out.sin().sum_all();
    let opts = SessionOptions { backend: kind, prec: Prec::F32, ..SessionOptions::default() };
    let mut sess = Session::with_options(&g, opts).unwrap();
    let r = sess.backprop(&root, &[&out]).unwrap();
    sess.run(&r).unwrap();
    let mut res = vec![sess.read(&out).unwrap()];
    res.extend([&q, &k, &v].iter().map(|p| sess.read_grad(p).unwrap()));
    res
}

/// Attention written as its parts.
fn parts(q: &Tensor, k: &Tensor, v: &Tensor, causal: bool, scale: f64) -> Tensor {
    let scores = q.einsum("... s | h d; ... t | h d => ... s | t -> h", k).scale(scale);
    let scores = if causal { causal_mask(&scores) } else { scores };
    let probs = scores.softmax("... s | t -> h => ... s | 0 -> h");
    probs.einsum("... s | t -> h; ... t | h e => ... s | h e", v)
}

#[test]
fn the_fused_attention_is_the_attention_of_its_parts() {
    let sizes: [Sizes; 3] = [(2, 6, 6, 3, 4, 5), (1, 5, 7, 2, 3, 3), (1, 70, 70, 2, 8, 8)];
    for kind in [BackendKind::Gccjit, BackendKind::Interp] {
        for (n, &z) in sizes.iter().enumerate() {
            for causal in [true, false] {
                if n == 2 && kind == BackendKind::Interp {
                    continue; // Many query blocks: the kernel's concern.
                }
                let fused = run(kind, z, causal, true);
                let want = run(kind, z, causal, false);
                for (k, what) in ["out", "dq", "dk", "dv"].iter().enumerate() {
                    let scale = want[k].iter().fold(1.0f64, |m, x| m.max(x.abs()));
                    for (i, (a, b)) in fused[k].iter().zip(&want[k]).enumerate() {
                        assert!(
                            (a - b).abs() <= 2e-5 * scale,
                            "{kind:?} {z:?} causal={causal} {what}[{i}]: {a} against {b}"
                        );
                    }
                }
            }
        }
    }
}

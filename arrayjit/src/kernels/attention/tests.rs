//! The kernels against a plain `f64` attention and its finite differences.

use super::*;

/// Deterministic values in `[-1, 1)` ([`crate::kernels::test_values`]) as `f32`.
fn values(n: usize, seed: u64) -> Vec<f32> {
    crate::kernels::test_values(n, seed).into_iter().map(|x| x as f32).collect()
}

struct Inputs {
    q: Vec<f64>,
    k: Vec<f64>,
    v: Vec<f64>,
}

/// The attention's output and log-sum-exp in `f64`, straight from the definition: the masked
/// keys get no weight.
fn reference(a: &Attention, x: &Inputs) -> (Vec<f64>, Vec<f64>) {
    let (h, d, e) = (a.heads, a.depth, a.width);
    let mut out = vec![0.0; a.batch * a.queries * h * e];
    let mut lse = vec![0.0; a.batch * a.queries * h];
    for b in 0..a.batch {
        for head in 0..h {
            for i in 0..a.queries {
                let cell = (b * a.queries + i) * h + head;
                let seen = |t: usize| !a.causal || t <= i;
                let score = |t: usize| {
                    let kc = (b * a.keys + t) * h + head;
                    (0..d).map(|j| x.q[cell * d + j] * x.k[kc * d + j]).sum::<f64>()
                        * a.scale as f64
                };
                let m = (0..a.keys).filter(|&t| seen(t)).map(score).fold(f64::MIN, f64::max);
                let w: Vec<f64> =
                    (0..a.keys).map(|t| if seen(t) { (score(t) - m).exp() } else { 0.0 }).collect();
                let l: f64 = w.iter().sum();
                lse[cell] = m + l.ln();
                for j in 0..e {
                    out[cell * e + j] = (0..a.keys)
                        .map(|t| w[t] * x.v[((b * a.keys + t) * h + head) * e + j])
                        .sum::<f64>()
                        / l;
                }
            }
        }
    }
    (out, lse)
}

fn sizes() -> Vec<Attention> {
    let mk = |batch, queries, keys, heads, depth, width, causal| Attention {
        batch,
        queries,
        keys,
        heads,
        depth,
        width,
        causal,
        scale: 1.0 / (depth as f32).sqrt(),
    };
    vec![
        mk(1, 1, 1, 1, 1, 1, true),
        mk(2, 5, 5, 3, 4, 4, true),
        mk(2, 5, 5, 3, 4, 4, false),
        mk(1, 7, 3, 2, 3, 5, true),
        mk(1, 3, 7, 2, 5, 3, true),
        mk(1, 4, 9, 1, 16, 16, false),
        // Several key blocks, a partial one, value rows wider than a register block.
        mk(1, 20, 19, 2, 3, 5, true),
        mk(1, 18, 18, 1, 2, 17, false),
        mk(2, 33, 33, 2, 16, 24, true),
        // Several blocks of query rows (64 a block), the last one partial.
        mk(1, 70, 70, 2, 3, 5, true),
        // So many keys that a block has 8 rows: two blocks, the last one partial.
        mk(1, 9, 2100, 1, 2, 3, false),
    ]
}

fn inputs(a: &Attention, seed: u64) -> (Vec<f32>, Vec<f32>, Vec<f32>) {
    let (h, d, e) = (a.heads, a.depth, a.width);
    // Scaled up so that the softmax is far from uniform.
    let big = |v: Vec<f32>| v.into_iter().map(|x| 3.0 * x).collect::<Vec<_>>();
    (
        big(values(a.batch * a.queries * h * d, seed)),
        big(values(a.batch * a.keys * h * d, seed + 1)),
        values(a.batch * a.keys * h * e, seed + 2),
    )
}

fn widen(x: &[f32]) -> Vec<f64> {
    x.iter().map(|&v| v as f64).collect()
}

fn run_forward(a: &Attention, q: &[f32], k: &[f32], v: &[f32], isa: Isa) -> (Vec<f32>, Vec<f32>) {
    let mut out = vec![f32::NAN; a.batch * a.queries * a.heads * a.width];
    let mut lse = vec![f32::NAN; a.batch * a.queries * a.heads];
    let f = Forward {
        q: q.as_ptr(),
        k: k.as_ptr(),
        v: v.as_ptr(),
        out: out.as_mut_ptr(),
        lse: lse.as_mut_ptr(),
    };
    // SAFETY: dense tensors of the sizes' layouts.
    unsafe { forward(a, f, 0..a.pairs(), isa) };
    (out, lse)
}

fn assert_close(what: &str, got: &[f32], want: &[f64], tol: f64) {
    assert_eq!(got.len(), want.len());
    for (i, (&g, &w)) in got.iter().zip(want).enumerate() {
        assert!((g as f64 - w).abs() <= tol * (1.0 + w.abs()), "{what}[{i}]: {g} against {w}");
    }
}

#[test]
fn the_forward_pass_is_the_attention_of_its_definition() {
    for isa in Isa::available() {
        for (n, a) in sizes().iter().enumerate() {
            let (q, k, v) = inputs(a, 10 + n as u64);
            let (out, lse) = run_forward(a, &q, &k, &v, isa);
            let x = Inputs { q: widen(&q), k: widen(&k), v: widen(&v) };
            let (want, want_lse) = reference(a, &x);
            assert_close(&format!("{isa:?} {a:?} out"), &out, &want, 2e-6);
            assert_close(&format!("{isa:?} {a:?} lse"), &lse, &want_lse, 2e-6);
        }
    }
}

#[test]
fn a_causal_query_ignores_later_keys_whatever_finite_values_they_hold() {
    let a = sizes()[1];
    let (q, k, v) = inputs(&a, 3);
    let (out, _) = run_forward(&a, &q, &k, &v, Isa::host());
    // Position 2's output reads keys 0..=2 only: overwrite keys and values past it with huge
    // finite values (a masked key's weight is an exact 0).
    let (mut k2, mut v2) = (k.clone(), v.clone());
    for b in 0..a.batch {
        for t in 3..a.keys {
            let kc = (b * a.keys + t) * a.heads;
            k2[kc * a.depth..(kc + a.heads) * a.depth].fill(1e30);
            v2[kc * a.width..(kc + a.heads) * a.width].fill(-3e38);
        }
    }
    let (out2, _) = run_forward(&a, &q, &k2, &v2, Isa::host());
    for b in 0..a.batch {
        for i in 0..3 {
            let c = (b * a.queries + i) * a.heads * a.width;
            let w = a.heads * a.width;
            assert_eq!(out[c..c + w], out2[c..c + w], "batch {b}, query {i}");
        }
    }
}

#[test]
fn pairs_split_across_calls_give_the_same_bits() {
    let a = sizes()[8];
    let (q, k, v) = inputs(&a, 5);
    let (whole, whole_lse) = run_forward(&a, &q, &k, &v, Isa::host());
    let mut out = vec![0.0; whole.len()];
    let mut lse = vec![0.0; whole_lse.len()];
    let f = Forward {
        q: q.as_ptr(),
        k: k.as_ptr(),
        v: v.as_ptr(),
        out: out.as_mut_ptr(),
        lse: lse.as_mut_ptr(),
    };
    for part in [0..1, 1..3, 3..a.pairs()] {
        // SAFETY: as above, disjoint pairs.
        unsafe { forward(&a, f, part, Isa::host()) };
    }
    assert_eq!(out, whole);
    assert_eq!(lse, whole_lse);
}

/// Accumulates the gradients of `Σ out·w` onto `dq` (skipped when `None`), `dk` and `dv`, from
/// the forward pass's `[q, k, v, out, lse]`.
fn run_backward(
    a: &Attention,
    [q, k, v, out, lse]: [&[f32]; 5],
    w: &[f32],
    dq: Option<&mut [f32]>,
    dk: &mut [f32],
    dv: &mut [f32],
    isa: Isa,
) {
    let b = Backward {
        q: q.as_ptr(),
        k: k.as_ptr(),
        v: v.as_ptr(),
        out: out.as_ptr(),
        lse: lse.as_ptr(),
        d_out: w.as_ptr(),
        d_q: dq.map_or(std::ptr::null_mut(), |d| d.as_mut_ptr()),
        d_k: dk.as_mut_ptr(),
        d_v: dv.as_mut_ptr(),
    };
    // SAFETY: dense tensors of the sizes' layouts.
    unsafe { backward(a, b, 0..a.pairs(), isa) };
}

/// The gradients of `Σ out·w` by central differences of the `f64` reference.
fn numeric_gradients(a: &Attention, x: &Inputs, w: &[f64]) -> [Vec<f64>; 3] {
    let loss = |x: &Inputs| reference(a, x).0.iter().zip(w).map(|(o, w)| o * w).sum::<f64>();
    let eps = 1e-6;
    let mut grads: [Vec<f64>; 3] = Default::default();
    for (which, grad) in grads.iter_mut().enumerate() {
        let len = [&x.q, &x.k, &x.v][which].len();
        for i in 0..len {
            let nudged = |by: f64| {
                let mut y = Inputs { q: x.q.clone(), k: x.k.clone(), v: x.v.clone() };
                [&mut y.q, &mut y.k, &mut y.v][which][i] += by;
                loss(&y)
            };
            grad.push((nudged(eps) - nudged(-eps)) / (2.0 * eps));
        }
    }
    grads
}

#[test]
fn the_gradients_are_the_finite_differences_of_the_definition() {
    for isa in Isa::available() {
        // The widest case and the longest (its differences would take seconds) only forward.
        for (n, a) in sizes().iter().enumerate().filter(|(n, _)| *n != 8 && *n != 10) {
            let (q, k, v) = inputs(a, 20 + n as u64);
            let (out, lse) = run_forward(a, &q, &k, &v, isa);
            let w = values(out.len(), 99 + n as u64);
            // Accumulated onto: start from known values and subtract them afterwards.
            let start = |len: usize, seed| values(len, seed);
            let (mut dq, mut dk, mut dv) =
                (start(q.len(), 1), start(k.len(), 2), start(v.len(), 3));
            let fwd = [&q[..], &k, &v, &out, &lse];
            run_backward(a, fwd, &w, Some(&mut dq), &mut dk, &mut dv, isa);
            let x = Inputs { q: widen(&q), k: widen(&k), v: widen(&v) };
            let want = numeric_gradients(a, &x, &widen(&w));
            for ((name, got, seed), want) in
                [("dq", &dq, 1), ("dk", &dk, 2), ("dv", &dv, 3)].into_iter().zip(&want)
            {
                let got: Vec<f32> =
                    got.iter().zip(start(got.len(), seed)).map(|(g, s)| g - s).collect();
                assert_close(&format!("{isa:?} {a:?} {name}"), &got, want, 2e-4);
            }
        }
    }
}

#[test]
fn a_null_gradient_is_skipped_and_the_others_unchanged() {
    let a = sizes()[2];
    let (q, k, v) = inputs(&a, 7);
    let (out, lse) = run_forward(&a, &q, &k, &v, Isa::host());
    let w = values(out.len(), 8);
    let grads = |want_q: bool| {
        let (mut dq, mut dk, mut dv) = (vec![0.0; q.len()], vec![0.0; k.len()], vec![0.0; v.len()]);
        let fwd = [&q[..], &k, &v, &out, &lse];
        let d_q = want_q.then_some(&mut dq[..]);
        run_backward(&a, fwd, &w, d_q, &mut dk, &mut dv, Isa::host());
        (dq, dk, dv)
    };
    let (dq, dk, dv) = grads(true);
    let (dq0, dk0, dv0) = grads(false);
    assert!(dq.iter().any(|&x| x != 0.0));
    assert!(dq0.iter().all(|&x| x == 0.0));
    assert_eq!((dk, dv), (dk0, dv0));
}

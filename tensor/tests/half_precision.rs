//! Half precision done the way users rely on it: every op and its gradient in f16 and bf16,
//! over magnitudes from 1e-4 to 6e4, against the same graph in f64. Norm statistics, softmax
//! sums, losses and composite activations are kept in f32 whatever the storage precision (as
//! PyTorch's autocast), so a residual stream of 300 normalizes to ±1 instead of 0.

use rocannl_tensor::nn::loss;
use rocannl_tensor::nn::norm::{LayerNorm, LayerNormConfig, RmsNorm, RmsNormConfig};
use rocannl_tensor::{
    Axes, BackendKind, Graph, Init, ParamSpec, Prec, Session, SessionOptions, Tensor,
};

type Build = fn(&Graph, &Tensor) -> Tensor;

/// Each op of the sweep, applied to `x` (`|->4` or `2|->4`).
fn ops() -> Vec<(&'static str, Build)> {
    vec![
        ("relu", |_, x| x.relu()),
        ("neg", |_, x| -x),
        ("abs", |_, x| x.abs()),
        ("exp", |_, x| x.exp()),
        ("log", |_, x| x.abs().log()),
        ("sqrt", |_, x| x.abs().sqrt()),
        ("recip", |_, x| x.recip()),
        ("tanh", |_, x| x.tanh()),
        ("sigmoid", |_, x| x.sigmoid()),
        ("sin", |_, x| x.sin()),
        ("cos", |_, x| x.cos()),
        ("erf", |_, x| x.erf()),
        ("gelu", |_, x| x.gelu()),
        ("gelu_tanh", |_, x| x.gelu_tanh()),
        ("silu", |_, x| x.silu()),
        ("softmax", |_, x| x.softmax_classes()),
        ("log_softmax", |_, x| x.log_softmax("..b..|..i..->..o.. => ..b..|..i..->0")),
        ("layer_norm", |g, x| LayerNorm::new(g, "ln", LayerNormConfig::default()).apply(x)),
        ("rms_norm", |g, x| RmsNorm::new(g, "rms", RmsNormConfig::default()).apply(x)),
        ("add", |g, x| x + &g.vector("c", &[0.5, -2.0, 3.0, 0.25])),
        ("sub", |g, x| x - &g.vector("c", &[0.5, -2.0, 3.0, 0.25])),
        ("pointmul", |g, x| x.pointmul(&g.vector("c", &[0.5, -2.0, 3.0, 0.25]))),
        ("div", |g, x| x / &g.vector("c", &[0.5, -2.0, 3.0, 0.25])),
        ("square", |_, x| x.pointmul(x)),
        ("pow3", |_, x| x.powf(3.0)),
        ("max", |g, x| x.max(&g.vector("c", &[0.5, -2.0, 3.0, 0.25]))),
        ("min", |g, x| x.min(&g.vector("c", &[0.5, -2.0, 3.0, 0.25]))),
        ("where", |g, x| {
            let c = g.vector("c", &[1.0, 0.0, 1.0, 0.0]);
            rocannl_tensor::Tensor::where_(&c, x, &x.scale(-0.5))
        }),
        ("matmul", |g, x| {
            let v = [0.5, -1.0, 0.25, 2.0, 1.0, 0.5, -0.5, 0.75, -2.0, 0.125, 1.5, -0.25, 1.0, 0.0];
            let w = g.ndarray(
                "w",
                Axes::new().input(&[4]).output(&[4]),
                &[v.as_slice(), &[0.5, 2.0]].concat(),
            );
            w.matmul(x)
        }),
        ("einsum_outer_sum", |_, x| x.einsum("i;j => i", x)),
        ("einmax1", |_, x| x.amax("i => 0")),
        ("var_biased", |_, x| x.var("i => 0", false)),
        ("var_unbiased", |_, x| x.var("i => 0", true)),
        ("mean_all", |_, x| x.mean_all()),
        ("sum_all", |_, x| x.sum_all()),
        ("mse", |g, x| {
            loss::mse(
                x,
                &g.ndarray("t", Axes::new().output(&[4]), &[0.5, 0.25, -0.5, 1.0]),
                loss::Reduction::Mean,
            )
        }),
        ("cross_entropy", |g, x| {
            let t = g.ndarray("t", Axes::new().output(&[4]), &[0.0, 1.0, 0.0, 0.0]);
            loss::cross_entropy(x, &t, loss::Reduction::Mean)
        }),
    ]
}

/// Values exactly representable in f16 and bf16: powers of two times 1, 0.75 and 0.5.
fn inputs(magnitude: f64) -> Vec<f64> {
    [1.0, -0.5, 0.75, -1.0].iter().map(|v| v * magnitude).collect()
}

/// The op's values and the gradient of a weighted sum of its cells with respect to `x` (the
/// weights keep gradients that vanish for a plain sum — of a softmax, a layer norm — from
/// being all cancellation).
fn run(
    op: Build,
    x: &[f64],
    prec: Prec,
    master: Option<Prec>,
    backend: BackendKind,
) -> (Vec<f64>, Vec<f64>) {
    let g = Graph::with_seed(0);
    let xp = g.param("x", ParamSpec::new(Axes::new().output(&[4])).init(Init::Values(x.to_vec())));
    let y = op(&g, &xp);
    let weights = g.ndarray("w", Axes::new().output(&[4]), &[1.0, -2.0, 3.0, 0.5]);
    let root = y.pointmul(&weights).sum_all();
    let opts = SessionOptions { backend, prec, master, ..SessionOptions::default() };
    let mut s = Session::with_options(&g, opts).unwrap();
    let r = s.backprop(&root, &[&y]).unwrap();
    s.run(&r).unwrap();
    (s.read(&y).unwrap(), s.read_grad(&xp).unwrap())
}

/// The smallest positive number of the precision: results below it flush to zero.
fn min_positive(prec: Prec) -> f64 {
    match prec {
        Prec::F16 => 2f64.powi(-24),
        Prec::Bf16 => 2f64.powi(-133),
        _ => 0.0,
    }
}

fn max_finite(prec: Prec) -> f64 {
    match prec {
        Prec::F16 => 65504.0,
        Prec::Bf16 => 3.389_531_389_251_535e38,
        _ => f64::MAX,
    }
}

/// Whether `got` is `want` (the f64 result) as the half precision can hold it: within `ulps`
/// units of its precision of each cell, or of the largest cell for cells near zero; ±inf
/// where the true value is past the precision's largest number; NaN only where f64 is NaN.
fn close(got: &[f64], want: &[f64], prec: Prec, ulps: f64) -> Result<(), String> {
    let eps = match prec {
        Prec::F16 => 2f64.powi(-11),
        _ => 2f64.powi(-8),
    };
    let scale = want.iter().filter(|v| v.is_finite()).fold(0.0f64, |m, v| m.max(v.abs()));
    for (i, (g, w)) in got.iter().zip(want).enumerate() {
        let ok = if w.is_nan() {
            g.is_nan()
        } else if w.abs() > max_finite(prec) {
            g.is_infinite() && g.signum() == w.signum() || (g - w).abs() <= ulps * eps * w.abs()
        } else {
            let tol = ulps * eps * (w.abs() + scale.min(max_finite(prec)) * 0.5);
            g.is_finite() && (g - w).abs() <= tol.max(min_positive(prec))
        };
        if !ok {
            return Err(format!("cell {i}: {g} against {w} (all: {got:?} against {want:?})"));
        }
    }
    Ok(())
}

fn sweep(backend: BackendKind) {
    let magnitudes = [2f64.powi(-13), 2f64.powi(-7), 1.0, 256.0 + 44.0, 2f64.powi(13), 57344.0];
    let mut failures = Vec::new();
    for (name, op) in ops() {
        for &m in &magnitudes {
            let x = inputs(m);
            let (want, want_grad) = run(op, &x, Prec::F64, None, backend);
            for (prec, master) in [
                (Prec::F16, None),
                (Prec::F16, Some(Prec::F32)),
                (Prec::Bf16, None),
                (Prec::Bf16, Some(Prec::F32)),
            ] {
                let (got, grad) = run(op, &x, prec, master, backend);
                let tag = format!("{name} at {m:e} in {prec:?} (master {master:?}) on {backend:?}");
                if let Err(e) = close(&got, &want, prec, 8.0) {
                    failures.push(format!("{tag}: value {e}"));
                }
                if let Err(e) = close(&grad, &want_grad, prec, 16.0) {
                    failures.push(format!("{tag}: gradient {e}"));
                }
            }
        }
    }
    assert!(failures.is_empty(), "{} failures:\n{}", failures.len(), failures.join("\n"));
}

#[test]
fn every_op_and_its_gradient_in_f16_and_bf16_matches_f64_on_the_interpreter() {
    sweep(BackendKind::Interp);
}

#[cfg(feature = "gccjit")]
#[test]
fn every_op_and_its_gradient_in_f16_and_bf16_matches_f64_on_gccjit() {
    sweep(BackendKind::Gccjit);
}

#[test]
fn f16_norms_of_activations_past_256_normalize_to_plus_minus_one() {
    for master in [None, Some(Prec::F32)] {
        for rms in [false, true] {
            let g = Graph::with_seed(0);
            let x = g.ndarray(
                "x",
                Axes::new().batch(&[1]).output(&[4]),
                &[300.0, -300.0, 300.0, -300.0],
            );
            let y = if rms {
                RmsNorm::new(&g, "rms", RmsNormConfig::default()).apply(&x)
            } else {
                LayerNorm::new(&g, "ln", LayerNormConfig::default()).apply(&x)
            };
            let opts = SessionOptions { prec: Prec::F16, master, ..SessionOptions::default() };
            let mut s = Session::with_options(&g, opts).unwrap();
            let r = s.forward(&[&y]).unwrap();
            s.run(&r).unwrap();
            let v = s.read(&y).unwrap();
            for (got, want) in v.iter().zip([1.0, -1.0, 1.0, -1.0]) {
                assert!((got - want).abs() < 2e-3, "rms {rms}, master {master:?}: {v:?}");
            }
        }
    }
}

#[test]
fn the_gradient_of_gelu_tanh_in_f16_is_finite_past_256() {
    let x = [300.0, -300.0, 1000.0, 60000.0];
    let (y, grad) = run(|_, x| x.gelu_tanh(), &x, Prec::F16, None, BackendKind::default());
    assert_eq!(y, vec![300.0, 0.0, 1000.0, 60000.0]);
    assert_eq!(grad, vec![1.0, 0.0, 3.0, 0.5]); // the weights of the root: slopes 1 and 0
}

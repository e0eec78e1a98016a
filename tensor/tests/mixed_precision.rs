//! Mixed precision (f32 master weights under half-precision activations) and dynamic loss
//! scaling.

use rocannl_tensor::nn::{Activation, Mlp, MlpConfig, loss};
use rocannl_tensor::{
    Adam, Axes, BackendKind, Graph, Init, LossScale, Optimizer, ParamSpec, Prec, Session,
    SessionOptions, Sgd, StepOptions,
};

fn backends() -> Vec<BackendKind> {
    BackendKind::available().into_iter().filter(|b| *b != BackendKind::Cuda).collect()
}

fn options(backend: BackendKind, prec: Prec, master: Option<Prec>) -> SessionOptions {
    SessionOptions { backend, prec, master, ..SessionOptions::default() }
}

/// A small regression: 16 points, an MLP with GELU, mean squared error.
fn regression(g: &Graph) -> (rocannl_tensor::Tensor, Vec<rocannl_tensor::Tensor>) {
    let xs: Vec<f64> = (0..64).map(|i| ((i * 37 % 23) as f64 - 11.0) / 9.0).collect();
    let ys: Vec<f64> = (0..16).map(|i| ((i * 5 % 7) as f64 - 3.0) / 4.0).collect();
    let x = g.ndarray("x", Axes::new().batch(&[16]).output(&[4]), &xs);
    let y = g.ndarray("y", Axes::new().batch(&[16]).output(&[1]), &ys);
    let out = Mlp::new(g, "mlp", MlpConfig::new(&[32, 1]).with_act(Activation::GeluTanh)).apply(&x);
    let l = loss::mse(&out, &y, loss::Reduction::Mean);
    (l, g.params())
}

#[test]
fn master_weights_are_stored_in_f32_under_half_precision_activations() {
    for backend in backends() {
        for prec in [Prec::Bf16, Prec::F16] {
            let g = Graph::with_seed(3);
            let (l, params) = regression(&g);
            let mut s = Session::with_options(&g, options(backend, prec, Some(Prec::F32))).unwrap();
            assert_eq!((s.prec(), s.master_prec()), (prec, Prec::F32));
            let mut step = s
                .train_step(&l, &Optimizer::Adam(Adam::default()), &[], &Default::default())
                .unwrap();
            let first = {
                s.step(&mut step, 1e-3).unwrap();
                s.loss(&step).unwrap()
            };
            for _ in 0..200 {
                s.step(&mut step, 1e-2).unwrap();
            }
            let last = s.loss(&step).unwrap();
            assert!(last < first * 0.5, "{backend:?} {prec:?}: {first} -> {last}");
            // Updates of 1e-3 on values of magnitude ~0.3 survive only in f32 storage: some
            // weight is not representable in the half precision.
            let w = s.read(&params[0]).unwrap();
            let half = |v: f64| prec.round(v) == v;
            assert!(w.iter().any(|v| !half(*v)), "{backend:?} {prec:?}: weights are not f32");
            // Checkpoints hold the master weights.
            let path = std::env::temp_dir().join(format!(
                "rocannl-master-{}-{}.safetensors",
                prec.name(),
                std::process::id()
            ));
            s.save_params(&path).unwrap();
            let before = s.read(&params[0]).unwrap();
            s.write(&params[0], &vec![0.0; before.len()]).unwrap();
            s.load_params(&path).unwrap();
            assert_eq!(s.read(&params[0]).unwrap(), before);
            let _ = std::fs::remove_file(path);
        }
    }
}

/// A loss whose gradient is 2⁻²⁶ per parameter: below f16's smallest subnormal (2⁻²⁴), so
/// without scaling it flushes to zero and nothing trains; scaled by 2¹⁴ it is representable,
/// and the f32 master weights move as in f32.
#[test]
fn loss_scaling_keeps_small_f16_gradients() {
    for backend in backends() {
        let run = |prec: Prec, master: Option<Prec>, scale: Option<LossScale>| {
            let g = Graph::with_seed(1);
            let w =
                g.param("w", ParamSpec::new(Axes::new().output(&[4])).init(Init::Constant(1.0)));
            // The loss is summed in f32, but the doubled weights are an f16 activation: the
            // gradient reaching them, 2⁻²⁷, is below f16's smallest number.
            let l = w.scale(2.0).sum_all().scale(2f64.powi(-27));
            let mut s = Session::with_options(&g, options(backend, prec, master)).unwrap();
            let opts = StepOptions { loss_scale: scale, ..StepOptions::default() };
            let mut step = s.train_step(&l, &Optimizer::Sgd(Sgd::default()), &[], &opts).unwrap();
            for _ in 0..4 {
                s.step(&mut step, 1024.0).unwrap();
            }
            (s.read(&w).unwrap(), step.skipped_steps())
        };
        let (exact, _) = run(Prec::F32, None, None);
        assert!((exact[0] - (1.0 - 4.0 * 1024.0 * 2f64.powi(-26))).abs() < 1e-9);
        let (unscaled, _) = run(Prec::F16, Some(Prec::F32), None);
        assert_eq!(unscaled, vec![1.0; 4], "{backend:?}: the gradient underflows in f16");
        let scale = LossScale { init: 2f64.powi(14), ..LossScale::default() };
        let (scaled, skipped) = run(Prec::F16, Some(Prec::F32), Some(scale));
        assert_eq!(skipped, 0);
        assert_eq!(scaled, exact, "{backend:?}: scaled f16 gradients train as f32 ones");
    }
}

/// An overflowing scale skips the step (parameters and optimizer state untouched) and halves;
/// finite steps in a row double it.
#[test]
fn loss_scaling_skips_overflowing_steps_and_adapts_the_scale() {
    for backend in backends() {
        let g = Graph::with_seed(1);
        let w = g.param(
            "w",
            ParamSpec::new(Axes::new().output(&[3])).init(Init::Values(vec![1.0, 2.0, 3.0])),
        );
        let l = w.pointmul(&w).sum_all();
        let mut s =
            Session::with_options(&g, options(backend, Prec::F16, Some(Prec::F32))).unwrap();
        // The loss's gradient seed is the scale, stored in f16 (max 65504): 2²⁰ overflows until
        // halved five times, to 2¹⁵. (The weights' gradients, 2w·scale, are f32 master ones.)
        let cfg = LossScale { init: 2f64.powi(20), growth: 2.0, backoff: 0.5, growth_interval: 3 };
        let opts = StepOptions { loss_scale: Some(cfg), ..StepOptions::default() };
        let mut step = s.train_step(&l, &Optimizer::Adam(Adam::default()), &[], &opts).unwrap();
        let mut skipped = 0;
        while step.steps() == 0 {
            s.step(&mut step, 0.1).unwrap();
            if step.steps() == 0 {
                skipped += 1;
                assert_eq!(s.read(&w).unwrap(), vec![1.0, 2.0, 3.0], "{backend:?}: a skipped step");
            }
            assert!(skipped < 20);
        }
        assert_eq!(step.skipped_steps(), skipped);
        assert_eq!(skipped, 5, "{backend:?}");
        let scale = step.loss_scale().unwrap();
        assert_eq!(scale, 2f64.powi(15));
        // Adam moved every weight down by about lr on the first applied step.
        let w1 = s.read(&w).unwrap();
        for (a, b) in w1.iter().zip([1.0, 2.0, 3.0]) {
            assert!((b - a - 0.1).abs() < 1e-3, "{backend:?}: {w1:?}");
        }
        s.step(&mut step, 0.1).unwrap();
        s.step(&mut step, 0.1).unwrap();
        assert_eq!(step.loss_scale(), Some(scale * 2.0), "{backend:?}: 3 finite steps double it");
        let bad = LossScale { backoff: 1.5, ..LossScale::default() };
        let opts = StepOptions { loss_scale: Some(bad), ..StepOptions::default() };
        let err = s.train_step(&l, &Optimizer::Adam(Adam::default()), &[], &opts).unwrap_err();
        assert!(err.to_string().contains("backoff"), "{err}");
    }
}

/// Under mixed precision, products read the weights rounded to the half precision (autocast);
/// with `autocast: false` they read the f32 master weights. Both are checked against exact
/// references: the weights have 16 fractional bits and the inputs are small integers, so every
/// product and sum is exact in f32 whatever the order, and only the final rounding remains.
#[test]
fn autocast_products_read_the_weights_rounded_to_the_half_precision() {
    let (rows, inputs, outputs) = (16, 8, 6);
    // Weights in [1, 2) just below the middle between two bf16 values (bf16 keeps 7
    // fractional bits there), so rounding takes almost half a step off each; inputs 0..3.
    let w: Vec<f64> = (0..outputs * inputs)
        .map(|i| {
            let grid = 1.0 + ((i * 37) % 128) as f64 / 128.0;
            grid + 1.0 / 256.0 - (1 + i % 5) as f64 / 65_536.0
        })
        .collect();
    let x: Vec<f64> = (0..rows * inputs).map(|i| ((i * 7 + i / 5) % 4) as f64).collect();
    // y[r, j] = Σ_k w[j, k] · x[r, k]  (memory order: batch, output, input).
    let exact = |round_w: bool| -> Vec<f64> {
        let mut y = vec![0.0; rows * outputs];
        for r in 0..rows {
            for j in 0..outputs {
                let sum: f64 = (0..inputs)
                    .map(|k| {
                        let wv = w[j * inputs + k];
                        (if round_w { Prec::Bf16.round(wv) } else { wv }) * x[r * inputs + k]
                    })
                    .sum();
                y[r * outputs + j] = Prec::Bf16.round(sum);
            }
        }
        y
    };
    let (rounded, master) = (exact(true), exact(false));
    let differ = rounded.iter().zip(&master).filter(|(a, b)| a != b).count();
    assert!(differ > 10, "the two references must tell the policies apart ({differ} cells)");
    for backend in backends() {
        for autocast in [true, false] {
            let g = Graph::with_seed(0);
            let xs = g.ndarray("x", Axes::new().batch(&[rows]).output(&[inputs]), &x);
            let wt = g.param(
                "w",
                ParamSpec::new(Axes::new().input(&[inputs]).output(&[outputs]))
                    .init(Init::Values(w.clone())),
            );
            let y = &wt * &xs;
            let opts = SessionOptions { autocast, ..options(backend, Prec::Bf16, Some(Prec::F32)) };
            let mut s = Session::with_options(&g, opts).unwrap();
            let r = s.forward(&[&y]).unwrap();
            s.run(&r).unwrap();
            let want = if autocast { &rounded } else { &master };
            assert_eq!(&s.read(&y).unwrap(), want, "{backend:?}, autocast {autocast}");
            // The master weights themselves stay f32.
            assert_eq!(s.read(&wt).unwrap(), w, "{backend:?}, autocast {autocast}");
        }
    }
}

/// A training step under autocast: each weight is rounded once per step into a copy the
/// products read, its gradient accumulates into the f32 master gradient, and the step matches
/// the interpreter bit for bit.
#[test]
fn autocast_training_matches_the_interpreter_and_keeps_f32_gradients() {
    let run = |backend: BackendKind| {
        let g = Graph::with_seed(5);
        let (l, params) = regression(&g);
        let mut s =
            Session::with_options(&g, options(backend, Prec::Bf16, Some(Prec::F32))).unwrap();
        let mut step =
            s.train_step(&l, &Optimizer::Adam(Adam::default()), &[], &Default::default()).unwrap();
        let mut losses = vec![];
        for _ in 0..5 {
            s.step(&mut step, 1e-2).unwrap();
            losses.push(s.loss(&step).unwrap());
        }
        let weights: Vec<Vec<f64>> = params.iter().map(|p| s.read(p).unwrap()).collect();
        (losses, weights)
    };
    let (losses, weights) = run(BackendKind::Interp);
    assert!(losses.iter().all(|l| l.is_finite()));
    assert!(weights[0].iter().any(|v| Prec::Bf16.round(*v) != *v), "master weights are f32");
    for backend in backends() {
        assert_eq!(run(backend), (losses.clone(), weights.clone()), "{backend:?}");
    }
}

/// A parameter that two products share (and that a pointwise square reads too) is copied into
/// bf16 once per routine, the products read the copy, the square the f32 master; interpreter
/// and gccjit agree bit for bit over a few steps.
#[test]
fn a_weight_shared_by_two_products_is_copied_once() {
    let run = |backend: BackendKind| {
        let g = Graph::with_seed(2);
        let xs: Vec<f64> = (0..32).map(|i| ((i * 7 % 11) as f64 - 5.0) / 4.0).collect();
        let x = g.ndarray("x", Axes::new().batch(&[4]).output(&[8]), &xs);
        let w = g.param("w", ParamSpec::new(Axes::new().input(&[8]).output(&[8])));
        let y = &w * &(&w * &x);
        let l = &y.pointmul(&y).sum_all() + &w.pointmul(&w).sum_all().scale(1e-2);
        let mut s =
            Session::with_options(&g, options(backend, Prec::Bf16, Some(Prec::F32))).unwrap();
        let mut step =
            s.train_step(&l, &Optimizer::Sgd(Sgd::default()), &[], &Default::default()).unwrap();
        let text = step.routine().code().to_string();
        assert_eq!(text.matches("'w' in bf16").count(), 1, "{text}");
        let mut losses = vec![];
        for _ in 0..3 {
            s.step(&mut step, 1e-3).unwrap();
            losses.push(s.loss(&step).unwrap());
        }
        (losses, s.read(&w).unwrap())
    };
    let want = run(BackendKind::Interp);
    assert!(want.0.iter().all(|l| l.is_finite()));
    for backend in backends() {
        assert_eq!(run(backend), want, "{backend:?}");
    }
}

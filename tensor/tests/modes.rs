//! Train and eval modes, and buffers: one graph compiled into a training step (train mode,
//! buffers updated in its compiled code) and evaluation routines (eval mode, buffers read and
//! left alone), on the interpreter and on native code; buffers in checkpoints.

use rocannl_tensor::nn::{
    self, Activation, BatchNorm, BatchNormConfig, Linear, LinearConfig, Module, loss,
};
use rocannl_tensor::optim::{Adam, Optimizer};
use rocannl_tensor::{
    Axes, BackendKind, Error, Graph, Init, Mode, ParamSpec, Session, SessionOptions,
};

fn backends() -> Vec<BackendKind> {
    let mut b = vec![BackendKind::Interp];
    if cfg!(feature = "gccjit") {
        b.push(BackendKind::Gccjit);
    }
    b
}

fn session(g: &Graph, backend: BackendKind) -> Session {
    Session::with_options(g, SessionOptions { backend, ..SessionOptions::default() }).unwrap()
}

/// Deterministic inputs in [-2, 2] and targets of a smooth function of them.
fn dataset(n: usize) -> (Vec<f64>, Vec<f64>) {
    let xs: Vec<f64> = (0..3 * n).map(|i| ((i as f64 * 0.618_034).fract() - 0.5) * 4.0).collect();
    let ts = xs.chunks(3).map(|x| (x[0] - 0.5 * x[1]).tanh() + 0.3 * x[2]).collect();
    (xs, ts)
}

/// Linear → BatchNorm → ReLU → Linear, trained by Adam: the training step updates the running
/// statistics in its own code (the host writes only the batch), the loss falls, and the eval
/// routine normalizes by exactly the statistics the steps left.
#[test]
fn a_batch_norm_model_trains_and_evaluates_with_the_running_statistics() {
    for backend in backends() {
        let g = Graph::new();
        let x = g.data("x", Axes::new().batch(&[16]).output(&[3]));
        let t = g.data("t", Axes::new().batch(&[16]).output(&[1]));
        let fc1 = Linear::new(&g, "fc1", LinearConfig::new(6));
        let bn = BatchNorm::new(&g, "bn", BatchNormConfig::default());
        let fc2 = Linear::new(&g, "fc2", LinearConfig::new(1));
        let z = fc1.apply(&x);
        let h = bn.apply(&z);
        let y = fc2.apply(&Activation::Relu.apply(&h));
        let l = loss::mse(&y, &t, loss::Reduction::Mean);
        let mut s = session(&g, backend);
        let mut step =
            s.train_step(&l, &Optimizer::Adam(Adam::default()), &[], &Default::default()).unwrap();
        let eval = s.forward(&[&z, &h, &l]).unwrap();
        let (xs, ts) = dataset(16);
        s.write(&x, &xs).unwrap();
        s.write(&t, &ts).unwrap();
        let mut losses = vec![];
        for _ in 0..60 {
            s.step(&mut step, 0.02).unwrap();
            losses.push(s.loss(&step).unwrap());
        }
        assert!(losses[59] < 0.5 * losses[0], "{backend:?}: {losses:?}");
        let [mean, var, count] = [0, 1, 2].map(|i| s.read(&bn.buffers()[i]).unwrap());
        assert_eq!(count, vec![60.0], "{backend:?}: one update per step");
        assert!(mean.iter().any(|m| m.abs() > 1e-3), "{backend:?}: {mean:?}");
        assert!(var.iter().all(|v| (v - 1.0).abs() > 1e-3), "{backend:?}: {var:?}");
        s.run(&eval).unwrap();
        let (zv, hv) = (s.read(&z).unwrap(), s.read(&h).unwrap());
        let (w, b) = (
            s.read(bn.weight.as_ref().unwrap()).unwrap(),
            s.read(bn.bias.as_ref().unwrap()).unwrap(),
        );
        for (i, (zi, hi)) in zv.iter().zip(&hv).enumerate() {
            let f = i % 6;
            let want = (zi - mean[f]) / (var[f] + 1e-5).sqrt() * w[f] + b[f];
            assert!((hi - want).abs() < 1e-4 * (1.0 + want.abs()), "{backend:?}: {hi} vs {want}");
        }
        let after = [0, 1, 2].map(|i| s.read(&bn.buffers()[i]).unwrap());
        assert_eq!(after, [mean, var, count], "{backend:?}: evaluation changed a buffer");
    }
}

/// A buffer updated with an expression of itself and the batch: train-mode routines update it
/// (the step and a train-mode forward), eval-mode ones never; a train-mode routine that does
/// not read the batch does not either.
#[test]
fn only_train_mode_routines_that_read_the_data_update_buffers() {
    for backend in backends() {
        let g = Graph::new();
        let x = g.data("x", Axes::new().batch(&[2]).output(&[2]));
        let other = g.data("other", Axes::new().output(&[2]));
        let total = g.buffer(
            "total",
            ParamSpec::new(Axes::new().input(&[]).output(&[2])).init(Init::Values(vec![1.0, 2.0])),
        );
        total.update_with(&(&total + &x.einsum("b|o => o", [])));
        let seen = &x + &total;
        let unrelated = other.scale(2.0);
        let mut s = session(&g, backend);
        let eval = s.forward(&[&seen]).unwrap();
        let train = s.forward_in(Mode::Train, &[&seen]).unwrap();
        let train_other = s.forward_in(Mode::Train, &[&unrelated]).unwrap();
        s.write(&x, &[1.0, 10.0, 2.0, 20.0]).unwrap();
        s.write(&other, &[0.0, 0.0]).unwrap();
        s.run(&eval).unwrap();
        s.run(&train_other).unwrap();
        assert_eq!(s.read(&total).unwrap(), vec![1.0, 2.0], "{backend:?}");
        assert_eq!(s.read(&seen).unwrap(), vec![2.0, 12.0, 3.0, 22.0], "{backend:?}");
        s.run(&train).unwrap();
        // The routine reads the value it began with; the update ends it.
        assert_eq!(s.read(&seen).unwrap(), vec![2.0, 12.0, 3.0, 22.0], "{backend:?}");
        assert_eq!(s.read(&total).unwrap(), vec![4.0, 32.0], "{backend:?}");
        s.run(&train).unwrap();
        assert_eq!(s.read(&total).unwrap(), vec![7.0, 62.0], "{backend:?}");
        s.run(&eval).unwrap();
        assert_eq!(s.read(&seen).unwrap(), vec![8.0, 72.0, 9.0, 82.0], "{backend:?}");
        assert_eq!(s.read(&total).unwrap(), vec![7.0, 62.0], "{backend:?}");
    }
}

/// Dropout obeys the routine's mode on native code as on the interpreter: the identity in
/// eval mode, masks in train mode.
#[test]
fn dropout_is_the_identity_in_eval_mode_and_drops_in_train_mode() {
    for backend in backends() {
        let g = Graph::with_seed(11);
        let values: Vec<f64> = (0..400).map(|i| 1.0 + i as f64 / 400.0).collect();
        let x = g.ndarray("x", Axes::new().output(&[400]), &values);
        let y = nn::dropout(&x, 0.5);
        let mut s = session(&g, backend);
        let eval = s.forward(&[&y]).unwrap();
        let train = s.forward_in(Mode::Train, &[&y]).unwrap();
        s.run(&eval).unwrap();
        let identity = s.read(&y).unwrap();
        assert!(identity.iter().zip(&values).all(|(a, b)| (a - b).abs() < 1e-6), "{backend:?}");
        s.run(&train).unwrap();
        let dropped = s.read(&y).unwrap();
        let zeros = dropped.iter().filter(|v| **v == 0.0).count();
        assert!((140..=260).contains(&zeros), "{backend:?}: {zeros} of 400 dropped");
        for (d, v) in dropped.iter().zip(&values) {
            assert!(*d == 0.0 || (d - 2.0 * v).abs() < 1e-5, "{backend:?}: {v} -> {d}");
        }
    }
}

/// Checkpoints hold the buffers beside the params: a round trip restores them, and a file
/// without one is refused naming it, with nothing written.
#[test]
fn checkpoints_save_and_load_buffers() {
    let g = Graph::new();
    let x = g.ndarray(
        "x",
        Axes::new().batch(&[4]).output(&[2]),
        &[1.0, 5.0, 2.0, 7.0, 4.0, 6.0, 9.0, 8.0],
    );
    let bn = BatchNorm::new(&g, "bn", BatchNormConfig::default());
    let y = bn.apply(&x);
    let mut s = Session::new(&g).unwrap();
    let train = s.forward_in(Mode::Train, &[&y]).unwrap();
    s.run(&train).unwrap();
    let dir = std::env::temp_dir();
    let path = dir.join(format!("rocannl_modes_{}.safetensors", std::process::id()));
    s.save_params(&path).unwrap();
    let saved: Vec<Vec<f64>> = bn.buffers().iter().map(|b| s.read(b).unwrap()).collect();
    s.run(&train).unwrap();
    assert_ne!(s.read(&bn.buffers()[2]).unwrap(), saved[2]);
    s.load_params(&path).unwrap();
    let loaded: Vec<Vec<f64>> = bn.buffers().iter().map(|b| s.read(b).unwrap()).collect();
    assert_eq!(loaded, saved);

    // The same block without running statistics has no buffers: the checkpoint has three
    // tensors too many.
    let g2 = Graph::new();
    let x2 = g2.ndarray("x", Axes::new().batch(&[4]).output(&[2]), &[0.0; 8]);
    let bn2 = BatchNorm::new(&g2, "bn", BatchNormConfig::default().with_track_running_stats(false));
    let y2 = bn2.apply(&x2);
    let mut s2 = Session::new(&g2).unwrap();
    let r2 = s2.forward(&[&y2]).unwrap();
    s2.run(&r2).unwrap();
    let e = s2.load_params(&path).unwrap_err().to_string();
    assert!(e.contains("bn.num_batches_tracked") || e.contains("bn.running_"), "{e}");
    // A graph with the buffers loading a checkpoint of params only: the buffer is named.
    let params_only = dir.join(format!("rocannl_modes_params_{}.safetensors", std::process::id()));
    s2.save_params(&params_only).unwrap();
    let before = s.read(&bn.buffers()[0]).unwrap();
    let e = s.load_params(&params_only).unwrap_err().to_string();
    assert!(e.contains("buffer 'bn.num_batches_tracked'"), "{e}");
    assert_eq!(s.read(&bn.buffers()[0]).unwrap(), before, "nothing written");
    std::fs::remove_file(&path).unwrap();
    std::fs::remove_file(&params_only).unwrap();
}

/// Misuse is a usage error naming the tensors: updating a tensor that is not a buffer, a buffer
/// named like a param, a batch norm's out-of-range settings.
#[test]
fn buffer_and_batch_norm_misuse_are_usage_errors() {
    let g = Graph::new();
    let w = g.param("w", ParamSpec::new(Axes::new().input(&[]).output(&[2])));
    w.update_with(&w.scale(2.0));
    let e = g.finish().unwrap_err().to_string();
    assert!(e.contains("'w'") && e.contains("buffers"), "{e}");

    let g = Graph::new();
    let _ = g.param("bn.weight", ParamSpec::new(Axes::new().input(&[]).output(&[2])));
    let _ = BatchNorm::new(&g, "bn", BatchNormConfig::default());
    let e = g.finish().unwrap_err().to_string();
    assert!(e.contains("'bn.weight'"), "{e}");

    for cfg in [
        BatchNormConfig::default().with_eps(-1.0),
        BatchNormConfig::default().with_momentum(Some(1.5)),
    ] {
        let g = Graph::new();
        let _ = BatchNorm::new(&g, "norm", cfg);
        match g.finish() {
            Err(Error::Usage(m)) => assert!(m.contains("'norm'"), "{m}"),
            other => panic!("{other:?}"),
        }
    }
}

/// Over a dynamic batch, batch norm's statistics count the current rows only: the running
/// estimates after a full batch and a partial one are those of the rows written.
#[test]
fn batch_norm_over_a_dynamic_batch_counts_the_current_rows() {
    let rows: Vec<[f64; 2]> =
        (0..6).map(|i| [i as f64 * 0.7 - 1.0, (i * i) as f64 * 0.3]).collect();
    let stats = |n: usize, f: usize| {
        let mean = rows[..n].iter().map(|r| r[f]).sum::<f64>() / n as f64;
        let ss: f64 = rows[..n].iter().map(|r| (r[f] - mean) * (r[f] - mean)).sum();
        (mean, ss / (n - 1) as f64)
    };
    for backend in backends() {
        let g = Graph::new();
        let batch = g.dynamic("batch", 6);
        let x = g.data("x", Axes::new().dynamic_batch(&batch).output(&[2]));
        let bn = BatchNorm::new(&g, "bn", BatchNormConfig::default());
        let y = bn.apply(&x);
        let opts = SessionOptions {
            backend,
            prec: rocannl_tensor::Prec::F64,
            ..SessionOptions::default()
        };
        let mut s = Session::with_options(&g, opts).unwrap();
        let train = s.forward_in(Mode::Train, &[&y]).unwrap();
        let (mut mean, mut var) = ([0.0; 2], [1.0; 2]);
        for n in [6, 3] {
            s.set_size(&batch, n).unwrap();
            s.write(&x, &rows[..n].concat()).unwrap();
            s.run(&train).unwrap();
            for f in 0..2 {
                let (m, v) = stats(n, f);
                mean[f] = 0.9 * mean[f] + 0.1 * m;
                var[f] = 0.9 * var[f] + 0.1 * v;
            }
        }
        let got = [0, 1].map(|i| s.read(&bn.buffers()[i]).unwrap());
        for (f, (m, v)) in mean.iter().zip(&var).enumerate() {
            assert!((got[0][f] - m).abs() < 1e-12, "{backend:?}: mean {:?} vs {mean:?}", got[0]);
            assert!((got[1][f] - v).abs() < 1e-12, "{backend:?}: var {:?} vs {var:?}", got[1]);
        }
    }
}

/// In f16 with f32 master weights, batch norm normalizes activations around 300 (its statistics
/// computed in f32), and its running estimates are kept in f32, as the params are.
#[test]
fn batch_norm_in_f16_keeps_its_statistics_and_buffers_in_f32() {
    use rocannl_tensor::Prec;
    let values: Vec<f64> = (0..16).map(|i| 300.0 + ((i * 7) % 16) as f64 * 4.0).collect();
    let g = Graph::new();
    let x = g.ndarray("x", Axes::new().batch(&[16]).output(&[1]), &values);
    let bn = BatchNorm::new(&g, "bn", BatchNormConfig::default());
    let y = bn.apply(&x);
    let opts =
        SessionOptions { prec: Prec::F16, master: Some(Prec::F32), ..SessionOptions::default() };
    let mut s = Session::with_options(&g, opts).unwrap();
    let train = s.forward_in(Mode::Train, &[&y]).unwrap();
    s.run(&train).unwrap();
    let mean = values.iter().sum::<f64>() / 16.0;
    let var = values.iter().map(|v| (v - mean) * (v - mean)).sum::<f64>() / 15.0;
    let yv = s.read(&y).unwrap();
    let sd = (var * 15.0 / 16.0 + 1e-5).sqrt();
    for (v, got) in values.iter().zip(&yv) {
        assert!((got - (v - mean) / sd).abs() < 1e-2, "{v} -> {got}");
    }
    let running = s.read_array(&bn.buffers()[1]).unwrap();
    assert_eq!(running.prec(), Prec::F32);
    let want = 0.9 + 0.1 * var;
    assert!((running.to_f64_vec()[0] - want).abs() < 1e-3 * want, "{running:?} vs {want}");
}

//! The tensor API: misuse gives errors (never panics), persistence round-trips bit-exactly,
//! optimizers follow their reference formulas, and backends agree.

use rocannl_tensor::nn::norm::{LayerNorm, LayerNormConfig};
use rocannl_tensor::nn::{Activation, Linear, LinearConfig, Mlp, MlpConfig, Module, loss};
use rocannl_tensor::train::{Column, Loader};
use rocannl_tensor::{
    Adam, AdamW, Axes, BackendKind, Error, Graph, Init, Optimizer, ParamSpec, Prec, Session,
    SessionOptions, Sgd, Tensor,
};

fn session(g: &Graph, backend: BackendKind, prec: Prec) -> Result<Session, Error> {
    Session::with_options(g, SessionOptions { backend, prec, ..SessionOptions::default() })
}

#[test]
fn shape_errors_surface_when_the_graph_is_finalized() {
    let g = Graph::new();
    let a = g.vector("a", &[1.0, 2.0, 3.0]);
    let b = g.vector("b", &[1.0, 2.0]);
    let c = (&a + &b).named("sum"); // building never fails
    assert!(c.shape_string().contains("$"), "partially inferred: {}", c.shape_string());
    let err = Session::new(&g).unwrap_err();
    let msg = err.to_string();
    assert!(matches!(err, Error::Shape(_)), "{msg}");
    assert!(msg.contains("'sum'") && msg.contains('3') && msg.contains('2'), "{msg}");
}

#[test]
fn bad_specs_and_arity_are_errors() {
    let g = Graph::new();
    let _ = g.range(3).einsum("i->j->k => i", []);
    assert!(matches!(g.finish(), Err(Error::Shape(rocannl_shape::ShapeError::Spec(_)))));
    let g = Graph::new();
    let _ = g.range(3).einsum("i; j => ij", []);
    assert!(matches!(g.finish(), Err(Error::Usage(_))));
}

#[test]
fn guessed_params_warn_and_strict_mode_refuses() {
    let g = Graph::new();
    let x = g.data("x", Axes::new().batch(&[4]).output(&[3]));
    let w = g.param("w", ParamSpec::default());
    let _y = w.matmul(&x).relu();
    g.finish().unwrap();
    assert!(g.warnings().iter().any(|w| w.contains("param w")), "{:?}", g.warnings());
    let g = Graph::new();
    g.set_strict(true);
    let x = g.data("x", Axes::new().batch(&[4]).output(&[3]));
    let _y = g.param("w", ParamSpec::default()).matmul(&x);
    assert!(matches!(g.finish(), Err(Error::Shape(_))));
}

#[test]
fn the_nn_blocks_declare_what_they_mean_and_need_no_guesses() {
    // Biases and gains state their empty input row, so a model built from the blocks closes
    // without a single guess; a forgotten width elsewhere is still reported.
    let g = Graph::new();
    let x = g.data("x", Axes::new().batch(&[8]).output(&[5]));
    let h = Mlp::new(&g, "mlp", MlpConfig::new(&[16, 4])).apply(&x);
    let h = LayerNorm::new(&g, "ln", LayerNormConfig::default()).apply(&h);
    let _ = Linear::new(&g, "head", LinearConfig::new(3)).apply(&h);
    g.finish().unwrap();
    assert!(g.warnings().is_empty(), "{:?}", g.warnings());
    let g = Graph::new();
    let x = g.data("x", Axes::new().batch(&[8]).output(&[5]));
    let _ = g
        .param("w2", ParamSpec::default())
        .matmul(&g.param("w1", ParamSpec::default()).matmul(&x).relu());
    g.finish().unwrap();
    let w = g.warnings();
    assert!(w.iter().any(|m| m.contains("w2") && m.contains("hidden dimension")), "{w:?}");
}

#[test]
fn tensors_with_no_elements_compute_like_any_other() {
    // Size-0 axes as in NumPy: pointwise results are empty, a sum over an empty axis is 0, and
    // gradients of empty parameters are empty.
    for backend in [BackendKind::Interp, BackendKind::Gccjit] {
        let g = Graph::new();
        let x = g.data("x", Axes::new().batch(&[0]).output(&[3]));
        let p = g.param(
            "p",
            ParamSpec::new(Axes::new().input(&[]).output(&[3])).init(Init::Constant(2.0)),
        );
        let y = (&x + &p).relu();
        let total = y.einsum("b|->i => |->i", []); // sums the empty batch axis
        let a = g.data("a", Axes::new().output(&[2, 0]));
        let b = g.data("b", Axes::new().output(&[0, 4]));
        let prod = a.einsum("ij;jk=>ik", &b); // an empty contraction: zeros
        let mut s = match session(&g, backend, Prec::F64) {
            Ok(s) => s,
            Err(e) if backend == BackendKind::Gccjit => {
                eprintln!("gccjit unavailable: {e}");
                continue;
            }
            Err(e) => panic!("{e}"),
        };
        s.write(&x, &[]).unwrap();
        let r = s.forward(&[&y, &total, &prod]).unwrap();
        s.run(&r).unwrap();
        assert_eq!(s.read(&y).unwrap(), Vec::<f64>::new());
        assert_eq!(s.read(&total).unwrap(), vec![0.0; 3]);
        assert_eq!(s.read(&prod).unwrap(), vec![0.0; 8]);
        let r = s.backprop(&total, &[]).unwrap();
        s.run(&r).unwrap();
        assert_eq!(s.read_grad(&p).unwrap(), vec![0.0; 3], "no example contributes");
    }
}

#[test]
fn mixing_graphs_and_reading_too_early_are_errors() {
    let g1 = Graph::new();
    let g2 = Graph::new();
    let a = g1.range(2);
    let b = g2.range(2);
    let _ = &a + &b;
    assert!(matches!(g1.finish(), Err(Error::Usage(_))));
    let g = Graph::new();
    let x = g.range(2);
    let y = x.exp();
    let s = Session::new(&g).unwrap();
    assert!(s.read(&y).is_err(), "nothing computed y yet");
    assert!(y.dims().is_ok());
}

fn model(g: &Graph) -> (Tensor, Tensor) {
    let x = g.data("x", Axes::new().batch(&[8]).output(&[3]));
    let m = Mlp::new(g, "m", MlpConfig::new(&[5, 2]).with_act(Activation::Tanh));
    let y = m.apply(&x);
    (x, y)
}

#[test]
fn safetensors_round_trip_is_bit_exact_and_mismatches_change_nothing() {
    for prec in [Prec::F32, Prec::F64] {
        let g = Graph::with_seed(9);
        let (x, y) = model(&g);
        let mut s = session(&g, BackendKind::Interp, prec).unwrap();
        s.write(&x, &[0.5; 24]).unwrap();
        let r = s.forward(&[&y]).unwrap();
        s.run(&r).unwrap();
        let path = std::env::temp_dir().join(format!("rocannl_api_{}.safetensors", prec.name()));
        s.save_params(&path).unwrap();
        let before: Vec<Vec<u64>> = g
            .params()
            .iter()
            .map(|p| s.read(p).unwrap().iter().map(|v| v.to_bits()).collect())
            .collect();
        for p in g.params() {
            let n = p.num_elements().unwrap();
            s.write(&p, &vec![7.0; n]).unwrap();
        }
        s.load_params(&path).unwrap();
        let after: Vec<Vec<u64>> = g
            .params()
            .iter()
            .map(|p| s.read(p).unwrap().iter().map(|v| v.to_bits()).collect())
            .collect();
        assert_eq!(before, after, "{}", prec.name());

        // A file for a wider model does not fit: error, and nothing changes.
        let g2 = Graph::with_seed(1);
        let x2 = g2.data("x", Axes::new().batch(&[8]).output(&[3]));
        let y2 = Mlp::new(&g2, "m", MlpConfig::new(&[6, 2]).with_act(Activation::Tanh)).apply(&x2);
        let mut s2 = session(&g2, BackendKind::Interp, prec).unwrap();
        let r2 = s2.forward(&[&y2]).unwrap();
        s2.write(&x2, &[0.5; 24]).unwrap();
        s2.run(&r2).unwrap();
        let keep: Vec<Vec<f64>> = g2.params().iter().map(|p| s2.read(p).unwrap()).collect();
        let err = s2.load_params(&path).unwrap_err();
        assert!(err.to_string().contains("m.0"), "{err}");
        let now: Vec<Vec<f64>> = g2.params().iter().map(|p| s2.read(p).unwrap()).collect();
        assert_eq!(keep, now);
        let _ = std::fs::remove_file(&path);
    }
}

/// `loss = Σ (p - t)² / 2`, so the gradient is `p - t`; compares a few steps of each optimizer
/// with the same formulas computed here (PyTorch's semantics).
#[test]
fn optimizers_follow_their_formulas() {
    let t = [1.0, -2.0, 0.5];
    let p0 = [0.3, 0.7, -1.1];
    let cases = [
        Optimizer::Sgd(Sgd::default()),
        Optimizer::Sgd(Sgd { momentum: 0.9, ..Default::default() }),
        Optimizer::Sgd(Sgd { momentum: 0.9, nesterov: true, weight_decay: 0.01 }),
        Optimizer::Adam(Adam::default()),
        Optimizer::Adam(Adam { weight_decay: 0.05, ..Default::default() }),
        Optimizer::AdamW(AdamW { weight_decay: 0.1, ..Default::default() }),
    ];
    for opt in cases {
        let g = Graph::new();
        let p =
            g.param("p", ParamSpec::new(Axes::new().output(&[3])).init(Init::Values(p0.to_vec())));
        let d = &p - &g.vector("t", &t);
        let l = d.pointmul(&d).sum_all().scale(0.5);
        let mut s = session(&g, BackendKind::Interp, Prec::F64).unwrap();
        let mut step = s.train_step(&l, &opt, &[], &Default::default()).unwrap();
        let lr = 0.1;
        let (mut p_ref, mut v, mut m) = (p0.to_vec(), [0.0; 3], [0.0; 3]);
        let mut v2 = [0.0; 3];
        for k in 1..=4 {
            s.step(&mut step, lr).unwrap();
            for i in 0..3 {
                let grad = p_ref[i] - t[i];
                match opt {
                    Optimizer::Sgd(Sgd { momentum, nesterov, weight_decay }) => {
                        let g = grad + weight_decay * p_ref[i];
                        if momentum == 0.0 {
                            p_ref[i] -= lr * g;
                        } else {
                            v[i] = momentum * v[i] + g;
                            p_ref[i] -= lr * if nesterov { g + momentum * v[i] } else { v[i] };
                        }
                    }
                    Optimizer::Adam(Adam { beta1, beta2, eps, weight_decay })
                    | Optimizer::AdamW(AdamW { beta1, beta2, eps, weight_decay }) => {
                        let decoupled = matches!(opt, Optimizer::AdamW(AdamW { .. }));
                        if decoupled {
                            p_ref[i] *= 1.0 - lr * weight_decay;
                        }
                        let g = if decoupled { grad } else { grad + weight_decay * p_ref[i] };
                        m[i] = beta1 * m[i] + (1.0 - beta1) * g;
                        v2[i] = beta2 * v2[i] + (1.0 - beta2) * g * g;
                        let mh = m[i] / (1.0 - beta1.powi(k));
                        let vh = v2[i] / (1.0 - beta2.powi(k));
                        p_ref[i] -= lr * mh / (vh.sqrt() + eps);
                    }
                }
            }
            let got = s.read(&p).unwrap();
            for i in 0..3 {
                assert!((got[i] - p_ref[i]).abs() < 1e-9, "{opt:?} step {k}: {got:?} vs {p_ref:?}");
            }
        }
    }
}

#[test]
fn backends_agree_on_a_training_run() {
    let run = |backend| -> Result<Vec<f64>, Error> {
        let g = Graph::with_seed(4);
        let xs: Vec<f64> = (0..64).map(|i| ((i * 37) % 17) as f64 / 17.0 - 0.5).collect();
        let ys: Vec<f64> = (0..32).map(|i| if i % 3 == 0 { 1.0 } else { -1.0 }).collect();
        let cols = [Column::new("x", &[2], xs), Column::new("y", &[1], ys)];
        let loader = Loader::new(&g, &cols, 8).unwrap();
        let f = Mlp::new(&g, "f", MlpConfig::new(&[6, 1])).apply(loader.batch(0));
        let l = loss::hinge(&f, loader.batch(1), loss::Reduction::Mean);
        let mut s = session(&g, backend, Prec::F32)?;
        let mut step =
            s.train_step(&l, &Optimizer::Adam(Adam::default()), &[], &Default::default()).unwrap();
        let order: Vec<usize> = (0..32).collect();
        loader.load(&mut s, &cols, &order).unwrap();
        let mut losses = Vec::new();
        for k in 0..12 {
            loader.set_batch(&mut s, k % 4).unwrap();
            s.step(&mut step, 0.01).unwrap();
            losses.push(s.loss(&step).unwrap());
        }
        Ok(losses)
    };
    let reference = run(BackendKind::Interp).unwrap();
    for backend in BackendKind::available() {
        let got = match run(backend) {
            Ok(got) => got,
            // Without a GPU the CUDA backend can only compile (tested in rocannl-arrayjit).
            Err(Error::Compile(rocannl_tensor::CompileError::NoDevice { .. }))
                if backend == BackendKind::Cuda =>
            {
                eprintln!("no CUDA device: the CUDA backend is not compared here");
                continue;
            }
            Err(e) => panic!("{backend:?}: {e}"),
        };
        for (a, b) in got.iter().zip(&reference) {
            assert!(
                (a - b).abs() < 1e-4 * (1.0 + b.abs()),
                "{backend:?}: {got:?} vs {reference:?}"
            );
        }
    }
    assert!(reference.last() < reference.first(), "{reference:?}");
}

#[test]
fn loader_batches_out_of_range_are_errors() {
    let g = Graph::new();
    let cols = [Column::new("x", &[1], (0..8).map(f64::from).collect())];
    let loader = Loader::new(&g, &cols, 4).unwrap();
    let y = loader.batch(0).exp();
    let mut s = Session::new(&g).unwrap();
    let r = s.forward(&[&y]).unwrap();
    loader.load(&mut s, &cols, &(0..8).collect::<Vec<_>>()).unwrap();
    assert!(s.run(&r).is_err(), "no batch chosen yet");
    loader.set_batch(&mut s, 1).unwrap();
    assert!(s.run(&r).is_ok());
    let err = loader.set_batch(&mut s, 2).unwrap_err().to_string();
    assert!(err.contains("batch 2"), "{err}");
}

#[test]
fn two_params_of_one_name_are_an_error_naming_both_call_sites() {
    let g = Graph::with_seed(0);
    let x = g.data("x", Axes::new().batch(&[4]).output(&[3]));
    let first = line!() + 1;
    let w = g.param("w", ParamSpec::default());
    let second = line!() + 1;
    let w2 = g.param("w", ParamSpec::default());
    let y = w2.matmul(&w.matmul(&x));
    let err = Session::new(&g).map(|_| ()).unwrap_err().to_string();
    let here = file!();
    assert!(err.contains("two params are named 'w'"), "{err}");
    assert!(err.contains(&format!("{here}:{first}:")), "{err}");
    assert!(err.contains(&format!("{here}:{second}:")), "{err}");
    drop(y);
    // Blocks name their params after the name they are given: the same name twice is caught
    // at the caller's line too.
    let g = Graph::with_seed(0);
    let x = g.data("x", Axes::new().batch(&[4]).output(&[3]));
    let line = line!() + 1;
    let h = Linear::new(&g, "fc", LinearConfig::new(5)).apply(&x);
    let _ = Linear::new(&g, "fc", LinearConfig::new(2)).apply(&h);
    let err = g.finish().unwrap_err().to_string();
    assert!(err.contains("two params are named 'fc.w'"), "{err}");
    assert!(err.contains(&format!("{here}:{line}:")), "{err}");
    assert!(err.contains(&format!("{here}:{}:", line + 1)), "{err}");
}

#[test]
fn activations_match_independent_values_on_every_backend_and_precision() {
    // From Python's `math` module (erf, tanh, exp), independently of this code.
    let xs = [-3.0, -1.5, -0.5, 0.0, 0.25, 1.0, 2.5];
    type F = fn(&rocannl_tensor::Tensor) -> rocannl_tensor::Tensor;
    let cases: [(&str, F, [f64; 7]); 4] = [
        (
            "erf",
            |x| x.erf(),
            [
                -0.9999779095030014,
                -0.9661051464753108,
                -0.5204998778130465,
                0.0,
                0.2763263901682369,
                0.8427007929497149,
                0.999593047982555,
            ],
        ),
        (
            "gelu",
            |x| x.gelu(),
            [
                -0.00404969409489031,
                -0.10021080190328713,
                -0.15426876936299344,
                0.0,
                0.14967658142073093,
                0.8413447460685429,
                2.4844758366855597,
            ],
        ),
        (
            "gelu_tanh",
            |x| x.gelu_tanh(),
            [
                -0.0036373920817729943,
                -0.10042842301976707,
                -0.15428599017485606,
                0.0,
                0.149675350701685,
                0.8411919906082768,
                2.484915733910001,
            ],
        ),
        (
            "silu",
            |x| x.silu(),
            [
                -0.14227761953270035,
                -0.2736382857095345,
                -0.1887703343990727,
                0.0,
                0.14054412522144952,
                0.7310585786300049,
                2.3103545499468914,
            ],
        ),
    ];
    for backend in rocannl_tensor::BackendKind::available()
        .into_iter()
        .filter(|b| *b != rocannl_tensor::BackendKind::Cuda)
    {
        for prec in [rocannl_tensor::Prec::F32, rocannl_tensor::Prec::F64] {
            // f32: a few ulps of the results (|y| < 3).
            let tol = if prec == rocannl_tensor::Prec::F32 { 2e-6 } else { 1e-14 };
            for (name, f, want) in &cases {
                let g = Graph::with_seed(0);
                let x = g.ndarray("x", Axes::new().output(&[7]), &xs);
                let y = f(&x);
                let opts = rocannl_tensor::SessionOptions {
                    backend,
                    prec,
                    ..rocannl_tensor::SessionOptions::default()
                };
                let mut s = Session::with_options(&g, opts).unwrap();
                let r = s.forward(&[&y]).unwrap();
                s.run(&r).unwrap();
                let got = s.read(&y).unwrap();
                for (k, (a, b)) in got.iter().zip(want).enumerate() {
                    assert!(
                        (a - b).abs() <= tol,
                        "{name} {backend:?} {prec:?} at {}: {a} vs {b}",
                        xs[k]
                    );
                }
            }
        }
    }
}

#[test]
fn gradients_are_clipped_by_their_global_norm_across_parameters() {
    use rocannl_tensor::{Axes, Init, Optimizer, ParamSpec, SessionOptions, Sgd, StepOptions};
    for backend in rocannl_tensor::BackendKind::available()
        .into_iter()
        .filter(|b| *b != rocannl_tensor::BackendKind::Cuda)
    {
        // The gradient of ½(Σw1² + Σw2²) is the params themselves: a global norm of
        // √(3² + 4² + 12²) = 13.
        for (max, coef) in [(1.3, 1.3 / (13.0 + 1e-6)), (100.0, 1.0)] {
            let g = Graph::with_seed(0);
            let w1 = g.param(
                "w1",
                ParamSpec::new(Axes::new().output(&[2])).init(Init::Values(vec![3.0, 4.0])),
            );
            let w2 = g.param(
                "w2",
                ParamSpec::new(Axes::new().output(&[1])).init(Init::Values(vec![12.0])),
            );
            let loss = (&w1.pointmul(&w1).sum_all() + &w2.pointmul(&w2).sum_all()).scale(0.5);
            let opts = SessionOptions {
                backend,
                prec: rocannl_tensor::Prec::F64,
                ..SessionOptions::default()
            };
            let mut s = Session::with_options(&g, opts).unwrap();
            let clip = StepOptions { clip_grad_norm: Some(max), ..StepOptions::default() };
            let mut step =
                s.train_step(&loss, &Optimizer::Sgd(Sgd::default()), &[], &clip).unwrap();
            s.step(&mut step, 0.5).unwrap();
            let norm = s.grad_norm(&step).unwrap().unwrap();
            assert!((norm - 13.0).abs() < 1e-12, "{backend:?}: {norm}");
            let want = |w: f64| w - 0.5 * coef * w;
            let (a, b) = (s.read(&w1).unwrap(), s.read(&w2).unwrap());
            for (got, w) in a.iter().chain(&b).zip([3.0, 4.0, 12.0]) {
                assert!(
                    (got - want(w)).abs() < 1e-12,
                    "{backend:?} max {max}: {got} vs {}",
                    want(w)
                );
            }
        }
    }
    // A step without clipping reports no norm; a bad bound is a usage error.
    let g = Graph::with_seed(0);
    let w = g.param("w", ParamSpec::new(Axes::new().output(&[1])).init(Init::Constant(1.0)));
    let loss = w.pointmul(&w);
    let mut s = Session::new(&g).unwrap();
    let step =
        s.train_step(&loss, &Optimizer::Sgd(Sgd::default()), &[], &Default::default()).unwrap();
    assert_eq!(s.grad_norm(&step).unwrap(), None);
    let bad = StepOptions { clip_grad_norm: Some(0.0), ..StepOptions::default() };
    let err = s.train_step(&loss, &Optimizer::Sgd(Sgd::default()), &[], &bad).unwrap_err();
    assert!(err.to_string().contains("clip_grad_norm"), "{err}");
}

/// Gradients with two and three axes (summed row by row, then the rows) give the same global
/// norm, on every backend, as the exact one; a non-finite gradient in such a parameter makes
/// the norm non-finite.
#[test]
fn the_global_norm_sums_matrices_row_by_row() {
    use rocannl_tensor::{Axes, Init, Optimizer, ParamSpec, SessionOptions, Sgd, StepOptions};
    let m: Vec<f64> = (0..12).map(|i| (i as f64) - 5.0).collect();
    let t: Vec<f64> = (0..12).map(|i| (3 * i % 7) as f64).collect();
    let exact = m.iter().chain(&t).chain(&[2.0]).map(|v| v * v).sum::<f64>().sqrt();
    for backend in rocannl_tensor::BackendKind::available()
        .into_iter()
        .filter(|b| *b != rocannl_tensor::BackendKind::Cuda)
    {
        for poison in [false, true] {
            let g = Graph::with_seed(0);
            let mut mv = m.clone();
            if poison {
                mv[7] = f64::INFINITY;
            }
            let w1 = g.param(
                "w1",
                ParamSpec::new(Axes::new().input(&[4]).output(&[3])).init(Init::Values(mv)),
            );
            let w2 = g.param(
                "w2",
                ParamSpec::new(Axes::new().input(&[3]).output(&[2, 2]))
                    .init(Init::Values(t.clone())),
            );
            let w3 = g.param(
                "w3",
                ParamSpec::new(Axes::new().output(&[1])).init(Init::Values(vec![2.0])),
            );
            // The gradient of ½Σw² is w.
            let loss = (&(&w1.pointmul(&w1).sum_all() + &w2.pointmul(&w2).sum_all())
                + &w3.pointmul(&w3).sum_all())
                .scale(0.5);
            let opts = SessionOptions {
                backend,
                prec: rocannl_tensor::Prec::F64,
                ..SessionOptions::default()
            };
            let mut s = Session::with_options(&g, opts).unwrap();
            let clip = StepOptions { clip_grad_norm: Some(1.0), ..StepOptions::default() };
            let mut step =
                s.train_step(&loss, &Optimizer::Sgd(Sgd::default()), &[], &clip).unwrap();
            s.step(&mut step, 0.5).unwrap();
            let norm = s.grad_norm(&step).unwrap().unwrap();
            if poison {
                assert!(!norm.is_finite(), "{backend:?}: {norm}");
            } else {
                assert_eq!(norm, exact, "{backend:?}");
            }
        }
    }
}

#[test]
fn weight_decay_skips_biases_norm_gains_and_embeddings() {
    use rocannl_tensor::{AdamW, Axes, Init, Optimizer, ParamSpec, Sgd};
    // A dense layer's weight decays, its bias does not; a param can opt out by hand.
    let run = |opt: Optimizer| {
        let g = Graph::with_seed(0);
        let x =
            g.ndarray("x", Axes::new().batch(&[2]).output(&[3]), &[0.1, 0.2, 0.3, -0.1, 0.4, 0.2]);
        let layer = Linear::new(&g, "fc", LinearConfig::new(2));
        let free = g.param(
            "free",
            ParamSpec::new(Axes::new().input(&[]).output(&[2]))
                .init(Init::Values(vec![1.0, -2.0]))
                .no_decay(),
        );
        let loss = (&layer.apply(&x) + &free).sum_all();
        let mut s = Session::with_options(&g, common_opts()).unwrap();
        let mut step = s.train_step(&loss, &opt, &[], &Default::default()).unwrap();
        s.step(&mut step, 0.1).unwrap();
        let r = |t: &rocannl_tensor::Tensor| s.read(t).unwrap();
        (r(&layer.w), r(layer.b.as_ref().unwrap()), r(&free))
    };
    for (with, without) in [
        (
            Optimizer::Sgd(Sgd { weight_decay: 0.5, ..Default::default() }),
            Optimizer::Sgd(Sgd::default()),
        ),
        (
            Optimizer::AdamW(AdamW { weight_decay: 0.5, ..Default::default() }),
            Optimizer::AdamW(AdamW { weight_decay: 0.0, ..Default::default() }),
        ),
    ] {
        let (w1, b1, f1) = run(with.clone());
        let (w0, b0, f0) = run(without);
        assert_eq!(b1, b0, "{with:?}: the bias decayed");
        assert_eq!(f1, f0, "{with:?}: a no_decay param decayed");
        assert!(w1.iter().zip(&w0).all(|(a, b)| a != b), "{with:?}: the weight did not decay");
    }
    // The blocks' biases, gains and tables are exempt; their weights are not.
    let g = Graph::with_seed(0);
    let x = g.data("x", Axes::new().batch(&[2]).output(&[3]));
    let h = Linear::new(&g, "fc", LinearConfig::new(4)).apply(&x);
    let _ = LayerNorm::new(&g, "ln", LayerNormConfig::default()).apply(&h);
    let emb = rocannl_tensor::nn::embed::EmbeddingConfig::new(5, 4);
    let _ = rocannl_tensor::nn::embed::Embedding::new(&g, "emb", emb);
    g.finish().unwrap();
    for p in g.params() {
        let exempt = matches!(p.label().as_str(), "fc.b" | "ln.gain" | "ln.bias" | "emb.table");
        assert_eq!(g.decays(&p).unwrap(), !exempt, "{}", p.label());
    }
    // SGD's L2 penalty, by hand: the bias' gradient is 2 (two examples), its step 0.1·2.
    let (_, b, f) = run(Optimizer::Sgd(Sgd { weight_decay: 0.5, ..Default::default() }));
    assert!(b.iter().all(|v| (v + 0.2).abs() < 1e-12), "{b:?}");
    assert!((f[0] - 0.8).abs() < 1e-12 && (f[1] + 2.2).abs() < 1e-12, "{f:?}");
}

fn common_opts() -> rocannl_tensor::SessionOptions {
    rocannl_tensor::SessionOptions {
        backend: rocannl_tensor::BackendKind::Interp,
        prec: rocannl_tensor::Prec::F64,
        ..rocannl_tensor::SessionOptions::default()
    }
}

#[test]
fn ids_out_of_range_or_beyond_the_precision_are_errors_that_write_nothing() {
    let g = Graph::with_seed(0);
    let ids = g.data("tokens", Axes::new().batch(&[4]));
    let y = ids.scale(1.0);
    let opts = rocannl_tensor::SessionOptions {
        backend: rocannl_tensor::BackendKind::Interp,
        ..rocannl_tensor::SessionOptions::default()
    };
    let mut s = Session::with_options(&g, opts).unwrap();
    let r = s.forward(&[&y]).unwrap();
    s.write_ids(&ids, &[1, 2, 3, 0], 27).unwrap();
    let err = s.write_ids(&ids, &[1, 2, 30, 0], 27).unwrap_err().to_string();
    assert!(err.contains("'tokens'") && err.contains("position 2") && err.contains("30"), "{err}");
    s.run(&r).unwrap();
    assert_eq!(s.read(&y).unwrap(), vec![1.0, 2.0, 3.0, 0.0], "the bad write changed nothing");
    let err = s.write_ids(&ids, &[0, 0, 0, 0], 1 << 25).unwrap_err().to_string();
    assert!(err.contains("exactly"), "{err}");
}

#[test]
fn normal_initializations_are_finite_in_half_precision() {
    use rocannl_tensor::{Axes, Init, ParamSpec, Prec, SessionOptions};
    for prec in [Prec::Bf16, Prec::F16] {
        for backend in rocannl_tensor::BackendKind::available()
            .into_iter()
            .filter(|b| *b != rocannl_tensor::BackendKind::Cuda)
        {
            let g = Graph::with_seed(1);
            // 65,536 draws: in bf16 dozens of the first uniforms round up to 1.
            let w = g.param(
                "w",
                ParamSpec::new(Axes::new().output(&[65_536]))
                    .init(Init::Normal { mean: 0.0, std: 1.0 }),
            );
            let y = w.scale(1.0);
            let mut s = Session::with_options(
                &g,
                SessionOptions { backend, prec, ..SessionOptions::default() },
            )
            .unwrap();
            let r = s.forward(&[&y]).unwrap();
            s.run(&r).unwrap();
            let v = s.read(&w).unwrap();
            assert!(v.iter().all(|x| x.is_finite()), "{prec:?} {backend:?}: a non-finite draw");
            let mean = v.iter().sum::<f64>() / v.len() as f64;
            let var = v.iter().map(|x| (x - mean) * (x - mean)).sum::<f64>() / v.len() as f64;
            // Standard normal: the mean within 5 standard errors, the variance within 5%.
            assert!(mean.abs() < 5.0 / 256.0 && (var - 1.0).abs() < 0.05, "{prec:?}: {mean} {var}");
        }
    }
}

#[test]
fn sessions_are_configured_from_this_crate_alone() {
    use rocannl_tensor::{BackendKind, CacheMode, CompileOptions, SessionOptions};
    let g = Graph::with_seed(0);
    let x = g.ndarray("x", Axes::new().output(&[2]), &[1.0, 2.0]);
    let y = x.scale(3.0);
    let compile =
        CompileOptions { opt_level: 1, cache: CacheMode::Off, ..CompileOptions::default() };
    let opts =
        SessionOptions { backend: BackendKind::default(), compile, ..SessionOptions::default() };
    let mut s = Session::with_options(&g, opts).unwrap();
    let r = s.forward(&[&y]).unwrap();
    s.run(&r).unwrap();
    assert_eq!(s.read(&y).unwrap(), vec![3.0, 6.0]);
}

#[test]
fn errors_inside_losses_and_blocks_name_the_users_call_and_tensors() {
    // A target of the wrong width: the mismatch is inside `mse`, and the message says so with
    // the line of this file, and names the layer's output and the target.
    let g = Graph::new();
    let x = g.data("inputs", Axes::new().batch(&[8]).output(&[5]));
    let y = g.data("targets", Axes::new().batch(&[8]).output(&[3]));
    let out = Mlp::new(&g, "mlp", MlpConfig::new(&[16, 2])).apply(&x);
    let line = line!() + 1;
    let _ = loss::mse(&out, &y, loss::Reduction::Mean);
    let msg = Session::new(&g).unwrap_err().to_string();
    assert!(msg.contains(&format!("loss::mse at {}:{line}", file!())), "{msg}");
    assert!(msg.contains("'mlp.1'") && msg.contains("'targets'"), "{msg}");
    assert!(!msg.contains('$'), "internal variables: {msg}");
    // Labels of another batch size in a sparse cross-entropy.
    let g = Graph::new();
    let x = g.data("inputs", Axes::new().batch(&[8]).output(&[5]));
    let ids = g.data("ids", Axes::new().batch(&[7]));
    let logits = Mlp::new(&g, "mlp", MlpConfig::new(&[16, 3])).apply(&x);
    let line = line!() + 1;
    let _ = loss::sparse_cross_entropy(&logits, &ids, loss::Reduction::Mean);
    let msg = Session::new(&g).unwrap_err().to_string();
    assert!(msg.contains(&format!("loss::sparse_cross_entropy at {}:{line}", file!())), "{msg}");
    assert!(msg.contains("one_hot(ids)") && msg.contains("'mlp.1'"), "{msg}");
    assert!(msg.contains('8') && msg.contains('7'), "{msg}");
    // Inside a block applied to an input of the wrong width: the block's call is named.
    let g = Graph::new();
    let a = g.data("a", Axes::new().batch(&[4]).output(&[5]));
    let b = g.data("b", Axes::new().batch(&[4]).output(&[6]));
    let layer = Linear::new(&g, "fc", LinearConfig::new(3));
    let _ = layer.apply(&a);
    let line = line!() + 1;
    let _ = layer.apply(&b);
    let msg = Session::new(&g).unwrap_err().to_string();
    assert!(msg.contains(&format!("Linear::apply at {}:{line}", file!())), "{msg}");
    assert!(msg.contains("'fc.w'") && msg.contains("'b'"), "{msg}");
}

/// The optimization level and the tiers change speed, never values: a training step built at
/// `-O0`, `-O1` and `-O3`, and a tiered one whose first step runs the quick `-O0` build and
/// whose later steps run the optimized build swapped in, end with the same bits.
#[test]
fn a_training_step_computes_the_same_bits_at_every_level_and_across_the_tier_swap() {
    if !BackendKind::available().contains(&BackendKind::Gccjit) {
        return;
    }
    let run = |level: u8, tiered: bool| {
        let g = Graph::with_seed(5);
        let x = g.ndarray(
            "x",
            Axes::new().batch(&[16]).output(&[12]),
            &(0..192).map(|i| ((i * 37 % 19) as f64 - 9.0) / 7.0).collect::<Vec<_>>(),
        );
        let y = g.ndarray(
            "y",
            Axes::new().batch(&[16]).output(&[3]),
            &(0..48).map(|i| (i % 3) as f64).collect::<Vec<_>>(),
        );
        let out =
            Mlp::new(&g, "mlp", MlpConfig::new(&[40, 3]).with_act(Activation::GeluTanh)).apply(&x);
        let l = loss::cross_entropy(
            &out.softmax(rocannl_tensor::nn::OUTPUT_AXES),
            &y,
            loss::Reduction::Mean,
        );
        let mut opts = SessionOptions { backend: BackendKind::Gccjit, ..SessionOptions::default() };
        opts.compile.opt_level = level;
        opts.compile.tiered = tiered;
        opts.compile.cache = rocannl_tensor::CacheMode::Off;
        let mut s = Session::with_options(&g, opts).unwrap();
        let mut step =
            s.train_step(&l, &Optimizer::Adam(Adam::default()), &[], &Default::default()).unwrap();
        for k in 0..3 {
            s.step(&mut step, 1e-2).unwrap();
            if k == 0 {
                // The first step ran the quick build; the others run the optimized one.
                s.finish_builds();
            }
        }
        g.params().iter().flat_map(|p| s.read(p).unwrap()).map(f64::to_bits).collect::<Vec<_>>()
    };
    let o3 = run(3, false);
    assert_eq!(run(0, false), o3);
    assert_eq!(run(1, false), o3);
    assert_eq!(run(3, true), o3);
}

/// A GPT (dynamic batch, GELU, attention, layer norms, uniform and normal initializations)
/// gets the same parameters and computes the same bits whether its initialization runs on the
/// interpreter (a tiered session) or natively, and at `-O0` as at `-O3`, in every precision
/// a model trains in. (bf16 once differed: the interpreter's stores rounded some values just
/// above a tie downward.)
#[test]
fn a_gpt_computes_the_same_bits_with_interpreted_or_native_init_at_any_level() {
    use rocannl_tensor::nn::gpt::{Gpt, GptConfig};
    if !BackendKind::available().contains(&BackendKind::Gccjit) {
        return;
    }
    for prec in [Prec::F32, Prec::Bf16, Prec::F16] {
        let run = |tiered: bool, level: u8| {
            let g = Graph::with_seed(0);
            let batch = g.dynamic("batch", 8);
            let x = g.data("inputs", Axes::new().dynamic_batch(&batch).batch(&[16]));
            let y = g.data("targets", Axes::new().dynamic_batch(&batch).batch(&[16]));
            let cfg = GptConfig::new(27, 16, 64, 4, 2).with_ff(256).with_act(Activation::GeluTanh);
            let gpt = Gpt::new(&g, "gpt", cfg);
            let logits = gpt.apply(&x);
            let per = loss::sparse_cross_entropy(&logits, &y, loss::Reduction::None);
            let mut opts =
                SessionOptions { backend: BackendKind::Gccjit, prec, ..SessionOptions::default() };
            opts.compile.tiered = tiered;
            opts.compile.opt_level = level;
            opts.compile.cache = rocannl_tensor::CacheMode::Off;
            let mut s = Session::with_options(&g, opts).unwrap();
            let eval = s.forward(&[&per]).unwrap();
            let ids: Vec<u32> = (0..8 * 17).map(|i| (i * 7 % 27) as u32).collect();
            s.set_size(&batch, 7).unwrap();
            s.write_ids(&x, &ids[..7 * 16], 27).unwrap();
            s.write_ids(&y, &ids[16..8 * 16], 27).unwrap();
            s.run(&eval).unwrap();
            let mut bits: Vec<u64> =
                gpt.params().iter().flat_map(|p| s.read(p).unwrap()).map(f64::to_bits).collect();
            bits.extend(s.read(&per).unwrap().into_iter().map(f64::to_bits));
            bits
        };
        let native = run(false, 3);
        assert!(run(true, 3) == native, "{prec:?}: interpreted init");
        assert!(run(false, 0) == native, "{prec:?}: -O0");
    }
}

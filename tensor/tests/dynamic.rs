//! Dynamic batch sizes: one routine compiled for a dynamic batch computes, at every size up to
//! the maximum, what a routine compiled for that fixed size computes — values, loss, gradients
//! and training steps — on every CPU backend; misuse is a clear error.

use rocannl_tensor::nn::{Activation, Mlp, MlpConfig, loss};
use rocannl_tensor::{
    Axes, BackendKind, DynDim, Error, Graph, Optimizer, Prec, Session, SessionOptions, Sgd, Tensor,
};

const MAX: usize = 12;

fn backends() -> Vec<BackendKind> {
    let mut b = vec![BackendKind::Interp];
    if cfg!(feature = "gccjit") || BackendKind::default() == BackendKind::Gccjit {
        b.push(BackendKind::Gccjit);
    }
    b
}

fn session(g: &Graph, backend: BackendKind) -> Session {
    Session::with_options(g, SessionOptions { backend, prec: Prec::F32, ..Default::default() })
        .unwrap()
}

/// A small regression model over `x` (batch | 5 features) with targets `y` (batch | 2): the
/// prediction, the mean squared error and the model's params.
fn model(g: &Graph, x: &Tensor, y: &Tensor) -> (Tensor, Tensor, Vec<Tensor>) {
    let mlp = Mlp::new(g, "mlp", MlpConfig::new(&[16, 2]).with_act(Activation::Tanh));
    let pred = mlp.apply(x);
    let err = loss::mse(&pred, y, loss::Reduction::Mean);
    (pred, err, g.params())
}

fn inputs(n: usize) -> (Vec<f64>, Vec<f64>) {
    let x = (0..n * 5).map(|i| ((i * 37 % 23) as f64 - 11.0) / 7.0).collect();
    let y = (0..n * 2).map(|i| ((i * 13 % 17) as f64 - 8.0) / 5.0).collect();
    (x, y)
}

/// Graph, data tensors and the model, either with a dynamic batch or a fixed one of `n`.
fn build(dynamic: Option<usize>, n: usize) -> (Graph, Option<DynDim>, Tensor, Tensor) {
    let g = Graph::with_seed(7);
    match dynamic {
        Some(max) => {
            let b = g.dynamic("batch", max);
            let x = g.data("x", Axes::new().dynamic_batch(&b).output(&[5]));
            let y = g.data("y", Axes::new().dynamic_batch(&b).output(&[2]));
            (g, Some(b), x, y)
        }
        None => {
            let x = g.data("x", Axes::new().batch(&[n]).output(&[5]));
            let y = g.data("y", Axes::new().batch(&[n]).output(&[2]));
            (g, None, x, y)
        }
    }
}

fn close(a: &[f64], b: &[f64], what: &str) {
    assert_eq!(a.len(), b.len(), "{what}: lengths");
    for (k, (p, q)) in a.iter().zip(b).enumerate() {
        let tol = 1e-5 * (1.0 + q.abs());
        assert!((p - q).abs() <= tol, "{what}[{k}]: {p} vs {q}");
    }
}

#[test]
fn one_routine_matches_a_fixed_batch_at_every_size() {
    for backend in backends() {
        let (g, b, x, y) = build(Some(MAX), MAX);
        let b = b.unwrap();
        let (pred, err, params) = model(&g, &x, &y);
        let mut s = session(&g, backend);
        let r = s.backprop(&err, &[&pred]).unwrap();
        for n in [MAX, 1, 5, MAX - 1] {
            let (xv, yv) = inputs(n);
            s.set_size(&b, n).unwrap();
            s.write(&x, &xv).unwrap();
            s.write(&y, &yv).unwrap();
            s.run(&r).unwrap();

            let (g2, _, x2, y2) = build(None, n);
            let (pred2, err2, params2) = model(&g2, &x2, &y2);
            let mut s2 = session(&g2, backend);
            let r2 = s2.backprop(&err2, &[&pred2]).unwrap();
            s2.write(&x2, &xv).unwrap();
            s2.write(&y2, &yv).unwrap();
            s2.run(&r2).unwrap();

            let what = format!("{backend:?} n={n}");
            close(&s.read(&pred).unwrap(), &s2.read(&pred2).unwrap(), &format!("{what} pred"));
            close(&s.read(&err).unwrap(), &s2.read(&err2).unwrap(), &format!("{what} loss"));
            for (p, p2) in params.iter().zip(&params2) {
                close(
                    &s.read_grad(p).unwrap(),
                    &s2.read_grad(p2).unwrap(),
                    &format!("{what} grad {}", p.label()),
                );
            }
        }
    }
}

#[test]
fn training_with_partial_batches_follows_fixed_batches() {
    // Plain SGD steps on batches of 12, 5, 1 and 12 rows through one compiled step, against a
    // session compiled for each size that starts from the parameters the previous step left.
    let sizes = [MAX, 5, 1, MAX];
    for backend in backends() {
        let (g, b, x, y) = build(Some(MAX), MAX);
        let b = b.unwrap();
        let (_, err, params) = model(&g, &x, &y);
        let mut s = session(&g, backend);
        let mut step =
            s.train_step(&err, &Optimizer::Sgd(Sgd::default()), &[], &Default::default()).unwrap();
        for (k, &n) in sizes.iter().enumerate() {
            let before: Vec<Vec<f64>> = params.iter().map(|p| s.read(p).unwrap()).collect();
            let (xv, yv) = inputs(n);
            s.set_size(&b, n).unwrap();
            s.write(&x, &xv).unwrap();
            s.write(&y, &yv).unwrap();
            s.step(&mut step, 0.1).unwrap();

            let (g2, _, x2, y2) = build(None, n);
            let (_, err2, params2) = model(&g2, &x2, &y2);
            let mut s2 = session(&g2, backend);
            let mut step2 = s2
                .train_step(&err2, &Optimizer::Sgd(Sgd::default()), &[], &Default::default())
                .unwrap();
            for (p, v) in params2.iter().zip(&before) {
                s2.write(p, v).unwrap();
            }
            s2.write(&x2, &xv).unwrap();
            s2.write(&y2, &yv).unwrap();
            s2.step(&mut step2, 0.1).unwrap();
            let what = format!("{backend:?} step {k} (n={n})");
            close(&[s.loss(&step).unwrap()], &[s2.loss(&step2).unwrap()], &what);
            for (p, p2) in params.iter().zip(&params2) {
                close(&s.read(p).unwrap(), &s2.read(p2).unwrap(), &format!("{what} {}", p.label()));
            }
        }
    }
}

#[test]
fn a_mean_over_the_batch_divides_by_the_rows_there_are() {
    for backend in backends() {
        let g = Graph::new();
        let b = g.dynamic("batch", 6);
        let x = g.data("x", Axes::new().dynamic_batch(&b).output(&[2]));
        let m = x.mean_all();
        let col = x.mean("b|o => 0|o");
        let mut s = session(&g, backend);
        let r = s.forward(&[&m, &col]).unwrap();
        for n in 1..=6 {
            let xv: Vec<f64> = (0..2 * n).map(|i| i as f64).collect();
            s.set_size(&b, n).unwrap();
            s.write(&x, &xv).unwrap();
            s.run(&r).unwrap();
            // Each cell is scaled by 1/count rounded to f32, then summed.
            let want = xv.iter().sum::<f64>() / xv.len() as f64;
            close(&s.read(&m).unwrap(), &[want], &format!("{backend:?} n={n} mean"));
            let cols = [(n - 1) as f64, n as f64];
            close(&s.read(&col).unwrap(), &cols, &format!("{backend:?} n={n} column means"));
        }
    }
}

#[test]
fn a_dynamic_axis_meeting_a_fixed_one_is_an_error_naming_both() {
    let g = Graph::new();
    let b = g.dynamic("batch", 8);
    let x = g.data("x", Axes::new().dynamic_batch(&b).output(&[3]));
    let z = g.data("z", Axes::new().batch(&[8]).output(&[3]));
    let sum = (&x + &z).named("sum");
    let mut s = Session::new(&g).unwrap();
    let err = s.forward(&[&sum]).unwrap_err();
    let msg = err.to_string();
    assert!(matches!(err, Error::Dynamic { .. }), "{msg}");
    assert!(msg.contains("batch<=8") && msg.contains("'z'") && msg.contains("'sum'"), "{msg}");
}

#[test]
fn two_dynamic_sizes_must_not_meet() {
    let g = Graph::new();
    let a = g.dynamic("a", 4);
    let c = g.dynamic("c", 4);
    let x = g.data("x", Axes::new().dynamic_batch(&a).output(&[3]));
    let y = g.data("y", Axes::new().dynamic_batch(&c).output(&[3]));
    let sum = (&x + &y).named("sum");
    let mut s = Session::new(&g).unwrap();
    let msg = s.forward(&[&sum]).unwrap_err().to_string();
    assert!(msg.contains("a<=4") && msg.contains("c<=4") && msg.contains("'y'"), "{msg}");
    // Nor in the one result axis the parts of a concatenation fill.
    let g = Graph::new();
    let a = g.dynamic("a", 8);
    let c = g.dynamic("c", 8);
    let x = g.data("x", Axes::new().dynamic_batch(&a).output(&[3]));
    let y = g.data("y", Axes::new().dynamic_batch(&c).output(&[4]));
    let z = x.concat("b|p; b|q => b|p^q", &[&y]).named("z");
    let mut s = Session::new(&g).unwrap();
    let msg = s.forward(&[&z]).unwrap_err().to_string();
    assert!(msg.contains("a<=8") && msg.contains("c<=8") && msg.contains("'z'"), "{msg}");
    // One dynamic size for both parts is fine.
    let g = Graph::new();
    let a = g.dynamic("a", 8);
    let x = g.data("x", Axes::new().dynamic_batch(&a).output(&[3]));
    let y = g.data("y", Axes::new().dynamic_batch(&a).output(&[4]));
    let z = x.concat("b|p; b|q => b|p^q", &[&y]);
    let mut s = Session::new(&g).unwrap();
    let r = s.forward(&[&z]).unwrap();
    s.set_size(&a, 2).unwrap();
    s.write(&x, &[1.0, 2.0, 3.0, 4.0, 5.0, 6.0]).unwrap();
    s.write(&y, &[7.0, 8.0, 9.0, 10.0, 11.0, 12.0, 13.0, 14.0]).unwrap();
    s.run(&r).unwrap();
    let want = [1.0, 2.0, 3.0, 7.0, 8.0, 9.0, 10.0, 4.0, 5.0, 6.0, 11.0, 12.0, 13.0, 14.0];
    assert_eq!(s.read(&z).unwrap(), want);
}

#[test]
fn sizes_and_lengths_are_checked() {
    let g = Graph::new();
    let b = g.dynamic("batch", 4);
    let x = g.data("x", Axes::new().dynamic_batch(&b).output(&[3]));
    let y = x.scale(2.0);
    let mut s = Session::new(&g).unwrap();
    let r = s.forward(&[&y]).unwrap();
    assert!(s.set_size(&b, 0).is_err());
    assert!(s.set_size(&b, 5).is_err());
    s.set_size(&b, 2).unwrap();
    let msg = s.write(&x, &[1.0; 12]).unwrap_err().to_string();
    assert!(msg.contains("'x'") && msg.contains('6') && msg.contains("12"), "{msg}");
    s.write(&x, &[1.0, 2.0, 3.0, 4.0, 5.0, 6.0]).unwrap();
    s.run(&r).unwrap();
    assert_eq!(s.read(&y).unwrap(), vec![2.0, 4.0, 6.0, 8.0, 10.0, 12.0]);
    // A maximum below 2 is refused when the graph is finished.
    let g = Graph::new();
    let b = g.dynamic("one", 1);
    let _ = g.data("x", Axes::new().dynamic_batch(&b).output(&[3])).scale(1.0);
    let msg = g.finish().unwrap_err().to_string();
    assert!(msg.contains("`one`") && msg.contains("at least 2"), "{msg}");
}

#[test]
fn scheduled_kernels_stop_at_the_size_and_agree_with_fixed_batches() {
    // Big enough for the CPU schedule's blocked kernels (row chunks of 64, reduction tiles):
    // sizes around their block boundaries.
    if !backends().contains(&BackendKind::Gccjit) {
        return;
    }
    let (max, input, hidden) = (128, 96, 80);
    let data = |n: usize, cols: usize, seed: usize| -> Vec<f64> {
        (0..n * cols).map(|i| (((i * 7919 + seed) % 211) as f64 - 105.0) / 97.0).collect()
    };
    let build = |dim: Option<usize>, n: usize| {
        let g = Graph::with_seed(3);
        let (x, y, d) = match dim {
            Some(max) => {
                let d = g.dynamic("batch", max);
                (
                    g.data("x", Axes::new().dynamic_batch(&d).output(&[input])),
                    g.data("y", Axes::new().dynamic_batch(&d).output(&[10])),
                    Some(d),
                )
            }
            None => (
                g.data("x", Axes::new().batch(&[n]).output(&[input])),
                g.data("y", Axes::new().batch(&[n]).output(&[10])),
                None,
            ),
        };
        let out = Mlp::new(&g, "mlp", MlpConfig::new(&[hidden, 10])).apply(&x);
        let l = loss::mse(&out, &y, loss::Reduction::Mean);
        (g, x, y, d, l)
    };
    let (g, x, y, d, l) = build(Some(max), max);
    let d = d.unwrap();
    let mut s = session(&g, BackendKind::Gccjit);
    let r = s.backprop(&l, &[]).unwrap();
    let params = g.params();
    for n in [1, 3, 37, 64, 65, 127, 128] {
        s.set_size(&d, n).unwrap();
        s.write(&x, &data(n, input, 1)).unwrap();
        s.write(&y, &data(n, 10, 2)).unwrap();
        s.run(&r).unwrap();
        let (g2, x2, y2, _, l2) = build(None, n);
        let mut s2 = session(&g2, BackendKind::Gccjit);
        let r2 = s2.backprop(&l2, &[]).unwrap();
        s2.write(&x2, &data(n, input, 1)).unwrap();
        s2.write(&y2, &data(n, 10, 2)).unwrap();
        s2.run(&r2).unwrap();
        close(&s.read(&l).unwrap(), &s2.read(&l2).unwrap(), &format!("n={n} loss"));
        for (p, p2) in params.iter().zip(&g2.params()) {
            let what = format!("n={n} grad {}", p.label());
            close(&s.read_grad(p).unwrap(), &s2.read_grad(p2).unwrap(), &what);
        }
    }
}

#[test]
fn a_dynamic_data_tensor_reads_back_its_current_rows() {
    let g = Graph::new();
    let b = g.dynamic("batch", 5);
    let x = g.data("x", Axes::new().dynamic_batch(&b).output(&[2]));
    let _ = x.scale(1.0);
    let mut s = Session::new(&g).unwrap();
    s.set_size(&b, 2).unwrap();
    s.write(&x, &[1.0, 2.0, 3.0, 4.0]).unwrap();
    assert_eq!(s.read(&x).unwrap(), vec![1.0, 2.0, 3.0, 4.0]);
    s.set_size(&b, 1).unwrap();
    assert_eq!(s.read(&x).unwrap(), vec![1.0, 2.0]);
    assert_eq!(s.size(&b), 1);
}

#[test]
fn a_loader_runs_its_last_partial_batch_with_its_own_size() {
    use rocannl_tensor::train::{Column, Loader};
    // 10 examples in batches of 4: 4, 4, then the last 2, through one compiled step.
    let xs: Vec<f64> = (0..50).map(|i| ((i * 13 % 17) as f64 - 8.0) / 5.0).collect();
    let ys: Vec<f64> = (0..20).map(|i| ((i * 7 % 11) as f64 - 5.0) / 4.0).collect();
    let cols = [Column::new("x", &[5], xs.clone()), Column::new("y", &[2], ys.clone())];
    let g = Graph::with_seed(7);
    let loader = Loader::new(&g, &cols, 4).unwrap();
    assert_eq!(loader.batches(), 3);
    let (_, err, params) = model(&g, loader.batch(0), loader.batch(1));
    let mut s = session(&g, BackendKind::Interp);
    let r = s.forward(&[&err]).unwrap();
    loader.load(&mut s, &cols, &(0..10).collect::<Vec<_>>()).unwrap();
    loader.set_batch(&mut s, 2).unwrap();
    s.run(&r).unwrap();
    let last = s.read(&err).unwrap();
    // The same two examples alone, in a graph of a fixed batch of 2.
    let (g2, _, x2, y2) = build(None, 2);
    let (_, err2, params2) = model(&g2, &x2, &y2);
    let mut s2 = session(&g2, BackendKind::Interp);
    let r2 = s2.forward(&[&err2]).unwrap();
    for (p, p2) in params.iter().zip(&params2) {
        s2.write(p2, &s.read(p).unwrap()).unwrap();
    }
    s2.write(&x2, &xs[40..]).unwrap();
    s2.write(&y2, &ys[16..]).unwrap();
    s2.run(&r2).unwrap();
    close(&last, &s2.read(&err2).unwrap(), "last partial batch loss");
}

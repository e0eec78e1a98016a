//! Gradients at the IEEE corners where PyTorch gives a number and a naive chain rule gives NaN
//! (`0 · inf`, `0 · -inf`); the edge-case sweep `tests/reference/edge_sweep.py` compares the
//! whole table of operations with PyTorch, these pin the fixed cases per backend.

use rocannl_tensor::{Axes, BackendKind, Graph, Init, ParamSpec, Prec, Session, SessionOptions};

/// `d/dx x^y` is 0 where `y = 0` (even at `x = 0`, where `y·x^(y-1)` is `0·inf`, and at
/// `x = NaN`), and `d/dy x^y` is 0 where `x = 0` and `y >= 0` (where `x^y·ln x` is `0·-inf` or
/// `1·-inf`), as in PyTorch.
#[test]
fn pow_gradients_at_a_zero_exponent_and_a_zero_base_are_zero_not_nan() {
    let xs = [0.0, -0.0, f64::NAN, 1e-30, 0.0, 0.0, 2.0];
    let ys = [0.0, 0.0, 0.0, 0.0, 2.0, 0.5, 3.0];
    for backend in [BackendKind::Interp, BackendKind::Gccjit] {
        for prec in [Prec::F32, Prec::F64] {
            let g = Graph::new();
            let x = g.param(
                "x",
                ParamSpec::new(Axes::new().output(&[7])).init(Init::Values(xs.to_vec())),
            );
            let y = g.param(
                "y",
                ParamSpec::new(Axes::new().output(&[7])).init(Init::Values(ys.to_vec())),
            );
            let z = x.pow(&y);
            let opts = SessionOptions { backend, prec, ..SessionOptions::default() };
            let mut s = match Session::with_options(&g, opts) {
                Ok(s) => s,
                Err(e) if backend == BackendKind::Gccjit => {
                    eprintln!("gccjit unavailable: {e}");
                    continue;
                }
                Err(e) => panic!("{e}"),
            };
            let r = s.forward(&[&z]).unwrap();
            s.run(&r).unwrap();
            let r = s.backprop(&z, &[]).unwrap();
            s.run(&r).unwrap();
            let dx = s.read_grad(&x).unwrap();
            let dy = s.read_grad(&y).unwrap();
            let what = format!("{backend:?} {prec:?}");
            assert_eq!(&dx[..5], &[0.0; 5], "{what}: d/dx x^0 and d/dx 0^2");
            assert_eq!(dx[5], f64::INFINITY, "{what}: d/dx x^0.5 at 0");
            assert_eq!(dx[6], 12.0, "{what}: d/dx x^3 at 2");
            assert_eq!(&dy[..2], &[0.0; 2], "{what}: d/dy 0^y at y = 0");
            assert!(dy[2].is_nan(), "{what}: d/dy NaN^0 = 1·ln NaN is NaN: {}", dy[2]);
            let ln = (1e-30f64).ln();
            assert!((dy[3] - ln).abs() < 1e-5 * ln.abs(), "{what}: d/dy x^0 = ln x: {}", dy[3]);
            assert_eq!(&dy[4..6], &[0.0; 2], "{what}: d/dy 0^y at y > 0");
            assert!((dy[6] - 8.0 * 2f64.ln()).abs() < 1e-5, "{what}: d/dy 2^3: {}", dy[6]);
        }
    }
}

/// A softmax's maximum is detached: backpropagation gives it no gradient code, so no pass adds
/// `0 · (x = max)` over the scores (an `eq` in the routine), and the gradient is as before:
/// `p ⊙ (w − Σ w ⊙ p)` for the loss `Σ w ⊙ p`, against an f64 reference.
#[test]
fn a_detached_maximum_gets_no_gradient_code() {
    let xs = [0.5, -1.0, 2.0, 0.25, 3.0, -0.5];
    let w = [1.0, -2.0, 0.5, 3.0, -1.0, 0.25];
    let g = Graph::new();
    let x = g.param("x", ParamSpec::new(Axes::new().output(&[6])).init(Init::Values(xs.to_vec())));
    let weights = g.ndarray("w", Axes::new().output(&[6]), &w);
    let p = x.softmax_classes();
    let loss = p.pointmul(&weights).sum_all();
    let opts = SessionOptions { backend: BackendKind::Interp, ..SessionOptions::default() };
    let mut s = Session::with_options(&g, opts).unwrap();
    let r = s.backprop(&loss, &[]).unwrap();
    assert!(!r.code().contains("eq("), "{}", r.code());
    s.run(&r).unwrap();
    let dx = s.read_grad(&x).unwrap();
    let m = xs.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
    let sum: f64 = xs.iter().map(|v| (v - m).exp()).sum();
    let p: Vec<f64> = xs.iter().map(|v| (v - m).exp() / sum).collect();
    let wp: f64 = p.iter().zip(&w).map(|(p, w)| p * w).sum();
    for j in 0..6 {
        let want = p[j] * (w[j] - wp);
        assert!((dx[j] - want).abs() < 1e-6, "{j}: {dx:?}");
    }
}

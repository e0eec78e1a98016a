//! `Tensor::var`, biased and unbiased, against the textbook formulas computed here in f64 (numpy's
//! `var(ddof=0)` and `var(ddof=1)`, PyTorch's `correction=0` and `1`), including over a dynamic
//! batch, where only the current rows count.

use rocannl_tensor::{Axes, BackendKind, Graph, Session, SessionOptions};

fn var(xs: &[f64], ddof: usize) -> f64 {
    let n = xs.len() as f64;
    let mean = xs.iter().sum::<f64>() / n;
    xs.iter().map(|x| (x - mean) * (x - mean)).sum::<f64>() / (n - ddof as f64)
}

fn backends() -> Vec<BackendKind> {
    let mut b = vec![BackendKind::Interp];
    if cfg!(feature = "gccjit") {
        b.push(BackendKind::Gccjit);
    }
    b
}

#[test]
fn var_matches_the_formulas_along_rows_and_columns() {
    let values: Vec<f64> = (0..21).map(|i| ((i * 37 % 11) as f64 - 4.5) * 0.73).collect();
    for backend in backends() {
        let g = Graph::new();
        let x = g.ndarray("x", Axes::new().batch(&[3]).output(&[7]), &values);
        let rows = [x.var("b|i => b|0", false), x.var("b|i => b|0", true)];
        let cols = [x.var("b|i => 0|i", false), x.var("b|i => 0|i", true)];
        let opts =
            SessionOptions { backend, prec: rocannl_tensor::Prec::F64, ..Default::default() };
        let mut s = Session::with_options(&g, opts).unwrap();
        let all: Vec<&rocannl_tensor::Tensor> = rows.iter().chain(&cols).collect();
        let r = s.forward(&all).unwrap();
        s.run(&r).unwrap();
        for (ddof, t) in rows.iter().enumerate() {
            let got = s.read(t).unwrap();
            for (b, v) in got.iter().enumerate() {
                let want = var(&values[7 * b..7 * b + 7], ddof);
                assert!((v - want).abs() < 1e-12, "row {b}, ddof {ddof}: {v} against {want}");
            }
        }
        for (ddof, t) in cols.iter().enumerate() {
            let got = s.read(t).unwrap();
            for (i, v) in got.iter().enumerate() {
                let col: Vec<f64> = (0..3).map(|b| values[7 * b + i]).collect();
                let want = var(&col, ddof);
                assert!((v - want).abs() < 1e-12, "column {i}, ddof {ddof}: {v} against {want}");
            }
        }
    }
}

#[test]
fn var_over_a_dynamic_batch_counts_the_current_rows() {
    let values: Vec<f64> = (0..10).map(|i| (i * i % 7) as f64 - 2.0).collect();
    for backend in backends() {
        let g = Graph::new();
        let batch = g.dynamic("batch", 10);
        let x = g.data("x", Axes::new().dynamic_batch(&batch));
        let (biased, unbiased) = (x.var("b| => 0|", false), x.var("b| => 0|", true));
        let opts =
            SessionOptions { backend, prec: rocannl_tensor::Prec::F64, ..Default::default() };
        let mut s = Session::with_options(&g, opts).unwrap();
        let r = s.forward(&[&biased, &unbiased]).unwrap();
        for n in [10, 6, 2] {
            s.set_size(&batch, n).unwrap();
            s.write(&x, &values[..n]).unwrap();
            s.run(&r).unwrap();
            let (b, u) = (s.read(&biased).unwrap()[0], s.read(&unbiased).unwrap()[0]);
            assert!((b - var(&values[..n], 0)).abs() < 1e-12, "{n} rows: {b}");
            assert!((u - var(&values[..n], 1)).abs() < 1e-12, "{n} rows: {u}");
        }
    }
}

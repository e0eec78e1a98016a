//! The finite-difference gradient check shared by the gradient test suites.
#![allow(dead_code)] // each test binary uses a different subset

use rocannl_tensor::{
    Axes, BackendKind, Graph, Init, Mode, ParamSpec, Prec, Session, SessionOptions, Tensor,
};

pub fn opts() -> SessionOptions {
    SessionOptions { backend: BackendKind::Interp, prec: Prec::F64, ..SessionOptions::default() }
}

/// Deterministic values in `[lo, hi]`, spread by the golden ratio.
pub fn spread(n: usize, lo: f64, hi: f64) -> Vec<f64> {
    (0..n)
        .map(|i| {
            let t = ((i as f64 + 1.0) * 0.618_033_988_75).fract();
            lo + (hi - lo) * (0.05 + 0.9 * t)
        })
        .collect()
}

/// A parameter with given rows and deterministic values in `[lo, hi]`.
pub fn param(g: &Graph, name: &str, input: &[usize], output: &[usize], lo: f64, hi: f64) -> Tensor {
    let n: usize = input.iter().chain(output).product();
    g.param(
        name,
        ParamSpec::new(Axes::new().input(input).output(output))
            .init(Init::Values(spread(n, lo, hi))),
    )
}

/// Compares backprop with central differences for every cell of every listed parameter, on
/// `Σ sin(result)`.
pub fn check(name: &str, build: impl Fn(&Graph) -> (Vec<Tensor>, Tensor)) {
    let g = Graph::new();
    let (params, out) = build(&g);
    let root = out.sin();
    let mut s = Session::with_options(&g, opts()).unwrap_or_else(|e| panic!("{name}: {e}"));
    let bp = s.backprop(&root, &[]).unwrap_or_else(|e| panic!("{name}: {e}"));
    s.run(&bp).unwrap();
    // In train mode, as backprop: batch norm normalizes by the batch's statistics.
    let fwd = s.forward_in(Mode::Train, &[&root]).unwrap();
    let total = |s: &mut Session| -> f64 {
        s.run(&fwd).unwrap();
        s.read(&root).unwrap().iter().sum()
    };
    for p in &params {
        let analytic = s.read_grad(p).unwrap_or_else(|e| panic!("{name}: {e}"));
        let base = s.read(p).unwrap();
        for i in 0..base.len() {
            let h = 1e-6 * base[i].abs().max(1.0);
            let mut v = base.clone();
            v[i] = base[i] + h;
            s.write(p, &v).unwrap();
            let up = total(&mut s);
            v[i] = base[i] - h;
            s.write(p, &v).unwrap();
            let down = total(&mut s);
            s.write(p, &base).unwrap();
            let numeric = (up - down) / (2.0 * h);
            let err = (numeric - analytic[i]).abs();
            assert!(
                err <= 1e-5 + 1e-4 * numeric.abs(),
                "{name}: d/d{}[{i}] analytic {} vs numeric {numeric}",
                p.label(),
                analytic[i]
            );
        }
    }
}

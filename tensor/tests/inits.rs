//! Initialization schemes drawn in a session: LeCun normal and uniform, and a gain on any
//! scheme, have the moments their formulas give (as `torch.nn.init` and `jax.nn.initializers`
//! define them), on the interpreter and gccjit.

use rocannl_tensor::{Axes, BackendKind, Graph, Init, ParamSpec, Session, SessionOptions};

/// The mean and standard deviation of a `fan_in → fan_out` weight drawn with `init`.
fn moments(init: Init, fan_in: usize, fan_out: usize, backend: BackendKind) -> (f64, f64) {
    let g = Graph::with_seed(3);
    let w =
        g.param("w", ParamSpec::new(Axes::new().input(&[fan_in]).output(&[fan_out])).init(init));
    let _ = w.relu();
    let opts = SessionOptions { backend, ..SessionOptions::default() };
    let mut s = Session::with_options(&g, opts).unwrap();
    let r = s.forward(&[&w]).unwrap();
    s.run(&r).unwrap();
    let v = s.read(&w).unwrap();
    let n = v.len() as f64;
    let mean = v.iter().sum::<f64>() / n;
    let var = v.iter().map(|x| (x - mean) * (x - mean)).sum::<f64>() / n;
    (mean, var.sqrt())
}

fn backends() -> Vec<BackendKind> {
    let mut b = vec![BackendKind::Interp];
    if cfg!(feature = "gccjit") {
        b.push(BackendKind::Gccjit);
    }
    b
}

#[test]
fn lecun_inits_and_gains_have_their_formulas_moments() {
    // 65,536 draws: the sample standard deviation is within 1 % of the true one (4 standard
    // errors of it, 4 / √(2·65536) ≈ 1.1 %, for a normal; less for a uniform).
    let (fan_in, fan_out) = (256, 256);
    let cases = [
        ("lecun_normal", Init::LecunNormal, 1.0 / 16.0),
        ("lecun_uniform", Init::LecunUniform, 1.0 / 16.0),
        ("kaiming_normal x 0.5", Init::KaimingNormal.gain(0.5), 0.5 * (2.0f64 / 256.0).sqrt()),
        ("normal x -3", Init::Normal { mean: 0.0, std: 0.02 }.gain(-3.0), 0.06),
        ("xavier_uniform x 2", Init::XavierUniform.gain(2.0), 2.0 * (2.0f64 / 512.0).sqrt()),
    ];
    for backend in backends() {
        for (name, init, std) in cases.clone() {
            let (m, sd) = moments(init, fan_in, fan_out, backend);
            assert!((sd / std - 1.0).abs() < 0.012, "{name} on {backend:?}: std {sd}, want {std}");
            assert!(m.abs() < 4.0 * std / 256.0, "{name} on {backend:?}: mean {m}");
        }
    }
}

#[test]
fn a_gain_keeps_the_seed_and_scales_every_value() {
    for backend in backends() {
        let draw = |init: Init| {
            let g = Graph::with_seed(9);
            let w = g.param("w", ParamSpec::new(Axes::new().input(&[8]).output(&[4])).init(init));
            let _ = w.relu();
            let opts = SessionOptions { backend, ..SessionOptions::default() };
            let mut s = Session::with_options(&g, opts).unwrap();
            let r = s.forward(&[&w]).unwrap();
            s.run(&r).unwrap();
            s.read(&w).unwrap()
        };
        let base = draw(Init::LecunUniform.seeded(5));
        let scaled = draw(Init::LecunUniform.seeded(5).gain(0.25));
        for (b, s) in base.iter().zip(&scaled) {
            assert!((s - 0.25 * b).abs() <= 1e-6 * b.abs().max(1e-3), "{b} {s}");
        }
        assert_eq!(draw(Init::Constant(3.0).gain(-2.0)), vec![-6.0; 32]);
    }
}

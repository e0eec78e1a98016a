//! Hyper-parameters out of their range — learning rates, optimizer settings, normalization
//! epsilons, window sizes, head counts — are usage errors naming the value, never NaN
//! parameters, silent substitutions or panics.

use rocannl_tensor::nn::attention::{AttentionConfig, MultiHeadAttention};
use rocannl_tensor::nn::conv::{self, Conv2d, Conv2dConfig};
use rocannl_tensor::nn::gpt::{Gpt, GptConfig};
use rocannl_tensor::nn::norm::{LayerNorm, LayerNormConfig, RmsNorm, RmsNormConfig};
use rocannl_tensor::nn::{Activation, loss};
use rocannl_tensor::{
    Adam, AdamW, Axes, BackendKind, Error, Graph, Init, Optimizer, ParamSpec, Session,
    SessionOptions, Sgd, Tensor,
};

fn interp() -> SessionOptions {
    SessionOptions { backend: BackendKind::Interp, ..SessionOptions::default() }
}

/// A one-parameter regression: the graph, its parameter and its loss.
fn regression() -> (Graph, Tensor, Tensor) {
    let g = Graph::new();
    let w =
        g.param("w", ParamSpec::new(Axes::new().output(&[2])).init(Init::Values(vec![0.5, -0.5])));
    let x = g.ndarray("x", Axes::new().batch(&[3]).output(&[2]), &[1.0, 2.0, 3.0, 4.0, 5.0, 6.0]);
    let loss = loss::mse(&w.pointmul(&x), &g.number(1.0), loss::Reduction::Mean);
    (g, w, loss)
}

fn usage_message<T: std::fmt::Debug>(r: Result<T, Error>) -> String {
    match r {
        Err(Error::Usage(m)) => m,
        other => panic!("expected a usage error, got {other:?}"),
    }
}

#[test]
fn learning_rates_that_are_negative_infinite_or_nan_are_refused_and_change_nothing() {
    let (g, w, loss) = regression();
    let mut s = Session::with_options(&g, interp()).unwrap();
    let mut step =
        s.train_step(&loss, &Optimizer::Adam(Adam::default()), &[], &Default::default()).unwrap();
    s.step(&mut step, 0.01).unwrap();
    let before = s.read(&w).unwrap();
    for lr in [f64::NAN, -0.01, f64::INFINITY, f64::NEG_INFINITY] {
        let m = usage_message(s.step(&mut step, lr));
        assert!(m.contains("learning rate") && m.contains(&format!("{lr}")), "{m}");
    }
    assert_eq!(s.read(&w).unwrap(), before, "no refused step moved the parameter");
    assert_eq!(step.steps(), 1, "and none was counted");
    s.step(&mut step, 0.0).unwrap();
}

#[test]
fn optimizer_settings_out_of_range_are_refused_naming_the_setting() {
    let adam =
        |beta1, beta2, eps, weight_decay| Optimizer::Adam(Adam { beta1, beta2, eps, weight_decay });
    let adamw =
        |beta1, beta2| Optimizer::AdamW(AdamW { beta1, beta2, eps: 1e-8, weight_decay: 0.0 });
    for (opt, what) in [
        (adam(1.0, 0.999, 1e-8, 0.0), "beta1 = 1"),
        (adam(-0.1, 0.999, 1e-8, 0.0), "beta1 = -0.1"),
        (adam(0.9, f64::NAN, 1e-8, 0.0), "beta2 = NaN"),
        (adamw(0.9, 1.5), "beta2 = 1.5"),
        (adam(0.9, 0.999, -1e-8, 0.0), "eps = -0.00000001"),
        (adam(0.9, 0.999, 1e-8, f64::INFINITY), "weight_decay = inf"),
        (Optimizer::Sgd(Sgd { momentum: -0.9, ..Default::default() }), "momentum = -0.9"),
        (Optimizer::Sgd(Sgd { momentum: f64::NAN, ..Default::default() }), "momentum = NaN"),
        (Optimizer::Sgd(Sgd { weight_decay: -1.0, ..Default::default() }), "weight_decay = -1"),
        (
            Optimizer::Sgd(Sgd { nesterov: true, ..Default::default() }),
            "Nesterov momentum without a momentum",
        ),
    ] {
        let (g, _, loss) = regression();
        let mut s = Session::with_options(&g, interp()).unwrap();
        let m = usage_message(s.train_step(&loss, &opt, &[], &Default::default()));
        assert!(m.contains(what), "{opt:?}: {m}");
    }
    for opt in [
        Optimizer::Adam(Adam::default()),
        Optimizer::AdamW(AdamW { weight_decay: 0.01, ..Default::default() }),
        Optimizer::Sgd(Sgd { momentum: 0.9, nesterov: true, ..Default::default() }),
    ] {
        opt.check().unwrap();
    }
}

#[test]
fn normalization_eps_that_is_negative_infinite_or_nan_is_refused() {
    for eps in [-1e-5, f64::NAN, f64::INFINITY] {
        for rms in [false, true] {
            let g = Graph::new();
            let x = g.ndarray("x", Axes::new().batch(&[1]).output(&[2]), &[3.0, 4.0]);
            let _ = if rms {
                RmsNorm::new(&g, "norm", RmsNormConfig::default().with_eps(eps)).apply(&x)
            } else {
                LayerNorm::new(&g, "norm", LayerNormConfig::default().with_eps(eps)).apply(&x)
            };
            let m = usage_message(g.finish());
            assert!(m.contains("'norm'") && m.contains(&format!("{eps}")), "{m}");
        }
    }
    let g = Graph::new();
    let x = g.ndarray("x", Axes::new().batch(&[1]).output(&[2]), &[3.0, 4.0]);
    let _ = RmsNorm::new(&g, "norm", RmsNormConfig::default().with_eps(0.0)).apply(&x);
    g.finish().unwrap();
}

#[test]
fn windows_and_strides_of_zero_are_refused_naming_the_layer() {
    for (kernel, stride) in [((0, 3), 1), ((3, 0), 1), ((3, 3), 0)] {
        let g = Graph::new();
        let x = g.ndarray("x", Axes::new().batch(&[1]).output(&[4, 4, 1]), &[1.0; 16]);
        let _ = Conv2d::new(&g, "c1", Conv2dConfig::new(kernel, 2).with_stride(stride)).apply(&x);
        let m = usage_message(g.finish());
        assert!(m.contains("conv2d 'c1'"), "{m}");
    }
    for (k, stride) in [(0, 1), (2, 0)] {
        for avg in [false, true] {
            let g = Graph::new();
            let x = g.ndarray("img", Axes::new().batch(&[1]).output(&[4, 4, 1]), &[1.0; 16]);
            let _ =
                if avg { conv::avg_pool2d(&x, k, stride) } else { conv::max_pool2d(&x, k, stride) };
            let m = usage_message(g.finish());
            assert!(m.contains("'img'") && m.contains("at least 1"), "{m}");
        }
    }
}

#[test]
fn attention_without_heads_and_a_gpt_width_not_split_by_its_heads_are_refused() {
    for cfg in [AttentionConfig::new(0, 4), AttentionConfig::new(2, 0)] {
        let g = Graph::new();
        let x = g.data("x", Axes::new().batch(&[2, 5]).output(&[8]));
        let y = MultiHeadAttention::new(&g, "att", cfg).apply(&x);
        let _ = &x + &y;
        let m = usage_message(g.finish());
        assert!(m.contains("attention 'att'"), "{m}");
    }
    for heads in [0, 3] {
        let g = Graph::new();
        let cfg = GptConfig::new(5, 4, 8, heads, 1).with_ff(8).with_act(Activation::Relu);
        let ids = g.data("ids", Axes::new().batch(&[2, 4]));
        let _ = Gpt::new(&g, "gpt", cfg).apply(&ids);
        let m = usage_message(g.finish());
        assert!(m.contains("GPT 'gpt'") && m.contains(&format!("{heads} heads")), "{m}");
    }
}

//! Each switch of the modules' configs does what it says: a bias turned off leaves no bias
//! param, a norm without bias or affine params computes the bare normalization, an init given
//! in a config is the one drawn, and a decay flag given in a config is the one the optimizer
//! reads.

mod common;

use common::opts;
use rocannl_tensor::nn::attention::{
    AttentionConfig, MultiHeadAttention, TransformerBlock, TransformerBlockConfig,
};
use rocannl_tensor::nn::conv::{Conv2d, Conv2dConfig};
use rocannl_tensor::nn::embed::{Embedding, EmbeddingConfig};
use rocannl_tensor::nn::gpt::{Gpt, GptConfig};
use rocannl_tensor::nn::norm::{LayerNorm, LayerNormConfig, RmsNorm, RmsNormConfig};
use rocannl_tensor::nn::{Linear, LinearConfig, Mlp, MlpConfig, Module};
use rocannl_tensor::{Axes, Graph, Init, Session, Tensor};

fn labels(m: &impl Module) -> Vec<String> {
    m.params().iter().map(|p| p.label()).collect()
}

/// The values of `tensors` after one forward pass computing them (f64, interpreter).
fn values(g: &Graph, tensors: &[&Tensor]) -> Vec<Vec<f64>> {
    let mut s = Session::with_options(g, opts()).unwrap();
    let r = s.forward(tensors).unwrap();
    s.run(&r).unwrap();
    tensors.iter().map(|t| s.read(t).unwrap()).collect()
}

#[test]
fn a_bias_turned_off_leaves_no_bias_param() {
    let g = Graph::new();
    let x = g.data("x", Axes::new().batch(&[2, 3]).output(&[8]));
    let on = Linear::new(&g, "on", LinearConfig::new(4));
    let off = Linear::new(&g, "off", LinearConfig::new(4).with_bias(false));
    assert_eq!(labels(&on), ["on.w", "on.b"]);
    assert_eq!(labels(&off), ["off.w"]);
    let no_bias = LinearConfig::default().with_bias(false);
    let mlp = Mlp::new(&g, "mlp", MlpConfig::new(&[5, 4]).with_layer(no_bias));
    assert_eq!(labels(&mlp), ["mlp.0.w", "mlp.1.w"]);
    let conv = Conv2d::new(&g, "conv", Conv2dConfig::new((3, 3), 2).with_bias(false));
    assert_eq!(labels(&conv), ["conv.kernel"]);
    let att = MultiHeadAttention::new(&g, "att", AttentionConfig::new(2, 4).with_bias(true));
    assert_eq!(
        labels(&att),
        ["att.wq", "att.wk", "att.wv", "att.wo", "att.bq", "att.bk", "att.bv", "att.bo"]
    );
    let ln = LayerNorm::new(&g, "ln", LayerNormConfig::default().with_bias(false));
    assert_eq!(labels(&ln), ["ln.gain"]);
    let bare = LayerNormConfig::default().with_elementwise_affine(false);
    assert!(labels(&LayerNorm::new(&g, "bare", bare)).is_empty());
    let rms = RmsNormConfig::default().with_elementwise_affine(false);
    assert!(labels(&RmsNorm::new(&g, "rms", rms)).is_empty());
    // The biased attention computes with its biases, whose shapes follow from use.
    let y = &x + &att.apply(&x);
    let _ = (on.apply(&x), off.apply(&x), mlp.apply(&x), ln.apply(&y));
    g.finish().unwrap();
    let dims = |t: &Option<Tensor>| t.as_ref().unwrap().dims().unwrap();
    assert_eq!((dims(&att.bq), dims(&att.bo)), (vec![2, 4], vec![8]));
    // A block and a GPT pass the switches on.
    let g = Graph::new();
    let block = TransformerBlockConfig::new(AttentionConfig::new(2, 4), 16)
        .with_ln(LayerNormConfig::default().with_bias(false))
        .with_ff1(LinearConfig::new(16).with_bias(false))
        .with_ff2(LinearConfig::default().with_bias(false));
    let block = TransformerBlock::new(&g, "blk", block);
    assert_eq!(
        labels(&block),
        ["blk.ln1.gain", "blk.att.wq", "blk.att.wk", "blk.att.wv", "blk.att.wo", "blk.ln2.gain"]
            .into_iter()
            .chain(["blk.ff1.w", "blk.ff2.w"])
            .collect::<Vec<_>>()
    );
    let gpt = Gpt::new(&g, "gpt", GptConfig::new(5, 4, 8, 2, 1).with_bias(false));
    let biases = labels(&gpt).into_iter().filter(|l| l.ends_with(".b") || l.ends_with(".bias"));
    assert_eq!(biases.count(), 0);
    assert_eq!(labels(gpt.head.as_ref().unwrap()), ["gpt.head.w"]);
}

/// `(x - mean) / √(var + eps)` over each row of `x`, by hand.
fn normalized(x: &[f64], width: usize, eps: f64, center: bool) -> Vec<f64> {
    x.chunks(width)
        .flat_map(|row| {
            let n = width as f64;
            let mean = if center { row.iter().sum::<f64>() / n } else { 0.0 };
            let var = row.iter().map(|v| (v - mean) * (v - mean)).sum::<f64>() / n;
            row.iter().map(move |v| (v - mean) / (var + eps).sqrt()).collect::<Vec<_>>()
        })
        .collect()
}

fn assert_close(what: &str, got: &[f64], want: &[f64]) {
    assert_eq!(got.len(), want.len(), "{what}");
    for (i, (a, b)) in got.iter().zip(want).enumerate() {
        // f64 throughout: only rounding differs.
        assert!((a - b).abs() <= 1e-12, "{what}[{i}]: {a} vs {b}");
    }
}

#[test]
fn norms_without_bias_or_affine_params_are_the_bare_normalization_times_the_gain() {
    let xs = [1.0, -2.0, 0.5, 4.0, 3.0, 3.5, -1.0, 0.0];
    let g = Graph::new();
    let x = g.ndarray("x", Axes::new().batch(&[2]).output(&[4]), &xs);
    let eps = 1e-3;
    let bare = LayerNorm::new(
        &g,
        "bare",
        LayerNormConfig::default().with_eps(eps).with_elementwise_affine(false),
    );
    let gain_only = LayerNormConfig::default().with_eps(eps).with_bias(false);
    let gain_only = LayerNorm::new(&g, "gain_only", gain_only.with_gain_init(Init::Constant(2.5)));
    let rms = RmsNormConfig::default().with_eps(eps).with_elementwise_affine(false);
    let rms = RmsNorm::new(&g, "rms", rms);
    let (a, b, c) = (bare.apply(&x), gain_only.apply(&x), rms.apply(&x));
    let v = values(&g, &[&a, &b, &c]);
    let want = normalized(&xs, 4, eps, true);
    assert_close("bare layer norm", &v[0], &want);
    let scaled: Vec<f64> = want.iter().map(|w| 2.5 * w).collect();
    assert_close("layer norm without bias", &v[1], &scaled);
    assert_close("bare rms norm", &v[2], &normalized(&xs, 4, eps, false));
}

#[test]
fn inits_given_in_configs_are_the_ones_drawn() {
    let g = Graph::new();
    let x = g.ndarray("x", Axes::new().batch(&[1, 2]).output(&[2]), &[0.1, 0.2, 0.3, 0.4]);
    let fc = LinearConfig::new(2)
        .with_w_init(Init::Values(vec![1.0, 2.0, 3.0, 4.0]))
        .with_b_init(Init::Constant(0.5));
    let fc = Linear::new(&g, "fc", fc);
    let emb = EmbeddingConfig::new(3, 2).with_table_init(Init::Constant(-1.0));
    let emb = Embedding::new(&g, "emb", emb);
    let att = AttentionConfig::new(1, 2)
        .with_bias(true)
        .with_w_init(Init::Constant(0.25))
        .with_wo_init(Init::Constant(0.75))
        .with_b_init(Init::Constant(0.125));
    let att = MultiHeadAttention::new(&g, "att", att);
    let ln = LayerNormConfig::default()
        .with_gain_init(Init::Constant(3.0))
        .with_bias_init(Init::Constant(-3.0));
    let ln = LayerNorm::new(&g, "ln", ln);
    let y = ln.apply(&(&fc.apply(&x) + &att.apply(&x)));
    let _ = emb.apply(&g.ndarray("ids", Axes::new().batch(&[1]), &[2.0]));
    let params = g.params();
    let refs: Vec<&Tensor> = std::iter::once(&y).chain(&params).collect();
    let v = values(&g, &refs);
    let got: Vec<(String, Vec<f64>)> =
        params.iter().map(|p| p.label()).zip(v.into_iter().skip(1)).collect();
    let want = |label: &str, vs: Vec<f64>| (label.to_string(), vs);
    assert_eq!(
        got,
        vec![
            want("fc.w", vec![1.0, 2.0, 3.0, 4.0]),
            want("fc.b", vec![0.5; 2]),
            want("emb.table", vec![-1.0; 6]),
            want("att.wq", vec![0.25; 4]),
            want("att.wk", vec![0.25; 4]),
            want("att.wv", vec![0.25; 4]),
            want("att.wo", vec![0.75; 4]),
            want("att.bq", vec![0.125; 2]),
            want("att.bk", vec![0.125; 2]),
            want("att.bv", vec![0.125; 2]),
            want("att.bo", vec![0.125; 2]),
            want("ln.gain", vec![3.0; 2]),
            want("ln.bias", vec![-3.0; 2]),
        ]
    );
}

#[test]
fn a_gpt_init_reaches_every_weight_and_the_residual_rule_scales_two_per_block() {
    let layers = 2;
    let g = Graph::new();
    let cfg = GptConfig::new(5, 4, 8, 2, layers)
        .with_init(Some(Init::Constant(0.5)))
        .with_residual_scaling(true);
    let gpt = Gpt::new(&g, "gpt", cfg);
    let logits = gpt.apply(&g.data("ids", Axes::new().batch(&[1, 4])));
    g.finish().unwrap();
    assert_eq!(logits.dims().unwrap(), vec![1, 4, 5]);
    let params = gpt.params();
    let v = values(&g, &params.iter().collect::<Vec<_>>());
    let residual = 0.5 / (2.0 * layers as f64).sqrt();
    for (p, vs) in params.iter().zip(&v) {
        let label = p.label();
        let want = match label.rsplit_once('.').map(|(_, last)| last).unwrap() {
            "gain" => 1.0,
            "b" | "bias" => 0.0,
            "wo" => residual,
            "w" if label.ends_with("ff2.w") => residual,
            _ => 0.5,
        };
        assert!(vs.iter().all(|x| *x == want), "{label}: {vs:?}, want {want}");
    }
}

#[test]
fn decay_flags_given_in_configs_are_the_ones_read() {
    let g = Graph::new();
    let x = g.data("x", Axes::new().batch(&[2]).output(&[3]));
    let fc = Linear::new(&g, "fc", LinearConfig::new(4).with_w_decay(false).with_b_decay(true));
    let emb = Embedding::new(&g, "emb", EmbeddingConfig::new(5, 4).with_table_decay(true));
    let ln = LayerNormConfig::default().with_gain_decay(true);
    let ln = LayerNorm::new(&g, "ln", ln);
    let conv = Conv2d::new(&g, "conv", Conv2dConfig::new((1, 1), 2).with_kernel_decay(false));
    let att = AttentionConfig::new(1, 4).with_bias(true).with_w_decay(false).with_b_decay(true);
    let att = MultiHeadAttention::new(&g, "att", att);
    let _ = ln.apply(&fc.apply(&x));
    let decays =
        |m: &dyn Module| -> Vec<bool> { m.params().iter().map(|p| g.decays(p).unwrap()).collect() };
    assert_eq!(decays(&fc), [false, true]);
    assert_eq!(decays(&emb), [true]);
    assert_eq!(decays(&ln), [true, false]);
    assert_eq!(decays(&conv), [false, false]);
    assert_eq!(decays(&att), [false, false, false, false, true, true, true, true]);
}

#[test]
fn the_new_switches_keep_gradients_right() {
    use common::{check, spread};
    check("attention with biases", |g| {
        let x = g.ndarray("x", Axes::new().batch(&[3]).output(&[4]), &spread(12, -1.0, 1.0));
        let cfg = AttentionConfig::new(2, 2).with_bias(true).with_b_init(Init::Constant(0.3));
        let y = &x + &MultiHeadAttention::new(g, "att", cfg).apply(&x);
        (g.params(), y)
    });
    check("layer norm without bias", |g| {
        let x = g.ndarray("x", Axes::new().batch(&[2]).output(&[4]), &spread(8, -1.0, 1.0));
        let cfg = LayerNormConfig::default().with_bias(false).with_gain_init(Init::Constant(1.5));
        let ln = LayerNorm::new(g, "ln", cfg);
        (g.params(), ln.apply(&x).pointmul(&x))
    });
    check("conv without bias", |g| {
        let x = g.ndarray("x", Axes::new().batch(&[1]).output(&[4, 4, 2]), &spread(32, -1.0, 1.0));
        let conv = Conv2d::new(g, "c", Conv2dConfig::new((3, 3), 2).with_bias(false));
        (g.params(), conv.apply(&x))
    });
}

//! Gradient checks of the nn blocks against central finite differences (f64, interpreter).

mod common;

use common::{check, param, spread};
use rocannl_tensor::nn::attention::{
    AttentionConfig, MultiHeadAttention, TransformerBlock, TransformerBlockConfig,
};
use rocannl_tensor::nn::conv::{Conv2d, Conv2dConfig, Padding};
use rocannl_tensor::nn::embed::{Embedding, EmbeddingConfig};
use rocannl_tensor::nn::norm::{LayerNorm, LayerNormConfig};
use rocannl_tensor::nn::{self, Activation, Linear, LinearConfig, Mlp, MlpConfig, conv, loss};
use rocannl_tensor::{Axes, Init, ParamSpec};

#[test]
fn dense_and_mlp() {
    check("mlp", |g| {
        let x = g.ndarray("x", Axes::new().batch(&[3]).output(&[2]), &spread(6, -1.0, 1.0));
        let y = Mlp::new(g, "mlp", MlpConfig::new(&[4, 2]).with_act(Activation::Tanh)).apply(&x);
        (g.params(), y)
    });
    check("linear without bias", |g| {
        let x = g.ndarray("x", Axes::new().batch(&[3]).output(&[2]), &spread(6, -1.0, 1.0));
        let y = Linear::new(g, "proj", LinearConfig::new(4).with_bias(false)).apply(&x).tanh();
        (g.params(), y)
    });
}

#[test]
fn softmax_and_losses() {
    check("softmax", |g| {
        let x = param(g, "x", &[], &[4], -1.0, 1.0);
        (vec![x.clone()], x.softmax_classes())
    });
    check("cross_entropy", |g| {
        let logits = g.param(
            "logits",
            ParamSpec::new(Axes::new().batch(&[2]).output(&[3]))
                .init(Init::Values(spread(6, -1.0, 1.0))),
        );
        let targets =
            g.ndarray("t", Axes::new().batch(&[2]).output(&[3]), &[0.0, 1.0, 0.0, 0.2, 0.3, 0.5]);
        (vec![logits.clone()], loss::cross_entropy(&logits, &targets, loss::Reduction::Mean))
    });
    check("sparse_cross_entropy", |g| {
        let logits = g.param(
            "logits",
            ParamSpec::new(Axes::new().batch(&[2]).output(&[3]))
                .init(Init::Values(spread(6, -1.0, 1.0))),
        );
        let labels = g.ndarray("labels", Axes::new().batch(&[2]), &[2.0, 0.0]);
        (vec![logits.clone()], loss::sparse_cross_entropy(&logits, &labels, loss::Reduction::Mean))
    });
    check("mse", |g| {
        let p = param(g, "p", &[], &[4], -1.0, 1.0);
        let t = g.vector("t", &[0.5, -0.5, 0.25, 0.0]);
        (vec![p.clone()], loss::mse(&p, &t, loss::Reduction::Mean))
    });
    check("hinge", |g| {
        let p = param(g, "p", &[], &[4], -0.8, 0.8);
        let y = g.vector("y", &[1.0, -1.0, 1.0, -1.0]);
        (vec![p.clone()], loss::hinge(&p, &y, loss::Reduction::Mean))
    });
    for reduction in [loss::Reduction::Sum, loss::Reduction::None] {
        check(&format!("cross_entropy_{reduction:?}"), |g| {
            let logits = g.param(
                "logits",
                ParamSpec::new(Axes::new().batch(&[2]).output(&[3]))
                    .init(Init::Values(spread(6, -1.0, 1.0))),
            );
            let targets = g.ndarray(
                "t",
                Axes::new().batch(&[2]).output(&[3]),
                &[0.0, 1.0, 0.0, 0.2, 0.3, 0.5],
            );
            (vec![logits.clone()], loss::cross_entropy(&logits, &targets, reduction))
        });
        check(&format!("mse_{reduction:?}"), |g| {
            let p = param(g, "p", &[], &[4], -1.0, 1.0);
            let t = g.vector("t", &[0.5, -0.5, 0.25, 0.0]);
            (vec![p.clone()], loss::mse(&p, &t, reduction))
        });
        check(&format!("hinge_{reduction:?}"), |g| {
            let p = param(g, "p", &[], &[4], -0.8, 0.8);
            let y = g.vector("y", &[1.0, -1.0, 1.0, -1.0]);
            (vec![p.clone()], loss::hinge(&p, &y, reduction))
        });
    }
}

#[test]
fn loss_reductions_are_the_mean_sum_or_values_per_position() {
    use rocannl_tensor::Session;
    let g = rocannl_tensor::Graph::with_seed(0);
    // Two examples of three classes; the per-example losses by hand.
    let logits =
        g.ndarray("logits", Axes::new().batch(&[2]).output(&[3]), &[1.0, 2.0, 3.0, 0.5, 0.5, -1.0]);
    let targets =
        g.ndarray("t", Axes::new().batch(&[2]).output(&[3]), &[0.0, 0.0, 1.0, 1.0, 0.0, 0.0]);
    let lse = |v: [f64; 3]| v.iter().map(|x| x.exp()).sum::<f64>().ln();
    let per = [lse([1.0, 2.0, 3.0]) - 3.0, lse([0.5, 0.5, -1.0]) - 0.5];
    let mean = loss::cross_entropy(&logits, &targets, loss::Reduction::Mean);
    let sum = loss::cross_entropy(&logits, &targets, loss::Reduction::Sum);
    let none = loss::cross_entropy(&logits, &targets, loss::Reduction::None);
    let mut s = Session::with_options(&g, common::opts()).unwrap();
    let r = s.forward(&[&mean, &sum, &none]).unwrap();
    s.run(&r).unwrap();
    let close = |a: f64, b: f64| assert!((a - b).abs() < 1e-12, "{a} vs {b}");
    close(s.read(&mean).unwrap()[0], (per[0] + per[1]) / 2.0);
    close(s.read(&sum).unwrap()[0], per[0] + per[1]);
    let v = s.read(&none).unwrap();
    assert_eq!(v.len(), 2);
    close(v[0], per[0]);
    close(v[1], per[1]);
}

#[test]
fn layer_norm_and_embedding() {
    check("layer_norm", |g| {
        let x = g.param(
            "x",
            ParamSpec::new(Axes::new().batch(&[2]).output(&[4]))
                .init(Init::Values(spread(8, -1.0, 1.0))),
        );
        let y = LayerNorm::new(g, "ln", LayerNormConfig::default()).apply(&x);
        (g.params(), y)
    });
    check("embedding", |g| {
        let ids = g.ndarray("ids", Axes::new().batch(&[3]), &[0.0, 2.0, 0.0]);
        let e = Embedding::new(g, "emb", EmbeddingConfig::new(3, 2)).apply(&ids);
        (g.params(), e)
    });
    // A table with two output axes, ids with two batch axes, ids repeated and one unused.
    check("lookup", |g| {
        let t = g.param(
            "t",
            ParamSpec::new(Axes::new().input(&[4]).output(&[2, 3]))
                .init(Init::Values(spread(24, -1.0, 1.0))),
        );
        let ids = g.ndarray("ids", Axes::new().batch(&[2, 3]), &[3.0, 0.0, 3.0, 1.0, 1.0, 3.0]);
        (vec![t.clone()], t.lookup(&ids).tanh())
    });
}

#[test]
fn attention_and_transformer() {
    let cfg = AttentionConfig::new(2, 2);
    check("self_attention", |g| {
        let x = g.ndarray("x", Axes::new().batch(&[3]).output(&[4]), &spread(12, -1.0, 1.0));
        let y = &x + &MultiHeadAttention::new(g, "att", cfg.clone()).apply(&x);
        (g.params(), y)
    });
    check("transformer_block", |g| {
        let x = g.ndarray("x", Axes::new().batch(&[3]).output(&[4]), &spread(12, -1.0, 1.0));
        let block = TransformerBlockConfig::new(cfg.clone(), 6);
        (g.params(), TransformerBlock::new(g, "blk", block).apply(&x))
    });
    check("transformer_block_gelu_causal", |g| {
        let x = g.ndarray("x", Axes::new().batch(&[3]).output(&[4]), &spread(12, -1.0, 1.0));
        let block = TransformerBlockConfig::new(cfg.clone().with_causal(true), 6)
            .with_act(Activation::GeluTanh);
        (g.params(), TransformerBlock::new(g, "blk", block).apply(&x))
    });
    // Causal: with the inputs as params too, so that the gradient to later positions' inputs
    // (zero from earlier outputs) is checked.
    check("causal_self_attention", |g| {
        let x = g.param(
            "x",
            ParamSpec::new(Axes::new().batch(&[2, 3]).output(&[4]))
                .init(Init::Values(spread(24, -1.0, 1.0))),
        );
        let y = &x + &MultiHeadAttention::new(g, "att", cfg.clone().with_causal(true)).apply(&x);
        (g.params(), y)
    });
}

#[test]
fn scaled_dot_product_attention() {
    // Queries, keys and values as params: every gradient of the one operation, causal or not,
    // with more keys than queries (cross attention) and two batch axes.
    for causal in [false, true] {
        check(&format!("attention causal={causal}"), |g| {
            let p = |name: &str, pos: usize, width: usize, seed: f64| {
                let n = 2 * 2 * pos * 2 * width;
                g.param(
                    name,
                    ParamSpec::new(Axes::new().batch(&[2, 2, pos]).output(&[2, width]))
                        .init(Init::Values(spread(n, -1.5 + seed, 1.5 + seed))),
                )
            };
            let (q, k, v) = (p("q", 3, 3, 0.0), p("k", 4, 3, 0.1), p("v", 4, 2, -0.2));
            (vec![q.clone(), k.clone(), v.clone()], q.attention(&k, &v, causal, 0.7))
        });
    }
}

#[test]
fn modules_share_their_params_across_applications() {
    use rocannl_tensor::nn::{
        Module,
        norm::{RmsNorm, RmsNormConfig},
    };
    check("rms_norm", |g| {
        let x = g.ndarray("x", Axes::new().batch(&[3]).output(&[4]), &spread(12, -1.0, 1.0));
        let n = RmsNorm::new(g, "rms", RmsNormConfig::default().with_eps(1e-5));
        (n.params(), Module::apply(&n, &x).pointmul(&x))
    });
    // One dense layer applied to two inputs: its gradient sums both uses.
    check("dense_applied_twice", |g| {
        let a = g.ndarray("a", Axes::new().batch(&[2]).output(&[3]), &spread(6, -1.0, 1.0));
        let b = g.ndarray("b", Axes::new().batch(&[4]).output(&[3]), &spread(12, -0.5, 0.5));
        let fc = Linear::new(g, "fc", LinearConfig::new(2));
        let y = &Module::apply(&fc, &a).tanh().sum_all() + &Module::apply(&fc, &b).sum_all();
        (fc.params(), y)
    });
}

#[test]
fn causal_attention_looks_only_backwards() {
    use rocannl_tensor::{Axes, Graph, Session};
    // Changing the inputs at positions after s changes no output at s or before.
    let outputs = |tail: f64| {
        let g = Graph::with_seed(3);
        let mut v = spread(16, -1.0, 1.0);
        v[8..].iter_mut().for_each(|x| *x += tail); // positions 2 and 3
        let x = g.ndarray("x", Axes::new().batch(&[4]).output(&[4]), &v);
        // The residual fixes the output projection's width (4).
        let att = MultiHeadAttention::new(&g, "att", AttentionConfig::new(2, 2).with_causal(true));
        let y = &x + &att.apply(&x);
        let mut s = Session::with_options(&g, common::opts()).unwrap();
        let r = s.forward(&[&y]).unwrap();
        s.run(&r).unwrap();
        s.read(&y).unwrap()
    };
    let (a, b) = (outputs(0.0), outputs(0.7));
    assert_eq!(a[..8], b[..8], "positions 0 and 1 saw the future");
    assert!(a[8..].iter().zip(&b[8..]).all(|(x, y)| x != y));
}

#[test]
fn convolution_and_pooling() {
    check("conv2d_valid", |g| {
        let x = g.ndarray("x", Axes::new().batch(&[1]).output(&[4, 4, 2]), &spread(32, -1.0, 1.0));
        (g.params(), Conv2d::new(g, "c", Conv2dConfig::new((3, 3), 2)).apply(&x))
    });
    check("conv2d_same", |g| {
        let x = g.ndarray("x", Axes::new().batch(&[1]).output(&[4, 4, 1]), &spread(16, -1.0, 1.0));
        let same = Conv2dConfig::new((3, 3), 2).with_padding(Padding::Same);
        (g.params(), Conv2d::new(g, "c", same).apply(&x))
    });
    check("conv2d_strided", |g| {
        let x = g.ndarray("x", Axes::new().batch(&[1]).output(&[5, 5, 1]), &spread(25, -1.0, 1.0));
        let strided = Conv2dConfig::new((3, 3), 1).with_stride(2);
        (g.params(), Conv2d::new(g, "c", strided).apply(&x))
    });
    check("max_pool", |g| {
        let x = g.param(
            "x",
            ParamSpec::new(Axes::new().output(&[4, 4, 1]))
                .init(Init::Values(spread(16, -1.0, 1.0))),
        );
        (vec![x.clone()], conv::max_pool2d(&x, 2, 2))
    });
    check("avg_pool", |g| {
        let x = g.param(
            "x",
            ParamSpec::new(Axes::new().output(&[4, 4, 1]))
                .init(Init::Values(spread(16, -1.0, 1.0))),
        );
        (vec![x.clone()], conv::avg_pool2d(&x, 2, 2))
    });
    check("mean", |g| {
        let x = param(g, "x", &[], &[2, 3], -1.0, 1.0);
        (vec![x.clone()], x.mean("ij => i"))
    });
}

/// Batch norm in train mode (the batch's statistics) through its input, weight and bias: per
/// feature over the batch, over batch and positions, and per channel of images.
#[test]
fn batch_norm() {
    use rocannl_tensor::nn::{BatchNorm, BatchNormAxes, BatchNormConfig};
    let features = BatchNormConfig::default()
        .with_weight_init(Init::Values(vec![0.7, 1.3, -0.4]))
        .with_bias_init(Init::Values(vec![0.1, -0.2, 0.3]));
    let cases = [
        ("batch_norm (N, C)", vec![5], vec![3], features.clone()),
        ("batch_norm (N, L, C)", vec![2, 3], vec![3], features.clone()),
        ("batch_norm images", vec![2], vec![2, 2, 3], features.with_axes(BatchNormAxes::Channels)),
        ("batch_norm no affine", vec![4], vec![3], BatchNormConfig::default().with_affine(false)),
    ];
    for (name, batch, output, cfg) in cases {
        check(name, |g| {
            let n: usize = batch.iter().chain(&output).product();
            let x = g.param(
                "x",
                ParamSpec::new(Axes::new().batch(&batch).input(&[]).output(&output))
                    .init(Init::Values(spread(n, -2.0, 2.0))),
            );
            let y = BatchNorm::new(g, "bn", cfg.clone()).apply(&x);
            (g.params(), y)
        });
    }
}

#[test]
fn dropout_masks_scale_change_every_step_and_carry_the_gradient() {
    use rocannl_tensor::{Axes, Graph, Optimizer, Session, Sgd};
    let g = Graph::with_seed(3);
    let x = g.param(
        "x",
        ParamSpec::new(Axes::new().output(&[200])).init(Init::Values(spread(200, 0.5, 1.5))),
    );
    let y = nn::dropout(&x, 0.25);
    let loss = y.sum_all();
    let mut s = Session::with_options(&g, common::opts()).unwrap();
    let eval = s.forward(&[&y]).unwrap();
    s.run(&eval).unwrap();
    assert_eq!(s.read(&y).unwrap(), s.read(&x).unwrap(), "eval mode is the identity");
    let mut step =
        s.train_step(&loss, &Optimizer::Sgd(Sgd::default()), &[&y], &Default::default()).unwrap();
    let mut masks = Vec::new();
    for _ in 0..2 {
        s.step(&mut step, 0.0).unwrap(); // lr 0: x stays put
        let (xv, yv) = (s.read(&x).unwrap(), s.read(&y).unwrap());
        let mask: Vec<bool> = xv
            .iter()
            .zip(&yv)
            .map(|(a, b)| {
                assert!(*b == 0.0 || (b - a / 0.75).abs() < 1e-12, "{a} -> {b}");
                *b != 0.0
            })
            .collect();
        let dropped = mask.iter().filter(|m| !**m).count();
        assert!((20..=80).contains(&dropped), "{dropped} of 200 dropped at p = 0.25");
        masks.push(mask);
    }
    assert_ne!(masks[0], masks[1], "a fresh mask every step");
    // The gradient of Σ dropout(x) is the mask scaled by 1/(1-p), for the step being run.
    let bp = s.backprop(&loss, &[&y]).unwrap();
    s.run(&bp).unwrap();
    let (yv, gv) = (s.read(&y).unwrap(), s.read_grad(&x).unwrap());
    for (b, d) in yv.iter().zip(&gv) {
        let want = if *b != 0.0 { 1.0 / 0.75 } else { 0.0 };
        assert!((d - want).abs() < 1e-12, "grad {d}, want {want}");
    }
}

#[test]
fn block_dropout_acts_in_training_only() {
    use rocannl_tensor::nn::attention::{
        AttentionConfig, TransformerBlock, TransformerBlockConfig,
    };
    use rocannl_tensor::{Axes, Graph, Mode, Session};
    let g = Graph::with_seed(5);
    let x = g.ndarray("x", Axes::new().batch(&[3]).output(&[4]), &spread(12, -1.0, 1.0));
    let cfg = TransformerBlockConfig::new(AttentionConfig::new(2, 2), 6).with_dropout(0.5);
    let block = TransformerBlock::new(&g, "blk", cfg);
    let y = block.apply(&x);
    let plain = TransformerBlock { dropout: 0.0, ..block.clone() }.apply(&x);
    let mut s = Session::with_options(&g, common::opts()).unwrap();
    // One graph: the train-mode routine drops, the eval-mode one does not.
    let train = s.forward_in(Mode::Train, &[&y, &plain]).unwrap();
    let eval = s.forward(&[&y]).unwrap();
    let mut runs = Vec::new();
    for _ in 0..2 {
        s.run(&train).unwrap();
        let (t, p) = (s.read(&y).unwrap(), s.read(&plain).unwrap());
        s.run(&eval).unwrap();
        runs.push((t, s.read(&y).unwrap(), p));
    }
    let ((t1, e1, p1), (t2, e2, _)) = (&runs[0], &runs[1]);
    assert_eq!(e1, e2, "evaluation has no dropout");
    assert_eq!(e1, p1, "evaluation equals the block without dropout");
    assert_ne!(t1, t2, "a fresh mask every step");
    assert_ne!(t1, e1, "training drops");
}

/// A dropout probability outside [0, 1] (or NaN) is a usage error naming the tensor and the
/// value, through the blocks that take one too.
#[test]
fn dropout_rejects_probabilities_outside_0_1() {
    use rocannl_tensor::nn::gpt::{Gpt, GptConfig};
    use rocannl_tensor::{Axes, Error, Graph};
    for p in [1.5, -0.5, f64::NAN, f64::INFINITY] {
        let g = Graph::new();
        let x = g.data("x", Axes::new().batch(&[4]).output(&[8]));
        let _ = nn::dropout(&x, p);
        match g.finish() {
            Err(Error::Usage(m)) => {
                assert!(m.contains("'x'") && m.contains(&format!("{p}")), "{m}")
            }
            other => panic!("p = {p}: {other:?}"),
        }
        let g = Graph::new();
        let x = g.data("x", Axes::new().batch(&[2, 5]).output(&[8]));
        let cfg = TransformerBlockConfig::new(AttentionConfig::new(2, 4), 16).with_dropout(p);
        let block = TransformerBlock::new(&g, "blk", cfg);
        let _ = block.apply(&x);
        let e = g.finish().unwrap_err().to_string();
        assert!(e.contains("dropout") && e.contains(&format!("{p}")), "{e}");
        let g = Graph::new();
        let cfg =
            GptConfig::new(5, 4, 8, 2, 1).with_ff(8).with_act(Activation::Relu).with_dropout(p);
        let ids = g.data("ids", Axes::new().batch(&[2, 4]));
        let _ = Gpt::new(&g, "gpt", cfg).apply(&ids);
        assert!(matches!(g.finish(), Err(Error::Usage(_))), "GPT dropout {p}");
    }
}

/// At p = 1 every cell is exactly 0 and so is every gradient through dropout: a training step
/// leaves the parameters finite (and, with nothing else in the loss, unchanged), on the
/// interpreter and on native code. At p = 0 dropout is the identity.
#[test]
fn dropout_of_one_zeroes_and_a_training_step_leaves_finite_params() {
    use rocannl_tensor::{
        Adam, Axes, BackendKind, Graph, Optimizer, Prec, Session, SessionOptions,
    };
    let backends = BackendKind::available().into_iter().filter(|b| *b != BackendKind::Cuda);
    for backend in backends {
        let g = Graph::with_seed(7);
        let x = g.ndarray("x", Axes::new().batch(&[4]).output(&[3]), &spread(12, -2.0, 2.0));
        let w = g.param(
            "w",
            ParamSpec::new(Axes::new().output(&[5])).init(Init::Values(spread(15, -1.0, 1.0))),
        );
        let y = nn::dropout(&w.matmul(&x), 1.0);
        let loss = loss::mse(&y, &g.number(1.0), loss::Reduction::Mean);
        assert!(nn::dropout(&x, 0.0).id() == x.id(), "p = 0 is the identity");
        let opts = SessionOptions { backend, prec: Prec::F32, ..SessionOptions::default() };
        let mut s = Session::with_options(&g, opts).unwrap();
        let mut step = s
            .train_step(&loss, &Optimizer::Adam(Adam::default()), &[&y], &Default::default())
            .unwrap();
        for _ in 0..3 {
            s.step(&mut step, 0.1).unwrap();
        }
        assert!(
            s.read(&y).unwrap().iter().all(|v| *v == 0.0 && v.is_sign_positive()),
            "{backend:?}"
        );
        let l = s.loss(&step).unwrap();
        assert!((l - 1.0).abs() < 1e-6, "{backend:?}: the loss of zeros against 1 is {l}");
        let after = s.read(&w).unwrap();
        assert!(after.iter().all(|v| v.is_finite()), "{backend:?}: {after:?}");
        let init: Vec<f64> = spread(15, -1.0, 1.0).iter().map(|v| *v as f32 as f64).collect();
        assert_eq!(after, init, "{backend:?}: a zero gradient moves nothing");
    }
}

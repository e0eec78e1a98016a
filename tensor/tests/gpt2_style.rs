//! A GPT-2 / nanoGPT-style model built from `GptConfig` alone: no biases, a head tied to the
//! token table, N(0, 0.02) weights with the residual projections scaled by `1/√(2·layers)`, and
//! AdamW groups that decay every param with two or more axes. Its params, their shapes, their
//! init statistics, the decay set and the tied head's gradient are checked.

mod common;

use common::{check, opts};
use rocannl_tensor::nn::gpt::{Gpt, GptConfig};
use rocannl_tensor::nn::{Activation, Module, loss};
use rocannl_tensor::{Axes, DecayPolicy, Graph, Init, Session, Tensor};

const STD: f64 = 0.02;

fn nanogpt(vocab: usize, context: usize, width: usize, heads: usize, layers: usize) -> GptConfig {
    GptConfig::new(vocab, context, width, heads, layers)
        .with_act(Activation::Gelu)
        .with_bias(false)
        .with_tied_head(true)
        .with_init(Some(Init::Normal { mean: 0.0, std: STD }))
        .with_residual_scaling(true)
}

/// Every param's values after initialization.
fn initial_values(g: &Graph, params: &[Tensor]) -> Vec<Vec<f64>> {
    let mut s = Session::with_options(g, opts()).unwrap();
    let r = s.forward(&params.iter().collect::<Vec<_>>()).unwrap();
    s.run(&r).unwrap();
    params.iter().map(|p| s.read(p).unwrap()).collect()
}

/// Checks that `values` look drawn from N(0, std²): the sample standard deviation within 4 of
/// its standard errors (`std/√(2n)` for a normal sample of `n`), the mean within 4 of its own
/// (`std/√n`).
fn assert_normal(what: &str, values: &[f64], std: f64) {
    let n = values.len() as f64;
    let mean = values.iter().sum::<f64>() / n;
    let sd = (values.iter().map(|v| (v - mean) * (v - mean)).sum::<f64>() / n).sqrt();
    let (sd_bound, mean_bound) = (4.0 * std / (2.0 * n).sqrt(), 4.0 * std / n.sqrt());
    assert!((sd - std).abs() < sd_bound, "{what}: std {sd}, want {std} ± {sd_bound} (n = {n})");
    assert!(mean.abs() < mean_bound, "{what}: mean {mean}, want 0 ± {mean_bound} (n = {n})");
}

#[test]
fn a_nanogpt_model_from_its_config_alone() {
    let (vocab, context, width, heads, layers) = (50, 16, 64, 4, 2);
    let g = Graph::with_seed(7);
    let gpt = Gpt::new(&g, "gpt", nanogpt(vocab, context, width, heads, layers));
    g.set_decay_policy(DecayPolicy::AllMatricesAndTables);
    let ids = g.data("ids", Axes::new().batch(&[2, context]));
    let logits = gpt.apply(&ids);
    g.finish().unwrap();
    assert_eq!(logits.dims().unwrap(), vec![2, context, vocab]);
    assert!(gpt.head.is_none());

    // The params: no bias anywhere, no head of its own.
    let params = gpt.params();
    assert_eq!(g.params().len(), params.len());
    let mut want: Vec<(String, Vec<usize>)> = vec![
        ("gpt.tok.table".into(), vec![width, vocab]),
        ("gpt.pos".into(), vec![context, width]),
    ];
    for l in 0..layers {
        let p = |n: &str, dims: &[usize]| (format!("gpt.h{l}.{n}"), dims.to_vec());
        want.extend([
            p("ln1.gain", &[width]),
            p("att.wq", &[heads, width / heads, width]),
            p("att.wk", &[heads, width / heads, width]),
            p("att.wv", &[heads, width / heads, width]),
            p("att.wo", &[width, heads, width / heads]),
            p("ln2.gain", &[width]),
            p("ff1.w", &[4 * width, width]),
            p("ff2.w", &[width, 4 * width]),
        ]);
    }
    want.push(("gpt.ln_f.gain".into(), vec![width]));
    let got: Vec<(String, Vec<usize>)> =
        params.iter().map(|p| (p.label(), p.dims().unwrap())).collect();
    assert_eq!(got, want);

    // nanoGPT's decay groups: every param with two or more axes, tables included.
    for p in &params {
        let matrix = !p.label().ends_with(".gain");
        assert_eq!(g.decays(p).unwrap(), matrix, "{}", p.label());
    }

    // Init statistics: N(0, 0.02) for the tables, the q/k/v projections and ff1; the residual
    // projections (att.wo, ff2.w) N(0, 0.02/√(2·layers)); the gains 1.
    let values = initial_values(&g, &params);
    let residual_std = STD / (2.0 * layers as f64).sqrt();
    let (mut plain, mut residual) = (Vec::new(), Vec::new());
    for (p, v) in params.iter().zip(&values) {
        let label = p.label();
        if label.ends_with(".gain") {
            assert!(v.iter().all(|x| *x == 1.0), "{label}");
        } else if label.ends_with("att.wo") || label.ends_with("ff2.w") {
            assert_normal(&label, v, residual_std);
            residual.extend_from_slice(v);
        } else {
            assert_normal(&label, v, STD);
            plain.extend_from_slice(v);
        }
    }
    assert_normal("every plain weight", &plain, STD);
    assert_normal("every residual projection", &residual, residual_std);
}

#[test]
fn the_per_param_policy_keeps_the_construction_flags_and_set_decay_wins() {
    let g = Graph::with_seed(1);
    let gpt = Gpt::new(&g, "gpt", nanogpt(7, 4, 8, 2, 1));
    let _ = gpt.apply(&g.data("ids", Axes::new().batch(&[1, 4])));
    g.finish().unwrap();
    assert_eq!(g.decay_policy(), DecayPolicy::PerParam);
    // Tables, positions and gains are exempt by construction; weight matrices decay.
    for p in gpt.params() {
        let label = p.label();
        let exempt = label.ends_with(".gain") || label == "gpt.tok.table" || label == "gpt.pos";
        assert_eq!(g.decays(&p).unwrap(), !exempt, "{label}");
    }
    g.set_decay(&gpt.tok.table, true);
    g.set_decay_policy(DecayPolicy::AllMatricesAndTables);
    g.set_decay(&gpt.pos, false);
    assert!(g.decays(&gpt.tok.table).unwrap() && !g.decays(&gpt.pos).unwrap());
    // Only params have a decay: anything else is an error naming the tensor.
    let g = Graph::new();
    let x = g.data("x", Axes::new().batch(&[2]).output(&[3]));
    g.set_decay(&x, true);
    let e = g.decays(&x).unwrap_err().to_string();
    assert!(e.contains("decays of 'x'") && e.contains("not a param"), "{e}");
    let e = g.finish().unwrap_err().to_string();
    assert!(e.contains("set_decay of 'x'") && e.contains("not a param"), "{e}");
}

/// The tied GPT's loss and its token table's gradient, and the same for an untied GPT whose
/// head starts as the table's transpose: the tied table's gradient is the sum of the untied
/// table's and the transposed head's.
#[test]
fn a_tied_heads_gradient_sums_both_uses() {
    let (vocab, context, width) = (7, 4, 8);
    let ids: Vec<f64> = (0..2 * context).map(|i| ((i * 3 + 1) % vocab) as f64).collect();
    let targets: Vec<f64> = (0..2 * context).map(|i| ((i * 5 + 2) % vocab) as f64).collect();
    let run = |tied: bool| {
        let g = Graph::with_seed(11);
        let cfg = nanogpt(vocab, context, width, 2, 1).with_tied_head(tied);
        let gpt = Gpt::new(&g, "gpt", cfg);
        let x = g.ndarray("ids", Axes::new().batch(&[2, context]), &ids);
        let y = g.ndarray("targets", Axes::new().batch(&[2, context]), &targets);
        let l = loss::sparse_cross_entropy(&gpt.apply(&x), &y, loss::Reduction::Mean);
        let mut s = Session::with_options(&g, opts()).unwrap();
        let bp = s.backprop(&l, &[]).unwrap();
        if let Some(head) = &gpt.head {
            // The head's weights (vocab -> … memory order [vocab, width]) from the table's
            // ([width, vocab]).
            let init = s.forward(&[&gpt.tok.table]).unwrap();
            s.run(&init).unwrap();
            let t = s.read(&gpt.tok.table).unwrap();
            let w: Vec<f64> =
                (0..vocab * width).map(|i| t[(i % width) * vocab + i / width]).collect();
            s.write(&head.w, &w).unwrap();
        }
        s.run(&bp).unwrap();
        let head = gpt.head.as_ref().map(|h| s.read_grad(&h.w).unwrap());
        (s.read(&l).unwrap()[0], s.read_grad(&gpt.tok.table).unwrap(), head)
    };
    let (tied_loss, tied_grad, none) = run(true);
    let (loss, table_grad, head_grad) = run(false);
    assert!(none.is_none());
    let head_grad = head_grad.unwrap();
    assert!((tied_loss - loss).abs() <= 1e-12 * loss.abs(), "{tied_loss} vs {loss}");
    // In memory order the table is [width, vocab] and the head [vocab, width].
    let want: Vec<f64> = (0..width * vocab)
        .map(|i| table_grad[i] + head_grad[(i % vocab) * width + i / vocab])
        .collect();
    let scale = want.iter().fold(0.0f64, |m, w| m.max(w.abs()));
    let from_head = head_grad.iter().fold(0.0f64, |m, h| m.max(h.abs()));
    assert!(from_head > 0.1 * scale, "the head's use contributes ({from_head} of {scale})");
    for (i, (g, w)) in tied_grad.iter().zip(&want).enumerate() {
        // The same sums in f64, perhaps in another order: equal up to rounding.
        assert!((g - w).abs() <= 1e-12 * scale, "cell {i}: {g} vs {w}");
    }
}

#[test]
fn a_tied_heads_gradient_matches_finite_differences() {
    check("tied GPT", |g| {
        // Weights of N(0, 0.5²), so that the gradients are far above the differences' noise.
        let cfg = nanogpt(5, 3, 4, 2, 1).with_init(Some(Init::Normal { mean: 0.0, std: 0.5 }));
        let gpt = Gpt::new(g, "gpt", cfg);
        let ids = g.ndarray("ids", Axes::new().batch(&[1, 3]), &[0.0, 3.0, 4.0]);
        (vec![gpt.tok.table.clone()], gpt.apply(&ids))
    });
}

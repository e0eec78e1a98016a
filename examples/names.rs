//! A character-level language model of first names (5,163 names bundled in `data/names.txt`):
//! first a bigram model, then an MLP over the three previous characters (Bengio et al. 2003),
//! each printing its loss going down and a few sampled names.
//!
//! Characters are ids 0..=26 (`.` marks the start and the end of a name). The MLP embeds each of
//! its three context characters with one table — an einsum `...|t, v; v -> e => ...|t, e` over
//! one-hot ids — and its hidden layer's input shape `t, e` (3 × 10) is inferred from that use.
//!
//! `cargo run --release --example names` (`--quick` for a short run).

use std::error::Error;

use rocannl::datasets::names;
use rocannl::datasets::uniform;
use rocannl::tensor::nn::{Linear, LinearConfig, loss};
use rocannl::tensor::train::{Column, Loader, LrSchedule, TrainConfig, train};
use rocannl::tensor::{Adam, Axes, Graph, Init, Optimizer, ParamSpec, Session, Tensor};

const VOCAB: usize = 27;
const CONTEXT: usize = 3;

fn id(c: char) -> usize {
    if c == '.' { 0 } else { (c as u8 - b'a') as usize + 1 }
}

fn ch(i: usize) -> char {
    if i == 0 { '.' } else { (b'a' + (i - 1) as u8) as char }
}

/// (context ids, next id) for every position of every name.
fn examples(words: &[String], context: usize) -> (Vec<f64>, Vec<f64>) {
    let (mut xs, mut ys) = (Vec::new(), Vec::new());
    for w in words {
        let mut ctx = vec![0usize; context];
        for c in w.chars().chain(std::iter::once('.')) {
            xs.extend(ctx.iter().map(|&i| i as f64));
            ys.push(id(c) as f64);
            ctx.remove(0);
            ctx.push(id(c));
        }
    }
    (xs, ys)
}

fn one_hot(ids: &[f64]) -> Vec<f64> {
    ids.iter()
        .flat_map(|&i| (0..VOCAB).map(move |c| if c as f64 == i { 1.0 } else { 0.0 }))
        .collect()
}

/// Samples names: the model's logits for a context, softmax on the host, a counter-based draw.
fn sample(
    s: &mut Session,
    ctx_t: &Tensor,
    logits: &Tensor,
    context: usize,
    count: usize,
) -> Result<Vec<String>, Box<dyn Error>> {
    let r = s.forward(&[logits])?;
    let mut out = Vec::new();
    let mut draw = 0u64;
    for _ in 0..count {
        let mut ctx = vec![0usize; context];
        let mut name = String::new();
        while name.len() < 20 {
            s.write(ctx_t, &ctx.iter().map(|&i| i as f64).collect::<Vec<_>>())?;
            s.run(&r)?;
            let l = s.read(logits)?;
            let m = l.iter().copied().fold(f64::MIN, f64::max);
            let p: Vec<f64> = l.iter().map(|v| (v - m).exp()).collect();
            let total: f64 = p.iter().sum();
            let mut u = uniform(2024, draw) * total;
            draw += 1;
            let next = p.iter().position(|q| {
                u -= q;
                u <= 0.0
            });
            let next = next.unwrap_or(0);
            if next == 0 {
                break;
            }
            name.push(ch(next));
            ctx.remove(0);
            ctx.push(next);
        }
        out.push(name);
    }
    Ok(out)
}

fn run(model: &str, quick: bool, words: &[String]) -> Result<(f64, f64), Box<dyn Error>> {
    let context = if model == "bigram" { 1 } else { CONTEXT };
    let (xs, ys) = examples(words, context);
    let g = Graph::with_seed(5);
    let columns =
        [Column::new("context", &[context, 1], xs), Column::new("next", &[VOCAB], one_hot(&ys))];
    let loader = Loader::new(&g, &columns, 256)?;
    // The logits of the next character for context ids `ctx` (`batch | context, 1`).
    let (table, hidden, out) = if model == "bigram" {
        let w = g.param(
            "bigram",
            ParamSpec::new(Axes::new().input(&[1, VOCAB]).output(&[VOCAB]))
                .init(Init::Constant(0.0)),
        );
        (w, None, None)
    } else {
        let table = g.param(
            "embed",
            ParamSpec::new(Axes::new().input(&[VOCAB]).output(&[10]))
                .init(Init::Normal { mean: 0.0, std: 1.0 }),
        );
        let hidden = Linear::new(&g, "hidden", LinearConfig::new(100));
        (table, Some(hidden), Some(Linear::new(&g, "out", LinearConfig::new(VOCAB))))
    };
    let logits_of = |ctx: &Tensor| -> Tensor {
        let onehot = ctx.eq(&g.range(VOCAB)); // batch | context, 27
        match (&hidden, &out) {
            (Some(h), Some(o)) => {
                let e = onehot.einsum("...|t, v; v -> e => ...|t, e", &table);
                o.apply(&h.apply(&e).tanh())
            }
            _ => table.matmul(&onehot),
        }
    };
    let logits = logits_of(loader.batch(0));
    let loss = loss::cross_entropy(&logits, loader.batch(1), loss::Reduction::Mean).named("loss");
    let sample_ctx = g.data("sample_context", Axes::new().output(&[context, 1]));
    let sample_logits = logits_of(&sample_ctx).named("sample_logits");

    let mut s = Session::new(&g)?;
    println!("== {model}: {} examples, {} batches of 256", columns[1].len(), loader.batches());
    for p in g.params() {
        println!("   {:10} {}", p.label(), p.shape_string());
    }
    let mut step =
        s.train_step(&loss, &Optimizer::Adam(Adam::default()), &[], &Default::default())?;
    let epochs = if quick { 2 } else { 8 };
    let lr = if model == "bigram" { 0.05 } else { 0.01 };
    let cfg = TrainConfig {
        epochs,
        lr: LrSchedule::Cosine { max: lr, min: lr / 10.0 },
        shuffle_seed: Some(1),
        progress: !quick,
    };
    let h = train(&mut s, &mut step, &loader, &columns, &cfg, |_| Ok(0.0))?;
    for (e, l) in h.epoch_losses.iter().enumerate() {
        println!("   epoch {:2}: loss {l:.4}", e + 1);
    }
    let names = sample(&mut s, &sample_ctx, &sample_logits, context, 8)?;
    println!("   samples: {}", names.join(", "));
    let (first, last) = (h.losses[0], h.epoch_losses[h.epoch_losses.len() - 1]);
    println!("metrics {model}: {{\"first_loss\": {first}, \"last_loss\": {last}}}");
    Ok((first, last))
}

fn main() -> Result<(), Box<dyn Error>> {
    let quick = std::env::args().any(|a| a == "--quick");
    let words = names();
    run("bigram", quick, &words)?;
    run("mlp", quick, &words)?;
    Ok(())
}

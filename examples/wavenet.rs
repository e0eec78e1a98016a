//! A WaveNet-style hierarchical MLP over the 32,033 names of `data/names32k.txt`: the final
//! model of a well-known lecture series on character-level language models.
//!
//! Eight previous characters predict the next: an embedding `27 × 24`, then three stages of
//! "flatten two consecutive positions (a reshape) → linear without bias → batch norm → tanh"
//! (positions 8 → 4 → 2 → 1), then a linear head; 76,579 params. Trained with SGD in batches
//! of 32 (learning rate 0.1, then 0.01 for the last quarter), evaluated in eval mode: the batch
//! norms use the running statistics the training step kept up to date in its compiled routine.
//!
//! ```text
//! cargo run --release --example wavenet                       # 8,000 steps, seed 0
//! cargo run --release --example wavenet -- --steps N --seed S --json
//! python3 scripts/reference/wavenet.py --steps N --seed S     # the same model in PyTorch
//! python3 scripts/reference/wavenet.py --load wavenet.safetensors   # our weights, in PyTorch
//! ```
//!
//! The data order, the split (80/10/10 by position in a hashed order) and the batches are the
//! PyTorch script's, drawn from the same counter-based generator; the initial weights are drawn
//! from the same distributions (PyTorch's defaults, the head's weights scaled by 0.1). The
//! parameters and the batch norms' running statistics are saved to `wavenet.safetensors` under
//! PyTorch's names for them, and the script's `--load` evaluates them as a PyTorch module.

use std::collections::BTreeSet;
use std::time::Instant;

use rocannl::tensor::nn::embed::{Embedding, EmbeddingConfig};
use rocannl::tensor::nn::{BatchNorm, BatchNormConfig, Linear, LinearConfig, loss};
use rocannl::tensor::{Axes, Graph, Init, Optimizer, Session, Sgd, Tensor};

const CONTEXT: usize = 8;
const EMBED: usize = 24;
const HIDDEN: usize = 128;
const BATCH: usize = 32;
/// Evaluation batch: the largest batch the routines are compiled for.
const EVAL_BATCH: usize = 32;

/// Examples of one split: each the 8 previous ids (0, `.`, before the start) and the next id.
#[derive(Default)]
struct Split {
    contexts: Vec<f64>,
    targets: Vec<f64>,
}

impl Split {
    fn len(&self) -> usize {
        self.targets.len()
    }

    fn push_name(&mut self, ids: impl Iterator<Item = u32>) {
        let mut ctx = [0u32; CONTEXT];
        for id in ids.chain(std::iter::once(0)) {
            self.contexts.extend(ctx.iter().map(|&c| f64::from(c)));
            self.targets.push(f64::from(id));
            ctx.rotate_left(1);
            ctx[CONTEXT - 1] = id;
        }
    }

    /// The examples at `rows`, as the contexts and targets to write.
    fn rows(&self, rows: &[usize]) -> (Vec<f64>, Vec<f64>) {
        let ctx = rows.iter().flat_map(|&r| self.contexts[r * CONTEXT..(r + 1) * CONTEXT].to_vec());
        (ctx.collect(), rows.iter().map(|&r| self.targets[r]).collect())
    }
}

/// The vocabulary and the train, validation and test splits: names in `(name_key, name)` order,
/// position `p % 10 == 0` validation, `== 1` test, the rest training.
fn data() -> (Vec<char>, [Split; 3]) {
    let mut names = rocannl::datasets::names_32k();
    let letters: BTreeSet<char> = names.iter().flat_map(|n| n.chars()).collect();
    let vocab: Vec<char> = std::iter::once('.').chain(letters).collect();
    names.sort_by(|a, b| {
        rocannl::datasets::name_key(a).cmp(&rocannl::datasets::name_key(b)).then_with(|| a.cmp(b))
    });
    let id = |c: char| vocab.iter().position(|v| *v == c).unwrap_or(0) as u32;
    let mut splits: [Split; 3] = Default::default();
    for (p, name) in names.iter().enumerate() {
        let s = match p % 10 {
            0 => 1,
            1 => 2,
            _ => 0,
        };
        splits[s].push_name(name.chars().map(id));
    }
    (vocab, splits)
}

/// The model's logits for ids `x` (`batch, 8` ids): each stage pairs consecutive positions.
fn model(g: &Graph, x: &Tensor, vocab: usize) -> Tensor {
    let emb = Embedding::new(g, "emb", EmbeddingConfig::new(vocab, EMBED));
    let mut h = emb.apply(x);
    let (mut positions, mut width) = (CONTEXT, EMBED);
    for s in 0..3 {
        // FlattenConsecutive(2): `B, T | -> C` as `B, T/2 | -> 2C` (PyTorch's view).
        positions /= 2;
        width *= 2;
        let view = Axes::new().batch_partial(&[None, Some(positions)]).output(&[width]);
        h = h.reshape(&view);
        let linear = LinearConfig::new(HIDDEN).with_bias(false);
        h = Linear::new(g, &format!("s{s}.linear"), linear).apply(&h);
        h = BatchNorm::new(g, &format!("s{s}.bn"), BatchNormConfig::default()).apply(&h);
        h = h.tanh();
        width = HIDDEN;
    }
    // The one position left goes: `B, 1 | -> C` as `B | -> C`.
    let h = h.reshape(&Axes::new().batch_partial(&[None]));
    let bound = 1.0 / (HIDDEN as f64).sqrt();
    let head = LinearConfig::new(vocab)
        .with_w_init(Init::FanInUniform.gain(0.1))
        .with_b_init(Init::Uniform { lo: -bound, hi: bound });
    Linear::new(g, "head", head).apply(&h)
}

struct Args {
    steps: usize,
    seed: u64,
    json: bool,
    /// Skip the training set's loss (a smoke run): the validation loss only.
    quick: bool,
}

fn args() -> Result<Args, String> {
    let mut a = Args { steps: 8_000, seed: 0, json: false, quick: false };
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        let mut value = || it.next().ok_or(format!("{flag} needs a value"));
        match flag.as_str() {
            "--steps" => a.steps = value()?.parse().map_err(|e| format!("--steps: {e}"))?,
            "--seed" => a.seed = value()?.parse().map_err(|e| format!("--seed: {e}"))?,
            "--json" => a.json = true,
            "--quick" => a.quick = true,
            other => {
                return Err(format!("unknown flag {other} (--steps N, --seed S, --json, --quick)"));
            }
        }
    }
    Ok(a)
}

fn run() -> Result<(), Box<dyn std::error::Error>> {
    let started = Instant::now();
    let a = args()?;
    let (vocab, [train, val, _test]) = data();
    let g = Graph::with_seed(a.seed);
    let batch = g.dynamic("batch", EVAL_BATCH);
    let x = g.ids("contexts", Axes::new().dynamic_batch(&batch).batch(&[CONTEXT]));
    let y = g.ids("targets", Axes::new().dynamic_batch(&batch));
    let logits = model(&g, &x, vocab.len());
    let per_example = loss::sparse_cross_entropy(&logits, &y, loss::Reduction::None);
    let mean = per_example.mean_all();
    let mut s = Session::new(&g)?;
    let params: usize =
        g.params().iter().map(|p| p.dims().map(|d| d.iter().product::<usize>()).unwrap_or(0)).sum();
    let mut step =
        s.train_step(&mean, &Optimizer::Sgd(Sgd::default()), &[], &Default::default())?;
    // Eval mode (the default of `forward`): the batch norms read their running statistics.
    let eval = s.forward(&[&per_example])?;
    let train_started = Instant::now();
    s.set_size(&batch, BATCH)?;
    let mut last = Vec::new();
    for t in 0..a.steps {
        let rows: Vec<usize> = (0..BATCH)
            .map(|i| {
                (rocannl::datasets::uniform(a.seed ^ 0x5EED, (t * BATCH + i) as u64)
                    * train.len() as f64) as usize
            })
            .collect();
        let (xs, ys) = train.rows(&rows);
        s.write(&x, &xs)?;
        s.write(&y, &ys)?;
        let lr = if t < a.steps * 3 / 4 { 0.1 } else { 0.01 };
        s.step(&mut step, lr)?;
        if t + 50 >= a.steps {
            last.push(s.loss(&step)?);
        }
        if !a.json && t % 2000 == 0 {
            println!("step {t:>6}: loss {:.4}", s.loss(&step)?);
        }
    }
    let steps_per_s = a.steps as f64 / train_started.elapsed().as_secs_f64();
    // The mean loss over a split, in eval mode, `EVAL_BATCH` examples at a time.
    let evaluate = |s: &mut Session, split: &Split| -> Result<f64, rocannl::tensor::Error> {
        let (mut total, mut count) = (0.0, 0usize);
        let all: Vec<usize> = (0..split.len()).collect();
        for chunk in all.chunks(EVAL_BATCH) {
            let (xs, ys) = split.rows(chunk);
            s.set_size(&batch, chunk.len())?;
            s.write(&x, &xs)?;
            s.write(&y, &ys)?;
            s.run(&eval)?;
            total += s.read(&per_example)?.iter().sum::<f64>();
            count += chunk.len();
        }
        Ok(total / count as f64)
    };
    let val_loss = evaluate(&mut s, &val)?;
    let train_loss = if a.quick { f64::NAN } else { evaluate(&mut s, &train)? };
    s.save_params(std::path::Path::new("wavenet.safetensors"))?;
    let wall_s = started.elapsed().as_secs_f64();
    if a.json {
        let line = serde_json::json!({
            "train_loss": train_loss, "val_loss": val_loss, "steps": a.steps, "seed": a.seed,
            "steps_per_s": steps_per_s, "wall_s": wall_s, "params": params,
            "examples": {"train": train.len(), "val": val.len()},
            "last_batch_losses_mean": last.iter().sum::<f64>() / last.len().max(1) as f64,
        });
        println!("{line}");
    } else {
        println!("{params} params; {} training and {} validation examples", train.len(), val.len());
        println!("train loss {train_loss:.4}, validation loss {val_loss:.4} (eval mode)");
        println!("{steps_per_s:.0} steps/s; wall {wall_s:.1} s; saved to wavenet.safetensors");
    }
    Ok(())
}

fn main() {
    if let Err(e) = run() {
        eprintln!("error: {e}");
        std::process::exit(1);
    }
}

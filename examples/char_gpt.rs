//! A character-level GPT on first names, in a configuration fixed exactly (data order included)
//! so that it can be compared with other frameworks on the same run.
//!
//! - Vocabulary: `.` (id 0, the boundary) and the letters of the data, sorted.
//! - Order and split: names ascending by `name_key` (64-bit FNV-1a of the UTF-8 bytes, then
//!   MurmurHash3's `fmix64`), ties by name; position `p % 10 == 0` is validation.
//! - Streams: per split, `.` + name for every name in that order, closed by one more `.`.
//! - Batches: 32 random windows of 17 consecutive training tokens (inputs the first 16, targets
//!   the last 16). Validation: mean cross-entropy over every position of the non-overlapping
//!   17-token windows (stride 16) of the validation stream.
//! - Model: token embedding 27×64, learned positions 16×64, 2 pre-LayerNorm blocks (causal
//!   attention, 4 heads of 16, projections without bias; MLP 64→256→64 with bias and tanh-GELU),
//!   final LayerNorm, head 64→27 with bias.
//! - Training: AdamW β = (0.9, 0.99), ε = 1e-8, weight decay 0.01 on weight matrices only,
//!   100 steps of linear warmup to 3e-3 then cosine to 3e-4 at the last step, gradients clipped
//!   to global norm 1, 2000 steps, f32.
//!
//! `cargo run --release --example char_gpt -- [--steps N] [--seed S] [--precision f32|bf16|f16]
//! [--master f32|same] [--backend B] [--data FILE] [--json]`
//!
//! Data-parallel on N processes (docs/distributed.md): build with `--features mpi` and start
//! it with `mpirun -np N target/release/examples/char_gpt --json`. Each rank trains on its
//! shard of every batch of 32 windows; rank 0 evaluates, samples, saves and prints, with the
//! same results as one process.
//!
//! In bf16 and f16 the run is mixed precision by default: activations and their gradients in
//! the half precision, parameters, their gradients and AdamW's state in f32 (`--master f32`),
//! and in f16 dynamic loss scaling. `--master same` stores everything in the half precision.

use std::collections::BTreeSet;
use std::time::Instant;

use rocannl::tensor::nn::gpt::{Gpt, GptConfig};
use rocannl::tensor::nn::sample::Sampler;
use rocannl::tensor::nn::{Activation, Module, loss};
use rocannl::tensor::optim::{AdamW, LossScale, Optimizer, StepOptions};
use rocannl::tensor::parallel::Group;
use rocannl::tensor::train::{LrSchedule, SequenceLoader};
use rocannl::tensor::{
    Axes, BackendKind, DynDim, Graph, Prec, Routine, Session, SessionOptions, Tensor, TrainStep,
};

const CONTEXT: usize = 16;
const BATCH: usize = 32;
const WIDTH: usize = 64;

struct Args {
    steps: usize,
    seed: u64,
    prec: Prec,
    /// The master weights' precision, when it differs from `prec`.
    master: Option<Prec>,
    backend: BackendKind,
    data: Option<String>,
    json: bool,
}

fn args() -> Result<Args, String> {
    let mut a = Args {
        steps: 2000,
        seed: 0,
        prec: Prec::F32,
        master: Some(Prec::F32),
        backend: BackendKind::default(),
        data: None,
        json: false,
    };
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        let mut value = || it.next().ok_or(format!("{flag} needs a value"));
        match flag.as_str() {
            "--steps" => a.steps = value()?.parse().map_err(|e| format!("--steps: {e}"))?,
            "--seed" => a.seed = value()?.parse().map_err(|e| format!("--seed: {e}"))?,
            "--precision" => {
                a.prec = match value()?.as_str() {
                    "f32" => Prec::F32,
                    "bf16" => Prec::Bf16,
                    "f16" => Prec::F16,
                    other => return Err(format!("--precision {other}: f32, bf16 or f16")),
                }
            }
            "--master" => {
                a.master = match value()?.as_str() {
                    "f32" => Some(Prec::F32),
                    "same" => None,
                    other => return Err(format!("--master {other}: f32 or same")),
                }
            }
            "--backend" => {
                a.backend = BackendKind::from_name(&value()?).map_err(|e| e.to_string())?
            }
            "--data" => a.data = Some(value()?),
            "--json" => a.json = true,
            other => return Err(format!("unknown flag {other}")),
        }
    }
    Ok(a)
}

/// The two token streams and the vocabulary.
struct Data {
    vocab: Vec<char>,
    train: Vec<u32>,
    val: Vec<u32>,
    /// The first names of the fixed order, reported so that a run can be checked against it.
    first: Vec<String>,
}

fn data(path: Option<&str>) -> Result<Data, String> {
    let mut names: Vec<String> = match path {
        Some(p) => std::fs::read_to_string(p)
            .map_err(|e| format!("{p}: {e}"))?
            .lines()
            .map(|l| l.trim().to_string())
            .filter(|l| !l.is_empty())
            .collect(),
        None => rocannl::datasets::names(),
    };
    let letters: BTreeSet<char> = names.iter().flat_map(|n| n.chars()).collect();
    let vocab: Vec<char> = std::iter::once('.').chain(letters).collect();
    names.sort_by(|a, b| {
        rocannl::datasets::name_key(a).cmp(&rocannl::datasets::name_key(b)).then_with(|| a.cmp(b))
    });
    let id = |c: char| vocab.iter().position(|v| *v == c).unwrap_or(0) as u32;
    let (mut train, mut val) = (Vec::new(), Vec::new());
    for (p, name) in names.iter().enumerate() {
        let stream = if p % 10 == 0 { &mut val } else { &mut train };
        stream.push(0);
        stream.extend(name.chars().map(id));
    }
    train.push(0);
    val.push(0);
    let first = names.iter().take(5).cloned().collect();
    Ok(Data { vocab, train, val, first })
}

fn main() {
    if let Err(e) = run() {
        eprintln!("error: {e}");
        std::process::exit(1);
    }
}

/// The model's tensors: one dynamic batch size at run time (32 windows to train, the rest of
/// the validation windows, 20 names to sample), so the same compiled routines serve them all.
struct Model {
    batch: DynDim,
    x: Tensor,
    y: Tensor,
    logits: Tensor,
    per_position: Tensor,
    /// The GPT's parameters (their shapes are known once the session has finished inference).
    params: Vec<Tensor>,
}

fn model(g: &Graph, vocab: usize) -> Model {
    let batch = g.dynamic("batch", BATCH);
    let x = g.ids("inputs", Axes::new().dynamic_batch(&batch).batch(&[CONTEXT]));
    let y = g.ids("targets", Axes::new().dynamic_batch(&batch).batch(&[CONTEXT]));
    // Attention without bias, MLPs and head with bias, PyTorch's default inits: the defaults.
    let cfg = GptConfig::new(vocab, CONTEXT, WIDTH, 4, 2)
        .with_ff(4 * WIDTH)
        .with_act(Activation::GeluTanh);
    let gpt = Gpt::new(g, "gpt", cfg);
    let logits = gpt.apply(&x);
    let per_position = loss::sparse_cross_entropy(&logits, &y, loss::Reduction::None);
    Model { batch, x, y, logits, per_position, params: gpt.params() }
}

/// What training recorded: every step's loss, when the first step's result was there and when
/// the optimized code of every routine started serving (from the start of compiling), and the
/// training's wall time.
struct Trained {
    losses: Vec<f64>,
    first_step_s: Option<f64>,
    optimized_s: Option<f64>,
    train_s: f64,
}

/// Trains `a.steps` steps on this rank's `shard` of every batch.
fn train(
    s: &mut Session,
    step: &mut TrainStep,
    m: &Model,
    a: &Args,
    d: &Data,
    shard: std::ops::Range<usize>,
    compile: Instant,
) -> Result<Trained, Box<dyn std::error::Error>> {
    let vocab = d.vocab.len();
    // Rank 0 (one process, or the rank whose shard starts every batch) prints.
    let root = shard.start == 0;
    let schedule = LrSchedule::WarmupCosine { warmup: 100, max: 3e-3, min: 3e-4 };
    let loader = SequenceLoader::new(d.train.clone(), CONTEXT, BATCH, a.seed ^ 0x5eed)?;
    let mut losses = Vec::with_capacity(a.steps);
    let started = Instant::now();
    let (mut first_step_s, mut optimized_s) = (None, None);
    for t in 0..a.steps {
        let (xs, ys) = loader.shard(t, shard.clone());
        s.write_ids(&m.x, &xs, vocab)?;
        s.write_ids(&m.y, &ys, vocab)?;
        let step_started = compile.elapsed().as_secs_f64();
        s.step(step, schedule.at(t, a.steps))?;
        losses.push(s.loss(step)?);
        first_step_s = first_step_s.or(Some(compile.elapsed().as_secs_f64()));
        if optimized_s.is_none() && !s.builds_pending() {
            optimized_s = Some(step_started);
        }
        if !a.json && root && (t % 200 == 0 || t + 1 == a.steps) {
            println!("step {t:>5}: loss {:.4}", losses[t]);
        }
    }
    let train_s = started.elapsed().as_secs_f64();
    Ok(Trained { losses, first_step_s, optimized_s, train_s })
}

/// The mean cross-entropy over every non-overlapping validation window, 32 at a time (the
/// last batch smaller), and the number of windows.
fn validate(
    s: &mut Session,
    eval: &Routine,
    m: &Model,
    d: &Data,
) -> Result<(f64, usize), Box<dyn std::error::Error>> {
    let val = SequenceLoader::new(d.val.clone(), CONTEXT, BATCH, 0)?;
    let (mut total, mut count) = (0.0, 0usize);
    for chunk in val.eval_starts().chunks(BATCH) {
        let (xs, ys) = val.windows(chunk);
        s.set_size(&m.batch, chunk.len())?;
        s.write_ids(&m.x, &xs, d.vocab.len())?;
        s.write_ids(&m.y, &ys, d.vocab.len())?;
        s.run(eval)?;
        let per = s.read(&m.per_position)?;
        total += per.iter().sum::<f64>();
        count += per.len();
    }
    Ok((total / count as f64, val.eval_starts().len()))
}

fn run() -> Result<(), Box<dyn std::error::Error>> {
    let started = Instant::now();
    let a = args()?;
    let d = data(a.data.as_deref())?;
    let vocab = d.vocab.len();
    let g = Graph::with_seed(a.seed);
    let m = model(&g, vocab);
    let mean = m.per_position.mean_all();
    let master = a.master.filter(|p| *p != a.prec);
    // Under `mpirun`, this process's shard of every batch; else the whole batch.
    let group = workers()?;
    let root = group.as_ref().is_none_or(Group::is_root);
    let shard = group.as_ref().map_or(0..BATCH, |g| g.shard(BATCH));
    let ranks = group.as_ref().map_or(1, Group::size);
    let opts = SessionOptions {
        backend: a.backend,
        prec: a.prec,
        master,
        data_parallel: group,
        ..SessionOptions::default()
    };
    let mut s = Session::with_options(&g, opts)?;
    s.set_size(&m.batch, shard.len())?;
    s.set_local_examples(shard.len())?;
    // After inference: the params' shapes come from their use.
    let params: usize =
        m.params.iter().map(|p| p.dims().map(|d| d.iter().product::<usize>()).unwrap_or(0)).sum();
    let adamw = Optimizer::AdamW(AdamW { beta1: 0.9, beta2: 0.99, eps: 1e-8, weight_decay: 0.01 });
    // f16's range needs loss scaling; bf16 has f32's.
    let loss_scale = (a.prec == Prec::F16).then(LossScale::default);
    let clip = StepOptions { clip_grad_norm: Some(1.0), loss_scale };
    let compile = Instant::now();
    let mut step = s.train_step(&mean, &adamw, &[], &clip)?;
    let eval = s.forward(&[&m.per_position, &m.logits])?;
    if ranks > 1 {
        // Each rank of `mpirun` is bound to a core of its own, where a background build would
        // starve beside the training loop: wait for the optimized code (at once when the
        // compile cache has it).
        s.finish_builds();
    }
    let compile_s = compile.elapsed().as_secs_f64();
    if !a.json && root {
        println!(
            "{params} params; {} training and {} validation tokens; compiled in {compile_s:.2} s",
            d.train.len(),
            d.val.len()
        );
    }
    let t = train(&mut s, &mut step, &m, &a, &d, shard, compile)?;
    if !root {
        return Ok(());
    }
    let (val_loss, windows) = validate(&mut s, &eval, &m, &d)?;
    s.set_size(&m.batch, SAMPLES)?;
    let samples = sample(&mut s, &eval, &m.x, &m.logits, &d.vocab, a.seed)?;
    let tail = &t.losses[t.losses.len().saturating_sub(50)..];
    let train_loss = tail.iter().sum::<f64>() / tail.len().max(1) as f64;
    let steps_per_s = a.steps as f64 / t.train_s;
    s.save_params(std::path::Path::new("char_gpt.safetensors"))?;
    let wall_s = started.elapsed().as_secs_f64();
    if a.json {
        // Valid JSON whatever happens: a non-finite loss is written as null.
        let line = serde_json::json!({
            "train_loss": train_loss, "val_loss": val_loss, "steps_per_s": steps_per_s,
            "compile_s": compile_s, "first_step_s": t.first_step_s,
            "optimized_s": t.optimized_s, "wall_s": wall_s, "samples": samples,
            "params": params, "precision": a.prec.name(), "master": s.master_prec().name(),
            "skipped_steps": step.skipped_steps(), "ranks": ranks,
            "allreduce": step.reduce_stats().map(|r| serde_json::json!({
                "bytes_per_step": r.bytes_per_step,
                "ms_per_step": 1e3 * r.total.as_secs_f64() / r.steps.max(1) as f64,
            })),
            "data": {
                "vocab": vocab, "train_tokens": d.train.len(), "val_tokens": d.val.len(),
                "eval_windows": windows, "first_names": d.first,
            },
        });
        println!("{line}");
        return Ok(());
    }
    println!(
        "train loss (mean of the last 50 steps) {train_loss:.4}, validation loss {val_loss:.4}"
    );
    let optimized = t.optimized_s.map_or("not within the run".into(), |t| format!("{t:.2} s"));
    println!(
        "{steps_per_s:.1} steps/s; compile {compile_s:.2} s (first step done at {:.2} s, \
         optimized code serving from {optimized}); wall {wall_s:.2} s",
        t.first_step_s.unwrap_or(compile_s)
    );
    if step.skipped_steps() > 0 {
        println!("loss scaling skipped {} steps", step.skipped_steps());
    }
    println!("samples: {}", samples.join(" "));
    println!("parameters saved to char_gpt.safetensors");
    Ok(())
}

/// The group of processes started by `mpirun`, when there are several (started alone, the
/// program does not initialize MPI).
#[cfg(feature = "mpi")]
fn workers() -> Result<Option<Group>, Box<dyn std::error::Error>> {
    Ok(Group::mpi_if_launched()?.filter(|world| world.size() > 1))
}

/// One process: built without the `mpi` feature.
#[cfg(not(feature = "mpi"))]
fn workers() -> Result<Option<Group>, Box<dyn std::error::Error>> {
    Ok(None)
}

/// How many names are sampled.
const SAMPLES: usize = 20;

/// 20 names sampled at temperature 1, in one batch of 20 windows: each step runs the forward
/// routine, reads the logits at every name's current position and draws the next character
/// from their softmax.
fn sample(
    s: &mut Session,
    eval: &Routine,
    x: &Tensor,
    logits: &Tensor,
    vocab: &[char],
    seed: u64,
) -> Result<Vec<String>, Box<dyn std::error::Error>> {
    let n = SAMPLES;
    let v = vocab.len();
    let mut ids = vec![0u32; n * CONTEXT];
    let mut names = vec![String::new(); n];
    let mut done = vec![false; n];
    for pos in 0..CONTEXT - 1 {
        s.write_ids(x, &ids, v)?;
        s.run(eval)?;
        let l = s.read(logits)?;
        for b in 0..n {
            if done[b] {
                continue;
            }
            let row = &l[(b * CONTEXT + pos) * v..(b * CONTEXT + pos + 1) * v];
            let draw = (pos * BATCH + b) as u64;
            let next = Sampler::default().sample(row, seed ^ 0xa11ce, draw).unwrap_or(0);
            if next == 0 {
                done[b] = true;
            } else {
                names[b].push(vocab[next]);
                ids[b * CONTEXT + pos + 1] = next as u32;
            }
        }
        if done.iter().all(|d| *d) {
            break;
        }
    }
    Ok(names)
}

//! The model suite's rocannl side (docs/benchmarks.md, "The model suite"): every model of
//! `benches/suite/models.json` built from the library's modules as a user would write it,
//! trained on random batches of the configured shapes, timed step by step. The PyTorch side of
//! the same file is `scripts/reference/suite.py`; `scripts/suite_compare.py` runs both,
//! alternated.
//!
//! ```text
//! cargo run --release --example suite -- --list
//! cargo run --release --example suite -- --model gpt-w128-l4-c64 [--steps N] [--warmup W]
//!     [--data-parallel] [--backend gccjit|cuda|interp] [--debug-dir DIR]
//! ```
//!
//! Prints one JSON object: the model, `step_s` (the median of the timed steps' wall times, after
//! `--warmup` steps and the optimized build), `steps_per_s`, `compile_s` (until the training
//! step is runnable), `first_step_s` (from the start of the process to the end of the first
//! step), `optimized_s` (from the start of the process until the optimized code serves), the
//! last `loss` and `params`.
//!
//! With `--data-parallel` (built with `--features mpi`, started by `mpirun -np N`; one rank
//! without a launcher) the model trains data-parallel: each rank's batch is its shard of the
//! configured batch (its own random values: the run measures time, not a loss to compare), and
//! rank 0 prints, with `ranks` and the gradient reductions' bytes and time per step
//! (`allreduce`). On one rank that time is the host's side alone: gathering the gradients and
//! writing them back.

use std::time::Instant;

use rocannl::tensor::nn::conv::{Conv2d, Conv2dConfig, Padding, max_pool2d};
use rocannl::tensor::nn::embed::{Embedding, EmbeddingConfig};
use rocannl::tensor::nn::gpt::{Gpt, GptConfig};
use rocannl::tensor::nn::{Activation, Linear, LinearConfig, Mlp, MlpConfig, loss};
use rocannl::tensor::optim::StepOptions;
use rocannl::tensor::parallel::Group;
use rocannl::tensor::{
    Adam, AdamW, Axes, BackendKind, Graph, Init, Optimizer, Session, SessionOptions, Sgd, Tensor,
};
use serde_json::Value;

/// The configuration file, compiled in so that the binary runs from anywhere.
const MODELS: &str = include_str!("../benches/suite/models.json");

/// A model ready to train: its graph, inputs with their values, loss, optimizer and clipping.
struct Problem {
    g: Graph,
    inputs: Vec<(Tensor, Vec<f64>)>,
    loss: Tensor,
    opt: Optimizer,
    lr: f64,
    clip: Option<f64>,
}

/// `n` draws in `[0, 1)` of the datasets' generator.
fn draws(seed: u64, n: usize) -> impl Iterator<Item = f64> {
    (0..n as u64).map(move |i| rocannl::datasets::uniform(seed, i))
}

/// `n` ids below `vocab`.
fn ids(seed: u64, n: usize, vocab: usize) -> Vec<f64> {
    draws(seed, n).map(|u| (u * vocab as f64).floor()).collect()
}

fn usize_of(v: &Value, key: &str) -> usize {
    v[key].as_u64().unwrap_or_else(|| panic!("models.json: no number {key} in {v}")) as usize
}

fn f64_of(v: &Value, key: &str) -> f64 {
    v[key].as_f64().unwrap_or_else(|| panic!("models.json: no number {key} in {v}"))
}

/// A GPT of the suite: pre-LayerNorm blocks, GPT-2's init, AdamW with clipping.
fn gpt(c: &Value, t: &Value) -> Problem {
    let (vocab, context, batch) =
        (usize_of(c, "vocab"), usize_of(c, "context"), usize_of(c, "batch"));
    let bias = c["bias"].as_bool().unwrap_or(true);
    let act = if c["gelu"] == "tanh" { Activation::GeluTanh } else { Activation::Gelu };
    let cfg = GptConfig::new(
        vocab,
        context,
        usize_of(c, "width"),
        usize_of(c, "heads"),
        usize_of(c, "layers"),
    )
    .with_ff(usize_of(t, "ff_ratio") * usize_of(c, "width"))
    .with_act(act)
    .with_bias(bias)
    .with_attention_bias(bias)
    .with_tied_head(c["tied"].as_bool().unwrap_or(false))
    .with_init(Some(Init::Normal { mean: 0.0, std: 0.02 }))
    .with_eps(f64_of(t, "layer_norm_eps"));
    let g = Graph::with_seed(0);
    let x = g.ids("x", Axes::new().batch(&[batch, context]));
    let y = g.ids("y", Axes::new().batch(&[batch, context]));
    let logits = Gpt::new(&g, "gpt", cfg).apply(&x);
    let loss = loss::sparse_cross_entropy(&logits, &y, loss::Reduction::Mean);
    let betas = &t["betas"];
    let opt = Optimizer::AdamW(AdamW {
        beta1: betas[0].as_f64().unwrap_or(0.9),
        beta2: betas[1].as_f64().unwrap_or(0.99),
        eps: f64_of(t, "eps"),
        weight_decay: f64_of(t, "weight_decay"),
    });
    let inputs = vec![(x, ids(1, batch * context, vocab)), (y, ids(2, batch * context, vocab))];
    Problem { g, inputs, loss, opt, lr: f64_of(t, "lr"), clip: Some(f64_of(t, "clip_grad_norm")) }
}

/// The anchors' MLP: ReLU layers, mean squared error against one-hot targets, SGD.
fn mlp(c: &Value) -> Problem {
    let dims: Vec<usize> = c["dims"]
        .as_array()
        .map(|a| a.iter().filter_map(Value::as_u64).map(|d| d as usize).collect())
        .unwrap_or_default();
    let batch = usize_of(c, "batch");
    let classes = dims[dims.len() - 1];
    let g = Graph::with_seed(0);
    let x = g.data("x", Axes::new().batch(&[batch]).output(&[dims[0]]));
    let y = g.data("y", Axes::new().batch(&[batch]).output(&[classes]));
    let pred = Mlp::new(&g, "mlp", MlpConfig::new(&dims[1..])).apply(&x);
    let loss = loss::mse(&pred, &y, loss::Reduction::Mean);
    let xs: Vec<f64> = draws(3, batch * dims[0]).map(|u| 2.0 * u - 1.0).collect();
    let labels = ids(4, batch, classes);
    let ys = (0..batch * classes)
        .map(|i| f64::from(labels[i / classes] as usize == i % classes))
        .collect();
    Problem {
        g,
        inputs: vec![(x, xs), (y, ys)],
        loss,
        opt: Optimizer::Sgd(Sgd::default()),
        lr: f64_of(c, "lr"),
        clip: None,
    }
}

/// The digits conv net: two 3×3 convolutions with ReLU and 2×2 max pooling, a linear head,
/// cross-entropy, Adam.
fn cnn(c: &Value) -> Problem {
    let batch = usize_of(c, "batch");
    let image: Vec<usize> = c["image"]
        .as_array()
        .map(|a| a.iter().filter_map(Value::as_u64).map(|d| d as usize).collect())
        .unwrap_or_default();
    let channels: Vec<usize> = c["channels"]
        .as_array()
        .map(|a| a.iter().filter_map(Value::as_u64).map(|d| d as usize).collect())
        .unwrap_or_default();
    let (k, pool, classes) = (usize_of(c, "kernel"), usize_of(c, "pool"), usize_of(c, "classes"));
    let g = Graph::with_seed(0);
    let x = g.data("x", Axes::new().batch(&[batch]).output(&image));
    let y = g.ids("y", Axes::new().batch(&[batch]));
    let conv = |name: &str, out: usize| {
        Conv2d::new(&g, name, Conv2dConfig::new((k, k), out).with_padding(Padding::Same))
    };
    let h = max_pool2d(&conv("conv1", channels[0]).apply(&x).relu(), pool, pool);
    let h = max_pool2d(&conv("conv2", channels[1]).apply(&h).relu(), pool, pool);
    let logits = Linear::new(&g, "head", LinearConfig::new(classes)).apply(&h);
    let loss = loss::sparse_cross_entropy(&logits, &y, loss::Reduction::Mean);
    let xs = draws(5, batch * image.iter().product::<usize>()).collect();
    let inputs = vec![(x, xs), (y, ids(6, batch, classes))];
    Problem {
        g,
        inputs,
        loss,
        opt: Optimizer::Adam(Adam::default()),
        lr: f64_of(c, "lr"),
        clip: None,
    }
}

/// A makemore-style MLP language model: embedded context, flattened, a tanh layer, logits.
fn mlp_lm(c: &Value) -> Problem {
    let (vocab, context, batch) =
        (usize_of(c, "vocab"), usize_of(c, "context"), usize_of(c, "batch"));
    let emb_dim = usize_of(c, "embedding");
    let g = Graph::with_seed(0);
    let x = g.ids("x", Axes::new().batch(&[batch, context]));
    let y = g.ids("y", Axes::new().batch(&[batch]));
    let e = Embedding::new(&g, "emb", EmbeddingConfig::new(vocab, emb_dim)).apply(&x);
    // `B, T | -> E` as `B | -> T·E`, PyTorch's `emb.view(B, -1)`.
    let flat = e.reshape(&Axes::new().batch(&[batch]).output(&[context * emb_dim]));
    let h = Linear::new(&g, "fc", LinearConfig::new(usize_of(c, "hidden"))).apply(&flat).tanh();
    let logits = Linear::new(&g, "out", LinearConfig::new(vocab)).apply(&h);
    let loss = loss::sparse_cross_entropy(&logits, &y, loss::Reduction::Mean);
    let inputs = vec![(x, ids(7, batch * context, vocab)), (y, ids(8, batch, vocab))];
    Problem {
        g,
        inputs,
        loss,
        opt: Optimizer::Sgd(Sgd::default()),
        lr: f64_of(c, "lr"),
        clip: None,
    }
}

/// The names of the suite's models, in the file's order.
fn names(cfg: &Value) -> Vec<String> {
    let mut out: Vec<String> = cfg["gpt"]
        .as_array()
        .map(|a| a.iter().filter_map(|c| c["name"].as_str().map(String::from)).collect())
        .unwrap_or_default();
    for k in ["mlp", "cnn", "mlp_lm"] {
        out.extend(cfg[k]["name"].as_str().map(String::from));
    }
    out
}

fn problem(cfg: &Value, name: &str) -> Option<Problem> {
    if let Some(c) = cfg["gpt"].as_array().and_then(|a| a.iter().find(|c| c["name"] == name)) {
        return Some(gpt(c, &cfg["gpt_training"]));
    }
    match ["mlp", "cnn", "mlp_lm"].into_iter().find(|k| cfg[*k]["name"] == name)? {
        "mlp" => Some(mlp(&cfg["mlp"])),
        "cnn" => Some(cnn(&cfg["cnn"])),
        k => Some(mlp_lm(&cfg[k])),
    }
}

struct Args {
    model: Option<String>,
    list: bool,
    steps: usize,
    warmup: usize,
    data_parallel: bool,
    debug_dir: Option<std::path::PathBuf>,
    backend: BackendKind,
}

fn args() -> Result<Args, String> {
    let mut a = Args {
        model: None,
        list: false,
        steps: 50,
        warmup: 5,
        data_parallel: false,
        debug_dir: None,
        backend: BackendKind::default(),
    };
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        let mut value = || it.next().ok_or(format!("{flag} needs a value"));
        match flag.as_str() {
            "--model" => a.model = Some(value()?),
            "--list" => a.list = true,
            "--steps" => a.steps = value()?.parse().map_err(|e| format!("--steps: {e}"))?,
            "--warmup" => a.warmup = value()?.parse().map_err(|e| format!("--warmup: {e}"))?,
            "--data-parallel" => a.data_parallel = true,
            "--debug-dir" => a.debug_dir = Some(value()?.into()),
            "--backend" => {
                a.backend = BackendKind::from_name(&value()?).map_err(|e| e.to_string())?
            }
            other => {
                return Err(format!(
                    "unknown flag {other} (--list, --model M, --steps N, --warmup W, \
                     --data-parallel, --debug-dir DIR, --backend B)"
                ));
            }
        }
    }
    Ok(a)
}

fn run() -> Result<(), Box<dyn std::error::Error>> {
    let started = Instant::now();
    let a = args()?;
    let cfg: Value = serde_json::from_str(MODELS)?;
    if a.list {
        println!("{}", names(&cfg).join("\n"));
        return Ok(());
    }
    let name = a.model.ok_or("--model M (or --list)")?;
    let group = if a.data_parallel { Some(workers()?) } else { None };
    let cfg = match &group {
        Some(g) => shard_batches(cfg, g),
        None => cfg,
    };
    let p = problem(&cfg, &name).ok_or(format!("no model named {name}; --list lists them"))?;
    let (root, ranks) = group.as_ref().map_or((true, 1), |g| (g.is_root(), g.size()));
    let mut opts =
        SessionOptions { backend: a.backend, data_parallel: group, ..SessionOptions::default() };
    // Each routine's assignments, loop IR and generated source, for reading a profile.
    opts.compile.debug_dir = a.debug_dir.clone();
    let mut s = Session::with_options(&p.g, opts)?;
    // After inference: the params' shapes come from their use.
    let params: usize = p.g.params().iter().map(|t| t.num_elements().unwrap_or(0)).sum();
    for (t, v) in &p.inputs {
        s.write(t, v)?;
    }
    let clip = StepOptions { clip_grad_norm: p.clip, ..StepOptions::default() };
    let mut step = s.train_step(&p.loss, &p.opt, &[], &clip)?;
    let compile_s = started.elapsed().as_secs_f64();
    let (mut first_step_s, mut optimized_s) = (None, None);
    let mut times = Vec::with_capacity(a.steps);
    for i in 0..a.warmup + a.steps {
        if i == a.warmup && a.warmup > 0 {
            // Steady state: the optimized code (with no warmup, the first build's code is
            // timed as it comes: a smoke run).
            s.finish_builds();
        }
        let t = Instant::now();
        let begun = started.elapsed().as_secs_f64();
        s.step(&mut step, p.lr)?;
        let _ = s.loss(&step)?;
        if i >= a.warmup {
            times.push(t.elapsed().as_secs_f64());
        }
        first_step_s = first_step_s.or(Some(started.elapsed().as_secs_f64()));
        if optimized_s.is_none() && !s.builds_pending() {
            optimized_s = Some(begun);
        }
    }
    times.sort_by(f64::total_cmp);
    let step_s = times.get(times.len() / 2).copied().unwrap_or(f64::NAN);
    let line = serde_json::json!({
        "framework": "rocannl", "model": name, "step_s": step_s, "steps_per_s": 1.0 / step_s,
        "compile_s": compile_s, "first_step_s": first_step_s, "optimized_s": optimized_s,
        "loss": s.loss(&step)?, "params": params, "backend": s.backend().name(),
        "ranks": ranks,
        "allreduce": step.reduce_stats().map(|r| serde_json::json!({
            "bytes_per_step": r.bytes_per_step,
            "ms_per_step": 1e3 * r.total.as_secs_f64() / r.steps.max(1) as f64,
        })),
    });
    if root {
        println!("{line}");
    }
    Ok(())
}

/// Every model's batch replaced by this rank's shard of it.
fn shard_batches(mut cfg: Value, g: &Group) -> Value {
    let shard = |c: &mut Value| {
        if let Some(b) = c["batch"].as_u64() {
            c["batch"] = Value::from(g.shard(b as usize).len());
        }
    };
    if let Some(gpts) = cfg["gpt"].as_array_mut() {
        gpts.iter_mut().for_each(shard);
    }
    for k in ["mlp", "cnn", "mlp_lm"] {
        shard(&mut cfg[k]);
    }
    cfg
}

/// The group of processes started by `mpirun` (one rank without it).
#[cfg(feature = "mpi")]
fn workers() -> Result<Group, Box<dyn std::error::Error>> {
    Ok(Group::mpi()?)
}

/// Data parallelism needs the `mpi` feature.
#[cfg(not(feature = "mpi"))]
fn workers() -> Result<Group, Box<dyn std::error::Error>> {
    Err("--data-parallel needs a build with --features mpi".into())
}

fn main() {
    if let Err(e) = run() {
        eprintln!("error: {e}");
        std::process::exit(1);
    }
}

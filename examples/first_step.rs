//! How long a fresh process takes to its first training step: the anchors' W2 workload (an MLP
//! 784→256→256→10 with ReLU, batch 128, MSE against one-hot targets, SGD with learning rate
//! 0.01), as `../shared/anchors/perf/bench.py --workload first-step` measures it for JAX and
//! PyTorch. Prints one JSON line:
//!
//! - `build_s`: the graph, its shape inference and the session;
//! - `compile_s`: `Session::train_step` (lowering, optimization, the native build);
//! - `first_step_s`: the first `Session::step` (parameter initialization, data, one step);
//! - `to_first_step_s`: the three together, the figure compared with JAX's `t_first_step_s`;
//! - `step_s`: the median of later steps, first while the optimized build is still being
//!   made in the background (`early_step_s`) and then after it was swapped in.
//!
//! `cargo run --release --example first_step [-- --no-tier] [--epilogues] [--no-groups] [--opt-level N] [--moons]`
//! (`--moons`: the anchors' W3, an MLP 2→16→16→1 with ReLU, batch 32, hinge loss, SGD). Point
//! `ROCANNL_CACHE_DIR` at an empty folder for a cold start, run again for a warm one.

use std::time::Instant;

use rocannl::tensor::nn::{Mlp, MlpConfig, loss};
use rocannl::tensor::{Axes, Graph, Optimizer, Session, SessionOptions, Sgd};

fn main() {
    if let Err(e) = run() {
        eprintln!("error: {e}");
        std::process::exit(1);
    }
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

fn run() -> Result<(), rocannl::tensor::Error> {
    let args: Vec<String> = std::env::args().collect();
    let mut opts = SessionOptions::default();
    if args.iter().any(|a| a == "--no-tier") {
        opts.compile.tiered = false;
    }
    if args.iter().any(|a| a == "--epilogues") {
        opts.compile.epilogues = true;
    }
    if args.iter().any(|a| a == "--no-groups") {
        opts.compile.parallel_groups = false;
    }
    if let Some(i) = args.iter().position(|a| a == "--opt-level") {
        opts.compile.opt_level = args.get(i + 1).and_then(|v| v.parse().ok()).unwrap_or(3);
    }
    // `--moons`: the anchors' W3 instead, an MLP 2→16→16→1 with ReLU, batch 32, hinge loss
    // against ±1 labels, SGD with learning rate 0.01 (a step of a few microseconds: it
    // measures per-step overhead).
    let moons = args.iter().any(|a| a == "--moons");
    let (batch, classes, features, hidden) =
        if moons { (32, 1, 2, 16) } else { (128, 10, 784, 256) };
    let inputs: Vec<f64> = (0..batch * features)
        .map(|i| rocannl::datasets::uniform(1, i as u64) * 2.0 - 1.0)
        .collect();
    let targets: Vec<f64> = if moons {
        (0..batch).map(|i| if i < batch / 2 { 1.0 } else { -1.0 }).collect()
    } else {
        (0..batch * classes)
            .map(|i| if i % classes == (i / classes * 7) % classes { 1.0 } else { 0.0 })
            .collect()
    };

    let t0 = Instant::now();
    let g = Graph::with_seed(0);
    let x = g.data("x", Axes::new().batch(&[batch]).output(&[features]));
    let y = g.data("y", Axes::new().batch(&[batch]).output(&[classes]));
    let out = Mlp::new(&g, "mlp", MlpConfig::new(&[hidden, hidden, classes])).apply(&x);
    let l = if moons {
        loss::hinge(&out, &y, loss::Reduction::Mean)
    } else {
        loss::mse(&out, &y, loss::Reduction::Mean)
    };
    let mut s = Session::with_options(&g, opts)?;
    let built = t0.elapsed().as_secs_f64();

    let t1 = Instant::now();
    let mut step = s.train_step(&l, &Optimizer::Sgd(Sgd::default()), &[], &Default::default())?;
    let compiled = t1.elapsed().as_secs_f64();
    if std::env::var_os("FIRST_STEP_PHASES").is_some() {
        eprintln!("{:?}", step.routine().compile_phases());
    }

    let t2 = Instant::now();
    s.write(&x, &inputs)?;
    s.write(&y, &targets)?;
    s.step(&mut step, 0.01)?;
    let first = t2.elapsed().as_secs_f64();
    let loss1 = s.loss(&step)?;

    // Steps while the optimized build may still be running, then after it is in place.
    let mut early = Vec::new();
    for _ in 0..20 {
        let t = Instant::now();
        s.step(&mut step, 0.01)?;
        early.push(t.elapsed().as_secs_f64());
    }
    let t3 = Instant::now();
    s.finish_builds();
    let waited = t3.elapsed().as_secs_f64();
    let mut late = Vec::new();
    for _ in 0..200 {
        let t = Instant::now();
        s.step(&mut step, 0.01)?;
        late.push(t.elapsed().as_secs_f64());
    }
    println!(
        "{{\"build_s\": {built:.5}, \"compile_s\": {compiled:.5}, \"first_step_s\": {first:.5}, \
         \"to_first_step_s\": {:.5}, \"loss_after_step1\": {loss1:.6}, \"early_step_s\": {:.9}, \
         \"wait_for_optimized_s\": {waited:.5}, \"step_s\": {:.9}}}",
        built + compiled + first,
        median(early),
        median(late),
    );
    Ok(())
}

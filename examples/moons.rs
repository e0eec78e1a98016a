//! Two half moons, an MLP 2→16→16→1, hinge loss and SGD.
//!
//! Every parameter's shape is inferred: the layers are given their output widths only, and the
//! first layer's input width comes from the data. The whole training step — forward, backward
//! and the SGD update — is one compiled routine, run once per batch with the batch number bound
//! to the batch slice's runtime symbol.
//!
//! `cargo run --release --example moons` (add `--quick` for a short run, `--backend interp` to
//! use the interpreter).

use std::error::Error;

use rocannl::datasets::half_moons;
use rocannl::tensor::nn::{Mlp, MlpConfig, loss};
use rocannl::tensor::train::{Column, Loader, LrSchedule, TrainConfig, train};
use rocannl::tensor::{Axes, BackendKind, Graph, Optimizer, Session, SessionOptions, Sgd};

fn main() -> Result<(), Box<dyn Error>> {
    let args: Vec<String> = std::env::args().collect();
    let quick = args.iter().any(|a| a == "--quick");
    let backend = match args.iter().position(|a| a == "--backend") {
        Some(i) => BackendKind::from_name(args.get(i + 1).map_or("", String::as_str))?,
        None => BackendKind::default(),
    };
    let epochs = if quick { 15 } else { 60 };

    let train_set = half_moons(1024, 0.1, 1);
    let test_set = half_moons(512, 0.1, 2);

    let g = Graph::with_seed(42);
    let columns = [
        Column::new("points", &[2], train_set.xy.clone()),
        Column::new("labels", &[1], train_set.labels.clone()),
    ];
    let loader = Loader::new(&g, &columns, 32)?;
    let model = Mlp::new(&g, "mlp", MlpConfig::new(&[16, 16, 1]));
    let scores = model.apply(loader.batch(0));
    let loss = loss::hinge(&scores, loader.batch(1), loss::Reduction::Mean).named("loss");

    // Held-out evaluation reuses the same parameters on the whole test set.
    let test_points = g.data("test_points", Axes::new().batch(&[512]).output(&[2]));
    let test_scores = model.apply(&test_points).named("test_scores");

    let opts = SessionOptions { backend, ..SessionOptions::default() };
    let mut s = Session::with_options(&g, opts)?;
    println!("backend: {}", s.backend().name());
    for p in g.params() {
        println!("{:10} {}", p.label(), p.shape_string());
    }
    let mut step = s.train_step(
        &loss,
        &Optimizer::Sgd(Sgd { momentum: 0.9, ..Default::default() }),
        &[],
        &Default::default(),
    )?;
    let eval = s.forward(&[&test_scores])?;
    s.write(&test_points, &test_set.xy)?;
    let accuracy = |s: &mut Session| -> Result<f64, rocannl::tensor::Error> {
        s.run(&eval)?;
        let scores = s.read(&test_scores)?;
        let correct = scores.iter().zip(&test_set.labels).filter(|(p, l)| **p * **l > 0.0).count();
        Ok(correct as f64 / test_set.labels.len() as f64)
    };
    let cfg = TrainConfig {
        epochs,
        lr: LrSchedule::Linear { start: 0.1, end: 0.01 },
        shuffle_seed: Some(7),
        progress: !quick,
    };
    let history = train(&mut s, &mut step, &loader, &columns, &cfg, accuracy)?;

    let svg = std::env::temp_dir().join("rocannl_moons_loss.svg");
    history.write_loss_svg(&svg)?;
    let first = history.epoch_losses.first().copied().unwrap_or(f64::NAN);
    let last = history.epoch_losses.last().copied().unwrap_or(f64::NAN);
    let acc = history.metrics.last().copied().unwrap_or(0.0);
    println!(
        "epochs: {epochs}, steps: {}, {:.0} steps/s",
        history.losses.len(),
        history.steps_per_second
    );
    println!("loss: first epoch {first:.4}, last epoch {last:.4}");
    println!("test accuracy: {:.1}%", 100.0 * acc);
    println!("loss curve: {}", svg.display());
    println!(
        "metrics: {{\"first_loss\": {first}, \"last_loss\": {last}, \"test_accuracy\": {acc}}}"
    );
    Ok(())
}

//! The anchor workloads of `shared/anchors/perf` (numpy, JAX, torch and tinygrad measured on
//! this machine), run by rocannl for a side-by-side comparison:
//!
//! - W2: a training step of an MLP 784→256→256→10 (ReLU), batch 128, MSE against one-hot
//!   targets, SGD lr 0.01 — forward, backward and update in one compiled routine;
//! - W3: the moons step, MLP 2→16→16→1, batch 32, hinge loss, SGD;
//! - W4: the einsums `bhqd,bhkd->bhqk` (8,8,128,128,64) and `bij,bjk->bik` (64,128,128,128).
//!
//! `w2_dynamic_*` is W2 with the batch declared dynamic ([`Graph::dynamic`], at most 128), run
//! at 128 rows and at 37: the cost of one routine serving every batch size.
//!
//! `cargo bench --bench anchors`. Each iteration is one call of the compiled routine; the time to
//! compile the first step is printed before the measurements.

use std::time::Instant;

use criterion::{Criterion, Throughput, criterion_group, criterion_main};
use rocannl_arrayjit::ops::uniform;
use rocannl_tensor::nn::{Mlp, MlpConfig, loss};
use rocannl_tensor::{Axes, Graph, Optimizer, Session, SessionOptions, Sgd};

fn data(n: usize, seed: u64) -> Vec<f64> {
    (0..n).map(|i| uniform(seed, i as u64) * 2.0 - 1.0).collect()
}

/// How the batch of an MLP step is declared: fixed, or dynamic with a maximum (and run at
/// `batch` rows).
#[derive(Clone, Copy)]
enum Batch {
    Fixed,
    Dynamic(usize),
}

fn mlp_step(
    c: &mut Criterion,
    name: &str,
    widths: &[usize],
    input: usize,
    (batch, kind): (usize, Batch),
    hinge: bool,
) {
    let g = Graph::with_seed(0);
    let classes = *widths.last().unwrap_or(&1);
    let (x, y, dim) = match kind {
        Batch::Fixed => (
            g.data("x", Axes::new().batch(&[batch]).output(&[input])),
            g.data("y", Axes::new().batch(&[batch]).output(&[classes])),
            None,
        ),
        Batch::Dynamic(max) => {
            let d = g.dynamic("batch", max);
            let x = g.data("x", Axes::new().dynamic_batch(&d).output(&[input]));
            (x, g.data("y", Axes::new().dynamic_batch(&d).output(&[classes])), Some(d))
        }
    };
    let out = Mlp::new(&g, "mlp", MlpConfig::new(widths)).apply(&x);
    let l = if hinge {
        loss::hinge(&out, &y, loss::Reduction::Mean)
    } else {
        loss::mse(&out, &y, loss::Reduction::Mean)
    };
    let mut s = Session::with_options(&g, SessionOptions::default()).expect("session");
    let t0 = Instant::now();
    let mut step = s
        .train_step(&l, &Optimizer::Sgd(Sgd::default()), &[], &Default::default())
        .expect("train step");
    if let Some(d) = &dim {
        s.set_size(d, batch).expect("size");
    }
    s.write(&x, &data(batch * input, 1)).expect("x");
    let targets: Vec<f64> = if hinge {
        (0..batch).map(|i| if i % 2 == 0 { 1.0 } else { -1.0 }).collect()
    } else {
        (0..batch * classes)
            .map(|i| if i % classes == (i / classes) % classes { 1.0 } else { 0.0 })
            .collect()
    };
    s.write(&y, &targets).expect("y");
    s.step(&mut step, 0.01).expect("first step");
    println!("{name}: first step (compile + run) {:.0} ms", t0.elapsed().as_secs_f64() * 1e3);
    // Steady state: the optimized build, not the quick first tier.
    s.finish_builds();
    c.bench_function(name, |b| b.iter(|| s.step(&mut step, 0.01).expect("step")));
}

fn einsum(c: &mut Criterion, name: &str, spec: &str, a: &[usize], b: &[usize], flop: u64) {
    let g = Graph::new();
    let ta = g.data("a", Axes::new().output(a));
    let tb = g.data("b", Axes::new().output(b));
    let out = ta.einsum(spec, &tb);
    let mut s = Session::new(&g).expect("session");
    let r = s.forward(&[&out]).expect("compile");
    s.write(&ta, &data(a.iter().product(), 2)).expect("a");
    s.write(&tb, &data(b.iter().product(), 3)).expect("b");
    s.finish_builds();
    let mut group = c.benchmark_group("w4_einsum");
    group.throughput(Throughput::Elements(flop));
    group.bench_function(name, |bch| bch.iter(|| s.run(&r).expect("run")));
    group.finish();
}

fn bench(c: &mut Criterion) {
    let w2 = [256, 256, 10];
    mlp_step(c, "w2_mlp_784_256_256_10_b128", &w2, 784, (128, Batch::Fixed), false);
    mlp_step(c, "w2_dynamic_b128_of_128", &w2, 784, (128, Batch::Dynamic(128)), false);
    mlp_step(c, "w2_dynamic_b37_of_128", &w2, 784, (37, Batch::Dynamic(128)), false);
    mlp_step(c, "w2_fixed_b37", &w2, 784, (37, Batch::Fixed), false);
    mlp_step(c, "w3_moons_2_16_16_1_b32", &[16, 16, 1], 2, (32, Batch::Fixed), true);
    einsum(
        c,
        "attention_scores",
        "bhqd; bhkd => bhqk",
        &[8, 8, 128, 64],
        &[8, 8, 128, 64],
        2 * 8 * 8 * 128 * 128 * 64,
    );
    einsum(c, "bmm", "bij; bjk => bik", &[64, 128, 128], &[64, 128, 128], 2 * 64 * 128 * 128 * 128);
}

criterion_group! {
    name = benches;
    config = Criterion::default().sample_size(10);
    targets = bench
}
criterion_main!(benches);

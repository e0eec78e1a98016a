//! char_gpt's training step in two precisions, in one process, steps interleaved: how fast a
//! bf16 (or f16) step runs against an f32 one.
//!
//! Timing two separate runs one after the other is unreliable on a shared machine whose speed
//! changes between minutes (a 2-vCPU KVM guest swings by up to 1.7×). Here both sessions train
//! the same model (char_gpt's default configuration, `examples/char_gpt.rs`) on the same
//! batches, alternating blocks of steps, the order swapped every block; the ratio of each
//! block pair is taken in the same minute, and the median of the ratios is the figure.
//!
//! `cargo bench --bench precisions -- [--vs bf16|f16] [--blocks N] [--steps S]` (default: bf16,
//! 20 blocks of 50 steps, after 100 warm-up steps per session with every optimized build
//! swapped in). Prints each precision's steps/s and the median, quartiles and total of
//! `f32 time / other time` (above 1: the other precision is faster).

use std::time::Instant;

use rocannl::tensor::nn::gpt::{Gpt, GptConfig};
use rocannl::tensor::nn::loss;
use rocannl::tensor::optim::{AdamW, LossScale, Optimizer, StepOptions, TrainStep};
use rocannl::tensor::train::{LrSchedule, SequenceLoader};
use rocannl::tensor::{Axes, Graph, Prec, Session, SessionOptions, Tensor};

const CONTEXT: usize = 16;
const BATCH: usize = 32;

/// One session training char_gpt's model in one precision (f32 master weights below f32).
struct Run {
    s: Session,
    step: TrainStep,
    x: Tensor,
    y: Tensor,
    vocab: usize,
}

fn build(prec: Prec, vocab: usize) -> Result<Run, Box<dyn std::error::Error>> {
    let g = Graph::with_seed(0);
    let batch = g.dynamic("batch", BATCH);
    let x = g.ids("inputs", Axes::new().dynamic_batch(&batch).batch(&[CONTEXT]));
    let y = g.ids("targets", Axes::new().dynamic_batch(&batch).batch(&[CONTEXT]));
    let cfg = GptConfig::new(vocab, CONTEXT, 64, 4, 2);
    let logits = Gpt::new(&g, "gpt", cfg).apply(&x);
    let mean = loss::sparse_cross_entropy(&logits, &y, loss::Reduction::None).mean_all();
    let master = (prec != Prec::F32).then_some(Prec::F32);
    let mut s = Session::with_options(&g, SessionOptions { prec, master, ..Default::default() })?;
    let adamw = Optimizer::AdamW(AdamW { beta1: 0.9, beta2: 0.99, eps: 1e-8, weight_decay: 0.01 });
    let loss_scale = (prec == Prec::F16).then(LossScale::default);
    let opts = StepOptions { clip_grad_norm: Some(1.0), loss_scale };
    let step = s.train_step(&mean, &adamw, &[], &opts)?;
    Ok(Run { s, step, x, y, vocab })
}

impl Run {
    /// Steps `from..from + n` of the schedule, on the loader's batches; the seconds they took.
    fn steps(
        &mut self,
        train: &SequenceLoader,
        from: usize,
        n: usize,
    ) -> Result<f64, Box<dyn std::error::Error>> {
        let schedule = LrSchedule::WarmupCosine { warmup: 100, max: 3e-3, min: 3e-4 };
        let started = Instant::now();
        for t in from..from + n {
            let (xs, ys) = train.batch(t);
            self.s.write_ids(&self.x, &xs, self.vocab)?;
            self.s.write_ids(&self.y, &ys, self.vocab)?;
            self.s.step(&mut self.step, schedule.at(t, 100_000))?;
            self.s.loss(&self.step)?;
        }
        Ok(started.elapsed().as_secs_f64())
    }
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let (mut other, mut blocks, mut per) = (Prec::Bf16, 20usize, 50usize);
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        let mut value = || args.next().ok_or(format!("{a} needs a value"));
        match a.as_str() {
            "--vs" => other = Prec::from_name(&value()?).ok_or("--vs: bf16 or f16")?,
            "--blocks" => blocks = value()?.parse()?,
            "--steps" => per = value()?.parse()?,
            // What `cargo bench` passes to every bench binary.
            "--bench" => {}
            other => return Err(format!("unknown argument {other}").into()),
        }
    }
    if blocks == 0 || per == 0 {
        return Err("--blocks and --steps must be at least 1".into());
    }
    // The names in file order: the speed does not depend on the order.
    let names = rocannl::datasets::names();
    let letters: std::collections::BTreeSet<char> = names.iter().flat_map(|n| n.chars()).collect();
    let vocab: Vec<char> = std::iter::once('.').chain(letters).collect();
    let mut stream = vec![];
    for name in &names {
        stream.push(0);
        stream.extend(name.chars().map(|c| vocab.iter().position(|v| *v == c).unwrap_or(0) as u32));
    }
    let train = SequenceLoader::new(stream, CONTEXT, BATCH, 1)?;
    let mut runs = [build(Prec::F32, vocab.len())?, build(other, vocab.len())?];
    for r in runs.iter_mut() {
        r.steps(&train, 0, 100)?;
        r.s.finish_builds();
    }
    let (mut total, mut ratios) = ([0.0f64; 2], vec![]);
    for b in 0..blocks {
        let mut t = [0.0; 2];
        for i in [b % 2, 1 - b % 2] {
            t[i] = runs[i].steps(&train, 100 + b * per, per)?;
            total[i] += t[i];
        }
        ratios.push(t[0] / t[1]);
    }
    ratios.sort_by(f64::total_cmp);
    let q = |f: f64| ratios[((ratios.len() - 1) as f64 * f).round() as usize];
    let n = (blocks * per) as f64;
    println!(
        "f32 {:.1} steps/s, {} {:.1} steps/s; f32 time / {} time: median {:.3} (quartiles \
         {:.3}–{:.3}), total {:.3}",
        n / total[0],
        other.name(),
        n / total[1],
        other.name(),
        q(0.5),
        q(0.25),
        q(0.75),
        total[0] / total[1]
    );
    Ok(())
}

//! Training: batching a dataset with the batch slice, the training loop, and its record.
//!
//! A [`Loader`] lays a dataset out as data tensors with two batch axes,
//! `[batches, batch_size | features]`, and selects the current batch with a batch slice at a
//! runtime symbol — so the compiled training step reads batch `i` when run with the symbol bound
//! to `i`, and one routine serves every batch. Each epoch can reshuffle the examples on the host
//! and rewrite the dataset tensors.
//!
//! [`train`] runs epochs of steps with a learning-rate schedule, shows a progress bar (loss,
//! accuracy, steps per second) and returns a [`History`] whose loss curve can be written as SVG.

use std::fmt::Write as _;
use std::time::Instant;

use indicatif::{ProgressBar, ProgressStyle};
use rocannl_arrayjit::indexing::Symbol;

use crate::Axes;
use crate::error::{Error, Result};
use crate::graph::{Graph, Tensor};
use crate::optim::TrainStep;
use crate::session::Session;

/// One column of a dataset: `n` examples of `example_dims` (memory order) each.
#[derive(Clone, Debug)]
pub struct Column {
    /// The name of the data tensor.
    pub name: String,
    /// The dims of one example (output axes).
    pub example_dims: Vec<usize>,
    /// All examples, one after the other.
    pub values: Vec<f64>,
}

impl Column {
    /// A column of examples of the given dims.
    pub fn new(name: &str, example_dims: &[usize], values: Vec<f64>) -> Column {
        Column { name: name.to_string(), example_dims: example_dims.to_vec(), values }
    }

    /// The number of values per example.
    pub fn example_len(&self) -> usize {
        self.example_dims.iter().product()
    }

    /// The number of examples.
    pub fn len(&self) -> usize {
        self.values.len() / self.example_len().max(1)
    }

    /// Whether the column has no examples.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The examples at `indices`, concatenated.
    pub fn gather(&self, indices: &[usize]) -> Vec<f64> {
        let l = self.example_len();
        indices.iter().flat_map(|&i| self.values[i * l..(i + 1) * l].iter().copied()).collect()
    }
}

/// Batches of a dataset as batch slices of data tensors.
#[derive(Debug)]
pub struct Loader {
    symbol: Symbol,
    batch_size: usize,
    batches: usize,
    /// The number of examples.
    examples: usize,
    /// This rank and the number of ranks (0 of 1 but under data parallelism).
    rank: (usize, usize),
    /// The rows a batch tensor holds: this rank's largest shard of a batch.
    rows: usize,
    /// The dynamic size of the batch tensors' rows, when some batch has fewer (a partial last
    /// batch, or shards of unequal size).
    dynamic: Option<crate::DynDim>,
    full: Vec<Tensor>,
    current: Vec<Tensor>,
}

impl Loader {
    /// Data tensors for `columns` (all with the same number of examples), in batches of
    /// `batch_size`. When the examples do not fill the last batch, it runs with the rows it
    /// has: the batches' rows have a dynamic size ([`Graph::dynamic`]), which
    /// [`Loader::set_batch`] sets for each batch, so one compiled step serves them all and a
    /// mean over the last batch divides by its own size.
    ///
    /// ```
    /// use rocannl_tensor::{Graph, Session, train::{Column, Loader}};
    /// let g = Graph::new();
    /// let x = Column::new("x", &[2], (0..20).map(f64::from).collect()); // 10 examples
    /// let loader = Loader::new(&g, &[x.clone()], 4).unwrap();
    /// assert_eq!(loader.batches(), 3); // 4, 4 and 2 examples
    /// let m = loader.batch(0).mean("b|o => 0|o");
    /// let mut s = Session::new(&g).unwrap();
    /// let r = s.forward(&[&m]).unwrap();
    /// loader.load(&mut s, &[x], &(0..10).collect::<Vec<_>>()).unwrap();
    /// loader.set_batch(&mut s, 2).unwrap();
    /// s.run(&r).unwrap();
    /// assert_eq!(s.read(&m).unwrap(), vec![17.0, 18.0]); // examples 8 and 9 only
    /// ```
    pub fn new(g: &Graph, columns: &[Column], batch_size: usize) -> Result<Loader> {
        Loader::with_shard(g, columns, batch_size, (0, 1))
    }

    /// [`Loader::new`] for one rank of a data-parallel group: `batch_size` is the global
    /// batch, and this rank's batch tensors hold its shard of each batch
    /// ([`crate::parallel::Group::shard`]), so the ranks' shards together are the batches one
    /// process would train on, in the same order. [`Loader::set_batch`] also sets the rank's
    /// weight in the mean over ranks ([`Session::set_local_examples`]), so a smaller last
    /// shard counts for what it holds.
    ///
    /// ```
    /// use rocannl_tensor::parallel::Group;
    /// use rocannl_tensor::{Graph, train::{Column, Loader}};
    /// let ranks = Group::in_process(2);
    /// let g = Graph::new();
    /// let x = Column::new("x", &[1], (0..10).map(f64::from).collect());
    /// let loader = Loader::sharded(&g, &[x], 4, &Group::from(ranks.into_iter().next().unwrap())).unwrap();
    /// assert_eq!(loader.batches(), 3); // global batches of 4, 4 and 2: rank 0 has 2, 2 and 1
    /// assert_eq!(loader.shard_rows(2), 1);
    /// ```
    pub fn sharded(
        g: &Graph,
        columns: &[Column],
        batch_size: usize,
        group: &crate::parallel::Group,
    ) -> Result<Loader> {
        Loader::with_shard(g, columns, batch_size, (group.rank(), group.size()))
    }

    fn with_shard(
        g: &Graph,
        columns: &[Column],
        batch_size: usize,
        (rank, size): (usize, usize),
    ) -> Result<Loader> {
        let n = columns.first().map_or(0, Column::len);
        if columns.iter().any(|c| c.len() != n || c.values.len() % c.example_len().max(1) != 0) {
            return Err(Error::usage("every column must hold the same number of whole examples"));
        }
        if batch_size == 0 || n == 0 {
            return Err(Error::usage(format!(
                "{n} examples in batches of {batch_size}: no batch to make"
            )));
        }
        let batches = n.div_ceil(batch_size);
        // The same on every rank, so that every rank compiles the same step.
        let rows = batch_size.div_ceil(size);
        let uneven = !n.is_multiple_of(batch_size) || !batch_size.is_multiple_of(size);
        let dynamic = uneven.then(|| g.dynamic("batch", rows.max(2)));
        let symbol = g.runtime_symbol();
        let mut full = Vec::new();
        let mut current = Vec::new();
        for c in columns {
            let t = g.data(&c.name, Axes::new().batch(&[batches, rows]).output(&c.example_dims));
            let mut batch = t.batch_slice_at(symbol);
            if let Some(d) = &dynamic {
                batch = batch.dynamic_rows(d);
            }
            current.push(batch.named(&format!("{}_batch", c.name)));
            full.push(t);
        }
        let rank = (rank, size);
        Ok(Loader { symbol, batch_size, batches, examples: n, rank, rows, dynamic, full, current })
    }

    /// This rank's examples of batch `b`, as positions in the loaded order.
    fn shard_range(&self, b: usize) -> std::ops::Range<usize> {
        let start = b * self.batch_size;
        let len = self.batch_size.min(self.examples.saturating_sub(start));
        let part = crate::parallel::shard_of(len, self.rank.0, self.rank.1);
        start + part.start..start + part.end
    }

    /// How many examples of batch `b` this rank's batch tensors hold (all of them but under
    /// data parallelism).
    pub fn shard_rows(&self, b: usize) -> usize {
        self.shard_range(b).len()
    }

    /// The current batch of column `i` (`batch_size | example dims`).
    pub fn batch(&self, i: usize) -> &Tensor {
        &self.current[i]
    }

    /// The number of batches per epoch.
    pub fn batches(&self) -> usize {
        self.batches
    }

    /// The batch size.
    pub fn batch_size(&self) -> usize {
        self.batch_size
    }

    /// Chooses batch `b` for the routines `s` runs next: which batch their batch tensors
    /// ([`Loader::batch`]) take, and, when the last batch is partial, its number of rows.
    pub fn set_batch(&self, s: &mut Session, b: usize) -> Result<()> {
        if b >= self.batches {
            return Err(Error::usage(format!(
                "batch {b} of a loader of {} batches (0..{})",
                self.batches, self.batches
            )));
        }
        s.bound.insert(self.symbol, b as i64);
        let rows = self.shard_rows(b);
        if let Some(d) = &self.dynamic {
            // A rank with no example of a small last batch runs one row of zeros, weighted 0.
            s.set_size(d, rows.max(1))?;
        }
        s.local_weight = rows as f64;
        Ok(())
    }

    /// Writes the dataset in the order `order` (a permutation of example indices): each
    /// batch's examples (this rank's shard of them, under data parallelism); the rows past a
    /// batch's examples are zeros.
    pub fn load(&self, s: &mut Session, columns: &[Column], order: &[usize]) -> Result<()> {
        if order.len() != self.examples {
            return Err(Error::usage(format!(
                "an order of {} examples for a loader of {}",
                order.len(),
                self.examples
            )));
        }
        for (t, c) in self.full.iter().zip(columns) {
            let width = c.example_len();
            let mut values = vec![0.0; self.batches * self.rows * width];
            for b in 0..self.batches {
                let shard = &order[self.shard_range(b)];
                let rows = c.gather(shard);
                let at = b * self.rows * width;
                values[at..at + rows.len()].copy_from_slice(&rows);
            }
            s.write(t, &values)?;
        }
        Ok(())
    }
}

/// A permutation of `0..n` from a seed (Fisher–Yates with SplitMix64).
pub fn shuffled(n: usize, seed: u64) -> Vec<usize> {
    let mut order: Vec<usize> = (0..n).collect();
    for i in (1..n).rev() {
        let r = rocannl_arrayjit::ops::uniform(seed, i as u64);
        let j = ((r * (i + 1) as f64) as usize).min(i);
        order.swap(i, j);
    }
    order
}

/// Batches of a token stream for a sequence model: windows of `context + 1` consecutive tokens,
/// the first `context` the inputs and the last `context` the targets (every position
/// predicted). Training batches are windows at random starts — drawn by the counter-based
/// generator, so a seed and a step always give the same batch; evaluation covers the stream
/// with non-overlapping windows.
///
/// ```
/// use rocannl_tensor::train::SequenceLoader;
/// let stream: Vec<u32> = (0..100).collect();
/// let loader = SequenceLoader::new(stream, 4, 2, 7).unwrap();
/// let (x, y) = loader.batch(0);
/// assert_eq!(x.len(), 8);
/// assert!(x.iter().zip(&y).all(|(a, b)| b == &(a + 1))); // targets are the next tokens
/// assert_eq!(loader.batch(0), loader.batch(0));
/// assert_eq!(loader.eval_starts().len(), 24); // starts 0, 4, ..., 92: windows end by 96
/// ```
#[derive(Clone, Debug)]
pub struct SequenceLoader {
    stream: Vec<u32>,
    context: usize,
    batch: usize,
    seed: u64,
}

impl SequenceLoader {
    /// A loader of `batch` windows of `context` positions over `stream`; an error when the
    /// stream is shorter than one window.
    pub fn new(
        stream: Vec<u32>,
        context: usize,
        batch: usize,
        seed: u64,
    ) -> crate::error::Result<SequenceLoader> {
        if context == 0 || batch == 0 || stream.len() < context + 1 {
            return Err(crate::error::Error::usage(format!(
                "a stream of {} tokens has no window of {} (and batches of {batch})",
                stream.len(),
                context + 1
            )));
        }
        Ok(SequenceLoader { stream, context, batch, seed })
    }

    /// The inputs and targets of training step `step` (`batch × context` ids each, window by
    /// window): window `b` starts at `⌊u · (len − context)⌋`, `u` the generator's draw
    /// `(seed, step · batch + b)`.
    pub fn batch(&self, step: usize) -> (Vec<u32>, Vec<u32>) {
        self.shard(step, 0..self.batch)
    }

    /// Windows `range` of training step `step`'s batch: a rank's shard under data parallelism
    /// ([`crate::parallel::Group::shard`]), so that the ranks' shards together are the batch
    /// one process trains on.
    ///
    /// ```
    /// use rocannl_tensor::train::SequenceLoader;
    /// let loader = SequenceLoader::new((0..100).collect(), 4, 6, 7).unwrap();
    /// let (x, _) = loader.batch(3);
    /// let (a, _) = loader.shard(3, 0..4);
    /// let (b, _) = loader.shard(3, 4..6);
    /// assert_eq!([a, b].concat(), x);
    /// ```
    pub fn shard(&self, step: usize, range: std::ops::Range<usize>) -> (Vec<u32>, Vec<u32>) {
        let windows = self.stream.len() - self.context;
        let starts: Vec<usize> = range
            .filter(|b| *b < self.batch)
            .map(|b| {
                let u = rocannl_arrayjit::ops::uniform(self.seed, (step * self.batch + b) as u64);
                ((u * windows as f64) as usize).min(windows - 1)
            })
            .collect();
        self.windows(&starts)
    }

    /// The starts of the non-overlapping windows covering the stream (stride `context`).
    pub fn eval_starts(&self) -> Vec<usize> {
        (0..)
            .map(|w| w * self.context)
            .take_while(|s| s + self.context < self.stream.len())
            .collect()
    }

    /// The inputs and targets of the windows starting at `starts`.
    pub fn windows(&self, starts: &[usize]) -> (Vec<u32>, Vec<u32>) {
        let c = self.context;
        let mut x = Vec::with_capacity(starts.len() * c);
        let mut y = Vec::with_capacity(starts.len() * c);
        for &s in starts {
            x.extend_from_slice(&self.stream[s..s + c]);
            y.extend_from_slice(&self.stream[s + 1..s + c + 1]);
        }
        (x, y)
    }
}

/// A learning-rate schedule over the steps of a run.
#[derive(Clone, Debug, PartialEq)]
pub enum LrSchedule {
    /// The same rate throughout.
    Constant(f64),
    /// Linear from `start` to `end`.
    Linear {
        /// At the first step.
        start: f64,
        /// At the last step.
        end: f64,
    },
    /// Cosine decay from `max` to `min`.
    Cosine {
        /// At the first step.
        max: f64,
        /// At the last step.
        min: f64,
    },
    /// Linear warmup over the first `warmup` steps (step `s` < `warmup`, 0-based, gets
    /// `max·(s+1)/warmup`), then cosine decay from `max` at step `warmup` to `min` at the last
    /// step.
    ///
    /// ```
    /// use rocannl_tensor::train::LrSchedule;
    /// let s = LrSchedule::WarmupCosine { warmup: 100, max: 3e-3, min: 3e-4 };
    /// assert!((s.at(0, 2000) - 3e-5).abs() < 1e-15);
    /// assert!((s.at(99, 2000) - 3e-3).abs() < 1e-15);
    /// assert!((s.at(100, 2000) - 3e-3).abs() < 1e-15);
    /// assert!((s.at(1999, 2000) - 3e-4).abs() < 1e-15);
    /// ```
    WarmupCosine {
        /// Steps of linear warmup.
        warmup: usize,
        /// The peak, at the end of the warmup.
        max: f64,
        /// At the last step.
        min: f64,
    },
}

impl LrSchedule {
    /// The rate at `step` of `total` (0-based).
    pub fn at(&self, step: usize, total: usize) -> f64 {
        let t = if total <= 1 { 0.0 } else { step as f64 / (total - 1) as f64 };
        match *self {
            LrSchedule::Constant(lr) => lr,
            LrSchedule::Linear { start, end } => start + (end - start) * t,
            LrSchedule::Cosine { max, min } => {
                min + 0.5 * (max - min) * (1.0 + (std::f64::consts::PI * t).cos())
            }
            LrSchedule::WarmupCosine { warmup, max, min } => {
                if step < warmup {
                    return max * (step + 1) as f64 / warmup as f64;
                }
                let span = total.saturating_sub(1).saturating_sub(warmup);
                let t =
                    if span == 0 { 0.0 } else { ((step - warmup) as f64 / span as f64).min(1.0) };
                min + 0.5 * (max - min) * (1.0 + (std::f64::consts::PI * t).cos())
            }
        }
    }
}

/// How to train.
#[derive(Clone, Debug)]
pub struct TrainConfig {
    /// Passes over the dataset.
    pub epochs: usize,
    /// The learning rate per step.
    pub lr: LrSchedule,
    /// Reshuffle the examples every epoch with this seed (none: keep the order).
    pub shuffle_seed: Option<u64>,
    /// Show a progress bar.
    pub progress: bool,
}

/// What a run recorded.
#[derive(Clone, Debug, Default)]
pub struct History {
    /// The loss after every step.
    pub losses: Vec<f64>,
    /// The mean loss of every epoch.
    pub epoch_losses: Vec<f64>,
    /// The metric `evaluate` returned after every epoch (e.g. test accuracy).
    pub metrics: Vec<f64>,
    /// Steps per second over the whole run.
    pub steps_per_second: f64,
}

/// Trains for `cfg.epochs` epochs: every epoch loads the (reshuffled) dataset, runs the
/// training step once per batch, then calls `evaluate` (whose result is recorded and shown).
pub fn train(
    s: &mut Session,
    step: &mut TrainStep,
    loader: &Loader,
    columns: &[Column],
    cfg: &TrainConfig,
    mut evaluate: impl FnMut(&mut Session) -> Result<f64>,
) -> Result<History> {
    let total = cfg.epochs * loader.batches();
    let bar = if cfg.progress { ProgressBar::new(total as u64) } else { ProgressBar::hidden() };
    bar.set_style(
        ProgressStyle::with_template("{bar:30} {pos}/{len} {msg}")
            .map_err(|e| Error::usage(e.to_string()))?,
    );
    let mut h = History::default();
    let n = columns.first().map_or(0, Column::len);
    let started = Instant::now();
    let mut k = 0;
    for epoch in 0..cfg.epochs {
        let order = match cfg.shuffle_seed {
            Some(seed) => shuffled(n, seed.wrapping_add(epoch as u64)),
            None => (0..n).collect(),
        };
        loader.load(s, columns, &order)?;
        let mut sum = 0.0;
        for b in 0..loader.batches() {
            loader.set_batch(s, b)?;
            s.step(step, cfg.lr.at(k, total))?;
            let loss = s.loss(step)?;
            h.losses.push(loss);
            sum += loss;
            k += 1;
            bar.inc(1);
        }
        // Evaluation sees the batches' rows at their full size, as before the epoch.
        loader.set_batch(s, 0)?;
        let epoch_loss = sum / loader.batches() as f64;
        h.epoch_losses.push(epoch_loss);
        let metric = evaluate(s)?;
        h.metrics.push(metric);
        let rate = k as f64 / started.elapsed().as_secs_f64().max(1e-9);
        bar.set_message(format!(
            "epoch {} loss {epoch_loss:.4} metric {metric:.4} {rate:.0} steps/s",
            epoch + 1
        ));
    }
    h.steps_per_second = k as f64 / started.elapsed().as_secs_f64().max(1e-9);
    bar.finish();
    Ok(h)
}

impl History {
    /// The loss curve as an SVG document (loss per step, with the epoch means).
    pub fn loss_svg(&self) -> String {
        let (w, hgt, pad) = (640.0, 360.0, 40.0);
        let max = self
            .losses
            .iter()
            .copied()
            .filter(|x| x.is_finite())
            .fold(f64::MIN, f64::max)
            .max(1e-12);
        let min =
            self.losses.iter().copied().filter(|x| x.is_finite()).fold(f64::MAX, f64::min).min(max);
        let n = self.losses.len().max(2) as f64;
        let x = |i: f64| pad + (w - 2.0 * pad) * i / (n - 1.0);
        let y = |v: f64| hgt - pad - (hgt - 2.0 * pad) * (v - min) / (max - min).max(1e-12);
        let mut points = String::new();
        for (i, v) in self.losses.iter().enumerate() {
            if v.is_finite() {
                let _ = write!(points, "{:.1},{:.1} ", x(i as f64), y(*v));
            }
        }
        format!(
            "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{w}\" height=\"{hgt}\">\n\
             <rect width=\"100%\" height=\"100%\" fill=\"white\"/>\n\
             <line x1=\"{pad}\" y1=\"{b}\" x2=\"{r}\" y2=\"{b}\" stroke=\"black\"/>\n\
             <line x1=\"{pad}\" y1=\"{pad}\" x2=\"{pad}\" y2=\"{b}\" stroke=\"black\"/>\n\
             <text x=\"{pad}\" y=\"{t}\" font-size=\"12\">loss {max:.4}</text>\n\
             <text x=\"{pad}\" y=\"{bt}\" font-size=\"12\">loss {min:.4} (step {n})</text>\n\
             <polyline fill=\"none\" stroke=\"steelblue\" stroke-width=\"1.5\" points=\"{points}\"/>\n</svg>\n",
            b = hgt - pad,
            r = w - pad,
            t = pad - 8.0,
            bt = hgt - 12.0,
            n = self.losses.len(),
        )
    }

    /// Writes [`History::loss_svg`] to a file.
    pub fn write_loss_svg(&self, path: &std::path::Path) -> Result<()> {
        std::fs::write(path, self.loss_svg())
            .map_err(|source| Error::Io { path: path.display().to_string(), source })
    }
}

/// The fraction of examples whose predicted class (argmax over `classes` scores per example)
/// equals the label (the class index).
pub fn accuracy(scores: &[f64], labels: &[f64], classes: usize) -> f64 {
    let n = labels.len().min(scores.len() / classes.max(1));
    if n == 0 {
        return 0.0;
    }
    let correct = (0..n)
        .filter(|&i| {
            let row = &scores[i * classes..(i + 1) * classes];
            let best = row
                .iter()
                .enumerate()
                .fold((0, f64::MIN), |acc, (j, &v)| if v > acc.1 { (j, v) } else { acc })
                .0;
            best as f64 == labels[i]
        })
        .count();
    correct as f64 / n as f64
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn schedules_and_shuffles() {
        assert_eq!(LrSchedule::Linear { start: 1.0, end: 0.0 }.at(5, 11), 0.5);
        assert!((LrSchedule::Cosine { max: 1.0, min: 0.0 }.at(10, 11)).abs() < 1e-12);
        let o = shuffled(10, 3);
        let mut sorted = o.clone();
        sorted.sort();
        assert_eq!(sorted, (0..10).collect::<Vec<_>>());
        assert_ne!(o, (0..10).collect::<Vec<_>>());
        assert_eq!(accuracy(&[0.1, 0.9, 0.8, 0.2], &[1.0, 1.0], 2), 0.5);
    }
}

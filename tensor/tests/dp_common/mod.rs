//! The training run shared by the data-parallel tests: one process or a rank of a group, on
//! its shard of every global batch.
#![allow(dead_code)] // each test binary uses a different subset

use std::ops::Range;

use rocannl_tensor::nn::{Activation, Mlp, MlpConfig, loss};
use rocannl_tensor::optim::{Optimizer, Sgd, StepOptions};
use rocannl_tensor::parallel::Group;
use rocannl_tensor::{Axes, Error, Graph, Prec, Session, SessionOptions};

/// Features and targets of example `i` (5 and 2 values).
pub fn example(i: usize) -> (Vec<f64>, Vec<f64>) {
    let x = (0..5).map(|k| (((i * 5 + k) * 37 % 23) as f64 - 11.0) / 7.0).collect();
    let y = (0..2).map(|k| (((i * 2 + k) * 13 % 17) as f64 - 8.0) / 5.0).collect();
    (x, y)
}

#[derive(Clone)]
pub struct Case {
    pub opt: Optimizer,
    pub step: StepOptions,
    pub prec: Prec,
    pub master: Option<Prec>,
    /// The global batch.
    pub batch: usize,
    pub steps: usize,
    /// A dynamic batch axis (shards of unequal size).
    pub dynamic: bool,
    /// Weight each rank by its shard.
    pub weighted: bool,
    /// The graph's seed (ranks may differ: rank 0's parameters are broadcast).
    pub seed: u64,
}

impl Default for Case {
    fn default() -> Case {
        Case {
            opt: Optimizer::Sgd(Sgd::default()),
            step: StepOptions::default(),
            prec: Prec::F32,
            master: None,
            batch: 8,
            steps: 5,
            dynamic: false,
            weighted: false,
            seed: 7,
        }
    }
}

/// What a rank saw: the loss of every step and the parameters at the end.
#[derive(Debug)]
pub struct Outcome {
    pub losses: Vec<f64>,
    pub params: Vec<Vec<f64>>,
}

/// Trains `case` on `group` (none: one process on the whole batch), this rank on `shard` of
/// every global batch, with a batch axis of the shard's size (dynamic when `weighted`).
pub fn train(case: &Case, group: Option<Group>, seed: u64) -> Result<Outcome, Error> {
    let shard: Range<usize> = group.as_ref().map_or(0..case.batch, |g| g.shard(case.batch));
    let n = shard.len();
    let g = Graph::with_seed(seed);
    let dynamic = case.dynamic.then(|| g.dynamic("batch", case.batch));
    let (x, y) = match &dynamic {
        Some(b) => (
            g.data("x", Axes::new().dynamic_batch(b).output(&[5])),
            g.data("y", Axes::new().dynamic_batch(b).output(&[2])),
        ),
        None => (
            g.data("x", Axes::new().batch(&[n]).output(&[5])),
            g.data("y", Axes::new().batch(&[n]).output(&[2])),
        ),
    };
    let mlp = Mlp::new(&g, "mlp", MlpConfig::new(&[16, 2]).with_act(Activation::Tanh));
    let err = loss::mse(&mlp.apply(&x), &y, loss::Reduction::Mean);
    let opts = SessionOptions {
        prec: case.prec,
        master: case.master,
        data_parallel: group,
        ..Default::default()
    };
    let mut s = Session::with_options(&g, opts)?;
    if let Some(b) = &dynamic {
        s.set_size(b, n)?;
    }
    if case.weighted {
        s.set_local_examples(n)?;
    }
    let mut step = s.train_step(&err, &case.opt, &[], &case.step)?;
    let mut losses = Vec::new();
    for k in 0..case.steps {
        let (mut xs, mut ys) = (Vec::new(), Vec::new());
        for i in shard.clone() {
            let (a, b) = example(k * case.batch + i);
            xs.extend(a);
            ys.extend(b);
        }
        s.write(&x, &xs)?;
        s.write(&y, &ys)?;
        s.step(&mut step, 0.1)?;
        losses.push(s.loss(&step)?);
    }
    let params = g.params().iter().map(|p| s.read(p)).collect::<Result<_, _>>()?;
    Ok(Outcome { losses, params })
}

pub fn close(a: &[f64], b: &[f64], tol: f64, what: &str) {
    assert_eq!(a.len(), b.len(), "{what}: lengths");
    for (k, (p, q)) in a.iter().zip(b).enumerate() {
        assert!((p - q).abs() <= tol * (1.0 + q.abs()), "{what}[{k}]: {p} vs {q}");
    }
}

//! Data parallelism: N ranks, each on its shard of every global batch, give the losses and
//! parameters of one process on the whole batch (within f32 rounding of the reduction's
//! order), for SGD and AdamW, with clipping, with a smaller last shard, under bf16 mixed
//! precision and under loss scaling; ranks that differ, leave or hang are errors naming the
//! rank. The ranks are threads ([`Group::in_process`]); the MPI engine runs the same code
//! (`tests/mpi.rs` of the root crate, feature `mpi`).

use std::ops::Range;
use std::time::{Duration, Instant};

use rocannl_tensor::nn::{Activation, Mlp, MlpConfig, loss};
use rocannl_tensor::optim::{LossScale, Optimizer, StepOptions};
use rocannl_tensor::parallel::Group;
use rocannl_tensor::{Error, Graph, Prec, Session, SessionOptions};

/// Features and targets of example `i` (5 and 2 values).
fn example(i: usize) -> (Vec<f64>, Vec<f64>) {
    let x = (0..5).map(|k| (((i * 5 + k) * 37 % 23) as f64 - 11.0) / 7.0).collect();
    let y = (0..2).map(|k| (((i * 2 + k) * 13 % 17) as f64 - 8.0) / 5.0).collect();
    (x, y)
}

#[derive(Clone)]
struct Case {
    opt: Optimizer,
    step: StepOptions,
    prec: Prec,
    master: Option<Prec>,
    /// The global batch.
    batch: usize,
    steps: usize,
    /// A dynamic batch axis (shards of unequal size).
    dynamic: bool,
    /// Weight each rank by its shard.
    weighted: bool,
    /// The graph's seed (ranks may differ: rank 0's parameters are broadcast).
    seed: u64,
}

impl Default for Case {
    fn default() -> Case {
        Case {
            opt: Optimizer::sgd(),
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
struct Outcome {
    losses: Vec<f64>,
    params: Vec<Vec<f64>>,
}

/// Trains `case` on `group` (none: one process on the whole batch), this rank on `shard` of
/// every global batch, with a batch axis of the shard's size (dynamic when `weighted`).
fn train(case: &Case, group: Option<Group>, seed: u64) -> Result<Outcome, Error> {
    let shard: Range<usize> = group.as_ref().map_or(0..case.batch, |g| g.shard(case.batch));
    let n = shard.len();
    let g = Graph::with_seed(seed);
    let dynamic = case.dynamic.then(|| g.dynamic("batch", case.batch));
    let (x, y) = match &dynamic {
        Some(b) => (g.data_dyn("x", b, &[], &[], &[5]), g.data_dyn("y", b, &[], &[], &[2])),
        None => (g.data("x", &[n], &[], &[5]), g.data("y", &[n], &[], &[2])),
    };
    let mlp = Mlp::new(&g, "mlp", MlpConfig::new(&[16, 2]).with_act(Activation::Tanh));
    let err = loss::mse(&mlp.apply(&x), &y);
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
    let mut step = s.train_step_with(&err, &case.opt, &[], &case.step)?;
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
        s.step(&mut step, 0.1, &[])?;
        losses.push(s.loss(&step)?);
    }
    let params = g.params().iter().map(|p| s.read(p)).collect::<Result<_, _>>()?;
    Ok(Outcome { losses, params })
}

/// `case` on `n` in-process ranks (rank r's graph seeded with `seeds(r)`).
fn ranks(
    case: &Case,
    n: usize,
    seeds: impl Fn(usize) -> u64 + Sync,
) -> Vec<Result<Outcome, Error>> {
    std::thread::scope(|s| {
        let handles: Vec<_> = Group::in_process(n)
            .into_iter()
            .enumerate()
            .map(|(r, rank)| {
                let seed = seeds(r);
                s.spawn(move || train(case, Some(Group::from(rank)), seed))
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    })
}

fn close(a: &[f64], b: &[f64], tol: f64, what: &str) {
    assert_eq!(a.len(), b.len(), "{what}: lengths");
    for (k, (p, q)) in a.iter().zip(b).enumerate() {
        assert!((p - q).abs() <= tol * (1.0 + q.abs()), "{what}[{k}]: {p} vs {q}");
    }
}

/// Every rank of `n` matches one process: same losses, same parameters.
fn matches_one_process(case: &Case, n: usize, tol: f64) {
    matches_one_process_within(case, n, tol, tol)
}

/// [`matches_one_process`], with the losses within `loss_tol` (a loss in a half precision is
/// rounded to it on one process, and each rank's before they are averaged).
fn matches_one_process_within(case: &Case, n: usize, loss_tol: f64, tol: f64) {
    let one = train(case, None, case.seed).unwrap();
    for (r, out) in ranks(case, n, |_| case.seed).into_iter().enumerate() {
        let out = out.unwrap();
        close(&out.losses, &one.losses, loss_tol, &format!("{n} ranks, rank {r}: losses"));
        for (i, (p, q)) in out.params.iter().zip(&one.params).enumerate() {
            close(p, q, tol, &format!("{n} ranks, rank {r}: param {i}"));
        }
    }
}

#[test]
fn sgd_on_two_and_four_ranks_matches_one_process() {
    for n in [1, 2, 4] {
        matches_one_process(&Case::default(), n, 2e-6);
    }
}

#[test]
fn adamw_with_clipping_matches_one_process() {
    let case = Case {
        opt: Optimizer::adamw(0.1),
        step: StepOptions { clip_grad_norm: Some(0.5), ..StepOptions::default() },
        ..Case::default()
    };
    for n in [2, 4] {
        matches_one_process(&case, n, 1e-5);
    }
}

#[test]
fn a_smaller_last_shard_is_weighted_by_its_examples() {
    // 7 examples on 2 ranks (4 and 3), on 4 ranks (2, 2, 2, 1).
    let case = Case { batch: 7, dynamic: true, weighted: true, ..Case::default() };
    for n in [2, 4] {
        matches_one_process(&case, n, 2e-6);
    }
    // Unweighted, the shards would count equally: the mean would not be the batch's.
    let unweighted = ranks(&Case { weighted: false, ..case.clone() }, 2, |_| 7);
    let one = train(&case, None, 7).unwrap();
    let l = unweighted[0].as_ref().unwrap().losses[0];
    assert!(
        (l - one.losses[0]).abs() > 1e-4,
        "equal weights should differ: {l} vs {}",
        one.losses[0]
    );
}

#[test]
fn bf16_mixed_precision_matches_one_process() {
    let case = Case {
        prec: Prec::Bf16,
        master: Some(Prec::F32),
        // SGD: its update is proportional to the gradient, so rounding stays rounding (Adam's
        // normalized update turns the sign of a gradient near zero into a step of lr).
        opt: Optimizer::sgd_momentum(0.9),
        ..Case::default()
    };
    // bf16 has 8 significant bits: the losses agree to 2^-8 relative. The gradients are sums
    // over the batch of products of bf16 values, accumulated in f32 (on AVX-512 BF16, in
    // pairs): a different split of the batch rounds them differently, at up to ~2^-8 of a
    // term, and the parameters move by the learning rate times such gradients: they agree to
    // 2^-8 of their total movement (under 0.4 here).
    matches_one_process_within(&case, 2, 4e-3, 1e-3);
}

#[test]
fn loss_scaling_skips_and_scales_alike_on_every_rank() {
    let scaling = LossScale { init: 1e38, growth_interval: 2, ..LossScale::default() };
    let case = Case {
        prec: Prec::F16,
        master: Some(Prec::F32),
        step: StepOptions { loss_scale: Some(scaling), ..StepOptions::default() },
        steps: 6,
        ..Case::default()
    };
    matches_one_process(&case, 2, 1e-5);
}

#[test]
fn rank_zeros_parameters_are_broadcast() {
    // Rank 1 seeds its graph differently: it still trains from rank 0's parameters.
    let case = Case::default();
    let one = train(&case, None, 7).unwrap();
    for out in ranks(&case, 2, |r| 7 + r as u64 * 1000) {
        let out = out.unwrap();
        close(&out.losses, &one.losses, 2e-6, "losses");
    }
}

#[test]
fn a_rank_with_another_model_is_an_error_on_every_rank() {
    let errs: Vec<String> = std::thread::scope(|s| {
        let handles: Vec<_> = Group::in_process(2)
            .into_iter()
            .enumerate()
            .map(|(r, rank)| {
                s.spawn(move || {
                    let g = Graph::new();
                    let x = g.data("x", &[4], &[], &[3]);
                    let width = if r == 1 { 9 } else { 8 };
                    let mlp = Mlp::new(&g, "mlp", MlpConfig::new(&[width, 1]));
                    let l = mlp.apply(&x).sum_all();
                    let opts = SessionOptions {
                        data_parallel: Some(Group::from(rank)),
                        ..Default::default()
                    };
                    let mut s = Session::with_options(&g, opts).unwrap();
                    s.train_step(&l, &Optimizer::sgd(), &[]).unwrap_err().to_string()
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    for (r, e) in errs.iter().enumerate() {
        assert!(e.contains(&format!("rank {r} of 2")) && e.contains("rank(s) [1]"), "{e}");
        assert!(e.contains("different training step"), "{e}");
    }
}

#[test]
fn a_rank_that_leaves_ends_the_others_with_an_error() {
    let case = Case { steps: 4, ..Case::default() };
    let started = Instant::now();
    let results: Vec<Result<Outcome, Error>> = std::thread::scope(|s| {
        let mut ranks = Group::in_process(2).into_iter();
        let (r0, r1) = (ranks.next().unwrap(), ranks.next().unwrap());
        let case = &case;
        let a = s.spawn(move || {
            train(case, Some(Group::from(r0).with_timeout(Duration::from_secs(60))), 7)
        });
        // Rank 1 joins the start, trains one step, and its thread ends (as a process that dies).
        let b =
            s.spawn(move || train(&Case { steps: 1, ..case.clone() }, Some(Group::from(r1)), 7));
        vec![a.join().unwrap(), b.join().unwrap()]
    });
    let e = results[0].as_ref().unwrap_err().to_string();
    assert!(e.contains("rank 0 of 2") && e.contains("rank 1 has left"), "{e}");
    assert!(results[1].is_ok());
    assert!(started.elapsed() < Duration::from_secs(30), "not at once: {:?}", started.elapsed());
}

#[test]
fn a_rank_that_hangs_is_a_timeout_naming_it() {
    let case = Case::default();
    let started = Instant::now();
    let e = std::thread::scope(|s| {
        let mut ranks = Group::in_process(2).into_iter();
        let (r0, r1) = (ranks.next().unwrap(), ranks.next().unwrap());
        let case = &case;
        let a = s.spawn(move || {
            let g = Group::from(r0).with_timeout(Duration::from_millis(300));
            train(case, Some(g), 7).unwrap_err().to_string()
        });
        let msg = a.join().unwrap();
        drop(r1); // rank 1 never took part
        msg
    });
    assert!(e.contains("rank 0 of 2") && e.contains("within 300ms"), "{e}");
    assert!(e.contains("rank(s) [1] did not take part"), "{e}");
    assert!(started.elapsed() < Duration::from_secs(20));
}

#[test]
fn a_single_rank_group_takes_the_data_parallel_path() {
    let case = Case { opt: Optimizer::adam(), ..Case::default() };
    let one = train(&case, None, 7).unwrap();
    let dp = train(&case, Some(Group::single()), 7).unwrap();
    close(&dp.losses, &one.losses, 1e-6, "losses");
    for (p, q) in dp.params.iter().zip(&one.params) {
        close(p, q, 1e-6, "params");
    }
}

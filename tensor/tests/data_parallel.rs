//! Data parallelism: N ranks, each on its shard of every global batch, give the losses and
//! parameters of one process on the whole batch (within f32 rounding of the reduction's
//! order), for SGD and AdamW, with clipping, with a smaller last shard, under bf16 mixed
//! precision and under loss scaling; ranks that differ, leave or hang are errors naming the
//! rank. The ranks are threads ([`Group::in_process`]); the MPI engine runs the same code
//! (`tests/mpi.rs` of the root crate, feature `mpi`).

mod dp_common;

use std::time::{Duration, Instant};

use dp_common::{Case, Outcome, close, train};
use rocannl_tensor::nn::{Mlp, MlpConfig};
use rocannl_tensor::optim::{Adam, AdamW, LossScale, Optimizer, Sgd, StepOptions};
use rocannl_tensor::parallel::Group;
use rocannl_tensor::{Axes, Error, Graph, Prec, Session, SessionOptions};

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
        opt: Optimizer::AdamW(AdamW { weight_decay: 0.1, ..Default::default() }),
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
        opt: Optimizer::Sgd(Sgd { momentum: 0.9, ..Default::default() }),
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
                    let x = g.data("x", Axes::new().batch(&[4]).output(&[3]));
                    let width = if r == 1 { 9 } else { 8 };
                    let mlp = Mlp::new(&g, "mlp", MlpConfig::new(&[width, 1]));
                    let l = mlp.apply(&x).sum_all();
                    let opts = SessionOptions {
                        data_parallel: Some(Group::from(rank)),
                        ..Default::default()
                    };
                    let mut s = Session::with_options(&g, opts).unwrap();
                    s.train_step(&l, &Optimizer::Sgd(Sgd::default()), &[], &StepOptions::default())
                        .unwrap_err()
                        .to_string()
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
    let case = Case { opt: Optimizer::Adam(Adam::default()), ..Case::default() };
    let one = train(&case, None, 7).unwrap();
    let dp = train(&case, Some(Group::single()), 7).unwrap();
    close(&dp.losses, &one.losses, 1e-6, "losses");
    for (p, q) in dp.params.iter().zip(&one.params) {
        close(p, q, 1e-6, "params");
    }
}

/// Two epochs of `train::train` over 10 examples in global batches of 4 (the last batch 2):
/// the losses of every step and the parameters at the end.
fn loader_run(group: Option<Group>) -> (Vec<f64>, Vec<Vec<f64>>) {
    use rocannl_tensor::train::{Column, Loader, LrSchedule, TrainConfig, train};
    let g = Graph::with_seed(3);
    let xs: Vec<f64> = (0..10).flat_map(|i| dp_common::example(i).0).collect();
    let ys: Vec<f64> = (0..10).flat_map(|i| dp_common::example(i).1).collect();
    let cols = [Column::new("x", &[5], xs), Column::new("y", &[2], ys)];
    let loader = match &group {
        Some(grp) => Loader::sharded(&g, &cols, 4, grp).unwrap(),
        None => Loader::new(&g, &cols, 4).unwrap(),
    };
    let mlp = Mlp::new(&g, "mlp", MlpConfig::new(&[8, 2]));
    let err = rocannl_tensor::nn::loss::mse(
        &mlp.apply(loader.batch(0)),
        loader.batch(1),
        rocannl_tensor::nn::loss::Reduction::Mean,
    );
    let opts = SessionOptions { data_parallel: group, ..Default::default() };
    let mut s = Session::with_options(&g, opts).unwrap();
    let mut step = s
        .train_step(&err, &Optimizer::Adam(Adam::default()), &[], &StepOptions::default())
        .unwrap();
    let cfg = TrainConfig {
        epochs: 2,
        lr: LrSchedule::Constant(0.01),
        shuffle_seed: Some(5),
        progress: false,
    };
    let h = train(&mut s, &mut step, &loader, &cols, &cfg, |_| Ok(0.0)).unwrap();
    (h.losses, g.params().iter().map(|p| s.read(p).unwrap()).collect())
}

#[test]
fn a_sharded_loader_trains_as_one_process_even_where_a_rank_has_no_example() {
    let (losses, params) = loader_run(None);
    // 3 ranks: batches of 4 are shards 2, 1, 1; the last batch of 2 is 1, 1 and none.
    for n in [2, 3] {
        let outs: Vec<(Vec<f64>, Vec<Vec<f64>>)> = std::thread::scope(|s| {
            let handles: Vec<_> = Group::in_process(n)
                .into_iter()
                .map(|r| s.spawn(move || loader_run(Some(Group::from(r)))))
                .collect();
            handles.into_iter().map(|h| h.join().unwrap()).collect()
        });
        for (r, (l, p)) in outs.iter().enumerate() {
            close(l, &losses, 1e-5, &format!("{n} ranks, rank {r}: losses"));
            close(&p.concat(), &params.concat(), 1e-5, &format!("{n} ranks, rank {r}: params"));
        }
    }
}

#[test]
fn the_in_process_group_gives_the_same_bits_on_every_run() {
    // Its documented promise: the ranks' values are added in rank order.
    let case = Case {
        opt: Optimizer::AdamW(AdamW { weight_decay: 0.1, ..Default::default() }),
        ..Case::default()
    };
    let bits = |outs: Vec<Result<Outcome, Error>>| -> Vec<u64> {
        let out = outs.into_iter().next().unwrap().unwrap();
        out.losses.iter().chain(out.params.concat().iter()).map(|x| x.to_bits()).collect()
    };
    let first = bits(ranks(&case, 4, |_| 7));
    for _ in 0..3 {
        assert_eq!(bits(ranks(&case, 4, |_| 7)), first);
    }
}

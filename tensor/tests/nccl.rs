//! NCCL: one rank on the GPU (`scripts/gpu_check.sh` runs this where a GPU is lent). The
//! collective operations of a one-rank group leave the values as they are, and a data-parallel
//! training step over it matches one process. Without a GPU, the CUDA driver or NCCL, `Group`'s
//! constructors are errors (never a panic), and the tests say so and pass.
#![cfg(feature = "nccl")]

mod dp_common;

use dp_common::{Case, close, train};
use rocannl_tensor::parallel::Group;

/// A one-rank NCCL group on device 0, or `None` (and why) where there is none.
fn one_rank() -> Option<Group> {
    let made = Group::nccl_id().and_then(|id| Group::nccl(0, 1, 0, id));
    match made {
        Ok(g) => Some(g),
        Err(e) => {
            let msg = e.to_string();
            assert!(msg.starts_with("rank 0 of 1: "), "{msg}");
            // The device check (`scripts/gpu_check.sh`) sets this: there, no group is a failure.
            let required = std::env::var_os("ROCANNL_REQUIRE_DEVICE").is_some();
            assert!(!required, "ROCANNL_REQUIRE_DEVICE is set but: {msg}");
            eprintln!("no NCCL group here: {msg}");
            None
        }
    }
}

#[test]
fn a_one_rank_group_keeps_the_values() {
    let Some(g) = one_rank() else { return };
    assert_eq!((g.rank(), g.size(), g.engine()), (0, 1, "nccl"));
    let mut v = vec![1.5f32, -2.0, 3.25];
    g.all_reduce_f32(&mut v).unwrap();
    assert_eq!(v, vec![1.5, -2.0, 3.25]);
    let mut w = vec![0.1f64; 1000];
    g.all_reduce_f64(&mut w).unwrap();
    assert!(w.iter().all(|x| *x == 0.1));
    let mut bytes = vec![7u8, 8, 9];
    g.broadcast(0, &mut bytes).unwrap();
    assert_eq!(bytes, vec![7, 8, 9]);
    assert_eq!(g.all_gather_u64(42).unwrap(), vec![42]);
    g.barrier().unwrap();
}

#[test]
fn a_data_parallel_step_over_nccl_matches_one_process() {
    let Some(g) = one_rank() else { return };
    let case = Case::default();
    let one = train(&case, None, case.seed).unwrap();
    let dp = train(&case, Some(g), case.seed).unwrap();
    close(&dp.losses, &one.losses, 1e-6, "losses");
    for (p, q) in dp.params.iter().zip(&one.params) {
        close(p, q, 1e-6, "params");
    }
}

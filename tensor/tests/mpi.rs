//! Data parallelism over MPI: `mpirun` runs this test binary's `mpi_rank` test on 2 and 4
//! processes (oversubscribed on a small machine), each on its shard of every global batch, and
//! rank 0's losses and parameters must match one process on the whole batch. A rank that dies
//! ends the run with an error within the timeout, and a rank that hangs is a timeout on the
//! others.
//!
//! The case a rank runs is named by a second test-name filter on its command line (which
//! matches no test: libtest runs `mpi_rank` alone).
#![cfg(feature = "mpi")]

mod dp_common;

use std::process::Command;
use std::time::{Duration, Instant};

use dp_common::{Case, close, train};
use rocannl_tensor::optim::{AdamW, Optimizer, StepOptions};
use rocannl_tensor::parallel::Group;

fn case(name: &str) -> Case {
    match name {
        "case_sgd" => Case::default(),
        "case_adamw_clip" => Case {
            opt: Optimizer::AdamW(AdamW { weight_decay: 0.1, ..Default::default() }),
            step: StepOptions { clip_grad_norm: Some(0.5), ..StepOptions::default() },
            ..Case::default()
        },
        "case_last_shard" => Case { batch: 7, dynamic: true, weighted: true, ..Case::default() },
        // Rank 1 exits after the first step (as a process that dies).
        "case_dies" | "case_hangs" => Case { steps: 50, ..Case::default() },
        _ => panic!("unknown case {name}"),
    }
}

/// Runs on every rank under `mpirun`: trains the case named on the command line and prints
/// rank 0's outcome.
#[test]
#[ignore = "run by the other tests under mpirun"]
fn mpi_rank() {
    let name = std::env::args().find(|a| a.starts_with("case_")).expect("a case_ argument");
    let group = Group::mpi().unwrap().with_timeout(Duration::from_secs(10));
    let mut c = case(&name);
    if name == "case_dies" && group.rank() == 1 {
        c.steps = 1;
        train(&c, Some(group), c.seed).unwrap();
        std::process::exit(3);
    }
    if name == "case_hangs" && group.rank() == 1 {
        c.steps = 1;
        train(&c, Some(group.clone()), c.seed).unwrap();
        std::thread::sleep(Duration::from_secs(120));
        return;
    }
    match train(&c, Some(group.clone()), c.seed) {
        Ok(out) if group.is_root() => println!("OUTCOME {:?} {:?}", out.losses, out.params),
        Ok(_) => {}
        Err(e) => {
            eprintln!("ERROR {e}");
            std::process::exit(2);
        }
    }
}

/// `mpirun -np n` on this binary's `mpi_rank` with case `name`: its exit status and output.
fn mpirun(n: usize, name: &str) -> (bool, String, String) {
    let exe = std::env::current_exe().unwrap();
    let out = Command::new("mpirun")
        .args(["--oversubscribe", "--allow-run-as-root", "-np", &n.to_string()])
        .arg(exe)
        .args(["mpi_rank", name, "--exact", "--ignored", "--nocapture", "--test-threads", "1"])
        .output()
        .expect("mpirun (scripts/setup.sh --mpi installs Open MPI)");
    let text = |b: &[u8]| String::from_utf8_lossy(b).into_owned();
    (out.status.success(), text(&out.stdout), text(&out.stderr))
}

/// Parses rank 0's `OUTCOME [losses] [[params]]` line.
fn outcome(stdout: &str) -> (Vec<f64>, Vec<Vec<f64>>) {
    // libtest's "test mpi_rank ... " may precede it on the line.
    let line = stdout
        .lines()
        .find_map(|l| l.find("OUTCOME ").map(|at| &l[at + "OUTCOME ".len()..]))
        .expect("rank 0's outcome");
    let nums = |s: &str| -> Vec<f64> {
        s.split([',', '[', ']', ' '])
            .filter(|t| !t.is_empty())
            .map(|t| t.parse().unwrap())
            .collect()
    };
    let split = line.find("] [").unwrap();
    let losses = nums(&line[..=split]);
    let params = line[split + 2..].split("], [").map(nums).collect();
    (losses, params)
}

fn matches_one_process(name: &str, n: usize, tol: f64) {
    let c = case(name);
    let one = train(&c, None, c.seed).unwrap();
    let (ok, stdout, stderr) = mpirun(n, name);
    assert!(ok, "mpirun -np {n} {name} failed:\n{stdout}\n{stderr}");
    let (losses, params) = outcome(&stdout);
    close(&losses, &one.losses, tol, &format!("{name} on {n} ranks: losses"));
    let flat: Vec<f64> = one.params.concat();
    close(&params.concat(), &flat, tol, &format!("{name} on {n} ranks: params"));
}

#[test]
fn sgd_on_two_and_four_processes_matches_one() {
    matches_one_process("case_sgd", 2, 2e-6);
    matches_one_process("case_sgd", 4, 2e-6);
}

#[test]
fn adamw_with_clipping_on_two_processes_matches_one() {
    matches_one_process("case_adamw_clip", 2, 1e-5);
}

#[test]
fn a_smaller_last_shard_on_two_and_four_processes_matches_one() {
    matches_one_process("case_last_shard", 2, 2e-6);
    matches_one_process("case_last_shard", 4, 2e-6);
}

#[test]
fn a_process_that_dies_ends_the_run_with_an_error() {
    let started = Instant::now();
    let (ok, stdout, stderr) = mpirun(2, "case_dies");
    assert!(!ok, "{stdout}\n{stderr}");
    // Open MPI's launcher names the rank that exited, and ends the others.
    let all = format!("{stdout}\n{stderr}");
    assert!(all.contains("rank 1") || all.contains("ERROR rank 0 of 2"), "{all}");
    assert!(started.elapsed() < Duration::from_secs(60), "{:?}", started.elapsed());
}

#[test]
fn a_process_that_hangs_is_a_timeout_on_the_others() {
    let started = Instant::now();
    let (ok, stdout, stderr) = mpirun(2, "case_hangs");
    assert!(!ok, "{stdout}\n{stderr}");
    assert!(
        stderr.contains("ERROR rank 0 of 2") && stderr.contains("did not complete within 10s"),
        "{stdout}\n{stderr}"
    );
    assert!(started.elapsed() < Duration::from_secs(60), "{:?}", started.elapsed());
}

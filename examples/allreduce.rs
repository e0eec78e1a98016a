//! What one all-reduce costs between the ranks of `mpirun` (docs/distributed.md): the sum of
//! a buffer of f32 values, as a data-parallel step reduces its gradients, timed after a barrier
//! so that no rank waits for a slower one.
//!
//! ```text
//! cargo build --release --features mpi --example allreduce
//! mpirun -np 2 target/release/examples/allreduce --values 104603 --reps 200
//! ```
//!
//! Rank 0 prints one JSON object: `ranks`, `values`, `bytes`, and the median and minimum time
//! of one all-reduce in milliseconds.

use std::time::Instant;

use rocannl::tensor::parallel::Group;

fn main() {
    if let Err(e) = run() {
        eprintln!("error: {e}");
        std::process::exit(1);
    }
}

fn run() -> Result<(), Box<dyn std::error::Error>> {
    let (mut values, mut reps) = (1usize << 20, 100usize);
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        let value = it.next().ok_or(format!("{flag} needs a value"))?;
        match flag.as_str() {
            "--values" => values = value.parse()?,
            "--reps" => reps = value.parse()?,
            other => return Err(format!("unknown flag {other} (--values N, --reps R)").into()),
        }
    }
    let group = Group::mpi()?;
    let mut buf: Vec<f32> = (0..values).map(|i| (i % 7) as f32).collect();
    let mut times = Vec::with_capacity(reps);
    for rep in 0..reps + 5 {
        group.barrier()?;
        let t = Instant::now();
        group.all_reduce_f32(&mut buf)?;
        if rep >= 5 {
            times.push(t.elapsed().as_secs_f64() * 1e3);
        }
        buf.iter_mut().for_each(|v| *v /= group.size() as f32);
    }
    times.sort_by(f64::total_cmp);
    if group.is_root() {
        let line = serde_json::json!({
            "ranks": group.size(), "values": values, "bytes": values * 4,
            "median_ms": times[times.len() / 2], "min_ms": times[0],
        });
        println!("{line}");
    }
    Ok(())
}

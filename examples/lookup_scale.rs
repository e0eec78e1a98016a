//! What an embedding's lookup costs as the vocabulary grows: `Tensor::lookup` (a row copied per
//! id, each row's gradient added back) against the same lookup written as a product with a
//! one-hot tensor, forward and backward, at a GPT-2-sized table by default.
//!
//! ```text
//! cargo run --release --example lookup_scale -- [--vocab 50257] [--dim 768] [--tokens 1024]
//!     [--reps 5] [--onehot]
//! ```
//!
//! Prints one JSON object: the sizes, the way (`lookup` or `onehot`) and the median seconds of
//! one forward-and-backward run after one warm-up run.

use std::time::Instant;

use rocannl::tensor::{Axes, Graph, Init, ParamSpec, Session};

fn arg(args: &[String], name: &str, default: usize) -> usize {
    args.iter()
        .position(|a| a == name)
        .and_then(|i| args.get(i + 1))
        .map_or(default, |v| v.parse().unwrap_or_else(|_| panic!("{name} takes a number")))
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let (vocab, dim, tokens) =
        (arg(&args, "--vocab", 50257), arg(&args, "--dim", 768), arg(&args, "--tokens", 1024));
    let reps = arg(&args, "--reps", 5).max(1);
    let onehot = args.iter().any(|a| a == "--onehot");
    let g = Graph::new();
    let spec = ParamSpec::new(Axes::new().input(&[vocab]).output(&[dim]))
        .init(Init::Normal { mean: 0.0, std: 0.02 });
    let table = g.param("table", spec);
    let ids = g.ids("ids", Axes::new().batch(&[tokens]));
    let rows = if onehot { table.matmul(&ids.eq(&g.range(vocab))) } else { table.lookup(&ids) };
    let root = rows.sum_all();
    let mut s = Session::new(&g).expect("the graph compiles");
    let values: Vec<u32> = (0..tokens).map(|t| ((t * 7919 + 13) % vocab) as u32).collect();
    s.write_ids(&ids, &values, vocab).expect("ids in range");
    let r = s.backprop(&root, &[]).expect("the gradient compiles");
    s.run(&r).expect("a run");
    let mut times: Vec<f64> = (0..reps)
        .map(|_| {
            let t = Instant::now();
            s.run(&r).expect("a run");
            t.elapsed().as_secs_f64()
        })
        .collect();
    times.sort_by(f64::total_cmp);
    let way = if onehot { "onehot" } else { "lookup" };
    println!(
        "{{\"vocab\":{vocab},\"dim\":{dim},\"tokens\":{tokens},\"way\":\"{way}\",\"run_s\":{}}}",
        times[times.len() / 2]
    );
}

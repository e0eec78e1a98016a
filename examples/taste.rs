//! The README's first example, as written there: a two-layer network whose weight shapes are
//! inferred from how they are used. `cargo run --release --example taste`
use rocannl::tensor::nn::loss;
use rocannl::tensor::{Adam, Axes, Graph, Optimizer, ParamSpec, Session};

fn main() {
    if let Err(e) = run() {
        eprintln!("error: {e}");
        std::process::exit(1);
    }
}

fn run() -> Result<(), rocannl::tensor::Error> {
    // 64 examples of 3 features, with targets from a linear rule.
    let inputs: Vec<f64> = (0..64 * 3).map(|i| ((i * 7) % 11) as f64 / 11.0 - 0.5).collect();
    let targets: Vec<f64> = (0..64)
        .map(|e| inputs[3 * e] - 2.0 * inputs[3 * e + 1] + 0.5 * inputs[3 * e + 2])
        .collect();

    let g = Graph::with_seed(0);
    let x = g.data("x", Axes::new().batch(&[64]).output(&[3])); // 64 examples with 3 features
    let y = g.data("y", Axes::new().batch(&[64]).output(&[1])); // their targets
    let w1 = g.param("w1", ParamSpec::default()); // both rows inferred
    let b1 = g.param("b1", ParamSpec::new(Axes::new().input(&[]).output(&[8]))); // the hidden width is the one size given
    let w2 = g.param("w2", ParamSpec::default());
    let pred = w2.matmul(&(&w1.matmul(&x) + &b1).tanh());
    let mse = loss::mse(&pred, &y, loss::Reduction::Mean);

    let mut s = Session::new(&g)?; // shapes are inferred here
    assert_eq!(w1.shape_string(), "|3->8"); // input from x, output from b1
    assert_eq!(w2.shape_string(), "|8->1"); // input from the hidden layer, output from y
    // One compiled routine: forward, backprop and Adam's update.
    let mut step =
        s.train_step(&mse, &Optimizer::Adam(Adam::default()), &[], &Default::default())?;
    s.write(&x, &inputs)?;
    s.write(&y, &targets)?;
    for _ in 0..500 {
        s.step(&mut step, 0.01)?;
    }
    println!("loss after 500 steps: {:.5}", s.loss(&step)?);
    Ok(())
}

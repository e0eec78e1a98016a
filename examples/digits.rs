//! The 8×8 handwritten digits (1,797 images bundled in `data/digits.csv`): an MLP and a small
//! convolutional network, each trained with Adam on a cross-entropy loss.
//!
//! The same pixels are seen as a vector of 64 by the MLP (`batch | 64`) and as an image
//! `batch | 8, 8, 1` by the conv net; the conv net's kernels and the classifier's weights get
//! their input shapes (channels, the flattened feature map `2, 2, 32`) from use.
//!
//! `cargo run --release --example digits` (`--quick` for a short run, `--model mlp|cnn`).

use std::error::Error;

use rocannl::datasets::{Digits, digits};
use rocannl::tensor::nn::conv::{Conv2d, Conv2dConfig, Padding, max_pool2d};
use rocannl::tensor::nn::{Linear, LinearConfig, Mlp, MlpConfig, loss};
use rocannl::tensor::train::{Column, Loader, LrSchedule, TrainConfig, accuracy, shuffled, train};
use rocannl::tensor::{Adam, Axes, Graph, Optimizer, Session, Tensor};

/// Shuffles the images with a seed and splits off the last `test` for evaluation.
fn split(d: &Digits, test: usize) -> (Digits, Digits) {
    let order = shuffled(d.len(), 2024);
    let images =
        order.iter().flat_map(|&i| d.images[i * 64..(i + 1) * 64].iter().copied()).collect();
    let labels = order.iter().map(|&i| d.labels[i]).collect();
    Digits { images, labels }.split(d.len() - test)
}

enum Model {
    Mlp(Mlp),
    Cnn(Conv2d, Conv2d, Linear),
}

impl Model {
    fn apply(&self, x: &Tensor) -> Tensor {
        match self {
            Model::Mlp(m) => m.apply(x),
            Model::Cnn(c1, c2, head) => {
                let h = max_pool2d(&c1.apply(x).relu(), 2, 2);
                let h = max_pool2d(&c2.apply(&h).relu(), 2, 2);
                head.apply(&h)
            }
        }
    }
}

fn run(
    name: &str,
    quick: bool,
    train_set: &Digits,
    test_set: &Digits,
) -> Result<f64, Box<dyn Error>> {
    let cnn = name == "cnn";
    let example = if cnn { vec![8, 8, 1] } else { vec![64] };
    let g = Graph::with_seed(3);
    let columns = [
        Column::new("images", &example, train_set.images.clone()),
        Column::new("targets", &[10], train_set.one_hot()),
    ];
    let loader = Loader::new(&g, &columns, 32)?;
    let model = if cnn {
        Model::Cnn(
            Conv2d::new(&g, "conv1", Conv2dConfig::new((3, 3), 16).with_padding(Padding::Same)),
            Conv2d::new(&g, "conv2", Conv2dConfig::new((3, 3), 32).with_padding(Padding::Same)),
            Linear::new(&g, "head", LinearConfig::new(10)),
        )
    } else {
        Model::Mlp(Mlp::new(&g, "mlp", MlpConfig::new(&[64, 10])))
    };
    let logits = model.apply(loader.batch(0));
    let loss = loss::cross_entropy(&logits, loader.batch(1), loss::Reduction::Mean).named("loss");
    let test_images = g.data("test_images", Axes::new().batch(&[test_set.len()]).output(&example));
    let test_logits = model.apply(&test_images).named("test_logits");

    let mut s = Session::new(&g)?;
    println!("== {name} ({})", s.backend().name());
    for p in g.params() {
        println!("   {:14} {}", p.label(), p.shape_string());
    }
    let mut step =
        s.train_step(&loss, &Optimizer::Adam(Adam::default()), &[], &Default::default())?;
    let eval = s.forward(&[&test_logits])?;
    s.write(&test_images, &test_set.images)?;
    let labels = test_set.labels.clone();
    let evaluate = |s: &mut Session| -> Result<f64, rocannl::tensor::Error> {
        s.run(&eval)?;
        Ok(accuracy(&s.read(&test_logits)?, &labels, 10))
    };
    let epochs = if quick { 4 } else { 25 };
    let cfg = TrainConfig {
        epochs,
        lr: LrSchedule::Cosine { max: 3e-3, min: 1e-4 },
        shuffle_seed: Some(11),
        progress: !quick,
    };
    let h = train(&mut s, &mut step, &loader, &columns, &cfg, evaluate)?;
    let (first, last) = (h.epoch_losses[0], h.epoch_losses[h.epoch_losses.len() - 1]);
    let acc = h.metrics.last().copied().unwrap_or(0.0);
    println!("   epochs {epochs}: loss {first:.4} -> {last:.4}, {:.0} steps/s", h.steps_per_second);
    println!("   test accuracy: {:.1}% of {} held-out images", 100.0 * acc, test_set.len());
    println!(
        "metrics {name}: {{\"first_loss\": {first}, \"last_loss\": {last}, \"test_accuracy\": {acc}}}"
    );
    Ok(acc)
}

fn main() -> Result<(), Box<dyn Error>> {
    let args: Vec<String> = std::env::args().collect();
    let quick = args.iter().any(|a| a == "--quick");
    let which = args.iter().position(|a| a == "--model").and_then(|i| args.get(i + 1)).cloned();
    let (train_set, test_set) = split(&digits(), 360);
    for name in ["mlp", "cnn"] {
        if which.as_deref().is_none_or(|w| w == name) {
            run(name, quick, &train_set, &test_set)?;
        }
    }
    Ok(())
}

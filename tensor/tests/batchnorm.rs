//! `nn::BatchNorm` against PyTorch's `BatchNorm1d` / `BatchNorm2d`: values computed by
//! `tests/reference/batchnorm.py --generate` in float64 and committed as
//! `tests/reference/batchnorm_expected.json` (the script's docstring gives the layouts). Each
//! case is checked on the interpreter and on native code: the train-mode output and gradients,
//! the running statistics after a few train-mode batches, the eval-mode output. A training run
//! with SGD checks the state the optimizer's steps leave and the checkpoint: where a Python
//! with torch is found, the script loads the checkpoint into PyTorch's module and its eval
//! output must be ours.

use rocannl_tensor::nn::{BatchNorm, BatchNormAxes, BatchNormConfig, Module, loss};
use rocannl_tensor::optim::{Optimizer, Sgd};
use rocannl_tensor::{
    Axes, BackendKind, Graph, Init, Mode, ParamSpec, Prec, Session, SessionOptions,
};
use serde_json::Value;

const EXPECTED: &str = include_str!(concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/../tests/reference/batchnorm_expected.json"
));

fn expected() -> Value {
    serde_json::from_str(EXPECTED).unwrap()
}

fn floats(v: &Value) -> Vec<f64> {
    v.as_array().unwrap().iter().map(|x| x.as_f64().unwrap()).collect()
}

fn backends() -> Vec<BackendKind> {
    let mut b = vec![BackendKind::Interp];
    if cfg!(feature = "gccjit") {
        b.push(BackendKind::Gccjit);
    }
    b
}

fn session(g: &Graph, backend: BackendKind) -> Session {
    let opts = SessionOptions { backend, prec: Prec::F64, ..SessionOptions::default() };
    Session::with_options(g, opts).unwrap()
}

/// Float64 against float64: only the order of the sums differs.
fn assert_close(what: &str, got: &[f64], want: &[f64]) {
    assert_eq!(got.len(), want.len(), "{what}: {got:?} against {want:?}");
    for (i, (a, b)) in got.iter().zip(want).enumerate() {
        assert!((a - b).abs() <= 1e-10 * (1.0 + b.abs()), "{what}[{i}]: {a} against {b}");
    }
}

/// The rows of the input in rocannl's layout (batch, output) and the block's settings.
fn layout(case: &Value) -> (Vec<usize>, Vec<usize>, BatchNormConfig) {
    let shape: Vec<usize> = case["torch_shape"]
        .as_array()
        .unwrap()
        .iter()
        .map(|d| d.as_u64().unwrap() as usize)
        .collect();
    let (n, c, rest) = (shape[0], shape[1], &shape[2..]);
    let two_d = case["kind"] == "2d";
    let (batch, output) = match (two_d, rest.len()) {
        (true, _) => (vec![n], [rest, &[c]].concat()),
        (false, 0) => (vec![n], vec![c]),
        (false, _) => ([&[n], rest].concat(), vec![c]),
    };
    let affine = case["affine"].as_bool().unwrap();
    let mut cfg = BatchNormConfig::default()
        .with_axes(if two_d { BatchNormAxes::Channels } else { BatchNormAxes::Features })
        .with_momentum(case["momentum"].as_f64())
        .with_eps(case["eps"].as_f64().unwrap())
        .with_affine(affine)
        .with_track_running_stats(case["track_running_stats"].as_bool().unwrap());
    if affine {
        cfg = cfg
            .with_weight_init(Init::Values(floats(&case["weight"])))
            .with_bias_init(Init::Values(floats(&case["bias"])));
    }
    (batch, output, cfg)
}

#[test]
fn train_mode_output_and_gradients_match_pytorch() {
    for case in expected()["cases"].as_array().unwrap() {
        let name = case["name"].as_str().unwrap();
        let (batch, output, cfg) = layout(case);
        for backend in backends() {
            let what = format!("{name} on {backend:?}");
            let g = Graph::new();
            let x0 = floats(&case["batches"][0]);
            let x = g.param(
                "x",
                ParamSpec::new(Axes::new().batch(&batch).input(&[]).output(&output))
                    .init(Init::Values(x0)),
            );
            let bn = BatchNorm::new(&g, "bn", cfg.clone());
            let y = bn.apply(&x);
            let r = g.ndarray("r", Axes::new().batch(&batch).output(&output), &floats(&case["r"]));
            let loss = y.pointmul(&r).sum_all();
            let mut s = session(&g, backend);
            let bp = s.backprop(&loss, &[&y]).unwrap();
            s.run(&bp).unwrap();
            assert_close(&format!("{what}: y"), &s.read(&y).unwrap(), &floats(&case["train_y"]));
            assert_close(
                &format!("{what}: dx"),
                &s.read_grad(&x).unwrap(),
                &floats(&case["grad_x"]),
            );
            if let (Some(w), Some(b)) = (&bn.weight, &bn.bias) {
                let (gw, gb) = (s.read_grad(w).unwrap(), s.read_grad(b).unwrap());
                assert_close(&format!("{what}: dweight"), &gw, &floats(&case["grad_weight"]));
                assert_close(&format!("{what}: dbias"), &gb, &floats(&case["grad_bias"]));
            }
        }
    }
}

#[test]
fn running_statistics_and_eval_mode_match_pytorch() {
    for case in expected()["cases"].as_array().unwrap() {
        let name = case["name"].as_str().unwrap();
        let (batch, output, cfg) = layout(case);
        for backend in backends() {
            let what = format!("{name} on {backend:?}");
            let g = Graph::new();
            let x = g.data("x", Axes::new().batch(&batch).output(&output));
            let bn = BatchNorm::new(&g, "bn", cfg.clone());
            let y = bn.apply(&x);
            let mut s = session(&g, backend);
            // A train-mode forward updates the running statistics, as in PyTorch.
            let train = s.forward_in(Mode::Train, &[&y]).unwrap();
            let eval = s.forward(&[&y]).unwrap();
            for b in case["batches"].as_array().unwrap() {
                s.write(&x, &floats(b)).unwrap();
                s.run(&train).unwrap();
            }
            let buffers = bn.buffers();
            let before: Vec<Vec<f64>> = buffers.iter().map(|b| s.read(b).unwrap()).collect();
            if let [mean, var, count] = before.as_slice() {
                assert_close(
                    &format!("{what}: running_mean"),
                    mean,
                    &floats(&case["running_mean"]),
                );
                assert_close(&format!("{what}: running_var"), var, &floats(&case["running_var"]));
                let want = case["num_batches_tracked"].as_f64().unwrap();
                assert_eq!(count, &vec![want], "{what}: num_batches_tracked");
            } else {
                assert!(case.get("running_mean").is_none(), "{what}: no buffers");
                assert!(before.is_empty(), "{what}: buffers without tracking");
            }
            s.write(&x, &floats(&case["eval_x"])).unwrap();
            s.run(&eval).unwrap();
            assert_close(
                &format!("{what}: eval y"),
                &s.read(&y).unwrap(),
                &floats(&case["eval_y"]),
            );
            let after: Vec<Vec<f64>> = buffers.iter().map(|b| s.read(b).unwrap()).collect();
            assert_eq!(before, after, "{what}: an eval routine changed a buffer");
        }
    }
}

/// A python with torch, if this machine has one.
fn torch_python() -> Option<std::path::PathBuf> {
    let candidates = ["/work/torchenv/bin/python", "python3"];
    candidates.iter().map(std::path::PathBuf::from).find(|p| {
        std::process::Command::new(p)
            .args(["-c", "import torch"])
            .output()
            .is_ok_and(|o| o.status.success())
    })
}

#[test]
fn a_trained_batch_norm_matches_pytorch_and_its_checkpoint_loads_there() {
    let run = &expected()["training_run"];
    let shape: Vec<usize> = run["torch_shape"]
        .as_array()
        .unwrap()
        .iter()
        .map(|d| d.as_u64().unwrap() as usize)
        .collect();
    let (n, c, l) = (shape[0], shape[1], shape[2]);
    let state = &run["state_dict"];
    for backend in backends() {
        let g = Graph::new();
        let x = g.data("x", Axes::new().batch(&[n, l]).output(&[c]));
        let t = g.data("t", Axes::new().batch(&[n, l]).output(&[c]));
        let cfg = BatchNormConfig::default()
            .with_weight_init(Init::Values(floats(&run["weight"])))
            .with_bias_init(Init::Values(floats(&run["bias"])));
        let bn = BatchNorm::new(&g, "bn", cfg);
        let y = bn.apply(&x);
        let loss = loss::mse(&y, &t, loss::Reduction::Mean);
        let mut s = session(&g, backend);
        let mut step =
            s.train_step(&loss, &Optimizer::Sgd(Sgd::default()), &[], &Default::default()).unwrap();
        let eval = s.forward(&[&y]).unwrap();
        let lr = run["lr"].as_f64().unwrap();
        for (xs, ts) in run["xs"].as_array().unwrap().iter().zip(run["targets"].as_array().unwrap())
        {
            s.write(&x, &floats(xs)).unwrap();
            s.write(&t, &floats(ts)).unwrap();
            s.step(&mut step, lr).unwrap();
        }
        let named = bn.params().into_iter().chain(bn.buffers());
        for tensor in named {
            let key = tensor.label().strip_prefix("bn.").unwrap().to_string();
            let what = format!("{backend:?}: {key}");
            assert_close(&what, &s.read(&tensor).unwrap(), &floats(&state[&key]));
        }
        s.write(&x, &floats(&run["eval_x"])).unwrap();
        s.run(&eval).unwrap();
        let eval_y = s.read(&y).unwrap();
        assert_close(&format!("{backend:?}: eval y"), &eval_y, &floats(&run["eval_y"]));
        let path = std::env::temp_dir()
            .join(format!("rocannl_batchnorm_{}_{backend:?}.safetensors", std::process::id()));
        s.save_params(&path).unwrap();
        if let Some(python) = torch_python() {
            let script = concat!(env!("CARGO_MANIFEST_DIR"), "/../tests/reference/batchnorm.py");
            let out = std::process::Command::new(python)
                .args([script, "--load"])
                .arg(&path)
                .output()
                .unwrap();
            assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
            let loaded: Value = serde_json::from_slice(&out.stdout).unwrap();
            assert_close(&format!("{backend:?}: in PyTorch"), &floats(&loaded["eval_y"]), &eval_y);
            assert_eq!(loaded["num_batches_tracked"], run["steps"]);
        } else {
            eprintln!("no python with torch: the checkpoint was not loaded into PyTorch");
        }
        std::fs::remove_file(&path).unwrap();
    }
}

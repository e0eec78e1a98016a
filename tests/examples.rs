//! Each example's training, shortened (`--quick`), with its fixed seeds: the loss goes down and
//! the accuracy passes a threshold. `cargo test` builds the examples; this runs the binaries and
//! reads the `metrics` lines they print.

use std::path::PathBuf;
use std::process::Command;

use serde_json::Value;

fn example(name: &str) -> PathBuf {
    let exe = std::env::current_exe().expect("the test binary's path");
    let dir = exe.parent().and_then(|d| d.parent()).expect("target/<profile>");
    dir.join("examples").join(name)
}

/// Runs an example with `--quick` and returns each `metrics ...: {json}` line by its label.
fn run(name: &str, args: &[&str]) -> Vec<(String, Value)> {
    let out = Command::new(example(name))
        .arg("--quick")
        .args(args)
        .output()
        .unwrap_or_else(|e| panic!("cannot run example {name} ({e}): `cargo test` builds the examples, `cargo test --test examples` alone does not"));
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{name} failed:\n{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    stdout
        .lines()
        .filter_map(|l| l.strip_prefix("metrics"))
        .map(|l| {
            let (label, json) = l.split_once(':').expect("metrics line");
            (label.trim().to_string(), serde_json::from_str(json.trim()).expect("metrics json"))
        })
        .collect()
}

fn num(v: &Value, key: &str) -> f64 {
    v[key].as_f64().unwrap_or_else(|| panic!("no number {key} in {v}"))
}

#[test]
fn moons_learns_to_separate() {
    let m = run("moons", &[]);
    let v = &m[0].1;
    assert!(num(v, "last_loss") < 0.5 * num(v, "first_loss"), "{v}");
    assert!(num(v, "test_accuracy") >= 0.95, "{v}");
}

#[test]
fn digits_mlp_and_cnn_learn() {
    for (label, v) in run("digits", &[]) {
        assert!(num(&v, "last_loss") < 0.5 * num(&v, "first_loss"), "{label}: {v}");
        assert!(num(&v, "test_accuracy") >= 0.85, "{label}: {v}");
    }
}

#[test]
fn names_models_learn() {
    let m = run("names", &[]);
    assert_eq!(m.len(), 2);
    for (label, v) in m {
        // Uniform guessing over 27 characters has loss ln 27 ≈ 3.30.
        assert!(num(&v, "last_loss") < 2.6, "{label}: {v}");
        assert!(num(&v, "last_loss") < num(&v, "first_loss"), "{label}: {v}");
    }
}

#[test]
fn einsum_tour_runs() {
    let out = Command::new(example("einsum_tour")).output().expect("run einsum_tour");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{stdout}");
    assert!(stdout.contains("rest was inferred as |->3"), "{stdout}");
    assert!(stdout.contains("values [1, 2, 3, 4]"), "{stdout}");
}

#[test]
fn char_gpt_learns_and_reports_json() {
    let dir = std::env::temp_dir().join(format!("rocannl-char-gpt-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let out = Command::new(example("char_gpt"))
        .args(["--steps", "150", "--json"])
        .current_dir(&dir)
        .output()
        .expect("run char_gpt");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{stdout}\n{}", String::from_utf8_lossy(&out.stderr));
    let v: Value = serde_json::from_str(stdout.lines().last().unwrap()).expect("a JSON last line");
    for key in ["train_loss", "val_loss", "steps_per_s", "compile_s", "wall_s"] {
        assert!(num(&v, key).is_finite(), "{key}: {v}");
    }
    // Uniform guessing over 27 symbols is ln 27 ≈ 3.30.
    assert!(num(&v, "val_loss") < 2.8, "{v}");
    assert_eq!(v["samples"].as_array().map(Vec::len), Some(20), "{v}");
    assert_eq!(v["params"], 104_091, "{v}");
    // The order and split the configuration fixes, as any other framework's run must see them.
    let data = &v["data"];
    assert_eq!(data["vocab"], 27, "{v}");
    assert_eq!((&data["train_tokens"], &data["val_tokens"]), (&32_550.into(), &3_574.into()));
    assert_eq!(data["eval_windows"], 223, "{v}");
    let first = serde_json::json!(["jane", "hannelore", "nelly", "terrence", "roger"]);
    assert_eq!(data["first_names"], first, "{v}");
    assert!(dir.join("char_gpt.safetensors").exists());
    // Mixed precision in bf16 (f32 master weights, bf16 products) learns as well.
    let out = Command::new(example("char_gpt"))
        .args(["--steps", "150", "--precision", "bf16", "--json"])
        .current_dir(&dir)
        .output()
        .expect("run char_gpt in bf16");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{stdout}\n{}", String::from_utf8_lossy(&out.stderr));
    let v: Value = serde_json::from_str(stdout.lines().last().unwrap()).expect("a JSON last line");
    assert_eq!((&v["precision"], &v["master"]), (&"bf16".into(), &"f32".into()), "{v}");
    assert!(num(&v, "val_loss") < 2.8, "{v}");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn wavenet_learns_with_batch_norm_and_saves_its_running_statistics() {
    let dir = std::env::temp_dir().join(format!("rocannl-wavenet-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let out = Command::new(example("wavenet"))
        .args(["--steps", "300", "--quick", "--json"])
        .current_dir(&dir)
        .output()
        .expect("run wavenet");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{stdout}\n{}", String::from_utf8_lossy(&out.stderr));
    let v: Value = serde_json::from_str(stdout.lines().last().unwrap()).expect("a JSON last line");
    assert_eq!(v["params"], 76_579, "{v}");
    assert_eq!((&v["examples"]["train"], &v["examples"]["val"]), (&182_463.into(), &22_807.into()));
    // Uniform guessing over 27 symbols is ln 27 ≈ 3.30; evaluated with the running statistics.
    assert!(num(&v, "val_loss") < 2.8, "{v}");
    let saved = std::fs::read(dir.join("wavenet.safetensors")).expect("the checkpoint");
    let header = String::from_utf8_lossy(&saved[8..saved.len().min(4096)]).to_string();
    for name in ["s2.bn.running_mean", "s2.bn.running_var", "s0.linear.w", "emb.table"] {
        assert!(header.contains(name), "{name} missing from the checkpoint: {header}");
    }
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn every_model_of_the_suite_trains_a_step() {
    let list = Command::new(example("suite")).arg("--list").output().expect("run suite --list");
    let names = String::from_utf8_lossy(&list.stdout).to_string();
    let names: Vec<&str> = names.lines().collect();
    assert!(names.len() >= 11, "{names:?}");
    for name in names {
        let out = Command::new(example("suite"))
            .args(["--model", name, "--steps", "1", "--warmup", "0"])
            .output()
            .expect("run suite");
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert!(out.status.success(), "{name}: {stdout}\n{}", String::from_utf8_lossy(&out.stderr));
        let v: Value = serde_json::from_str(stdout.lines().last().unwrap()).expect("JSON");
        assert!(num(&v, "loss").is_finite() && num(&v, "step_s") > 0.0, "{name}: {v}");
        assert!(num(&v, "params") > 0.0, "{name}: {v}");
    }
}

#[test]
fn the_lookup_scale_example_runs_both_ways() {
    for way in [&[][..], &["--onehot"][..]] {
        let out = Command::new(example("lookup_scale"))
            .args(["--vocab", "300", "--dim", "8", "--tokens", "40", "--reps", "1"])
            .args(way)
            .output()
            .expect("run lookup_scale");
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert!(out.status.success(), "{stdout}\n{}", String::from_utf8_lossy(&out.stderr));
        let v: Value = serde_json::from_str(stdout.trim()).expect("JSON");
        let want = if way.is_empty() { "lookup" } else { "onehot" };
        assert_eq!(v["way"], want, "{v}");
        assert!(num(&v, "run_s") > 0.0 && num(&v, "vocab") == 300.0, "{v}");
    }
}

#[test]
fn the_suite_plot_draws_every_model_of_the_committed_results() {
    let dir = tempfile::tempdir().unwrap();
    let svg = dir.path().join("ratios.svg");
    let results =
        concat!(env!("CARGO_MANIFEST_DIR"), "/benches/suite/results/2026-11-27-eager.json");
    let out = Command::new(example("suite_plot"))
        .arg(&svg)
        .arg(results)
        .output()
        .expect("run suite_plot");
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let text = std::fs::read_to_string(&svg).unwrap();
    for model in ["gpt-w64-l2-c16", "gpt-w128-l2-c256", "cnn-digits", "mlp-lm-c8-w200"] {
        assert!(text.contains(model), "{model} missing from the plot");
    }
    assert!(text.contains("PyTorch eager"), "no legend");
    // No result file: an error, not a picture.
    let none = Command::new(example("suite_plot")).arg(dir.path().join("x.svg")).output().unwrap();
    assert!(!none.status.success());
}

//! The command line under hostile or unusual input: usage errors as JSON, sizes that do not fit
//! in 63 bits, deeply nested documents, a reader that goes away, documents whose root is a leaf.

mod common;

use std::io::{Read, Write};
use std::process::{Command, Stdio};

use serde_json::{Value, json};

fn rocannl(args: &[&str], doc: &str) -> (i32, Value) {
    let (rc, v, _) = common::rocannl(args, doc);
    (rc, v)
}

fn kind(v: &Value) -> &str {
    v["error"]["kind"].as_str().unwrap_or("")
}

#[test]
fn usage_errors_are_json_with_exit_status_2() {
    for args in [
        vec!["eval", "--strict", "--strict", "-"],
        vec!["eval", "--frobnicate", "-"],
        vec!["eval"],
        vec!["frobnicate", "-"],
        vec!["eval", "--precision", "f8", "-"],
    ] {
        let (rc, v) = rocannl(&args, r#"{"expr": {"leaf": "range", "n": 2}}"#);
        assert_eq!((rc, kind(&v)), (2, "usage"), "{args:?}: {v}");
        assert!(v["error"]["message"].as_str().is_some_and(|m| !m.is_empty()), "{v}");
    }
}

#[test]
fn sizes_beyond_63_bits_are_shape_errors() {
    let docs = [
        // An axis of 2^63.
        json!({"expr": {"op": "einsum1", "spec": "i => 0", "args": [{"leaf": "range", "n": 9223372036854775808u64}]}}),
        // Two values for 3 · 6148914691236517206 cells (a wrapping product would make it 2).
        json!({"expr": {"leaf": "ndarray", "output": [3, 6148914691236517206u64], "values": [1, 2]}}),
        // A concatenation whose size is 2^63 + 2.
        json!({"expr": {"op": "concat", "spec": "a; b => a^b", "args": [
            {"leaf": "range", "n": 9223372036854775807u64}, {"leaf": "range", "n": 3}]}}),
        // A broadcast whose element count is 2^64.
        json!({"expr": {"op": "add", "args": [{"leaf": "range", "n": 4294967296u64},
            {"leaf": "range_of_shape", "batch": [4294967296u64]}]}}),
    ];
    for doc in docs {
        for cmd in ["shapes", "eval"] {
            let (rc, v) = rocannl(&[cmd, "-"], &doc.to_string());
            assert_eq!((rc, kind(&v)), (1, "shape"), "{cmd} {doc}: {v}");
            assert!(v["error"]["message"].as_str().is_some_and(|m| m.contains("63 bits")), "{v}");
        }
    }
}

#[test]
fn deeply_nested_documents_are_read() {
    let depth = 20_000;
    let doc = format!(
        "{{\"expr\":{}{{\"leaf\":\"range\",\"n\":3}}{}}}",
        "{\"op\":\"neg\",\"args\":[".repeat(depth),
        "]}".repeat(depth)
    );
    let (rc, v) = rocannl(&["shapes", "-"], &doc);
    assert_eq!(rc, 0, "{v}");
    assert_eq!(v["shape"]["output"], json!([3]));
    // Beyond the documented depth: a limit error, not a crash.
    let depth = 100_001;
    let doc = format!(
        "{{\"expr\":{}{{\"leaf\":\"range\",\"n\":3}}{}}}",
        "{\"op\":\"neg\",\"args\":[".repeat(depth),
        "]}".repeat(depth)
    );
    let (rc, v) = rocannl(&["shapes", "-"], &doc);
    assert_eq!((rc, kind(&v)), (1, "limit"), "{v}");
}

#[test]
fn a_reader_that_goes_away_is_no_crash() {
    let doc = json!({"expr": {"op": "einsum1", "spec": "i => i", "args": [{"leaf": "range", "n": 2000000}]}});
    let mut child = Command::new(env!("CARGO_BIN_EXE_rocannl"))
        .args(["eval", "--backend", "interp", "-"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("run rocannl");
    child.stdin.take().expect("stdin").write_all(doc.to_string().as_bytes()).expect("write");
    let mut first = [0u8; 10];
    child.stdout.take().expect("stdout").read_exact(&mut first).expect("the answer starts");
    // Standard output is closed here, with most of the answer unwritten.
    let out = child.wait_with_output().expect("rocannl finishes");
    assert_eq!(out.status.code(), Some(0), "{}", String::from_utf8_lossy(&out.stderr));
    assert!(out.stderr.is_empty(), "{}", String::from_utf8_lossy(&out.stderr));
}

#[test]
fn a_leaf_as_root_is_evaluated() {
    let backends: &[&str] =
        if cfg!(feature = "gccjit") { &["interp", "gccjit"] } else { &["interp"] };
    for be in backends {
        let doc = json!({"expr": {"leaf": "ndarray", "output": [2], "values": [1, 2]}});
        let (rc, v) = rocannl(&["eval", "--backend", be, "-"], &doc.to_string());
        assert_eq!((rc, &v["values"]), (0, &json!([1.0, 2.0])), "{v}");
        let doc = json!({"grad": true, "expr": {"leaf": "param", "name": "w", "input": [], "output": [2],
            "init": {"values": [3, 4]}}});
        let (rc, v) = rocannl(&["eval", "--backend", be, "-"], &doc.to_string());
        assert_eq!((rc, &v["values"]), (0, &json!([3.0, 4.0])), "{v}");
        assert_eq!(v["params"]["w"]["grad"], json!([1.0, 1.0]), "{v}");
    }
}

/// `rocannl bench --json`: one run per backend in the contract's shape, with the document's
/// floating-point operations (a multiply-add counts 2) and a warm compile served by the cache
/// where the backend has one.
#[test]
fn bench_reports_compile_and_run_times() {
    let doc = json!({"expr": {"op": "matmul", "args": [
        {"leaf": "param", "name": "a", "input": [8], "output": [8], "init": {"constant": 1}},
        {"leaf": "param", "name": "b", "input": [8], "output": [8], "init": {"constant": 2}}]}});
    let backends: &[&str] =
        if cfg!(feature = "gccjit") { &["interp", "gccjit"] } else { &["interp"] };
    let mut args = vec!["bench", "--json", "--reps", "3"];
    for b in backends {
        args.extend(["--backend", b]);
    }
    args.push("-");
    let (rc, v) = rocannl(&args, &doc.to_string());
    assert_eq!(rc, 0, "{v}");
    let runs = v["runs"].as_array().expect("runs");
    assert_eq!(runs.len(), backends.len(), "{v}");
    for (run, be) in runs.iter().zip(backends) {
        assert_eq!(run["backend"], json!(be));
        assert_eq!(run["precision"], json!("f32"));
        assert_eq!(run["flops"], json!(2 * 8 * 8 * 8), "{run}");
        assert_eq!(run["run_s"]["reps"], json!(3));
        let t = |k: &str| run["run_s"][k].as_f64().expect("a time");
        assert!(0.0 < t("min") && t("min") <= t("median") && t("median") <= t("max"), "{run}");
        assert!(run["compile_s"]["cold"].as_f64().is_some_and(|c| c > 0.0), "{run}");
        let warm = &run["compile_s"]["warm"];
        if *be == "interp" {
            assert!(warm.is_null(), "the interpreter has no compile cache: {run}");
        } else {
            assert!(warm.as_f64().is_some_and(|w| w > 0.0), "{run}");
        }
    }
}

/// Work and memory are estimated before anything runs: a 100-byte document asking for 10¹²
/// iterations or more memory than allowed is refused at once with kind `limit`, naming the flag
/// that raises the limit.
#[test]
fn work_and_memory_beyond_the_limits_are_refused_before_running() {
    let endless = json!({"expr": {"op": "einsum1", "spec": "i => 0", "args": [{"leaf": "range", "n": 1000000000000u64}]}});
    let started = std::time::Instant::now();
    let (rc, v) = rocannl(&["eval", "-"], &endless.to_string());
    assert_eq!((rc, kind(&v)), (1, "limit"), "{v}");
    assert!(v["error"]["message"].as_str().is_some_and(|m| m.contains("--max-work")), "{v}");
    assert!(started.elapsed().as_secs() < 30, "refused before running");
    let big = json!({"grad": true, "expr": {"leaf": "param", "name": "w", "input": [], "output": [1000000],
        "init": {"constant": 1}}});
    let (rc, v) = rocannl(&["eval", "--max-memory", "1000000", "-"], &big.to_string());
    assert_eq!((rc, kind(&v)), (1, "limit"), "{v}");
    assert!(v["error"]["message"].as_str().is_some_and(|m| m.contains("--max-memory")), "{v}");
    // Raised limits, or none: the same documents' small cousins run.
    let small = json!({"expr": {"op": "einsum1", "spec": "i => 0", "args": [{"leaf": "range", "n": 1000}]}});
    let (rc, v) =
        rocannl(&["eval", "--max-work", "none", "--max-memory", "none", "-"], &small.to_string());
    assert_eq!((rc, &v["values"]), (0, &json!([499500.0])), "{v}");
    let (rc, v) = rocannl(&["eval", "--max-work", "999", "-"], &small.to_string());
    assert_eq!((rc, kind(&v)), (1, "limit"), "{v}");
    let (rc, v) = rocannl(&["eval", "--max-work", "lots", "-"], &small.to_string());
    assert_eq!((rc, kind(&v)), (2, "usage"), "{v}");
}

/// `bench --reps` takes 1 to 1,000,000 timed runs: 0 (which left nothing to report), a count
/// whose records would exhaust memory, one past `u64` or not a number is a usage error (exit
/// status 2) before anything runs; so is an optimization level past 3.
#[test]
fn bench_reps_outside_1_to_a_million_are_usage_errors() {
    let doc = r#"{"expr": {"leaf": "range", "n": 2}}"#;
    let bench = |extra: &[&str]| {
        let mut args = vec!["bench", "--backend", "interp", "--json"];
        args.extend(extra);
        args.push("-");
        rocannl(&args, doc)
    };
    for reps in
        ["0", "1000001", "2000000000", "18446744073709551615", "18446744073709551616", "-1", "x"]
    {
        let started = std::time::Instant::now();
        let (rc, v) = bench(&[&format!("--reps={reps}")]);
        assert_eq!((rc, kind(&v)), (2, "usage"), "--reps {reps}: {v}");
        assert!(v["error"]["message"].as_str().is_some_and(|m| m.contains("--reps")), "{v}");
        assert!(started.elapsed().as_secs() < 30, "--reps {reps} is refused at once");
    }
    let (rc, v) = bench(&["--opt-level", "4"]);
    assert_eq!((rc, kind(&v)), (2, "usage"), "{v}");
    // The smallest count is one run, with figures.
    let (rc, v) = bench(&["--reps", "1"]);
    assert_eq!(rc, 0, "{v}");
    let run = &v["runs"][0]["run_s"];
    assert_eq!(run["reps"], json!(1), "{v}");
    assert!(["median", "min", "max"].iter().all(|k| run[k].as_f64().is_some()), "{v}");
}

/// The default work limit is the backend's: the interpreter refuses at once a 90-byte document
/// it would take minutes over (it was allowed 10¹¹ operations, 40 minutes of its time), saying
/// which limit, the estimate, and the flag; native code runs the smaller one in seconds.
#[test]
fn the_default_work_limit_is_the_backends() {
    let sum = |n: u64| {
        json!({"expr": {"op": "einsum1", "spec": "i => 0", "args": [{"leaf": "range", "n": n}]}})
            .to_string()
    };
    for n in [2_000_000_000u64, 100_000_000_000] {
        let started = std::time::Instant::now();
        let (rc, v) = rocannl(&["eval", "--backend", "interp", "-"], &sum(n));
        assert_eq!((rc, kind(&v)), (1, "limit"), "{v}");
        let m = v["error"]["message"].as_str().unwrap_or_default();
        // Two statements per term: the term into its local, then into the f64 sum.
        assert!(m.contains(&format!("needs {} operations of work", 2 * n + 2)), "{m}");
        assert!(m.contains("above the limit of 1000000000 operations"), "{m}");
        assert!(m.contains("interp backend's default") && m.contains("--max-work"), "{m}");
        assert!(started.elapsed().as_secs() < 10, "refused before running");
    }
    // An explicit limit is no backend's default.
    let (rc, v) = rocannl(&["eval", "--backend", "interp", "--max-work", "10", "-"], &sum(100));
    assert_eq!((rc, kind(&v)), (1, "limit"), "{v}");
    assert!(v["error"]["message"].as_str().is_some_and(|m| !m.contains("default")), "{v}");
    if cfg!(feature = "gccjit") {
        let started = std::time::Instant::now();
        // 1.2·10⁹ operations: past the interpreter's default, within native code's.
        let (rc, v) = rocannl(&["eval", "--backend", "gccjit", "-"], &sum(600_000_000));
        assert_eq!(rc, 0, "{v}");
        assert!(v["values"][0].as_f64().is_some_and(|x| x > 0.0), "{v}");
        eprintln!("gccjit: 1.2·10⁹ operations in {:.1} s", started.elapsed().as_secs_f64());
    }
}

/// A param's explicit init values that do not fill its inferred shape are an `input` error
/// naming the param, found by `shapes` already.
#[test]
fn init_values_that_do_not_fill_the_inferred_shape_name_the_param() {
    let doc = json!({"expr": {"op": "matmul", "args": [
        {"leaf": "param", "name": "w", "init": {"values": [1, 2, 3]}},
        {"leaf": "ndarray", "output": [2], "values": [1, 2]}]}});
    for cmd in ["shapes", "eval"] {
        let (rc, v) = rocannl(&[cmd, "-"], &doc.to_string());
        assert_eq!((rc, kind(&v)), (1, "input"), "{cmd}: {v}");
        let m = v["error"]["message"].as_str().unwrap_or("");
        assert!(m.contains("param w") && m.contains("3 values"), "{m}");
    }
}

/// Tensors of very high rank are inferred and evaluated (closing a row resumes where it left
/// off, axes of size 1 get no loop, and the solver's budget grows with the graph): 50,000 axes
/// of size 1 and a few larger ones, on both backends. Such a graph used to be cubic in the rank
/// (minutes), and a million axes "did not converge"; the figures are in docs/testing.md.
#[test]
fn tensors_of_very_high_rank_are_evaluated() {
    let n = 50_000;
    let mut dims = vec![1usize; n];
    dims[7] = 2;
    dims[n - 1] = 3;
    let doc = json!({"expr": {"op": "add", "args": [
        {"op": "exp", "args": [{"op": "log", "args": [{"leaf": "range_of_shape", "output": dims}]}]},
        {"op": "einsum1", "spec": "...->... => ...->...", "args": [
            {"leaf": "range_of_shape", "output": dims}]}
    ]}})
    .to_string();
    let (rc, v) = rocannl(&["shapes", "-"], &doc);
    assert_eq!(rc, 0, "{v}");
    assert_eq!(v["shape"]["output"].as_array().unwrap().len(), n);
    for backend in ["interp", "gccjit"] {
        let (rc, v) = rocannl(&["eval", "--backend", backend, "-"], &doc);
        assert_eq!(rc, 0, "{backend}: {v}");
        let values: Vec<f64> =
            v["values"].as_array().unwrap().iter().map(|x| x.as_f64().unwrap()).collect();
        let want: Vec<f64> = (0..6).map(|i| 2.0 * i as f64).collect();
        assert!(
            values.iter().zip(&want).all(|(a, b)| (a - b).abs() < 1e-12),
            "{backend}: {values:?}"
        );
        assert_eq!(values.len(), 6, "{backend}");
    }
}

/// `--plot` draws compile and run times per backend and optimization level into an SVG file
/// (gccjit at each of -O0..-O3), and leaves the JSON answer as it is: one run per backend.
#[test]
fn bench_plots_every_backend_and_optimization_level() {
    let doc = json!({"expr": {"op": "matmul", "args": [
        {"leaf": "param", "name": "a", "input": [8], "output": [8], "init": {"constant": 1}},
        {"leaf": "param", "name": "b", "input": [8], "output": [8], "init": {"constant": 2}}]}});
    let backends: &[&str] =
        if cfg!(feature = "gccjit") { &["interp", "gccjit"] } else { &["interp"] };
    let path = std::env::temp_dir().join(format!("rocannl-plot-{}.svg", std::process::id()));
    let path_s = path.display().to_string();
    let mut args = vec!["bench", "--json", "--reps", "2", "--plot", &path_s];
    for b in backends {
        args.extend(["--backend", b]);
    }
    args.push("-");
    let (rc, v) = rocannl(&args, &doc.to_string());
    assert_eq!(rc, 0, "{v}");
    assert_eq!(v["runs"].as_array().map(Vec::len), Some(backends.len()), "{v}");
    let svg = std::fs::read_to_string(&path).expect("the plot");
    assert!(svg.starts_with("<svg") && svg.trim_end().ends_with("</svg>"));
    let mut labels = vec!["interp".to_string()];
    if cfg!(feature = "gccjit") {
        labels.extend((0..=3).map(|l| format!("gccjit -O{l}")));
    }
    for label in labels.iter().chain(&["compile (s): cold | warm".to_string()]) {
        assert!(svg.contains(label.as_str()), "no '{label}' in the plot");
    }
    // One bar per configuration and panel at least (and the warm bars of gccjit's).
    assert!(svg.matches("<rect").count() > 2 * labels.len(), "{svg}");
    let _ = std::fs::remove_file(&path);
    // A plot that cannot be written is an error, not a panic.
    let bad = "/nonexistent-folder/plot.svg";
    let (rc, v) = rocannl(
        &["bench", "--reps", "1", "--backend", "interp", "--plot", bad, "-"],
        &doc.to_string(),
    );
    assert_eq!(rc, 1, "{v}");
    assert!(v["error"]["message"].as_str().is_some_and(|m| m.contains("plot.svg")), "{v}");
}

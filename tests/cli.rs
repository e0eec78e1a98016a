//! The `rocannl` command against its JSON contract: answers, error kinds, strict mode, and a
//! sweep of mutated documents that must always get one JSON object and never a panic.

mod common;

use std::io::Write;
use std::process::{Command, Stdio};

use serde_json::{Value, json};

fn rocannl(args: &[&str], doc: &str) -> (i32, Value, String) {
    let mut all = args.to_vec();
    all.push("-");
    common::rocannl(&all, doc)
}

fn kind(v: &Value) -> &str {
    v["error"]["kind"].as_str().unwrap_or("")
}

/// `eval` on the `interp` and `gccjit` backends (in f64): both must succeed with the same
/// answer, which is returned.
fn eval_both(doc: &Value) -> Value {
    let mut answers = ["interp", "gccjit"].map(|b| {
        let (rc, v, stderr) =
            rocannl(&["eval", "--backend", b, "--precision", "f64"], &doc.to_string());
        assert_eq!(rc, 0, "{b}: {doc} -> {v} {stderr}");
        v
    });
    assert_eq!(answers[0], answers[1], "interp and gccjit disagree on {doc}");
    std::mem::take(&mut answers[0])
}

#[test]
fn shapes_and_values() {
    let doc = json!({"expr": {"op": "add", "args": [
        {"op": "matmul", "args": [{"leaf": "param", "name": "w", "init": {"constant": 1}},
                                   {"leaf": "ndarray", "values": [1, 2, 3], "output": [3]}]},
        {"leaf": "param", "name": "b", "output": [2], "init": {"values": [10, 20]}}]}, "grad": true});
    let (rc, v, _) = rocannl(&["shapes"], &doc.to_string());
    assert_eq!(rc, 0, "{v}");
    assert_eq!(v["shape"], json!({"batch": [], "input": [], "output": [2]}));
    assert_eq!(v["params"]["w"]["shape"], json!({"batch": [], "input": [3], "output": [2]}));
    // b's input row was omitted and nothing bounds it: closing guessed "no axes".
    assert_eq!(v["warnings"].as_array().map(Vec::len), Some(1), "{v}");
    assert!(v["warnings"][0].as_str().is_some_and(|w| w.contains("param b")), "{v}");
    let (rc, v, _) =
        rocannl(&["eval", "--backend", "interp", "--precision", "f64"], &doc.to_string());
    assert_eq!(rc, 0, "{v}");
    assert_eq!(v["values"], json!([16.0, 26.0]));
    assert_eq!(v["params"]["w"]["grad"], json!([1.0, 2.0, 3.0, 1.0, 2.0, 3.0]));
    assert_eq!(v["params"]["b"]["grad"], json!([1.0, 1.0]));
}

#[test]
fn non_finite_values_are_strings() {
    let doc = json!({"expr": {"op": "div", "args": [
        {"leaf": "ndarray", "values": [1, -1, 0], "output": [3]},
        {"leaf": "number", "value": 0}]}});
    let (rc, v, _) = rocannl(&["eval"], &doc.to_string());
    assert_eq!(rc, 0);
    assert_eq!(v["values"], json!(["inf", "-inf", "nan"]));
}

#[test]
fn every_error_kind() {
    let cases = [
        ("json", "{\"expr\": "),
        ("input", r#"{"expr": {"op": "frobnicate", "args": []}}"#),
        (
            "input",
            r#"{"expr": {"op": "relu", "args": [{"leaf": "range", "n": 2}, {"leaf": "range", "n": 2}]}}"#,
        ),
        ("input", r#"{"grad": false}"#),
        ("input", r#"{"expr": {"leaf": "ndarray", "values": [1, 2], "output": [3]}}"#),
        ("input", r#"{"expr": {"ref": "nowhere"}}"#),
        (
            "input",
            r#"{"expr": {"op": "einsum", "spec": "i => i", "args": [{"leaf": "range", "n": 2}, {"leaf": "range", "n": 2}]}}"#,
        ),
        (
            "spec",
            r#"{"expr": {"op": "einsum1", "spec": "ij", "args": [{"leaf": "range", "n": 2}]}}"#,
        ),
        (
            "shape",
            r#"{"expr": {"op": "add", "args": [{"leaf": "range", "n": 2}, {"leaf": "range", "n": 3}]}}"#,
        ),
        (
            "shape",
            r#"{"expr": {"op": "batch_slice", "index": 0, "args": [{"leaf": "range", "n": 2}]}}"#,
        ),
    ];
    for (want, doc) in cases {
        let (rc, v, stderr) = rocannl(&["eval"], doc);
        assert_eq!(kind(&v), want, "{doc} -> {v}");
        assert_eq!(rc, 1, "{doc}");
        assert!(v["error"]["message"].as_str().is_some_and(|m| !m.is_empty()), "{doc}");
        assert!(!stderr.contains("panicked"), "{doc}: {stderr}");
    }
    let (rc, v, _) =
        rocannl(&["eval", "--backend", "tpu"], r#"{"expr": {"leaf": "range", "n": 2}}"#);
    assert_eq!((rc, kind(&v)), (1, "backend"));
}

#[test]
fn shape_errors_name_the_operation() {
    let doc = r#"{"expr": {"op": "matmul", "name": "prod", "args": [
        {"leaf": "range_of_shape", "input": [4], "output": [3]},
        {"leaf": "range_of_shape", "input": [7], "output": [5]}]}}"#;
    let (_, v, _) = rocannl(&["shapes"], doc);
    let msg = v["error"]["message"].as_str().unwrap_or("");
    assert!(msg.contains("matmul 'prod'"), "{msg}");
    assert!(msg.contains('4') && msg.contains('5'), "{msg}");
}

#[test]
fn strict_mode_rejects_guesses() {
    let doc = r#"{"expr": {"op": "relu", "args": [{"leaf": "param", "name": "p"}]}}"#;
    let (rc, v, _) = rocannl(&["shapes"], doc);
    assert_eq!(rc, 0);
    assert!(v["warnings"][0].as_str().is_some_and(|w| w.contains("param p")), "{v}");
    let (rc, v, _) = rocannl(&["shapes", "--strict"], doc);
    assert_eq!((rc, kind(&v)), (1, "shape"));
}

#[test]
fn explain_shows_loop_nests() {
    let doc = r#"{"expr": {"op": "einsum", "spec": "ij; jk => ik", "args": [
        {"leaf": "range_of_shape", "output": [2, 3]}, {"leaf": "range_of_shape", "output": [3, 4]}]}}"#;
    let out = Command::new(env!("CARGO_BIN_EXE_rocannl"))
        .args(["explain", "-"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .and_then(|mut c| {
            c.stdin.take().expect("stdin").write_all(doc.as_bytes())?;
            c.wait_with_output()
        })
        .expect("run explain");
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("shape |->2,4"), "{text}");
    assert!(text.contains("for i2 in 0..3:"), "{text}");
    assert!(text.contains("+="), "{text}");
}

/// Mutates valid documents byte by byte (deterministically) and checks every answer is one JSON
/// object with exit status 0 or 1 — never a crash, a panic or a hang.
#[test]
fn mutated_documents_never_panic() {
    let seeds = [
        r#"{"expr": {"op": "einsum", "spec": "...|i->h; ...|h->o => ...|i->o", "args": [{"leaf": "range_of_shape", "batch": [2], "input": [3], "output": [4]}, {"leaf": "param", "name": "w"}]}, "grad": true}"#,
        r#"{"expr": {"op": "concat", "spec": "a, j; b, j => a^b, j", "args": [{"leaf": "param", "name": "x"}, {"leaf": "range_of_shape", "output": [6, 4]}]}}"#,
        r#"{"expr": {"op": "tropical", "spec": "... | 2*oh+wh, ..c..; wh => ... | oh, ..c..", "args": [{"leaf": "range_of_shape", "output": [6, 2]}, {"leaf": "ndarray", "values": [0, 0], "output": [2]}]}}"#,
    ];
    let alphabet = b"{}[]:,\"0123456789.-+*^|>=;ahijkostvwxn ";
    let mut state = 0x9E37_79B9_7F4A_7C15u64;
    let mut next = || {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        state
    };
    for seed in seeds {
        for _ in 0..25 {
            let mut bytes = seed.as_bytes().to_vec();
            for _ in 0..(1 + next() % 3) {
                let pos = (next() as usize) % bytes.len();
                match next() % 3 {
                    0 => bytes[pos] = alphabet[(next() as usize) % alphabet.len()],
                    1 => {
                        bytes.remove(pos);
                    }
                    _ => bytes.insert(pos, alphabet[(next() as usize) % alphabet.len()]),
                }
            }
            let doc = String::from_utf8_lossy(&bytes).to_string();
            for cmd in ["shapes", "eval"] {
                let (rc, v, stderr) = rocannl(&[cmd, "--backend", "interp"], &doc);
                assert!(rc == 0 || rc == 1, "{doc}: exit {rc}");
                assert!(v.is_object(), "{doc}: not one JSON object");
                assert!(
                    !stderr.contains("panicked") && !stderr.contains("internal error"),
                    "{doc}: {stderr}"
                );
                assert!(
                    (rc == 0) == v.get("error").is_none(),
                    "{doc}: exit status and error object disagree: {v}"
                );
            }
        }
    }
}

#[test]
fn a_repeated_param_may_state_the_empty_batch_row_it_omitted() {
    let w = |rows: Value| {
        let mut p = json!({"leaf": "param", "name": "w"});
        p.as_object_mut().expect("object").extend(rows.as_object().expect("object").clone());
        p
    };
    let init = json!({"values": [1, 2]});
    // The first occurrence omits the batch row and a later one states it as [], or the other
    // way round: one param either way.
    for args in [
        [w(json!({"output": [2], "init": init})), w(json!({"batch": []}))],
        [w(json!({"batch": [], "output": [2], "init": init})), w(json!({}))],
    ] {
        let doc = json!({"expr": {"op": "add", "args": args}});
        let v = eval_both(&doc);
        assert_eq!(v["values"], json!([2.0, 4.0]), "{doc}");
        assert_eq!(v["params"]["w"]["shape"], json!({"batch": [], "input": [], "output": [2]}));
    }
    // A batch row other than the omitted (empty) one is still a conflict.
    let doc = json!({"expr": {"op": "add", "args": [
        w(json!({"output": [2]})), w(json!({"batch": [3]}))]}});
    let (rc, v, _) = rocannl(&["shapes"], &doc.to_string());
    assert_eq!((rc, kind(&v)), (1, "input"), "{v}");
}

/// A param repeated with the same init is one param even when the init holds NaN (NaN is
/// not `==` to itself, but it is the same init); a really different init is still a conflict.
#[test]
fn a_repeated_param_with_an_identical_nan_init_is_one_param() {
    let w = |init: Value| json!({"leaf": "param", "name": "w", "output": [2], "init": init});
    for init in [
        json!({"constant": "nan"}),
        json!({"values": ["nan", 1.5]}),
        json!({"values": ["inf", "-inf"]}),
        json!({"uniform": ["nan", 1], "seed": 3}),
    ] {
        let doc = json!({"expr": {"op": "add", "args": [w(init.clone()), w(init.clone())]}});
        let (rc, v, _) = rocannl(&["shapes"], &doc.to_string());
        assert_eq!(rc, 0, "{doc}: {v}");
        assert_eq!(v["params"].as_object().map(|p| p.len()), Some(1), "{v}");
    }
    let doc = json!({"expr": {"op": "add", "args": [w(json!({"constant": "nan"})), w(json!({"constant": "nan"}))]}});
    let (rc, v, _) = rocannl(&["eval", "--backend", "interp"], &doc.to_string());
    assert_eq!((rc, &v["values"]), (0, &json!(["nan", "nan"])), "{v}");
    for (a, b) in [
        (json!({"constant": "nan"}), json!({"constant": 1})),
        (json!({"values": ["nan", 1]}), json!({"values": ["nan", 2]})),
        (json!({"constant": "inf"}), json!({"constant": "-inf"})),
        (json!({"uniform": ["nan", 1], "seed": 3}), json!({"uniform": ["nan", 1], "seed": 4})),
    ] {
        let doc = json!({"expr": {"op": "add", "args": [w(a), w(b)]}});
        let (rc, v, _) = rocannl(&["shapes"], &doc.to_string());
        assert_eq!((rc, kind(&v)), (1, "input"), "{doc}: {v}");
        assert!(v["error"]["message"].as_str().is_some_and(|m| m.contains("different init")));
    }
}

fn range(n: usize) -> Value {
    json!({"leaf": "range", "n": n})
}

fn ndarray(output: &[usize], values: &[f64]) -> Value {
    json!({"leaf": "ndarray", "output": output, "values": values})
}

fn einsum(spec: &str, args: &[Value]) -> Value {
    let op = if args.len() == 1 { "einsum1" } else { "einsum" };
    json!({"op": op, "spec": spec, "args": args})
}

/// Evaluates an expression on both backends: its output row and values.
fn output_and_values(expr: Value) -> (Value, Value) {
    let v = eval_both(&json!({ "expr": expr }));
    assert_eq!(v["shape"]["batch"], json!([]), "{v}");
    assert_eq!(v["shape"]["input"], json!([]), "{v}");
    (v["shape"]["output"].clone(), v["values"].clone())
}

#[test]
fn a_convolution_kernel_of_size_one_is_one_tap() {
    let (shape, values) =
        output_and_values(einsum("2*o+k; k => o", &[range(5), ndarray(&[1], &[1.0])]));
    assert_eq!((shape, values), (json!([3]), json!([0.0, 2.0, 4.0])));
    let x = json!({"leaf": "range_of_shape", "output": [2, 1]});
    let (shape, values) =
        output_and_values(einsum("o+2*k, c; k => o, c", &[x, ndarray(&[1], &[1.0])]));
    assert_eq!((shape, values), (json!([2, 1]), json!([0.0, 1.0])));
    // A scalar kernel lacks the kernel axis: one tap.
    let two = json!({"leaf": "number", "value": 2});
    let (shape, values) = output_and_values(einsum("o+k; k => o", &[range(4), two]));
    assert_eq!((shape, values), (json!([4]), json!([0.0, 2.0, 4.0, 6.0])));
}

#[test]
fn a_convolution_kernel_of_size_zero_has_no_window() {
    for spec in ["o+k; k => o", "2*o+3*k; k => o"] {
        let (shape, values) = output_and_values(einsum(spec, &[range(7), ndarray(&[0], &[])]));
        assert_eq!((shape, values), (json!([0]), json!([])), "{spec}");
    }
}

#[test]
fn a_pure_stride_axis_over_an_empty_axis_is_empty() {
    let (shape, values) = output_and_values(einsum("2*o => o", &[range(0)]));
    assert_eq!((shape, values), (json!([0]), json!([])));
}

#[test]
fn a_stride_of_one_reads_every_position() {
    let (shape, values) = output_and_values(einsum("1*o => o", &[range(4)]));
    assert_eq!((shape, values), (json!([4]), json!([0.0, 1.0, 2.0, 3.0])));
}

#[test]
fn a_fixed_index_placement_feeds_a_convolution() {
    let placed = einsum("e => 3", &[ndarray(&[1], &[5.0])]);
    let (shape, values) =
        output_and_values(einsum("o+k ; k => o", &[placed, ndarray(&[2], &[1.0, 10.0])]));
    assert_eq!((shape, values), (json!([3]), json!([0.0, 0.0, 50.0])));
}

fn concat(spec: &str, args: &[Value]) -> Value {
    json!({"op": "concat", "spec": spec, "args": args})
}

#[test]
fn a_label_repeated_in_a_concatenation_writes_each_part_at_its_offset() {
    let (shape, values) = output_and_values(concat("a; a => a^a", &[range(2), range(2)]));
    assert_eq!((shape, values), (json!([4]), json!([0.0, 1.0, 0.0, 1.0])));
    let b = ndarray(&[3], &[10.0, 11.0, 12.0]);
    let c = ndarray(&[2], &[20.0, 21.0]);
    let (shape, values) = output_and_values(concat("a; b; a => a^b^a", &[range(2), b, c]));
    let want = json!([0.0, 1.0, 10.0, 11.0, 12.0, 20.0, 21.0]);
    assert_eq!((shape, values), (json!([7]), want));
    let b = ndarray(&[3], &[10.0, 11.0, 12.0]);
    let (shape, values) = output_and_values(concat("a; b => b^a", &[range(2), b]));
    assert_eq!((shape, values), (json!([5]), json!([10.0, 11.0, 12.0, 0.0, 1.0])));
}

/// A concatenated axis whose parts cannot be filled is a spec error already when only shapes
/// are asked for (it used to pass `shapes` and fail `eval` as an input error), naming the spec.
#[test]
fn a_concatenation_that_cannot_be_filled_is_a_spec_error_at_shapes_time() {
    let cases = [
        (einsum("a^b => a", &[range(3)]), "a^b => a"),
        (concat("a; c => a^b", &[range(2), range(3)]), "a; c => a^b"),
        (concat("a; b => a^a", &[range(2), range(3)]), "a; b => a^a"),
        (einsum("a; b => a^b", &[range(2), range(3)]), "a; b => a^b"),
    ];
    for (expr, spec) in cases {
        let doc = json!({ "expr": expr }).to_string();
        for cmd in ["shapes", "eval"] {
            let (rc, v, _) = rocannl(&[cmd], &doc);
            assert_eq!((rc, kind(&v)), (1, "spec"), "{cmd} {doc}: {v}");
            let msg = v["error"]["message"].as_str().unwrap_or("");
            assert!(msg.contains(&format!("\"{spec}\"")), "{msg}");
        }
    }
}

#[test]
fn a_batch_slice_of_a_composite_with_two_batch_axes() {
    let x = json!({"leaf": "ndarray", "batch": [2, 3], "values": [1, 2, 3, 4, 5, 6]});
    let expr = json!({"op": "batch_slice", "index": 1, "args": [{"op": "neg", "args": [x]}]});
    let v = eval_both(&json!({ "expr": expr }));
    assert_eq!(v["shape"], json!({"batch": [3], "input": [], "output": []}));
    assert_eq!(v["values"], json!([-4.0, -5.0, -6.0]));
}

/// A row variable after a label on an einsum's result side, added to a param of more axes:
/// the results NumPy's broadcasting gives, whichever argument comes first.
#[test]
fn a_result_row_variable_after_a_label_broadcasts_like_numpy() {
    let param = |name: &str, output: &[usize], values: &[f64]| json!({"leaf": "param", "name": name, "output": output, "init": {"values": values}});
    let tens = [10.0, 20.0, 30.0, 40.0, 50.0, 60.0];
    let x = param("x", &[2], &[1.0, 2.0]);
    let y = param("y", &[3, 2], &tens);
    let e = einsum("m => m...", &[x]);
    for args in [[e.clone(), y.clone()], [y, e]] {
        let (shape, values) = output_and_values(json!({"op": "add", "args": args}));
        assert_eq!(shape, json!([3, 2]));
        assert_eq!(values, json!([11.0, 22.0, 31.0, 42.0, 51.0, 62.0]));
    }
    let x = param("x", &[2, 3], &[1.0, 2.0, 3.0, 4.0, 5.0, 6.0]);
    let y = param("y", &[2, 3], &tens);
    let e = einsum("i... => i...", &[json!({"op": "neg", "args": [x]})]);
    for args in [[y.clone(), e.clone()], [e, y]] {
        let (shape, values) = output_and_values(json!({"op": "add", "args": args}));
        assert_eq!(shape, json!([2, 3]));
        assert_eq!(values, json!([9.0, 18.0, 27.0, 36.0, 45.0, 54.0]));
    }
}

//! Values and gradients the command computes, checked against independently known answers on
//! every CPU backend and precision: the regressions of wrong answers found by differential and
//! adversarial testing, each named after what it checks.

mod common;

use serde_json::{Value, json};

/// Runs `rocannl eval` on a document and returns its JSON answer.
fn eval(doc: &Value, backend: &str, prec: &str) -> Value {
    common::rocannl(&["eval", "--backend", backend, "--precision", prec, "-"], &doc.to_string()).1
}

/// The CPU backends this build has.
fn backends() -> Vec<&'static str> {
    if cfg!(feature = "gccjit") { vec!["interp", "gccjit"] } else { vec!["interp"] }
}

fn numbers(v: &Value) -> Vec<f64> {
    v.as_array()
        .unwrap_or_else(|| panic!("a list of numbers, not {v}"))
        .iter()
        .map(|x| x.as_f64().unwrap_or_else(|| panic!("a number, not {x}")))
        .collect()
}

/// Every cell of `where(one_hot, a, -a)` takes the branch its condition names, for every
/// position of the one and every small shape: compiled code once returned 0 for the cell whose
/// condition held (a conditional load that GCC 12 vectorized with the wrong mask).
#[test]
fn where_takes_the_selected_branch_in_every_cell() {
    for be in backends() {
        for prec in ["f32", "f64"] {
            for rows in 1..=5usize {
                for cols in 1..=4usize {
                    let n = rows * cols;
                    let a: Vec<f64> = (0..n).map(|i| 10.0 + i as f64).collect();
                    for pos in 0..n {
                        let mut cond = vec![0.0; n];
                        cond[pos] = 1.0;
                        let leaf = json!({"leaf": "ndarray", "output": [rows, cols], "values": a});
                        let doc = json!({"expr": {"op": "where", "args": [
                            {"leaf": "ndarray", "output": [rows, cols], "values": cond},
                            leaf, {"op": "neg", "args": [leaf]}]}});
                        let want: Vec<f64> = a
                            .iter()
                            .enumerate()
                            .map(|(i, x)| if i == pos { *x } else { -x })
                            .collect();
                        let got = eval(&doc, be, prec);
                        assert_eq!(
                            numbers(&got["values"]),
                            want,
                            "{be} {prec} {rows}x{cols} at {pos}"
                        );
                    }
                }
            }
        }
    }
}

/// The gradient of `where` flows to the selected branch only, cell by cell.
#[test]
fn where_gradient_follows_the_condition() {
    let cond = [0.0, 0.0, 0.0, 0.0, 1.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 1.0];
    let doc = json!({"grad": true, "expr": {"op": "where", "args": [
        {"leaf": "ndarray", "output": [4, 3], "values": cond},
        {"leaf": "param", "name": "a", "output": [4, 3], "input": [],
         "init": {"values": (10..22).collect::<Vec<i32>>()}},
        {"op": "pointmul", "args": [{"leaf": "param", "name": "a"}, {"leaf": "number", "value": 3}]}]}});
    let want: Vec<f64> = cond.iter().map(|c| if *c != 0.0 { 1.0 } else { 3.0 }).collect();
    for be in backends() {
        for prec in ["f32", "f64"] {
            let got = eval(&doc, be, prec);
            assert_eq!(numbers(&got["params"]["a"]["grad"]), want, "{be} {prec}: {got}");
        }
    }
}

/// `min` sends the gradient to the smaller argument only. Compiled code once split a routine
/// into functions between a local's assignment and its use, so the comparison read an
/// uninitialized value and found ties (or the wrong winner) that were not there.
#[test]
fn min_gradient_goes_to_the_smaller_argument_only() {
    let r = json!({"leaf": "param", "name": "r", "batch": [2], "output": [], "init": {"values": [0.25, -0.75]}});
    // min(sum r, sum_z place(tanh(r)·0.5)[1, z]) = min(-0.5, tanh(-0.75)/2 ≈ -0.318) = sum r.
    let doc = json!({"grad": true, "expr": {"op": "min", "args": [
        {"op": "einsum1", "spec": "z| => |", "args": [r]},
        {"op": "einsum1", "spec": "1z| => |", "args": [{"op": "einsum", "spec": "p| ; => p1|", "args": [
            {"op": "tanh", "args": [{"leaf": "param", "name": "r"}]}, {"leaf": "number", "value": 0.5}]}]}]}});
    // min(q, min(sum sum r, max max 1)) with q = -0.3: the inner minimum -0.5 wins.
    let nested = json!({"grad": true, "expr": {"op": "min", "args": [
        {"op": "einsum1", "spec": "z| => |", "args": [{"leaf": "param", "name": "q", "init": {"constant": -0.3}}]},
        {"op": "min", "args": [
            {"op": "einsum1", "spec": "z| => |", "args": [{"op": "einsum1", "spec": "z| => |", "args": [r]}]},
            {"op": "einmax1", "spec": "z| => |", "args": [{"op": "einmax1", "spec": "z| => |", "args": [
                {"leaf": "number", "value": 1}]}]}]}]}});
    for be in backends() {
        for prec in ["f32", "f64"] {
            let got = eval(&doc, be, prec);
            assert_eq!(numbers(&got["values"]), [-0.5], "{be} {prec}: {got}");
            assert_eq!(numbers(&got["params"]["r"]["grad"]), [1.0, 1.0], "{be} {prec}: {got}");
            let got = eval(&nested, be, prec);
            assert_eq!(numbers(&got["values"]), [-0.5], "{be} {prec}: {got}");
            assert_eq!(numbers(&got["params"]["r"]["grad"]), [1.0, 1.0], "{be} {prec}: {got}");
            assert_eq!(numbers(&got["params"]["q"]["grad"]), [0.0], "{be} {prec}: {got}");
        }
    }
}

/// Every backend computes in the declared precision: in `f32`, `exp(100)` overflows to
/// infinity before `log` sees it, on the interpreter as in compiled code, and `log(exp(1))` is
/// the `f32` functions' (every backend's) composition, here as the library computes it in an
/// `f32` session.
#[test]
fn intermediates_are_computed_in_the_declared_precision() {
    let doc = json!({"expr": {"op": "log", "args": [{"op": "exp", "args": [
        {"leaf": "ndarray", "output": [2], "values": [100, 1]}]}]}});
    let f32_composition = {
        use rocannl::tensor::{BackendKind, Graph, Prec, Session, SessionOptions};
        let g = Graph::new();
        let y = g.vector("x", &[1.0]).exp().log();
        let opts = SessionOptions {
            backend: BackendKind::Interp,
            prec: Prec::F32,
            ..SessionOptions::default()
        };
        let mut s = Session::with_options(&g, opts).unwrap();
        let r = s.forward(&[&y]).unwrap();
        s.run(&r).unwrap();
        s.read(&y).unwrap()[0]
    };
    // Within two roundings of exactly 1.
    assert!((f32_composition - 1.0f64.exp().ln()).abs() <= 2f64.powi(-24) * 1.5);
    for be in backends() {
        let got = eval(&doc, be, "f32");
        assert_eq!(got["values"][0], json!("inf"), "{be}: {got}");
        assert_eq!(got["values"][1].as_f64(), Some(f32_composition), "{be}: {got}");
        let got = eval(&doc, be, "f64");
        assert_eq!(numbers(&got["values"]), [100.0, 1.0f64.exp().ln()], "{be}: {got}");
    }
}

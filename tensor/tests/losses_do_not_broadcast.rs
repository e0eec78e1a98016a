//! A loss pairs predictions with targets cell for cell: shapes that would broadcast (a
//! leftover axis of size 1, an ids tensor given as dense targets) are shape errors naming both
//! tensors, as PyTorch refuses them — never a mean over batch × batch pairs.

use rocannl_tensor::nn::loss;
use rocannl_tensor::{Axes, Graph, ParamSpec, Session};

fn value(g: &Graph, t: &rocannl_tensor::Tensor) -> Result<f64, String> {
    let mut s = Session::new(g).map_err(|e| e.to_string())?;
    let r = s.forward(&[t]).map_err(|e| e.to_string())?;
    s.run(&r).map_err(|e| e.to_string())?;
    Ok(s.read(t).map_err(|e| e.to_string())?[0])
}

#[test]
fn sparse_cross_entropy_refuses_logits_with_a_leftover_axis_of_one() {
    let g = Graph::new();
    let logits = g.ndarray(
        "logits",
        Axes::new().batch(&[3, 1]).output(&[2]),
        &[0.0, 0.0, 0.0, 5.0, 5.0, 0.0],
    );
    let labels = g.ndarray("labels", Axes::new().batch(&[3]), &[0.0, 1.0, 0.0]);
    let l = loss::sparse_cross_entropy(&logits, &labels, loss::Reduction::Mean);
    let err = value(&g, &l).unwrap_err();
    assert!(err.contains("logits") && err.contains("labels"), "{err}");
    // The right shapes give the right value (0.2355 in the user's report).
    let g = Graph::new();
    let logits =
        g.ndarray("logits", Axes::new().batch(&[3]).output(&[2]), &[0.0, 0.0, 0.0, 5.0, 5.0, 0.0]);
    let labels = g.ndarray("labels", Axes::new().batch(&[3]), &[0.0, 1.0, 0.0]);
    let l = loss::sparse_cross_entropy(&logits, &labels, loss::Reduction::Mean);
    let expect = (2f64.ln() + 2.0 * (1.0 + (-5f64).exp()).ln()) / 3.0;
    assert!((value(&g, &l).unwrap() - expect).abs() < 1e-6);
}

#[test]
fn dense_cross_entropy_refuses_ids_as_targets() {
    let g = Graph::new();
    let logits = g.ndarray("logits", Axes::new().batch(&[2]).output(&[3]), &[0.0; 6]);
    let ids = g.ids("ids", Axes::new().batch(&[2]));
    let l = loss::cross_entropy(&logits, &ids, loss::Reduction::Mean);
    let err = value(&g, &l).unwrap_err();
    assert!(err.contains("'ids'") && err.contains("sparse_cross_entropy"), "{err}");
    // Ids in a plain data tensor have no output axis: a shape error naming both tensors.
    let g = Graph::new();
    let logits = g.ndarray("logits", Axes::new().batch(&[2]).output(&[3]), &[0.0; 6]);
    let labels = g.ndarray("labels", Axes::new().batch(&[2]), &[0.0, 2.0]);
    let err = value(&g, &loss::cross_entropy(&logits, &labels, loss::Reduction::Mean)).unwrap_err();
    assert!(err.contains("logits") && err.contains("labels"), "{err}");
}

#[test]
fn mse_and_hinge_refuse_targets_that_would_broadcast() {
    let g = Graph::new();
    let pred = g.ndarray("pred", Axes::new().batch(&[4]).output(&[1]), &[1.0; 4]);
    let target = g.ndarray("target", Axes::new().batch(&[4]), &[1.0; 4]);
    let err = value(&g, &loss::mse(&pred, &target, loss::Reduction::Mean)).unwrap_err();
    assert!(err.contains("pred") && err.contains("target"), "{err}");
    let g = Graph::new();
    let scores = g.ndarray("scores", Axes::new().batch(&[4, 1]), &[1.0; 4]);
    let labels = g.ndarray("labels", Axes::new().batch(&[4]), &[1.0; 4]);
    let err = value(&g, &loss::hinge(&scores, &labels, loss::Reduction::Mean)).unwrap_err();
    assert!(err.contains("scores") && err.contains("labels"), "{err}");
}

#[test]
fn a_param_still_takes_its_shape_from_the_targets() {
    let g = Graph::new();
    let x = g.data("x", Axes::new().batch(&[8]).output(&[3]));
    let y = g.data("y", Axes::new().batch(&[8]).output(&[2]));
    let w = g.param("w", ParamSpec::default());
    let l = loss::mse(&w.matmul(&x), &y, loss::Reduction::Mean);
    let _ = l;
    g.finish().unwrap();
    assert_eq!(w.shape_string(), "|3->2");
}

//! Values that would silently select nothing, and tensors that belong elsewhere: ids out of
//! the range of the lookup that reads them, tensors of another graph, data never written and
//! the wrong number of values are errors naming the tensor — never a zero row, a zero loss,
//! another tensor's values, a step on zeros or a panic.

use rocannl_tensor::nn::embed::{Embedding, EmbeddingConfig};
use rocannl_tensor::nn::loss;
use rocannl_tensor::train::{Column, Loader};
use rocannl_tensor::{Axes, Graph, Session};

fn embedding_graph(
    ids_leaf: impl Fn(&Graph) -> rocannl_tensor::Tensor,
) -> (Graph, rocannl_tensor::Tensor, rocannl_tensor::Tensor) {
    let g = Graph::with_seed(0);
    let ids = ids_leaf(&g);
    let e = Embedding::new(&g, "wte", EmbeddingConfig::new(5, 4)).apply(&ids);
    (g, ids, e)
}

#[test]
fn writing_ids_beyond_an_embeddings_vocabulary_is_an_error() {
    for ids_leaf in
        [(|g: &Graph| g.data("tokens", Axes::new().batch(&[3]))) as fn(&Graph) -> _, |g: &Graph| {
            g.ids("tokens", Axes::new().batch(&[3]))
        }]
    {
        let (g, ids, e) = embedding_graph(ids_leaf);
        let mut s = Session::new(&g).unwrap();
        let r = s.forward(&[&e]).unwrap();
        s.write(&ids, &[0.0, 4.0, 2.0]).unwrap();
        s.run(&r).unwrap();
        for bad in [5.0, 7.0, 1.5, -1.0, f64::NAN, f64::INFINITY] {
            let err = s.write(&ids, &[0.0, bad, 2.0]).unwrap_err().to_string();
            assert!(
                err.contains("'tokens'")
                    && err.contains("position 1")
                    && err.contains("'wte.table'"),
                "{bad}: {err}"
            );
            assert!(err.contains("0..5"), "{err}");
        }
    }
}

#[test]
fn write_ids_checks_the_vocabulary_of_the_embedding_not_only_the_callers_bound() {
    let (g, ids, _e) = embedding_graph(|g| g.ids("tokens", Axes::new().batch(&[2])));
    let mut s = Session::new(&g).unwrap();
    s.write_ids(&ids, &[1, 4], 65).unwrap();
    let err = s.write_ids(&ids, &[1, 7], 65).unwrap_err().to_string();
    assert!(err.contains("'tokens'") && err.contains("7") && err.contains("0..5"), "{err}");
}

#[test]
fn constant_ids_out_of_range_are_an_error_when_the_session_prepares_them() {
    let (g, _ids, e) =
        embedding_graph(|g| g.ndarray("tokens", Axes::new().batch(&[2]), &[1.0, 9.0]));
    let mut s = Session::new(&g).unwrap();
    let err = s.forward(&[&e]).unwrap_err().to_string();
    assert!(err.contains("'tokens'") && err.contains("9") && err.contains("position 1"), "{err}");
}

#[test]
fn labels_beyond_a_sparse_losss_classes_are_an_error() {
    let g = Graph::new();
    let logits = g.ndarray("logits", Axes::new().batch(&[2]).output(&[3]), &[0.0; 6]);
    let labels = g.data("labels", Axes::new().batch(&[2]));
    let l = loss::sparse_cross_entropy(&logits, &labels, loss::Reduction::Mean);
    let mut s = Session::new(&g).unwrap();
    let r = s.forward(&[&l]).unwrap();
    s.write(&labels, &[2.0, 0.0]).unwrap();
    s.run(&r).unwrap();
    assert!((s.read(&l).unwrap()[0] - 3f64.ln()).abs() < 1e-6);
    let err = s.write(&labels, &[3.0, 0.0]).unwrap_err().to_string();
    assert!(
        err.contains("'labels'") && err.contains("classes of 'logits'") && err.contains("0..3"),
        "{err}"
    );
}

#[test]
fn a_loader_checks_the_ids_it_loads_through_its_batches() {
    let g = Graph::with_seed(0);
    let cols = [Column::new("tokens", &[], vec![0.0, 1.0, 2.0, 3.0, 8.0])];
    let loader = Loader::new(&g, &cols, 2).unwrap();
    let e = Embedding::new(&g, "wte", EmbeddingConfig::new(5, 4)).apply(loader.batch(0));
    let mut s = Session::new(&g).unwrap();
    let _r = s.forward(&[&e]).unwrap();
    let err = loader.load(&mut s, &cols, &[0, 1, 2, 3, 4]).unwrap_err().to_string();
    assert!(err.contains("'tokens'") && err.contains("8") && err.contains("position 4"), "{err}");
    let ok = [Column::new("tokens", &[], vec![0.0, 1.0, 2.0, 3.0, 4.0])];
    loader.load(&mut s, &ok, &[0, 1, 2, 3, 4]).unwrap();
}

#[test]
fn a_tensor_of_another_graph_is_refused_by_every_session_call() {
    let g1 = Graph::new();
    let a = g1.data("a", Axes::new().output(&[2]));
    let y1 = a.relu();
    let g2 = Graph::new();
    let b = g2.data("b", Axes::new().output(&[3]));
    let y2 = b.relu();
    let mut s = Session::new(&g1).unwrap();
    let r = s.forward(&[&y1]).unwrap();
    s.write(&a, &[1.0, 2.0]).unwrap();
    s.run(&r).unwrap();
    let errs = [
        s.write(&b, &[1.0, 2.0, 3.0]).unwrap_err(),
        s.write_ids(&b, &[1, 2, 3], 4).unwrap_err(),
        s.read(&y2).unwrap_err(),
        s.read_grad(&b).unwrap_err(),
        s.forward(&[&y2]).unwrap_err(),
        s.backprop(&y2, &[]).unwrap_err(),
    ];
    for e in errs {
        let e = e.to_string();
        assert!(e.contains("another graph"), "{e}");
    }
    // The session's own tensors are untouched.
    assert_eq!(s.read(&a).unwrap(), vec![1.0, 2.0]);
    assert_eq!(s.read(&y1).unwrap(), vec![1.0, 2.0]);
}

#[test]
fn running_a_routine_on_data_never_written_is_an_error_naming_it() {
    let g = Graph::with_seed(0);
    let x = g.data("inputs", Axes::new().batch(&[4]).output(&[3]));
    let y = g.data("targets", Axes::new().batch(&[4]).output(&[1]));
    let w = g.param("w", rocannl_tensor::ParamSpec::default());
    let l = loss::mse(&w.matmul(&x), &y, loss::Reduction::Mean);
    let mut s = Session::new(&g).unwrap();
    let mut step = s
        .train_step(
            &l,
            &rocannl_tensor::Optimizer::Sgd(Default::default()),
            &[],
            &Default::default(),
        )
        .unwrap();
    s.write(&x, &[1.0; 12]).unwrap();
    let err = s.step(&mut step, 0.1).unwrap_err().to_string();
    assert!(err.contains("'targets'") && err.contains("never written"), "{err}");
    let before = s.read(&w).unwrap();
    s.write(&y, &[1.0; 4]).unwrap();
    assert_eq!(s.read(&w).unwrap(), before, "the refused step changed nothing");
    s.step(&mut step, 0.1).unwrap();
    // A forward routine alike.
    let r = s.forward(&[&l]).unwrap();
    s.run(&r).unwrap();
}

#[test]
fn writing_the_wrong_number_of_values_names_the_tensor() {
    let g = Graph::new();
    let x = g.data("tokens", Axes::new().batch(&[2, 8]));
    let _ = x.relu();
    let mut s = Session::new(&g).unwrap();
    let err = s.write(&x, &[0.0; 15]).unwrap_err().to_string();
    assert!(err.contains("'tokens'") && err.contains("16") && err.contains("15"), "{err}");
}

#[test]
fn an_embeddings_result_is_named_after_its_table_and_ids() {
    let (_g, _ids, e) = embedding_graph(|g| g.ids("tokens", Axes::new().batch(&[3])));
    assert_eq!(e.label(), "wte.table[tokens]");
}

//! Ids stored as u32 (`Graph::ids`): exact in every session precision, checked when written,
//! and computing exactly what float-stored ids compute.

use rocannl_tensor::nn::embed::{Embedding, EmbeddingConfig};
use rocannl_tensor::nn::loss;
use rocannl_tensor::{Axes, BackendKind, Graph, Prec, Session, SessionOptions};

fn backends() -> Vec<BackendKind> {
    BackendKind::available().into_iter().filter(|b| *b != BackendKind::Cuda).collect()
}

/// An embedding and a sparse cross-entropy over ids; `as_ids` chooses u32 storage.
fn model(
    g: &Graph,
    as_ids: bool,
    vocab: usize,
) -> (rocannl_tensor::Tensor, [rocannl_tensor::Tensor; 2]) {
    let (x, y) = if as_ids {
        (g.ids("x", Axes::new().batch(&[4, 3])), g.ids("y", Axes::new().batch(&[4, 3])))
    } else {
        (g.data("x", Axes::new().batch(&[4, 3])), g.data("y", Axes::new().batch(&[4, 3])))
    };
    let logits = Embedding::new(g, "emb", EmbeddingConfig::new(vocab, vocab)).apply(&x);
    (loss::sparse_cross_entropy(&logits, &y, loss::Reduction::Mean), [x, y])
}

#[test]
fn u32_ids_compute_what_float_ids_compute() {
    let xs: Vec<u32> = (0..12).map(|i| (i * 5 % 7) as u32).collect();
    let ys: Vec<u32> = (0..12).map(|i| (i * 3 % 7) as u32).collect();
    for backend in backends() {
        let run = |as_ids: bool| {
            let g = Graph::with_seed(4);
            let (l, [x, y]) = model(&g, as_ids, 7);
            let opts = SessionOptions { backend, ..SessionOptions::default() };
            let mut s = Session::with_options(&g, opts).unwrap();
            let r = s.backprop(&l, &[&l]).unwrap();
            s.write_ids(&x, &xs, 7).unwrap();
            s.write_ids(&y, &ys, 7).unwrap();
            s.run(&r).unwrap();
            let table = &g.params()[0];
            let mut bits: Vec<u64> = s.read(&l).unwrap().into_iter().map(f64::to_bits).collect();
            bits.extend(s.read_grad(table).unwrap().into_iter().map(f64::to_bits));
            (bits, s.read(&x).unwrap())
        };
        let (float, _) = run(false);
        let (ids, read) = run(true);
        assert_eq!(ids, float, "{backend:?}");
        assert_eq!(read, xs.iter().map(|v| *v as f64).collect::<Vec<_>>());
    }
}

#[test]
fn ids_stay_exact_in_half_precision_sessions() {
    // A vocabulary of 2100: beyond bf16's (256) and f16's (2048) exact integers.
    let vocab = 2100;
    let xs: Vec<u32> = (0..12).map(|i| 2099 - 3 * i as u32).collect();
    for backend in backends() {
        for prec in [Prec::Bf16, Prec::F16] {
            let g = Graph::with_seed(1);
            let x = g.ids("x", Axes::new().batch(&[4, 3]));
            let emb = Embedding::new(&g, "emb", EmbeddingConfig::new(vocab, 4));
            let rows = emb.apply(&x);
            let opts = SessionOptions { backend, prec, ..SessionOptions::default() };
            let mut s = Session::with_options(&g, opts).unwrap();
            let r = s.forward(&[&rows]).unwrap();
            s.write_ids(&x, &xs, vocab).unwrap();
            s.run(&r).unwrap();
            assert_eq!(s.read(&x).unwrap(), xs.iter().map(|v| *v as f64).collect::<Vec<_>>());
            // Each looked-up row is exactly the table's row of its id (memory order: the
            // table is [dim, vocab], the rows [4, 3, dim]).
            let table = s.read(&emb.table).unwrap();
            let got = s.read(&rows).unwrap();
            for (k, id) in xs.iter().enumerate() {
                for d in 0..4 {
                    assert_eq!(got[k * 4 + d], table[d * vocab + *id as usize], "{prec:?} id {id}");
                }
            }
            // Float-stored ids cannot hold this vocabulary, and the error says what to do.
            let g = Graph::with_seed(1);
            let x = g.data("x", Axes::new().batch(&[4, 3]));
            let _ = Embedding::new(&g, "emb", EmbeddingConfig::new(vocab, 4)).apply(&x);
            let opts = SessionOptions { backend, prec, ..SessionOptions::default() };
            let mut s = Session::with_options(&g, opts).unwrap();
            let err = s.write_ids(&x, &xs, vocab).unwrap_err().to_string();
            assert!(err.contains("'x'") && err.contains("Graph::ids"), "{err}");
        }
    }
}

#[test]
fn writing_a_value_that_is_not_an_id_names_the_tensor() {
    let g = Graph::new();
    let ids = g.ids("labels", Axes::new().batch(&[3]));
    let _ = ids.scale(1.0);
    let mut s = Session::new(&g).unwrap();
    for bad in [2.5, -1.0, f64::NAN, 5e9] {
        let err = s.write(&ids, &[0.0, bad, 1.0]).unwrap_err().to_string();
        assert!(err.contains("'labels'") && err.contains("position 1"), "{err}");
    }
    let err = s.write_ids(&ids, &[0, 9, 1], 5).unwrap_err().to_string();
    assert!(err.contains("'labels'") && err.contains("position 1"), "{err}");
    assert!(g.holds_ids(&ids));
}

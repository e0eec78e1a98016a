//! `Tensor::lookup` (a row copied per id; a kernel on the native backend, nests elsewhere)
//! against the one-hot product it replaces, `table · onehot(ids)`, on the native backend and
//! the interpreter: with finite tables the two agree bit for bit, values and the table's
//! gradient (both add a cell's ids in token order; the product's other terms are `+0`). Where
//! they may differ the lookup does what a lookup means: a NaN in another id's row stays out
//! of the result. Ids out of range are refused when written, through the table's vocabulary.

use rocannl_tensor::{Axes, BackendKind, Graph, Init, ParamSpec, Prec, Session, SessionOptions};

fn spread(n: usize, lo: f64, hi: f64) -> Vec<f64> {
    (0..n).map(|i| lo + (hi - lo) * ((i as f64 + 1.0) * 0.618_033_988_75).fract()).collect()
}

/// The vocabulary, the cells of a row, the ids' batch axes (the makemore MLP's sizes).
const VOCAB: usize = 27;
const CELLS: usize = 10;
const TOKENS: [usize; 2] = [32, 8];

/// Token `t`'s id: every third id, each many times.
fn id(t: usize) -> usize {
    (t * 3 + 1) % VOCAB
}

/// The rows of `table` (`CELLS × VOCAB`, the id innermost) for a batch of `TOKENS` ids, and the
/// table's gradient of `Σ sin(rows)·w`; `onehot`: as the product with a one-hot tensor.
fn run(kind: BackendKind, table: &[f64], onehot: bool) -> (Vec<f64>, Vec<f64>) {
    let (vocab, tokens) = (VOCAB, TOKENS);
    let g = Graph::new();
    let t = g.param(
        "table",
        ParamSpec::new(Axes::new().input(&[vocab]).output(&[CELLS]))
            .init(Init::Values(table.to_vec())),
    );
    let ids = g.ids("ids", Axes::new().batch(&tokens));
    let rows = if onehot { t.matmul(&ids.eq(&g.range(vocab))) } else { t.lookup(&ids) };
    let n = TOKENS.iter().product::<usize>();
    let w =
        g.ndarray("w", Axes::new().batch(&tokens).output(&[CELLS]), &spread(n * CELLS, -1.0, 1.0));
    let root = (&rows.sin() * &w).sum_all();
    let opts = SessionOptions { backend: kind, prec: Prec::F32, ..SessionOptions::default() };
    let mut s = Session::with_options(&g, opts).unwrap();
    let ids_vals: Vec<u32> = (0..n).map(|t| id(t) as u32).collect();
    s.write_ids(&ids, &ids_vals, vocab).unwrap();
    let r = s.backprop(&root, &[&rows]).unwrap();
    s.run(&r).unwrap();
    (s.read(&rows).unwrap(), s.read_grad(&t).unwrap())
}

#[test]
fn the_lookup_is_the_one_hot_product_bit_for_bit() {
    let table = spread(CELLS * VOCAB, -2.0, 2.0);
    for kind in [BackendKind::Gccjit, BackendKind::Interp] {
        let (rows, grad) = run(kind, &table, false);
        let (want_rows, want_grad) = run(kind, &table, true);
        assert_eq!(rows, want_rows, "{kind:?} rows");
        assert_eq!(grad, want_grad, "{kind:?} the table's gradient");
        // And the two backends agree with each other.
        if kind == BackendKind::Interp {
            assert_eq!((rows, grad), run(BackendKind::Gccjit, &table, false), "interp vs native");
        }
    }
}

#[test]
fn a_nan_in_one_ids_row_reaches_only_that_ids_rows() {
    // A NaN in cell 0 of id 4 must reach cell 0 of the rows of the tokens of id 4, and nothing
    // else (the table is stored `[CELLS, VOCAB]`, the id innermost).
    let mut table = spread(CELLS * VOCAB, -2.0, 2.0);
    table[4] = f64::NAN;
    let n = TOKENS.iter().product::<usize>();
    for kind in [BackendKind::Gccjit, BackendKind::Interp] {
        let (rows, _) = run(kind, &table, false);
        for t in 0..n {
            for r in 0..CELLS {
                let x = rows[t * CELLS + r];
                assert_eq!(x.is_nan(), id(t) == 4 && r == 0, "{kind:?} token {t} cell {r}: {x}");
            }
        }
        // The one-hot product spreads it to every token's cell 0 (0 · NaN is NaN).
        let (onehot, _) = run(kind, &table, true);
        assert!((0..n).all(|t| onehot[t * CELLS].is_nan()), "{kind:?}");
    }
}

#[test]
fn ids_beyond_the_tables_vocabulary_are_refused_when_written() {
    let g = Graph::new();
    let t = g.param("table", ParamSpec::new(Axes::new().input(&[5]).output(&[2])));
    let ids = g.ids("ids", Axes::new().batch(&[3]));
    let _ = t.lookup(&ids);
    let mut s = Session::new(&g).unwrap();
    let err = s.write_ids(&ids, &[1, 5, 0], 100).unwrap_err().to_string();
    assert!(err.contains("lookup of 'table'") && err.contains('5'), "{err}");
    s.write_ids(&ids, &[1, 4, 0], 100).unwrap();
}

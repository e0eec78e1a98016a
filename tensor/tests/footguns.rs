//! Graphs that are valid but probably wrong are warned about, and shape mismatches say what
//! was matched against what, each naming the user's tensors.

use rocannl_tensor::nn::embed::{Embedding, EmbeddingConfig};
use rocannl_tensor::nn::{Linear, LinearConfig};
use rocannl_tensor::{Axes, Graph, ParamSpec, Tensor, Warnings};

const T: usize = 8;
const C: usize = 16;
const V: usize = 5;

/// Token embeddings of a batch of 2 windows of `T` ids, plus a position table `wpe`, through a
/// linear head: logits.
fn gpt_like(g: &Graph, wpe: ParamSpec) -> (Tensor, Tensor) {
    let ids = g.ids("ids", Axes::new().batch(&[2, T]));
    let tok = Embedding::new(g, "wte", EmbeddingConfig::new(V, C)).apply(&ids);
    let wpe = g.param("wpe", wpe);
    let h = (&tok + &wpe).named("h");
    let logits = Linear::new(g, "head", LinearConfig::new(V)).apply(&h);
    (wpe, logits)
}

#[test]
fn a_position_table_declared_like_a_token_table_warns_with_both_shapes() {
    let g = Graph::with_seed(0);
    let (wpe, logits) = gpt_like(&g, ParamSpec::new(Axes::new().input(&[T]).output(&[C])));
    g.finish().unwrap();
    // It trains, as another model: every position holds all T rows of the table.
    assert_eq!(logits.shape_string(), "2,8|8->5");
    let warnings = g.warnings();
    let w = warnings.iter().find(|w| w.contains("'wpe'")).unwrap_or_else(|| panic!("{warnings:?}"));
    assert!(w.contains("'h'") && w.contains(&wpe.shape_string()), "{w}");
    assert!(w.contains("|8->16") && w.contains("2,8|->16") && w.contains("2,8|8->16"), "{w}");
    assert!(w.contains("Axes::new().batch(&[8])"), "the fix: {w}");
}

#[test]
fn a_position_table_with_a_batch_row_of_positions_does_not_warn() {
    let g = Graph::with_seed(0);
    let spec = ParamSpec::new(Axes::new().batch(&[T]).input(&[]).output(&[C]));
    let (_, logits) = gpt_like(&g, spec);
    g.finish().unwrap();
    assert_eq!(logits.shape_string(), "2,8|->5");
    assert!(g.warnings().is_empty(), "{:?}", g.warnings());
}

#[test]
fn a_bias_does_not_warn() {
    let g = Graph::with_seed(0);
    let x = g.data("x", Axes::new().batch(&[4]).output(&[3]));
    let b = g.param("b", ParamSpec::new(Axes::new().input(&[]).output(&[3])));
    let w = g.param("w", ParamSpec::new(Axes::new().batch(&[4]).input(&[]).output(&[3])));
    let _ = (&x + &b).pointmul(&w);
    g.finish().unwrap();
    assert!(g.warnings().is_empty(), "{:?}", g.warnings());
}

#[test]
fn a_contraction_mismatch_says_which_axes_were_contracted() {
    let g = Graph::with_seed(0);
    let ids = g.ids("ids", Axes::new().batch(&[2, T]));
    let wte = Embedding::new(&g, "wte", EmbeddingConfig::new(V, C));
    let h = wte.apply(&ids).named("h");
    // A tied head without the transpose: the table's input (the vocabulary) meets `h`'s output.
    let _logits = wte.table.matmul(&h);
    let err = g.finish().unwrap_err().to_string();
    assert!(
        err.contains("matmul") && err.contains("contracts the input axes of 'wte.table' [5]"),
        "{err}"
    );
    assert!(err.contains("with the output axes of 'h' [16]"), "{err}");
}

#[test]
fn a_contraction_that_fits_is_no_error() {
    let g = Graph::with_seed(0);
    let ids = g.ids("ids", Axes::new().batch(&[2, T]));
    let wte = Embedding::new(&g, "wte", EmbeddingConfig::new(V, C));
    let h = wte.apply(&ids).named("h");
    let logits = wte.table.transpose().matmul(&h); // the tied head, transposed
    g.finish().unwrap();
    assert_eq!(logits.shape_string(), "2,8|->5");
}

/// Set in the child process of [`warnings_are_printed_once_by_default`].
const CHILD: &str = "ROCANNL_FOOTGUNS_PRINT_CHILD";

/// The child: a graph with the position-table warning, finished twice under the default policy.
#[test]
fn print_child() {
    if std::env::var_os(CHILD).is_none() {
        return;
    }
    let g = Graph::with_seed(0);
    let _ = gpt_like(&g, ParamSpec::new(Axes::new().input(&[T]).output(&[C])));
    g.finish().unwrap();
    g.finish().unwrap();
}

#[test]
fn warnings_are_printed_once_by_default() {
    let out = std::process::Command::new(std::env::current_exe().unwrap())
        .args(["--exact", "print_child", "--nocapture", "--test-threads=1"])
        .env(CHILD, "1")
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    let stderr = String::from_utf8_lossy(&out.stderr);
    let printed: Vec<&str> = stderr.lines().filter(|l| l.starts_with("rocannl warning:")).collect();
    assert_eq!(printed.len(), 1, "{stderr}");
    assert!(printed[0].contains("'wpe'") && printed[0].contains("'h'"), "{stderr}");
}

#[test]
fn collected_warnings_are_not_printed_and_denied_ones_are_errors() {
    let g = Graph::with_seed(0);
    g.set_warnings(Warnings::Collect);
    let _ = gpt_like(&g, ParamSpec::new(Axes::new().input(&[T]).output(&[C])));
    g.finish().unwrap();
    assert!(g.warnings().iter().any(|w| w.contains("'wpe'")));
    g.set_warnings(Warnings::Deny);
    let e = g.finish().unwrap_err();
    assert!(matches!(e, rocannl_tensor::Error::Warnings(ref w) if w.len() == g.warnings().len()));
    assert!(e.to_string().contains("'wpe'"), "{e}");
    g.set_warnings(Warnings::Collect);
    g.finish().unwrap();
}

//! Sizes and alignments at the edges of the notation, through the public pipeline: kernels of
//! one tap and of none, empty axes, a stride of 1, fixed indices feeding convolutions,
//! concatenations that repeat a label, row variables after a label, and batch slices of
//! composite tensors. Each test was a wrong answer or a spurious error before.

use std::sync::Arc;

use expect_test::expect;
use rocannl_arrayjit::indexing::SymbolGen;
use rocannl_shape::inference::{Inference, RowDecl, ShapeDecl};
use rocannl_shape::logic::{Logic, SliceIndex, Terminal, TerminalData};
use rocannl_shape::spec::EinsumSpec;
use rocannl_shape::var::{ShapeId, StepId};

fn spec(s: &str) -> Arc<EinsumSpec> {
    Arc::new(EinsumSpec::parse(s).unwrap())
}

/// A leaf with the given rows; `param` for a learnable parameter.
fn leaf(inf: &mut Inference, name: &str, decl: &ShapeDecl, param: bool) -> ShapeId {
    let id = inf.new_shape(name, decl);
    let t = Terminal { param, data: TerminalData::Rows, input_equals_output: false };
    inf.add_step(id, Logic::Terminal(t)).unwrap();
    id
}

/// Data with only output axes.
fn vector(inf: &mut Inference, name: &str, output: &[usize]) -> ShapeId {
    leaf(inf, name, &ShapeDecl::given(&[], &[], output), false)
}

/// A parameter with no batch axes whose other rows are inferred.
fn param(inf: &mut Inference, name: &str) -> ShapeId {
    leaf(inf, name, &param_decl(), true)
}

/// A parameter's declaration: no batch axes, the rest inferred from use.
fn param_decl() -> ShapeDecl {
    ShapeDecl { batch: RowDecl::Given(vec![]), ..ShapeDecl::inferred() }
}

fn op(inf: &mut Inference, name: &str, logic: Logic) -> (ShapeId, StepId) {
    let id = inf.new_shape(name, &ShapeDecl::inferred());
    let step = inf.add_step(id, logic).unwrap();
    (id, step)
}

fn projections(inf: &Inference, step: StepId) -> String {
    inf.derive_projections(step, &mut SymbolGen::default()).unwrap().to_string()
}

/// A kernel argument of size 1 is a kernel of one tap: it fixes the kernel label to 1 instead
/// of broadcasting against it (which left the label open, and closing then made the window as
/// wide as the input and the output 1).
#[test]
fn a_kernel_of_size_one_is_one_tap() {
    let mut inf = Inference::new();
    let x = vector(&mut inf, "x", &[5]);
    let k = vector(&mut inf, "k", &[1]);
    let (y, step) = op(&mut inf, "y", Logic::Einsum(spec("2*o+k; k => o"), vec![x, k]));
    inf.finish().unwrap();
    // 5 = 2*(o-1) + 1.
    assert_eq!(inf.shape(y).to_string(), "|->3");
    expect!["[i0:3] lhs[i0] <- rhs0[2*i0], rhs1[0]"].assert_eq(&projections(&inf, step));

    // A dilated kernel of one tap beside a channel axis: 2 = (o-1) + 2*(1-1) + 1.
    let mut inf = Inference::new();
    let x = vector(&mut inf, "x", &[2, 1]);
    let k = vector(&mut inf, "k", &[1]);
    let (y, _) = op(&mut inf, "y", Logic::Einsum(spec("o+2*k, c; k => o, c"), vec![x, k]));
    inf.finish().unwrap();
    assert_eq!(inf.shape(y).to_string(), "|->2,1");

    // A kernel lacking the kernel axis (a scalar) is one tap too, as a missing axis
    // broadcasts like an axis of 1.
    let mut inf = Inference::new();
    let x = vector(&mut inf, "x", &[4]);
    let k = vector(&mut inf, "k", &[]);
    let (y, _) = op(&mut inf, "y", Logic::Einsum(spec("o+k; k => o"), vec![x, k]));
    inf.finish().unwrap();
    assert_eq!(inf.shape(y).to_string(), "|->4");
}

/// A kernel label is the same kernel in every operand: two kernels of 3 and 1 taps disagree
/// whichever comes first (the second used to broadcast when the first had fixed the label).
#[test]
fn two_kernels_of_different_sizes_disagree_in_either_order() {
    for sizes in [[3, 1], [1, 3]] {
        let mut inf = Inference::new();
        let x = vector(&mut inf, "x", &[6]);
        let k1 = vector(&mut inf, "k1", &[sizes[0]]);
        let k2 = vector(&mut inf, "k2", &[sizes[1]]);
        let y = inf.new_shape("y", &ShapeDecl::inferred());
        let r = inf.add_step(y, Logic::Einsum(spec("o+k; k; k => o"), vec![x, k1, k2]));
        let r = r.map_err(|e| e.to_string()).and_then(|_| inf.finish().map_err(|e| e.to_string()));
        let msg = r.expect_err("a kernel of 3 and one of 1");
        assert!(msg.contains("o+k; k; k => o") && !msg.contains('$'), "{msg}");
    }
}

/// A kernel of size 0 has no taps, so no window: the output is empty, whatever the input, and
/// the input is not sized by the convolution (a parameter there is sized like one nothing
/// bounds). No window also means no taps when the kernel is what is inferred.
#[test]
fn a_kernel_of_size_zero_has_no_window() {
    let mut inf = Inference::new();
    let x = vector(&mut inf, "x", &[7]);
    let k = vector(&mut inf, "k", &[0]);
    let (y, step) = op(&mut inf, "y", Logic::Einsum(spec("2*o+3*k; k => o"), vec![x, k]));
    inf.finish().unwrap();
    assert_eq!(inf.shape(y).to_string(), "|->0");
    // Both loops are empty.
    expect!["[i0:0, i1:0] lhs[i0] <- rhs0[2*i0 + 3*i1], rhs1[i1]"]
        .assert_eq(&projections(&inf, step));

    let mut inf = Inference::new();
    let x = param(&mut inf, "x");
    let k = vector(&mut inf, "k", &[0]);
    let (y, _) = op(&mut inf, "y", Logic::Einsum(spec("o+k; k => o"), vec![x, k]));
    inf.finish().unwrap();
    assert_eq!(inf.shape(y).to_string(), "|->0");
    assert_eq!(inf.shape(x).to_string(), "|->1");
    assert_eq!(inf.warnings().len(), 1, "{:?}", inf.warnings());
}

/// A pure stride axis over an empty axis: 0 = 2*0, so the output is empty (it was "not a whole
/// number of strides").
#[test]
fn a_pure_stride_axis_may_be_empty() {
    let mut inf = Inference::new();
    let x = vector(&mut inf, "x", &[0]);
    let (y, _) = op(&mut inf, "y", Logic::Einsum(spec("2*o => o"), vec![x]));
    inf.finish().unwrap();
    assert_eq!(inf.shape(y).to_string(), "|->0");
}

/// The grammar allows any stride: `1*o` reads every position (and, being a stride axis, does
/// not broadcast).
#[test]
fn a_stride_of_one_is_accepted() {
    let mut inf = Inference::new();
    let x = vector(&mut inf, "x", &[4]);
    let (y, step) = op(&mut inf, "y", Logic::Einsum(spec("1*o => o"), vec![x]));
    inf.finish().unwrap();
    assert_eq!(inf.shape(y).to_string(), "|->4");
    expect!["[i0:4] lhs[i0] <- rhs0[i0]"].assert_eq(&projections(&inf, step));
}

/// A fixed index placing a value at position 3 makes its axis at least 4 long; fed to a
/// convolution with a kernel of 2, the convolution's output must be at least 3 (it was closed
/// to 1, and the axis to 2: "fixed index out of range").
#[test]
fn a_fixed_index_placement_sizes_the_convolution_it_feeds() {
    let mut inf = Inference::new();
    let x = vector(&mut inf, "x", &[1]);
    let (placed, _) = op(&mut inf, "placed", Logic::Einsum(spec("e => 3"), vec![x]));
    let k = vector(&mut inf, "k", &[2]);
    let (y, step) = op(&mut inf, "y", Logic::Einsum(spec("o+k ; k => o"), vec![placed, k]));
    inf.finish().unwrap();
    assert_eq!(inf.shape(placed).to_string(), "|->4");
    assert_eq!(inf.shape(y).to_string(), "|->3");
    expect!["[i0:3, i1:2] lhs[i0] <- rhs0[i0 + i1], rhs1[i1]"].assert_eq(&projections(&inf, step));

    // The same with a concatenation: the placed axis is added to a^b with b = 2, so the part a
    // closes to at least 2 positions (its lower bound, rather than 1).
    let mut inf = Inference::new();
    let x = vector(&mut inf, "x", &[1]);
    let (placed, _) = op(&mut inf, "placed", Logic::Einsum(spec("e => 3"), vec![x]));
    let a = param(&mut inf, "a");
    let b = vector(&mut inf, "b", &[2]);
    let (cat, _) = op(&mut inf, "cat", Logic::Einsum(spec("a; b => a^b"), vec![a, b]));
    let (sum, _) = op(&mut inf, "sum", Logic::Pointwise(vec![placed, cat]));
    inf.finish().unwrap();
    assert_eq!(inf.shape(cat).to_string(), "|->4");
    assert_eq!(inf.shape(sum).to_string(), "|->4");
}

/// The parts of a concatenation are filled in the order of the arguments naming their labels:
/// with one label used for two parts, the second argument fills the second part, at its offset
/// (both used to fill the first).
#[test]
fn a_label_repeated_in_a_concatenation_fills_each_part_in_turn() {
    let mut inf = Inference::new();
    let a = vector(&mut inf, "a", &[2]);
    let b = vector(&mut inf, "b", &[2]);
    let (y, step) = op(&mut inf, "y", Logic::Einsum(spec("a; a => a^a"), vec![a, b]));
    inf.finish().unwrap();
    assert_eq!(inf.shape(y).to_string(), "|->4");
    let ps = inf.derive_concat_projections(step, &mut SymbolGen::default()).unwrap();
    let shown: Vec<String> = ps.iter().map(|p| p.to_string()).collect();
    expect![[r#"
        [
            "[i0:2] lhs[i0] <- rhs0[i0]",
            "[i1:2] lhs[i1 + 2] <- rhs0[i1]",
        ]
    "#]]
    .assert_debug_eq(&shown);

    let mut inf = Inference::new();
    let a = vector(&mut inf, "a", &[2]);
    let b = vector(&mut inf, "b", &[3]);
    let c = vector(&mut inf, "c", &[2]);
    let (y, step) = op(&mut inf, "y", Logic::Einsum(spec("a; b; a => a^b^a"), vec![a, b, c]));
    inf.finish().unwrap();
    assert_eq!(inf.shape(y).to_string(), "|->7");
    let ps = inf.derive_concat_projections(step, &mut SymbolGen::default()).unwrap();
    let shown: Vec<String> = ps.iter().map(|p| p.to_string()).collect();
    expect![[r#"
        [
            "[i0:2] lhs[i0] <- rhs0[i0]",
            "[i1:3] lhs[i1 + 2] <- rhs0[i1]",
            "[i2:2] lhs[i2 + 5] <- rhs0[i2]",
        ]
    "#]]
    .assert_debug_eq(&shown);
}

/// A batch slice of a composite tensor whose argument has two batch axes: the composite's
/// batch row is `[..r.., 2, 3]`, and the slice's row is `[3]` (the slice's row used to close to
/// no axes first, leaving the argument one axis short).
#[test]
fn a_batch_slice_of_a_composite_keeps_the_other_batch_axes() {
    let mut inf = Inference::new();
    let x = leaf(&mut inf, "x", &ShapeDecl::given(&[2, 3], &[], &[]), false);
    let (n, _) = op(&mut inf, "n", Logic::Pointwise(vec![x]));
    let (s, step) = op(&mut inf, "s", Logic::BatchSlice(n, SliceIndex::Fixed(1)));
    inf.finish().unwrap();
    assert_eq!(inf.shape(n).to_string(), "2,3|->");
    assert_eq!(inf.shape(s).to_string(), "3|->");
    expect!["[i0:3] lhs[i0] <- rhs0[1, i0]"].assert_eq(&projections(&inf, step));
}

/// A row variable after a label on an einsum's result side: the result's first axis is the
/// label's, but added to a tensor of more axes it lines up from the right as broadcasting
/// does, whichever argument comes first (it used to take its first axis from the other
/// argument, or lose its axes when bound through a non-leaf argument).
#[test]
fn a_result_row_variable_after_a_label_broadcasts_like_numpy_in_either_order() {
    for swap in [false, true] {
        let mut inf = Inference::new();
        let x = vector(&mut inf, "x", &[2]);
        let (e, _) = op(&mut inf, "e", Logic::Einsum(spec("m => m..."), vec![x]));
        let y = vector(&mut inf, "y", &[3, 2]);
        let args = if swap { vec![y, e] } else { vec![e, y] };
        let (sum, _) = op(&mut inf, "sum", Logic::Pointwise(args));
        inf.finish().unwrap();
        assert_eq!(inf.shape(e).to_string(), "|->2", "swap {swap}");
        assert_eq!(inf.shape(sum).to_string(), "|->3,2", "swap {swap}");
    }
    for swap in [false, true] {
        let mut inf = Inference::new();
        let x = vector(&mut inf, "x", &[2, 3]);
        let (n, _) = op(&mut inf, "n", Logic::Pointwise(vec![x]));
        let (e, _) = op(&mut inf, "e", Logic::Einsum(spec("i... => i..."), vec![n]));
        let y = vector(&mut inf, "y", &[2, 3]);
        let args = if swap { vec![e, y] } else { vec![y, e] };
        let (sum, _) = op(&mut inf, "sum", Logic::Pointwise(args));
        inf.finish().unwrap();
        assert_eq!(inf.shape(e).to_string(), "|->2,3", "swap {swap}");
        assert_eq!(inf.shape(sum).to_string(), "|->2,3", "swap {swap}");
    }
}

/// Shape errors name einsum labels and write other unknown axes as `_` and row variables as
/// `...`, never the solver's variables (`$d3`, `..$r628..`).
#[test]
fn shape_errors_show_labels_not_solver_variables() {
    let mut inf = Inference::new();
    let x = vector(&mut inf, "x", &[6]);
    let k = vector(&mut inf, "k", &[1]);
    let y = inf.new_shape("y", &ShapeDecl::inferred());
    let e = inf.add_step(y, Logic::Einsum(spec("2*o+k; k => o"), vec![x, k])).unwrap_err();
    expect![[r#"shape error: convolution 2*o+k (stride 2, kernel k = 1) of einsum "2*o+k; k => o" cannot have size 6: 6 = 2*(o-1) + 1 has no whole-number solution; in einsum "2*o+k; k => o" 'y': result ...|...->...,_ from 'x' |->6, 'k' |->1"#]]
        .assert_eq(&e.to_string());
}

/// A dense layer after a pooling: the pooled rows are `[oh, ow, ..c..]` (the pooling's result
/// pattern), and the layer's weight, a parameter whose input row is inferred, must hold all of
/// them. Lined up from the right that waits until `c` is known, and meanwhile the waiting
/// inequality relates the weight's row, so it is not closed as unbounded at stage 4; at stage 6
/// the convolution's leftover batch axes close first (the row deepest in the graph), then the
/// pooled row, then the weight takes it.
#[test]
fn a_parameter_above_a_pooled_row_waits_for_its_channels() {
    let mut inf = Inference::new();
    let x = leaf(&mut inf, "x", &ShapeDecl::given(&[4], &[], &[8, 8, 1]), false);
    let kernel_decl = ShapeDecl {
        batch: RowDecl::Given(vec![]),
        input: RowDecl::Partial(vec![Some(3), Some(3), None]),
        output: RowDecl::Given(vec![16]),
    };
    let k = leaf(&mut inf, "k", &kernel_decl, true);
    let w_decl = ShapeDecl { output: RowDecl::Given(vec![10]), ..param_decl() };
    let w = leaf(&mut inf, "w", &w_decl, true);
    let conv = Arc::new(
        EinsumSpec::parse_padded("... | h+i, w+j, c; i, j, c -> d => ... | h, w, d").unwrap(),
    );
    let (y, _) = op(&mut inf, "y", Logic::Einsum(conv, vec![x, k]));
    let (r, _) = op(&mut inf, "r", Logic::Pointwise(vec![y]));
    let window = vector(&mut inf, "window", &[2, 2]);
    let pool = spec("... | 2*oh+wh, 2*ow+ww, ..c..; wh, ww => ... | oh, ow, ..c..");
    let (p, _) = op(&mut inf, "p", Logic::Einsum(pool, vec![r, window]));
    let (logits, _) = op(&mut inf, "logits", Logic::Compose(w, p));
    inf.finish().unwrap();
    assert_eq!(inf.shape(p).to_string(), "4|->4,4,16");
    assert_eq!(inf.shape(w).to_string(), "|4,4,16->10");
    assert_eq!(inf.shape(logits).to_string(), "4|->10");
}

/// An axis below a concatenation may still broadcast as 1: a concatenated axis is an upper
/// bound of what is added to it, not something it equals. `(6 placed at 0) + ([1]^[2])` keeps
/// the placement at 1 (it broadcasts, giving `[7, 8]`); the placement used to be widened to the
/// concatenation (giving `[7, 2]`), and so was any size-1 composite added to one.
#[test]
fn an_axis_added_to_a_concatenation_may_still_broadcast() {
    let mut inf = Inference::new();
    let six = leaf(&mut inf, "six", &ShapeDecl::given(&[], &[], &[]), false);
    let (placed, _) = op(&mut inf, "placed", Logic::Einsum(spec(" => 0"), vec![six]));
    let a = vector(&mut inf, "a", &[1]);
    let b = vector(&mut inf, "b", &[1]);
    let (cat, _) = op(&mut inf, "cat", Logic::Einsum(spec("a; b => a^b"), vec![a, b]));
    let (sum, step) = op(&mut inf, "sum", Logic::Pointwise(vec![placed, cat]));
    inf.finish().unwrap();
    assert_eq!(inf.shape(placed).to_string(), "|->1");
    assert_eq!(inf.shape(cat).to_string(), "|->2");
    assert_eq!(inf.shape(sum).to_string(), "|->2");
    expect!["[i0:2] lhs[i0] <- rhs0[0], rhs1[i0]"].assert_eq(&projections(&inf, step));

    // A size-1 composite added to a concatenation keeps its size.
    let mut inf = Inference::new();
    let a = vector(&mut inf, "a", &[1]);
    let b = vector(&mut inf, "b", &[1]);
    let (cat, _) = op(&mut inf, "cat", Logic::Einsum(spec("u; v => u^v"), vec![a, b]));
    let x = vector(&mut inf, "x", &[1]);
    let (n, _) = op(&mut inf, "n", Logic::Pointwise(vec![x]));
    let (sum, _) = op(&mut inf, "sum", Logic::Pointwise(vec![cat, n]));
    inf.finish().unwrap();
    assert_eq!(inf.shape(n).to_string(), "|->1");
    assert_eq!(inf.shape(sum).to_string(), "|->2");

    // A tensor times a concatenation of itself with one more cell: the tensor broadcasts (it
    // was rejected as `m = m^s`, a dimension containing itself).
    let mut inf = Inference::new();
    let x = vector(&mut inf, "x", &[1]);
    let (n, _) = op(&mut inf, "n", Logic::Pointwise(vec![x]));
    let one = vector(&mut inf, "one", &[1]);
    let (cat, _) = op(&mut inf, "cat", Logic::Einsum(spec("m; s => m^s"), vec![n, one]));
    let (prod, _) = op(&mut inf, "prod", Logic::Pointwise(vec![n, cat]));
    inf.finish().unwrap();
    assert_eq!(inf.shape(n).to_string(), "|->1");
    assert_eq!(inf.shape(prod).to_string(), "|->2");
}

/// A param that meets a placed axis (` => 5`, at least 6 long) through an einsum label takes
/// the label's size, 6, like any param bounded from above; it was closed to 1 with a warning
/// because the label had not been sized yet when the param was closed.
#[test]
fn a_param_bounded_by_a_placed_axis_takes_its_size() {
    let mut inf = Inference::new();
    let two = leaf(&mut inf, "two", &ShapeDecl::given(&[], &[], &[]), false);
    let (placed, _) = op(&mut inf, "placed", Logic::Einsum(spec(" => 5"), vec![two]));
    let p = param(&mut inf, "p");
    let (y, _) = op(&mut inf, "y", Logic::Einsum(spec("r; r => r"), vec![placed, p]));
    inf.finish().unwrap();
    assert_eq!(inf.shape(placed).to_string(), "|->6");
    assert_eq!(inf.shape(p).to_string(), "|->6");
    assert_eq!(inf.shape(y).to_string(), "|->6");
    assert!(inf.warnings().is_empty(), "{:?}", inf.warnings());
}

/// A stride axis over a concatenation with an open part: `2*z = gg + 9` with `gg` from a
/// size-1 axis. The concatenation's row closes before the stride's result (arguments first),
/// so `gg = 1` and `z = 5`; closing `z` first made it 1 and the equation unsolvable.
#[test]
fn a_stride_over_a_concatenation_with_an_open_part_is_solved() {
    let mut inf = Inference::new();
    let a = vector(&mut inf, "a", &[1, 1]);
    let b = vector(&mut inf, "b", &[1, 9]);
    let (cat, _) =
        op(&mut inf, "cat", Logic::Einsum(spec("col, gg; col, x => col, gg^x"), vec![a, b]));
    let (y, step) = op(&mut inf, "y", Logic::Einsum(spec("l, 2*z => z->l"), vec![cat]));
    inf.finish().unwrap();
    assert_eq!(inf.shape(cat).to_string(), "|->1,10");
    assert_eq!(inf.shape(y).to_string(), "|5->1");
    expect!["[i0:5] lhs[0, i0] <- rhs0[0, 2*i0]"].assert_eq(&projections(&inf, step));
}

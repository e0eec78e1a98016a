//! The worked examples and stated rules of the design document (`shape_inference.md`), each
//! as a test through the public pipeline: declare shapes, add steps, finish, derive
//! projections.

use std::sync::Arc;

use expect_test::expect;
use rocannl_arrayjit::indexing::SymbolGen;
use rocannl_shape::inference::{Inference, RowDecl, ShapeDecl};
use rocannl_shape::logic::{Logic, SliceIndex, Terminal, TerminalData};
use rocannl_shape::spec::EinsumSpec;
use rocannl_shape::var::ShapeId;

fn spec(s: &str) -> Arc<EinsumSpec> {
    Arc::new(EinsumSpec::parse(s).unwrap())
}

/// A leaf: `param` for a learnable parameter (its guesses are warned about).
fn leaf(inf: &mut Inference, name: &str, decl: &ShapeDecl, param: bool) -> ShapeId {
    let id = inf.new_shape(name, decl);
    let t = Terminal { param, data: TerminalData::Rows, input_equals_output: false };
    inf.add_step(id, Logic::Terminal(t)).unwrap();
    id
}

/// A parameter's declaration: no batch axes, the rest inferred from use.
fn param_decl() -> ShapeDecl {
    ShapeDecl { batch: RowDecl::Given(vec![]), ..ShapeDecl::inferred() }
}

fn op(inf: &mut Inference, name: &str, logic: Logic) -> ShapeId {
    let id = inf.new_shape(name, &ShapeDecl::inferred());
    inf.add_step(id, logic).unwrap();
    id
}

fn shown(inf: &Inference, ids: &[ShapeId]) -> String {
    ids.iter().map(|id| format!("{}: {}\n", inf.shape(*id).debug_name, inf.shape(*id))).collect()
}

/// "For ground dimensions n ≥ m means either n = m, or m = 1; for ground rows q ≥ r means q
/// has at least as many axes as r, and each axis of q is ≥ the axis of r it lines up with."
#[test]
fn ground_broadcasting() {
    let mut inf = Inference::new();
    let a = leaf(&mut inf, "a", &ShapeDecl::given(&[], &[], &[2, 3]), false);
    let b = leaf(&mut inf, "b", &ShapeDecl::given(&[], &[], &[1, 3]), false);
    let c = leaf(&mut inf, "c", &ShapeDecl::given(&[], &[], &[3]), false);
    let sum = op(&mut inf, "sum", Logic::Pointwise(vec![a, b]));
    let sum2 = op(&mut inf, "sum2", Logic::Pointwise(vec![sum, c]));
    inf.finish().unwrap();
    expect![[r#"
        sum: |->2,3
        sum2: |->2,3
    "#]]
    .assert_eq(&shown(&inf, &[sum, sum2]));

    // 3 does not broadcast to 4: the error names both operations' tensors and both shapes.
    let mut inf = Inference::new();
    let a = leaf(&mut inf, "a", &ShapeDecl::given(&[], &[], &[4]), false);
    let b = leaf(&mut inf, "b", &ShapeDecl::given(&[], &[], &[3]), false);
    let s = inf.new_shape("s", &ShapeDecl::inferred());
    let e = inf.add_step(s, Logic::Pointwise(vec![a, b])).unwrap_err();
    let msg = e.to_string();
    assert!(msg.contains("4") && msg.contains("3"), "{msg}");
    assert!(msg.contains("'a'") || msg.contains("a"), "{msg}");
}

/// "A parameter's shape comes from how it is used": compose (`*`) contracts the input axes of
/// the left operand with the output axes of the right one, so `w * x` fixes w's input row to
/// x's output row; its output row is given (the hidden size).
#[test]
fn parameter_shapes_come_from_their_use() {
    let mut inf = Inference::new();
    let x = leaf(&mut inf, "x", &ShapeDecl::given(&[8], &[], &[3]), false);
    // Parameters have no batch axes; a bias has no input axes; b's output row is inferred.
    let w_decl = ShapeDecl { output: RowDecl::Given(vec![16]), ..param_decl() };
    let w = leaf(&mut inf, "w", &w_decl, true);
    let b = leaf(&mut inf, "b", &ShapeDecl { input: RowDecl::Given(vec![]), ..param_decl() }, true);
    let wx = op(&mut inf, "wx", Logic::Compose(w, x));
    let y = op(&mut inf, "y", Logic::Pointwise(vec![wx, b]));
    inf.finish().unwrap();
    expect![[r#"
        w: |3->16
        b: |->16
        wx: 8|->16
        y: 8|->16
    "#]]
    .assert_eq(&shown(&inf, &[w, b, wx, y]));
    assert!(inf.warnings().is_empty(), "{:?}", inf.warnings());
}

/// The rationale for closing: leaves close to their least upper bound (they can always be
/// broadcast, so their uses are their only information), composite tensors to the smallest
/// shape (their components force them from below).
#[test]
fn leaves_close_to_their_bounds_composites_from_below() {
    let mut inf = Inference::new();
    let x = leaf(&mut inf, "x", &ShapeDecl::given(&[], &[], &[5]), false);
    let p = leaf(&mut inf, "p", &param_decl(), true);
    // r = p + x; q = relu(r) with nothing else known about p.
    let r = op(&mut inf, "r", Logic::Pointwise(vec![p, x]));
    let q = op(&mut inf, "q", Logic::Pointwise(vec![r]));
    inf.finish().unwrap();
    // p's only upper bound is r = [5]: as a leaf it takes it.
    expect![[r#"
        p: |->5
        r: |->5
        q: |->5
    "#]]
    .assert_eq(&shown(&inf, &[p, r, q]));
}

/// The classic forgotten hidden dimension: nothing bounds the parameter's output row, so
/// closing guesses (no axes) and records a warning naming the parameter; strict mode refuses.
#[test]
fn a_guessed_parameter_size_is_a_warning_or_a_strict_error() {
    let build = |strict: bool| {
        let mut inf = Inference::new();
        inf.set_strict(strict);
        let x = leaf(&mut inf, "x", &ShapeDecl::given(&[8], &[], &[3]), false);
        let w1 = leaf(&mut inf, "w1", &param_decl(), true);
        let h = op(&mut inf, "h", Logic::Compose(w1, x));
        let _ = h;
        let r = inf.finish();
        (inf, r)
    };
    let (inf, r) = build(false);
    r.unwrap();
    let ws: Vec<String> = inf.warnings().iter().map(|w| w.message.clone()).collect();
    assert!(!ws.is_empty() && ws.iter().any(|m| m.contains("w1")), "{ws:?}");
    let (_, r) = build(true);
    let e = r.unwrap_err().to_string();
    assert!(e.contains("w1"), "{e}");
}

/// Labels: equal labels are required, a missing label is taken from the other side ("rgb").
#[test]
fn labels_are_inferred_and_checked() {
    let rgb = |label: &str| ShapeDecl {
        batch: RowDecl::Given(vec![]),
        input: RowDecl::Given(vec![]),
        output: RowDecl::Labeled(vec![(3, Some(label.to_string()))]),
    };
    let mut inf = Inference::new();
    let img = leaf(&mut inf, "img", &rgb("rgb"), false);
    let gain = leaf(&mut inf, "gain", &param_decl(), true);
    let out = op(&mut inf, "out", Logic::Pointwise(vec![img, gain]));
    inf.finish().unwrap();
    expect![[r#"
        gain: |->rgb=3
        out: |->rgb=3
    "#]]
    .assert_eq(&shown(&inf, &[gain, out]));

    let mut inf = Inference::new();
    let a = leaf(&mut inf, "a", &rgb("rgb"), false);
    let b = leaf(&mut inf, "b", &rgb("hsv"), false);
    let s = inf.new_shape("s", &ShapeDecl::inferred());
    let e = inf.add_step(s, Logic::Pointwise(vec![a, b])).unwrap_err();
    assert!(e.to_string().contains("label"), "{e}");
}

/// Projections are re-derived per operation with fresh projection ids: two axes that another
/// operation equates (here: a diagonal `ii=>i` makes both axes of x the same size) still get
/// separate iterators in an operation that does not equate them.
#[test]
fn projections_are_not_contaminated_across_operations() {
    let mut inf = Inference::new();
    let x = leaf(&mut inf, "x", &ShapeDecl::given(&[], &[], &[4, 4]), false);
    let diag = op(&mut inf, "diag", Logic::Einsum(spec("ii=>i"), vec![x]));
    let copy = inf.new_shape("copy", &ShapeDecl::inferred());
    let copy_step = inf.add_step(copy, Logic::Pointwise(vec![x])).unwrap();
    let _ = diag;
    inf.finish().unwrap();
    let mut syms = SymbolGen::default();
    let p = inf.derive_projections(copy_step, &mut syms).unwrap();
    expect!["[i0:4, i1:4] lhs[i0, i1] <- rhs0[i0, i1]"].assert_eq(&p.to_string());
    // The diagonal itself iterates one index for both axes.
    let diag_step = rocannl_shape::var::StepId(1);
    let p = inf.derive_projections(diag_step, &mut syms).unwrap();
    expect!["[i2:4] lhs[i2] <- rhs0[i2, i2]"].assert_eq(&p.to_string());
}

/// A broadcast (dimension-1) axis is indexed at the fixed position 0.
#[test]
fn broadcast_axes_get_fixed_index_zero() {
    let mut inf = Inference::new();
    let a = leaf(&mut inf, "a", &ShapeDecl::given(&[], &[], &[2, 3]), false);
    let b = leaf(&mut inf, "b", &ShapeDecl::given(&[], &[], &[1, 3]), false);
    let c = inf.new_shape("c", &ShapeDecl::inferred());
    let step = inf.add_step(c, Logic::Pointwise(vec![a, b])).unwrap();
    inf.finish().unwrap();
    let p = inf.derive_projections(step, &mut SymbolGen::default()).unwrap();
    expect!["[i0:2, i1:3] lhs[i0, i1] <- rhs0[i0, i1], rhs1[0, i1]"].assert_eq(&p.to_string());
}

/// Convolution axes: the input size of an unpadded window is
/// `stride*(output-1) + dilation*(kernel-1) + 1` (the exact count of positions the windows
/// touch), and the input index is `stride*o + dilation*k`.
#[test]
fn convolution_input_size_and_index() {
    let mut inf = Inference::new();
    let x = leaf(&mut inf, "x", &ShapeDecl::given(&[], &[], &[11]), false);
    let k = leaf(&mut inf, "k", &ShapeDecl::given(&[], &[], &[3]), false);
    let y = inf.new_shape("y", &ShapeDecl::inferred());
    let step = inf.add_step(y, Logic::Einsum(spec("2*o+2*k; k => o"), vec![x, k])).unwrap();
    inf.finish().unwrap();
    // 2*(o-1) + 2*(3-1) + 1 = 11 gives o = 4.
    assert_eq!(inf.shape(y).to_string(), "|->4");
    let p = inf.derive_projections(step, &mut SymbolGen::default()).unwrap();
    expect!["[i0:4, i1:3] lhs[i0] <- rhs0[2*i0 + 2*i1], rhs1[i1]"].assert_eq(&p.to_string());
}

/// With dimension-preserving padding (`use_padding`), kernels do not count in shape inference
/// and the padding is computed by projection inference: output size = input size for stride 1.
#[test]
fn padded_convolution_preserves_dimensions() {
    let mut inf = Inference::new();
    let x = leaf(&mut inf, "x", &ShapeDecl::given(&[], &[], &[10]), false);
    let k = leaf(&mut inf, "k", &ShapeDecl::given(&[], &[], &[3]), false);
    let y = inf.new_shape("y", &ShapeDecl::inferred());
    let padded = Arc::new(EinsumSpec::parse_padded("o+k; k => o").unwrap());
    let step = inf.add_step(y, Logic::Einsum(padded, vec![x, k])).unwrap();
    inf.finish().unwrap();
    assert_eq!(inf.shape(y).to_string(), "|->10");
    let p = inf.derive_projections(step, &mut SymbolGen::default()).unwrap();
    // The window is centred: the input index is o + k - 1, reading the padding at the edges.
    expect!["[i0:10, i1:3] lhs[i0] <- rhs0[i0 + i1 - 1], rhs1[i1]"].assert_eq(&p.to_string());
}

/// Batch slicing (`@|`) removes the leftmost batch axis and indexes it at a runtime position.
#[test]
fn batch_slice_removes_the_leftmost_batch_axis() {
    let mut inf = Inference::new();
    let data = leaf(&mut inf, "data", &ShapeDecl::given(&[10, 32], &[], &[3]), false);
    let mut syms = SymbolGen::default();
    let sym = syms.fresh();
    let slice = inf.new_shape("slice", &ShapeDecl::inferred());
    let step = inf.add_step(slice, Logic::BatchSlice(data, SliceIndex::Runtime(sym))).unwrap();
    inf.finish().unwrap();
    assert_eq!(inf.shape(slice).to_string(), "32|->3");
    let p = inf.derive_projections(step, &mut syms).unwrap();
    // The sliced axis is indexed by the runtime symbol, the others iterate.
    let text = p.to_string();
    assert!(text.contains(&format!("rhs0[{sym}, ")), "{text}");
}

/// "Shape inference is intended to be declarative — independent of the order in which
/// constraints are added": the same graph built in two orders closes to the same shapes.
#[test]
fn the_order_of_building_does_not_matter() {
    let run = |forward: bool| {
        let mut inf = Inference::new();
        let x = leaf(&mut inf, "x", &ShapeDecl::given(&[4], &[], &[3]), false);
        let w = leaf(&mut inf, "w", &param_decl(), true);
        let v = leaf(&mut inf, "v", &ShapeDecl::given(&[], &[], &[7]), false);
        let h = inf.new_shape("h", &ShapeDecl::inferred());
        let o = inf.new_shape("o", &ShapeDecl::inferred());
        let steps = [(h, Logic::Compose(w, x)), (o, Logic::Pointwise(vec![h, v]))];
        if forward {
            for (s, l) in steps {
                inf.add_step(s, l).unwrap();
            }
        } else {
            for (s, l) in steps.into_iter().rev() {
                inf.add_step(s, l).unwrap();
            }
        }
        inf.finish().unwrap();
        shown(&inf, &[w, h, o])
    };
    let a = run(true);
    assert_eq!(a, run(false));
    expect![[r#"
        w: |3->7
        h: 4|->7
        o: 4|->7
    "#]]
    .assert_eq(&a);
}

//! Graphs the property tests (`properties.rs`) found violating a property, minimized, replayed as
//! plain tests. The comment on each says what went wrong before the fix.

mod common;

use rocannl_arrayjit::indexing::SymbolGen;
use rocannl_shape::logic::Logic;

use common::check::{check_projection_bounds, check_step};
use common::{Built, Graph, Node};

fn shapes(b: &Built) -> Vec<String> {
    assert!(b.error.is_none(), "{:?}", b.error.as_ref().map(|e| e.to_string()));
    b.shapes.iter().map(|s| b.inf.shape(*s).to_string()).collect()
}

/// Builds `g` in both orders, and checks that every step holds and has in-bounds projections.
fn build_both(g: &Graph, other: &[usize]) -> (Built, Built) {
    let (a, b) = (g.build(&g.natural_order()), g.build(other));
    for x in [&a, &b] {
        assert!(x.error.is_none(), "{:?}", x.error.as_ref().map(|e| e.to_string()));
        for &step in x.steps.iter().flatten() {
            check_step(&x.inf, step).unwrap();
            let mut symbols = SymbolGen::default();
            let ps = match x.inf.step_logic(step) {
                Logic::Einsum(spec, _) if spec.text.contains('^') => {
                    x.inf.derive_concat_projections(step, &mut symbols).unwrap()
                }
                _ => vec![x.inf.derive_projections(step, &mut symbols).unwrap()],
            };
            ps.iter().for_each(|p| check_projection_bounds(p).unwrap());
        }
    }
    (a, b)
}

/// Builds `g` in node order and checks every step and its projections.
fn build_checked(g: &Graph) -> Built {
    let (b, _) = build_both(g, &g.natural_order());
    b
}

/// Closing constraints were processed in queue order, interleaved with propagation: with the
/// matmul added before the einsum, the parameter's first output axis was closed to 1 while the
/// equation giving it the upper bound 3 (through the einsum's `d, d`) was still queued.
#[test]
fn closing_waits_for_propagation() {
    let g = Graph {
        nodes: vec![
            Node::Data { batch: vec![2], input: vec![1], output: vec![1, 3] },
            Node::Param { input: None, output: None },
            Node::Transpose(1),
            Node::Einsum(" -> ..., d, d => ..., d".into(), vec![1]),
            Node::Compose(2, 0),
        ],
    };
    let (a, b) = build_both(&g, &[0, 1, 2, 4, 3]);
    assert_eq!(shapes(&a), shapes(&b));
    assert_eq!(shapes(&a)[1], "|->3,3");
}

/// `p1`'s output row is bounded only by `p0`'s input row, and nothing bounds that. Once closing
/// waited for propagation, which leaf row closed first followed the step order: closing `p0`
/// first (a guess) forced `p1`'s row without recording a guess; closing `p1` first recorded one.
/// A guess now also covers the variables below the guessed one, so both orders warn about both.
#[test]
fn a_guess_covers_the_variables_below_it() {
    let g = Graph {
        nodes: vec![
            Node::Param { input: None, output: None },
            Node::Param { input: Some(vec![]), output: None },
            Node::ComposeAccumulate(0, 1, 1),
        ],
    };
    let (a, b) = (g.build(&[0, 1, 2]), g.build(&[1, 0, 2]));
    let warned = |x: &Built| {
        let mut w: Vec<String> = x.inf.warnings().iter().map(|w| w.message.clone()).collect();
        w.sort();
        w
    };
    assert_eq!(warned(&a), warned(&b));
    assert!(warned(&a).iter().any(|w| w.starts_with("param p1: its output row")));
}

/// Projection inference re-solves a step from the closed shapes alone; the parts of a
/// concatenation that only closing sized (here both `p` and `q`: the argument's rows are
/// empty) stayed unknown, and the projections failed with "an axis of unknown size".
#[test]
fn concatenation_parts_sized_by_closing_have_projections() {
    let g = Graph {
        nodes: vec![
            Node::Param { input: None, output: None },
            Node::Einsum("..., a, p; ..., a, q => ..., a, p^q".into(), vec![0, 0]),
        ],
    };
    let b = g.build(&g.natural_order());
    assert_eq!(shapes(&b)[1], "|->1,2");
    let step = b.steps[1].unwrap();
    let ps = b.inf.derive_concat_projections(step, &mut SymbolGen::default()).unwrap();
    assert_eq!(ps.len(), 2);
    ps.iter().for_each(|p| check_projection_bounds(p).unwrap());
}

/// A batch slice makes its argument's batch row `[s, ..r..]`: `s` is its first axis. Against
/// the pattern `c, b` (no row variable, so aligned from the right) the solver paired `s` with
/// `c`, as if `r` would fill the rest; `r` closed to no axes, so the closed row `[2]` actually
/// lines up with `b`, and the closed shapes broke the einsum (`b` was closed to 1).
#[test]
fn a_sliced_row_lines_up_from_the_right() {
    let g = Graph {
        nodes: vec![
            Node::Param { input: None, output: None },
            Node::Pointwise(vec![0]),
            Node::Einsum("c, b | ... => ... | b".into(), vec![1]),
            Node::BatchSlice(1, 1),
        ],
    };
    let (a, _) = build_both(&g, &[0, 1, 3, 2]);
    assert_eq!(shapes(&a)[1..3], ["2|->", "|->2"]);
}

/// An einsum pattern's leading axes anchor at the start of the argument (`c` with the 3), as
/// the solver has it; projection inference lined everything up from the right (`b` with the 3)
/// and failed: "axes of sizes 1 and 3 would share one index".
#[test]
fn projections_anchor_leading_pattern_axes() {
    let g = Graph {
        nodes: vec![
            Node::Param { input: None, output: Some(vec![3]) },
            Node::Einsum("d -> c, b, ... => ..., b, c, d".into(), vec![0]),
        ],
    };
    let (a, _) = build_both(&g, &[0, 1]);
    assert_eq!(shapes(&a)[1], "|->1,3,1");
}

/// `k = b+k` (a stride-1 convolution of size `b + k - 1`) holds for `b = 1`, but the occurs
/// check rejected it as a dimension containing itself — only in the orders where `b` was not
/// yet known. The equation now waits for the other parts.
#[test]
fn a_dimension_equal_to_a_convolution_of_itself_waits() {
    let g = Graph {
        nodes: vec![
            Node::Param { input: None, output: None },
            Node::Compose(0, 0),
            Node::Pointwise(vec![0, 1, 1]),
            Node::Einsum("b, 2*a+c | a, b+a -> c, d; 2*b+a | d, d => a, b, c".into(), vec![1, 1]),
            Node::Einsum("c | a -> ... => ..., a, c".into(), vec![2]),
        ],
    };
    let (a, b) = build_both(&g, &[0, 1, 2, 4, 3]);
    assert_eq!(shapes(&a), shapes(&b));
}

/// `d, ..., a` anchors `d` at the first axis of the argument `[3, 2]` and `a` at the last, so
/// `d` is 3 — while the first operand `..., d` makes it 2: a contradiction. Once `...` was known
/// (from the first operand), substituting it made the pattern `[d, 3, a]`, lined up from the
/// right, and inference succeeded with `d` unpaired and the einsum's projections broken.
#[test]
fn a_known_row_variable_keeps_the_pattern_anchored() {
    let g = Graph {
        nodes: vec![
            Node::Data { batch: vec![], input: vec![], output: vec![3, 2] },
            Node::Einsum("..., d; d, b -> d, ..., a => ..., a, b, d".into(), vec![0, 0]),
        ],
    };
    let b = g.build(&g.natural_order());
    let err = b.error.expect("d cannot be both 2 and 3");
    assert!(err.message().contains("must be equal"), "{err}");
}

/// The same with the argument's axes known only through a concatenation: `c` anchors at the
/// first axis of `[2, 1]`, so it is 2 (it was closed to 1).
#[test]
fn a_pattern_waits_for_its_arguments_first_axes() {
    let g = Graph {
        nodes: vec![
            Node::Data { batch: vec![], input: vec![], output: vec![] },
            Node::Einsum("..., p, a; ..., q, a => ..., p^q, a".into(), vec![0, 0]),
            Node::Einsum("...;  -> c, ... => ..., c".into(), vec![1, 1]),
        ],
    };
    assert_eq!(shapes(&build_checked(&g))[1..], ["|->2,1", "|->2,1,2"]);
}

/// At stage 6 the pattern's own row variable was closed first (to no axes), turning it into an
/// ordinary row before the argument showed its axes; `d` then missed its anchor. Tensor rows
/// close first now.
#[test]
fn tensor_rows_close_before_pattern_rows() {
    let g = Graph {
        nodes: vec![
            Node::Data { batch: vec![], input: vec![3, 3], output: vec![] },
            Node::Transpose(0),
            Node::Einsum(
                "a -> ..., a; ..., b, a -> d, a, ... => ... -> ..., b, d".into(),
                vec![1, 1],
            ),
        ],
    };
    assert_eq!(shapes(&build_checked(&g))[2], "|->3,1,3");
}

/// Two problems in one graph. The closing of a shape row closed both parts of the axis
/// `2*b+d` (known to be 2) to 1 at once, missing its one solution (b = 1, d = 2); and a known
/// size above a convolution that may still be 1 was equated with it, so the outcome depended on
/// whether its parts were known first (one order failed, the other succeeded).
#[test]
fn arithmetic_axes_close_one_part_at_a_time() {
    let g = Graph {
        nodes: vec![
            Node::Param { input: None, output: None },
            Node::Data { batch: vec![], input: vec![2], output: vec![] },
            Node::Compose(1, 0),
            Node::Compose(0, 0),
            Node::Einsum("..., b, 0 -> a; ... => ..., a -> ...".into(), vec![3, 3]),
            Node::Einsum("c -> 2*b+d, 2*b+d; ..., b => d | ..., c".into(), vec![4, 2]),
        ],
    };
    let (a, b) = build_both(&g, &[0, 1, 3, 4, 2, 5]);
    assert_eq!(shapes(&a), shapes(&b));
}

/// Batch slices wait until one of the two batch rows has a known number of axes (the seed's
/// rule). Written as an equation at once, they gave their arguments a known first axis in
/// front of a row variable; rows like that line up from the left, and here a pointwise
/// operation then broadcast `[2]` against the first axis of `[2, 1]`.
#[test]
fn batch_slices_wait_for_the_batch_rows() {
    let g = Graph {
        nodes: vec![
            Node::Param { input: None, output: None },
            Node::Pointwise(vec![0, 0, 0]),
            Node::Einsum("..., d, c | d => ... | c, d".into(), vec![1]),
            Node::BatchSlice(2, 1),
            Node::Pointwise(vec![1, 2]),
            Node::BatchSlice(4, 1),
            Node::BatchSlice(5, 0),
        ],
    };
    assert_eq!(shapes(&build_checked(&g))[4..], ["2,2|->1,1", "2|->1,1", "|->1,1"]);
}

/// One parameter as both the input and the kernel of a convolution: the two instantiations of
/// the spec (first and second propagation pass) met in the parameter's upper bound through
/// fresh variables, and a kernel label bound to such a variable passed its "does not
/// broadcast" marking on to it; the projections' local solve, marking the labels again, then
/// disagreed with the sizes inference had found ("dimensions 2 and 1 must be equal").
#[test]
fn a_parameter_that_is_its_own_kernel_has_projections() {
    let g = Graph {
        nodes: vec![
            Node::Param { input: None, output: None },
            Node::Einsum("b+a, 1; ..., 1, a => ..., a, b".into(), vec![0, 0]),
        ],
    };
    build_checked(&g);
}

/// Two slices of one tensor, one of them sliced again: closing the first slice's argument to
/// its one known axis, before the second slice had passed on that the argument needs two,
/// failed in one order of the steps. The known trailing axes of a slice's argument and result
/// are now kept in step before any row closes.
#[test]
fn batch_slices_of_one_tensor_agree_on_its_axes() {
    let g = Graph {
        nodes: vec![
            Node::Data { batch: vec![1], input: vec![2], output: vec![1, 3] },
            Node::Pointwise(vec![0]),
            Node::BatchSlice(1, 0),
            Node::BatchSlice(1, 0),
            Node::BatchSlice(2, 1),
        ],
    };
    let (a, b) = build_both(&g, &[0, 1, 3, 2, 4]);
    assert_eq!(shapes(&a), shapes(&b));
    assert_eq!(shapes(&a)[1..4], ["1,2|2->1,3", "2|2->1,3", "2|2->1,3"]);
}

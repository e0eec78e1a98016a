//! Convolution axes whose output and kernel the axis' size alone does not determine
//! (`2*t+k` over 8 positions: `t = 4, k = 2`, or `t = 1, k = 8`, …). A later operation that
//! bounds the kernel or the output decides before anything is closed; an axis nothing decides is
//! a warning naming the einsum (an error in strict mode); a size with no solution is an error
//! naming the convolution as written, its stride and its kernel.

use std::sync::Arc;

use rocannl_arrayjit::indexing::SymbolGen;
use rocannl_shape::ShapeError;
use rocannl_shape::inference::{Inference, RowDecl, ShapeDecl};
use rocannl_shape::logic::{Logic, Terminal, TerminalData};
use rocannl_shape::spec::EinsumSpec;
use rocannl_shape::var::{ShapeId, StepId};

fn spec(s: &str) -> Arc<EinsumSpec> {
    Arc::new(EinsumSpec::parse(s).unwrap())
}

fn leaf(inf: &mut Inference, name: &str, decl: &ShapeDecl, param: bool) -> ShapeId {
    let id = inf.new_shape(name, decl);
    let t = Terminal { param, data: TerminalData::Rows, input_equals_output: false };
    inf.add_step(id, Logic::Terminal(t)).unwrap();
    id
}

fn op(inf: &mut Inference, name: &str, logic: Logic) -> (ShapeId, StepId) {
    let id = inf.new_shape(name, &ShapeDecl::inferred());
    let step = inf.add_step(id, logic).unwrap();
    (id, step)
}

/// The WaveNet's "flatten two consecutive positions": `x` of batch `32, 8` and 24 channels,
/// the einsum splits the positions into `t` pairs of `k`, and a weight of two positions (input
/// row `2, 24`) takes the pairs. The weight bounds `k` by 2 only through an inequality (its
/// input row is above the einsum's output row), so it is a least upper bound, and the split
/// waits for it: `k = 2`, `t = 4`.
fn flatten_consecutive(weight_positions: usize) -> (Inference, ShapeId, StepId) {
    let mut inf = Inference::new();
    let x = leaf(&mut inf, "x", &ShapeDecl::given(&[32, 8], &[], &[24]), false);
    let e = spec("..b.., 2*t+k | c => ..b.., t | k, c");
    let (y, step) = op(&mut inf, "pairs", Logic::Einsum(e, vec![x]));
    let w_decl = ShapeDecl::given(&[], &[weight_positions, 24], &[128]);
    let w = leaf(&mut inf, "w", &w_decl, true);
    op(&mut inf, "h", Logic::Compose(w, y));
    (inf, y, step)
}

#[test]
fn a_later_weight_decides_the_kernel_before_anything_closes() {
    let (mut inf, y, step) = flatten_consecutive(2);
    inf.finish().unwrap();
    assert_eq!((inf.label_size(step, "t"), inf.label_size(step, "k")), (Some(4), Some(2)));
    assert_eq!(inf.shape(y).to_string(), "32,4|->2,24");
    assert!(inf.warnings().is_empty(), "{:?}", inf.warnings());
    // Positions 2t+k for t < 4, k < 2: the pairs (0,1), (2,3), (4,5), (6,7).
    let p = inf.derive_projections(step, &mut SymbolGen::default()).unwrap();
    assert_eq!(
        p.to_string(),
        "[i0:32, i1:4, i2:2, i3:24] lhs[i0, i1, i2, i3] <- rhs0[i0, 2*i1 + i2, i3]"
    );
}

#[test]
fn a_later_operation_can_decide_the_output_instead() {
    // The weight's input row gives the number of pairs, 4, and leaves the kernel open.
    let mut inf = Inference::new();
    let x = leaf(&mut inf, "x", &ShapeDecl::given(&[], &[], &[8]), false);
    let (y, step) = op(&mut inf, "y", Logic::Einsum(spec("2*t+k => t, k"), vec![x]));
    let w_decl = ShapeDecl {
        batch: RowDecl::Given(vec![]),
        input: RowDecl::Partial(vec![Some(4), None]),
        output: RowDecl::Given(vec![3]),
    };
    let w = leaf(&mut inf, "w", &w_decl, true);
    op(&mut inf, "h", Logic::Compose(w, y));
    inf.finish().unwrap();
    assert_eq!((inf.label_size(step, "t"), inf.label_size(step, "k")), (Some(4), Some(2)));
    assert_eq!(inf.shape(y).to_string(), "|->4,2");
    assert_eq!(inf.shape(w).to_string(), "|4,2->3");
}

#[test]
fn a_split_nothing_decides_is_a_warning_naming_the_einsum() {
    for strict in [false, true] {
        let mut inf = Inference::new();
        inf.set_strict(strict);
        let x = leaf(&mut inf, "x", &ShapeDecl::given(&[], &[], &[8]), false);
        let (y, _) = op(&mut inf, "y", Logic::Einsum(spec("2*t+k => t, k"), vec![x]));
        let r = inf.finish();
        let expected = "einsum \"2*t+k => t, k\" ('y'): its convolution 2*t+k (stride 2) over 8 \
                        positions does not determine its output t and its kernel k; closing \
                        chose t = 1, k = 8. Give the kernel's size (e.g. a weight with that many \
                        positions) or the output's";
        if strict {
            assert_eq!(r, Err(ShapeError::Guess(expected.to_string())));
        } else {
            r.unwrap();
            assert_eq!(inf.shape(y).to_string(), "|->1,8");
            let w: Vec<String> = inf.warnings().iter().map(|w| w.to_string()).collect();
            assert_eq!(w, vec![expected.to_string()]);
        }
    }
}

#[test]
fn a_kernel_that_does_not_fit_names_the_convolution_stride_and_kernel() {
    // Three positions per step of two over 8 positions: 2*(t-1) + 3 = 8 has no solution.
    let (mut inf, _, _) = flatten_consecutive(3);
    let e = inf.finish().unwrap_err().to_string();
    assert!(
        e.starts_with(
            "shape error: convolution 2*t+k (stride 2, kernel k = 3) of einsum \
             \"..b.., 2*t+k | c => ..b.., t | k, c\" cannot have size 8: 8 = 2*(t-1) + 3 has no \
             whole-number solution; in compose (matmul) 'h'"
        ),
        "{e}"
    );
    assert!(e.contains("'w' |3,24->128") && !e.contains('$'), "{e}");
}

#[test]
fn a_given_kernel_is_not_a_guess() {
    // The kernel comes from an operand (a filter of 2 taps): no warning.
    let mut inf = Inference::new();
    let x = leaf(&mut inf, "x", &ShapeDecl::given(&[], &[], &[8]), false);
    let f = leaf(&mut inf, "f", &ShapeDecl::given(&[], &[], &[2]), true);
    let (_, step) = op(&mut inf, "y", Logic::Einsum(spec("2*t+k; k => t"), vec![x, f]));
    inf.set_strict(true);
    inf.finish().unwrap();
    assert_eq!((inf.label_size(step, "t"), inf.label_size(step, "k")), (Some(4), Some(2)));
}

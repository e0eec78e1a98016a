//! Inputs the fuzz targets (`fuzz/`) found crashing or hanging the solver, replayed as plain
//! tests. Each is the minimized plan of a crash, written out with the public API; the comment
//! says what went wrong before the fix.

use std::sync::Arc;
use std::time::{Duration, Instant};

use rocannl_arrayjit::indexing::{AxisIndex, SymbolGen};
use rocannl_shape::inference::{Inference, RowDecl, ShapeDecl};
use rocannl_shape::logic::{Logic, SliceIndex, Terminal, TerminalData};
use rocannl_shape::spec::EinsumSpec;
use rocannl_shape::var::ShapeId;

fn leaf(data: TerminalData, param: bool) -> Logic {
    Logic::Terminal(Terminal { param, data, input_equals_output: false })
}

fn given(inf: &mut Inference, b: &[usize], i: &[usize], o: &[usize]) -> ShapeId {
    let s = inf.new_shape("data", &ShapeDecl::given(b, i, o));
    inf.add_step(s, leaf(TerminalData::Rows, false)).unwrap();
    s
}

fn einsum(spec: &str, args: Vec<ShapeId>) -> Logic {
    Logic::Einsum(Arc::new(EinsumSpec::parse(spec).unwrap()), args)
}

/// `apply_total_elems` multiplied the known sizes unchecked: two huge axes overflowed `usize`
/// (a panic with overflow checks, a wrong count without).
#[test]
fn element_count_overflow_is_an_error() {
    let mut inf = Inference::new();
    let huge = usize::MAX / 3;
    let s = inf.new_shape("x", &ShapeDecl::given(&[], &[huge], &[huge]));
    let err = inf.add_step(s, leaf(TerminalData::Values(1), false)).unwrap_err();
    assert!(err.message().contains("too large"), "{err}");
}

/// `ConvDim::input_size` computed `stride*(output-1) + …` unchecked. An input size that does
/// not fit in `usize` is now no size at all, so the axis stays unsolved and `finish` fails.
#[test]
fn convolution_size_overflow_is_an_error() {
    let mut inf = Inference::new();
    let x = inf.new_shape("x", &ShapeDecl::inferred());
    inf.add_step(x, leaf(TerminalData::Rows, true)).unwrap();
    let y = inf.new_shape("y", &ShapeDecl::given(&[], &[], &[usize::MAX / 2]));
    inf.add_step(y, einsum("4*o => o", vec![x])).unwrap();
    assert!(inf.finish().is_err());
}

/// A fixed index or stride too large for an `i64` position wrapped around when cast (and
/// `index + 1` overflowed); the parser now rejects it, and so does a batch slice.
#[test]
fn huge_indices_are_rejected() {
    let err = EinsumSpec::parse("i, 18446744073709551615 => i").unwrap_err();
    assert!(err.message.contains("too large"), "{err}");
    let err = EinsumSpec::parse("9223372036854775807*o => o").unwrap_err();
    assert!(err.message.contains("too large"), "{err}");
    assert!(EinsumSpec::parse("i, 9223372036854775806 => i").is_ok());
    let mut inf = Inference::new();
    let x = given(&mut inf, &[3], &[], &[2]);
    let y = inf.new_shape("y", &ShapeDecl::inferred());
    assert!(inf.add_step(y, Logic::BatchSlice(x, SliceIndex::Fixed(usize::MAX))).is_err());
}

/// Projection inference indexed every axis of size 0 or 1 at the fixed position 0, so an
/// assignment over an empty tensor read and wrote its (missing) first cell once. An axis of 0
/// is now an iterator over an empty range.
#[test]
fn axes_of_size_zero_are_iterated() {
    let mut inf = Inference::new();
    let x = given(&mut inf, &[], &[], &[0, 3]);
    let one = given(&mut inf, &[], &[], &[1, 3]);
    let y = inf.new_shape("y", &ShapeDecl::inferred());
    let step = inf.add_step(y, Logic::Pointwise(vec![x, one])).unwrap();
    inf.finish().unwrap();
    assert_eq!(inf.shape(y).to_string(), "|->0,3");
    let p = inf.derive_projections(step, &mut SymbolGen::default()).unwrap();
    assert_eq!(p.product_space, vec![0, 3]);
    assert!(matches!(p.project_lhs[0], AxisIndex::Iterator(_)));
    assert_eq!(p.project_rhs[1][0], AxisIndex::Fixed(0));
}

/// A batch slice at position 0 of a batch axis of size 0 was accepted (`AtLeast(1)` was not
/// checked, as if every axis had a position 0) and its projection read out of bounds.
#[test]
fn slicing_an_empty_batch_axis_is_out_of_range() {
    let mut inf = Inference::new();
    let x = given(&mut inf, &[0], &[], &[2]);
    let y = inf.new_shape("y", &ShapeDecl::inferred());
    let err = inf.add_step(y, Logic::BatchSlice(x, SliceIndex::Fixed(0))).unwrap_err();
    assert!(err.message().contains("out of range"), "{err}");
}

/// Zero elements over known axes that include an axis of 0 are consistent; the check divided
/// by the known product and reported a conflict.
#[test]
fn zero_elements_fit_an_axis_of_zero() {
    let mut inf = Inference::new();
    let x = inf.new_shape("x", &ShapeDecl::given(&[], &[], &[0, 3]));
    inf.add_step(x, leaf(TerminalData::Values(0), false)).unwrap();
    inf.finish().unwrap();
    assert_eq!(inf.shape(x).to_string(), "|->0,3");
}

/// Two element counts for the same row variable replaced each other in its entry on every
/// pass, so the solver never reached a fixed point and ran on until its fuel ran out (about
/// 20 seconds). They must agree.
#[test]
fn two_element_counts_for_one_row_conflict_at_once() {
    let mut inf = Inference::new();
    let decl = ShapeDecl {
        batch: RowDecl::Given(vec![]),
        input: RowDecl::Given(vec![]),
        output: RowDecl::Inferred,
    };
    let p = inf.new_shape("p", &decl);
    let start = Instant::now();
    inf.add_step(p, leaf(TerminalData::Values(0), true)).unwrap();
    let second = inf.add_step(p, leaf(TerminalData::Values(2), true));
    let err = match second {
        Err(e) => e,
        Ok(_) => inf.finish().unwrap_err(),
    };
    assert!(err.message().contains("both 0 and 2 elements"), "{err}");
    assert!(start.elapsed() < Duration::from_secs(2));
}

/// A result fed back into its own argument (`x = pointwise(einsum(x))`) with a spec that
/// surrounds a row variable by more axes makes a row contain itself plus axes. The solver
/// expanded row variables forever, each round slower than the last, never reaching its fuel
/// limit in reasonable time. Expansion depth is now bounded.
#[test]
fn self_containing_rows_stop_growing() {
    let mut inf = Inference::new();
    let x = inf.new_shape("x", &ShapeDecl::inferred());
    let y = inf.new_shape("y", &ShapeDecl::inferred());
    let start = Instant::now();
    inf.add_step(y, einsum("..v..|..v..-> => d|a,..v..,c,c->", vec![x])).unwrap();
    inf.add_step(x, leaf(TerminalData::Rows, false)).unwrap();
    let err = match inf.add_step(x, Logic::Pointwise(vec![y])) {
        Err(e) => e,
        Ok(_) => inf.finish().unwrap_err(),
    };
    assert!(err.message().contains("more than 64 axes"), "{err}");
    assert!(start.elapsed() < Duration::from_secs(2));
}

/// The occurs check looked only at the variables that count towards a dimension's size, so it
/// missed `v` in the kernel of a padded convolution, bound `v` to a convolution of itself, and
/// substitution then recursed until the stack overflowed.
#[test]
fn the_occurs_check_sees_padded_kernels() {
    let mut inf = Inference::new();
    let x = inf.new_shape("x", &ShapeDecl::inferred());
    let y = inf.new_shape("y", &ShapeDecl::inferred());
    let spec = EinsumSpec::parse_padded("a|b,..v..; c|..w..,d+b; b => |b,..v..").unwrap();
    inf.add_step(y, Logic::Einsum(Arc::new(spec), vec![x, x, x])).unwrap();
    inf.add_step(x, leaf(TerminalData::Rows, false)).unwrap();
    let _ = inf.add_step(x, Logic::Pointwise(vec![y]));
    let _ = inf.finish();
}

/// The meet of two upper bounds whose axes are unknown concatenations made a fresh variable,
/// equated with the concatenation; as the two could not be compared yet, every pass made a new
/// one and changed the bound again, until the fuel ran out (10 seconds). The meet of an
/// arithmetic axis with another is now that axis.
#[test]
fn meets_of_concatenations_do_not_loop() {
    let mut inf = Inference::new();
    let (x, y, z) = (
        inf.new_shape("x", &ShapeDecl::inferred()),
        inf.new_shape("y", &ShapeDecl::inferred()),
        inf.new_shape("z", &ShapeDecl::inferred()),
    );
    let spec = "e,a,_|_,a^b->a^a^e,a,_=>..v..|_,..v..->_,d,a";
    let start = Instant::now();
    let spec = Arc::new(EinsumSpec::parse_padded(spec).unwrap());
    inf.add_step(y, Logic::Einsum(spec, vec![x])).unwrap();
    inf.add_step(x, leaf(TerminalData::Rows, true)).unwrap();
    inf.add_step(z, Logic::Pointwise(vec![y])).unwrap();
    let _ = inf.add_step(x, Logic::Pointwise(vec![z]));
    let _ = inf.finish();
    assert!(start.elapsed() < Duration::from_secs(2));
}

/// A leaf whose input row equals its output row, with a count of values: one row variable
/// occurs in two rows of the count. At stage 5 the constraint kept that variable (the output
/// row's) and closed "the others", of which there were none, then retried itself forever
/// without changing anything, until the fuel ran out. Each occurrence now holds the square root
/// of the count (or the count has none, an error).
#[test]
fn a_row_variable_occurring_twice_in_a_count() {
    for (values, expected) in [(0, Some("|0->0")), (9, Some("|3->3")), (2, None)] {
        let mut inf = Inference::new();
        let decl = ShapeDecl {
            batch: RowDecl::Given(vec![]),
            input: RowDecl::Inferred,
            output: RowDecl::Inferred,
        };
        let (p, q) = (inf.new_shape("p", &decl), inf.new_shape("q", &decl));
        let square =
            Terminal { param: true, data: TerminalData::Values(values), input_equals_output: true };
        let start = Instant::now();
        let r = inf
            .add_step(p, Logic::Terminal(square))
            .and_then(|_| inf.add_step(q, leaf(TerminalData::Rows, true)))
            .and_then(|_| inf.add_step(q, Logic::Pointwise(vec![p])))
            .and_then(|_| inf.finish());
        assert!(start.elapsed() < Duration::from_secs(2));
        match expected {
            Some(shape) => {
                assert!(r.is_ok(), "{values}: {r:?}");
                assert_eq!(inf.shape(p).to_string(), shape);
                assert_eq!(inf.shape(q).to_string(), shape);
            }
            None => assert!(r.unwrap_err().message().contains("no such power"), "{values}"),
        }
    }
}

/// The same with exact axes: the row variable's occurrences share the axes left by the others.
#[test]
fn a_row_variable_occurring_twice_in_exact_axes() {
    for (axes, expected) in
        [(vec![2, 3, 2, 3], Some("|2,3->2,3")), (vec![2, 3, 3, 2], None), (vec![2, 3, 4], None)]
    {
        let mut inf = Inference::new();
        let decl = ShapeDecl {
            batch: RowDecl::Given(vec![]),
            input: RowDecl::Inferred,
            output: RowDecl::Inferred,
        };
        let p = inf.new_shape("p", &decl);
        let square = Terminal {
            param: false,
            data: TerminalData::Exact(axes.clone()),
            input_equals_output: true,
        };
        let r = inf.add_step(p, Logic::Terminal(square)).and_then(|_| inf.finish());
        match expected {
            Some(shape) => {
                assert!(r.is_ok(), "{axes:?}: {r:?}");
                assert_eq!(inf.shape(p).to_string(), shape);
            }
            None => assert!(r.is_err(), "{axes:?}"),
        }
    }
}

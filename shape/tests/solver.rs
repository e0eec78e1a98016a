//! Unit and snapshot tests of each solver function and each closing stage.
//!
//! Every test drives one function of [`Solver`] on hand-built rows and dimensions, then
//! snapshots what it derived and the environment it left (both through their stable printers).
//! `UPDATE_EXPECT=1 cargo test -p rocannl-shape --test solver` regenerates the snapshots; a
//! changed snapshot is a changed solver and deserves a look.

use std::sync::Arc;

use expect_test::{Expect, expect};
use rocannl_shape::constraint::{
    Constr, Constraint, DimConstraint, Origin, RowConstraint, TotalElems,
};
use rocannl_shape::dim::{ConvDim, Dim};
use rocannl_shape::row::{Bcast, Kind, Row, RowId};
use rocannl_shape::solve::Solver;
use rocannl_shape::stage::Stage;
use rocannl_shape::var::{DimVar, RowVar, ShapeId, StepId};

fn id() -> RowId {
    RowId { shape: ShapeId(0), kind: Kind::Output }
}

fn origin() -> Origin {
    Origin::step(StepId(0))
}

fn n(d: usize) -> Dim {
    Dim::of(d)
}

/// The unpadded convolution input axis `stride*output + dilation*kernel`.
fn conv(stride: usize, output: Dim, dilation: usize, kernel: Dim) -> Dim {
    Dim::Conv(Arc::new(ConvDim { stride, output, dilation, kernel, padded: false }))
}

fn fixed(dims: Vec<Dim>) -> Row {
    Row::fixed(dims, id())
}

/// `beg ++ ..v.. ++ dims`.
fn open(beg: Vec<Dim>, v: RowVar, dims: Vec<Dim>) -> Row {
    Row { dims, bcast: Bcast::Var { v, beg_dims: beg }, id: id() }
}

/// A solver with `dims` fresh dimension variables and `rows` fresh row variables.
fn solver(dims: usize, rows: usize) -> (Solver, Vec<Dim>, Vec<RowVar>) {
    let mut s = Solver::default();
    let ds = (0..dims).map(|_| Dim::Var(s.vars.dim())).collect();
    let rs = (0..rows).map(|_| s.vars.row()).collect();
    (s, ds, rs)
}

/// What one call derived (or its error), then the environment.
fn show(s: &Solver, r: Result<Vec<Constr>, rocannl_shape::error::Conflict>) -> String {
    let mut out = match r {
        Ok(cs) if cs.is_empty() => "derived nothing\n".to_string(),
        Ok(cs) => cs.iter().map(|c| format!("derived {}\n", c.c)).collect(),
        Err(e) => format!("error: {}\n", e.message),
    };
    out.push_str("--\n");
    out.push_str(&s.env.to_string());
    out
}

/// Solves constraints to a fixed point at a stage, showing what remains and the environment.
fn solve_at(s: &mut Solver, stage: Stage, cs: Vec<Constraint>) -> String {
    let cs = cs.into_iter().map(|c| c.at(&origin())).collect();
    let r = s.solve(stage, cs);
    let mut out = match r {
        Ok(rest) if rest.is_empty() => "solved\n".to_string(),
        Ok(rest) => rest.iter().map(|c| format!("remains {}\n", c.c)).collect(),
        Err(e) => format!("error: {}\n", e.message),
    };
    out.push_str("--\n");
    out.push_str(&s.env.to_string());
    out
}

fn check(actual: String, expect: Expect) {
    expect.assert_eq(&actual);
}

// ---------------------------------------------------------------------------------------------
// unify_dim

#[test]
fn unify_dim_solves_a_variable_and_checks_sizes() {
    let (mut s, d, _) = solver(2, 0);
    let r = s.unify_dim(&d[0], &n(3), &origin());
    check(
        show(&s, r),
        expect![[r#"
            derived nothing
            --
            $d0 = 3
        "#]],
    );
    let r = s.unify_dim(&d[0], &n(4), &origin());
    check(
        show(&s, r),
        expect![[r#"
            error: dimensions 3 and 4 must be equal
            --
            $d0 = 3
        "#]],
    );
    // Two variables: one becomes the other.
    let r = s.unify_dim(&d[1], &d[0], &origin());
    check(
        show(&s, r),
        expect![[r#"
            derived nothing
            --
            $d0 = 3
            $d1 = 3
        "#]],
    );
}

#[test]
fn unify_dim_infers_a_missing_label_and_rejects_different_ones() {
    let (mut s, d, _) = solver(1, 0);
    let r = s.unify_dim(&d[0], &Dim::labeled(3, "rgb"), &origin());
    check(
        show(&s, r),
        expect![[r#"
            derived nothing
            --
            $d0 = rgb=3
        "#]],
    );
    assert!(s.unify_dim(&n(3), &Dim::labeled(3, "rgb"), &origin()).is_ok());
    let r = s.unify_dim(&Dim::labeled(3, "hsv"), &Dim::labeled(3, "rgb"), &origin());
    check(
        show(&s, r),
        expect![[r#"
            error: axes of size 3 have different labels: hsv=3 vs rgb=3
            --
            $d0 = rgb=3
        "#]],
    );
}

#[test]
fn unify_dim_solves_convolution_arithmetic() {
    // input = stride*(output-1) + dilation*(kernel-1) + 1: 2*(o-1) + (3-1) + 1 = 9 gives o = 4.
    let (mut s, d, _) = solver(1, 0);
    let window = conv(2, d[0].clone(), 1, n(3));
    let r = s.unify_dim(&window, &n(9), &origin());
    check(
        show(&s, r),
        expect![[r#"
            derived $d0 = 4
            --
        "#]],
    );
    // 10 has no whole-number solution for the same window.
    let (mut s, d, _) = solver(1, 0);
    assert!(s.unify_dim(&conv(2, d[0].clone(), 1, n(3)), &n(10), &origin()).is_err());
}

#[test]
fn unify_dim_occurs_check() {
    let (mut s, d, _) = solver(1, 0);
    let r = s.unify_dim(&d[0], &conv(2, d[0].clone(), 0, n(1)), &origin());
    assert!(r.is_err(), "a dimension cannot be twice itself: {r:?}");
}

#[test]
fn unify_dim_a_convolution_of_itself_solves_its_other_parts() {
    // d0 = d1 + d0 (valid, stride 1): (d1 - 1) + (d0 - 1) + 1 = d0 holds only for d1 = 1.
    let (mut s, d, _) = solver(2, 0);
    let r = s.unify_dim(&d[0], &conv(1, d[1].clone(), 1, d[0].clone()), &origin());
    check(
        show(&s, r),
        expect![[r#"
            derived $d1 = 1
            --
        "#]],
    );
    // With a dilation of 2: (d1 - 1) + 2*(d0 - 1) + 1 = d0 holds only for d1 = d0 = 1.
    let (mut s, d, _) = solver(2, 0);
    let r = s.unify_dim(&d[0], &conv(1, d[1].clone(), 2, d[0].clone()), &origin());
    check(
        show(&s, r),
        expect![[r#"
            derived $d1 = 1
            derived $d0 = 1
            --
        "#]],
    );
    // A padded strided convolution's kernel does not count towards its size, but the
    // equation cannot bind d0 to a value containing it: it waits for the output.
    let (mut s, d, _) = solver(2, 0);
    let padded = Dim::Conv(Arc::new(ConvDim {
        stride: 2,
        output: d[1].clone(),
        dilation: 1,
        kernel: d[0].clone(),
        padded: true,
    }));
    let cs = vec![
        Constraint::DimEq { d1: d[0].clone(), d2: padded },
        Constraint::DimEq { d1: d[1].clone(), d2: n(3) },
    ];
    check(
        solve_at(&mut s, Stage::Online, cs),
        expect![[r#"
            solved
            --
            $d0 = 6
            $d1 = 3
        "#]],
    );
}

#[test]
fn unify_dim_equal_convolutions_unify_their_parts() {
    // Two padded convolutions of stride 2: 2*d0 = 2*d1 whatever the kernels.
    let (mut s, d, _) = solver(4, 0);
    let padded = |o: &Dim, k: &Dim| {
        Dim::Conv(Arc::new(ConvDim {
            stride: 2,
            output: o.clone(),
            dilation: 1,
            kernel: k.clone(),
            padded: true,
        }))
    };
    let r = s.unify_dim(&padded(&d[0], &d[2]), &padded(&d[1], &d[3]), &origin());
    check(
        show(&s, r),
        expect![[r#"
            derived $d0 = $d1
            --
        "#]],
    );
    // Valid convolutions with the same kernel: the outputs are equal.
    let r =
        s.unify_dim(&conv(2, d[0].clone(), 1, n(3)), &conv(2, d[1].clone(), 1, n(3)), &origin());
    check(
        show(&s, r),
        expect![[r#"
            derived $d0 = $d1
            --
        "#]],
    );
    // The same dimension on both sides says nothing, even with unknown parts.
    let r = s.unify_dim(
        &conv(2, d[0].clone(), 1, d[2].clone()),
        &conv(2, d[0].clone(), 1, d[2].clone()),
        &origin(),
    );
    check(
        show(&s, r),
        expect![[r#"
            derived nothing
            --
        "#]],
    );
}

#[test]
fn unify_dim_solves_a_concatenated_part_by_subtraction() {
    // 2^d0 = 5: d0 = 3; 2^d0^d1 = 5 waits for one more part; 4^3 = 5 is an error.
    let (mut s, d, _) = solver(2, 0);
    let r = s.unify_dim(&Dim::Concat(vec![n(2), d[0].clone()]), &n(5), &origin());
    check(
        show(&s, r),
        expect![[r#"
            derived $d0 = 3
            --
        "#]],
    );
    let r = s.unify_dim(&Dim::Concat(vec![n(2), d[0].clone(), d[1].clone()]), &n(5), &origin());
    check(
        show(&s, r),
        expect![[r#"
            derived nothing
            --
        "#]],
    );
    let r = s.unify_dim(&Dim::Concat(vec![n(4), n(3)]), &n(5), &origin());
    check(
        show(&s, r),
        expect![[r#"
            error: dimensions 7 and 5 must be equal
            --
        "#]],
    );
    // A sum that does not fit in usize is no size.
    let huge = Dim::Concat(vec![n(usize::MAX), n(1)]);
    assert_eq!(huge.size(), None);
}

// ---------------------------------------------------------------------------------------------
// unify_row

#[test]
fn unify_row_splits_a_known_row_around_the_fixed_axes() {
    let (mut s, d, r) = solver(2, 1);
    // [d0, ..r0.., d1] = [2, 3, 4, 5]
    let a = open(vec![d[0].clone()], r[0], vec![d[1].clone()]);
    let b = fixed(vec![n(2), n(3), n(4), n(5)]);
    let res = s.unify_row(&a, &b, &origin());
    check(
        show(&s, res),
        expect![[r#"
            derived $d0 = 2
            derived $d1 = 5
            --
            $r0 = [3,4]
        "#]],
    );
}

#[test]
fn unify_row_between_row_variables_and_errors() {
    let (mut s, _, r) = solver(0, 2);
    // [..r0.., 3] = [..r1.., 2, 3]: r0 = [..r1.., 2].
    let res = s.unify_row(
        &open(vec![], r[0], vec![n(3)]),
        &open(vec![], r[1], vec![n(2), n(3)]),
        &origin(),
    );
    check(
        show(&s, res),
        expect![[r#"
            derived 3 = 3
            --
            $r0 = [..$r1..,2]
        "#]],
    );
    let (mut s, _, _) = solver(0, 0);
    let res = s.unify_row(&fixed(vec![n(2)]), &fixed(vec![n(2), n(3)]), &origin());
    check(
        show(&s, res),
        expect![[r#"
            error: rows [2] and [2,3] must be equal, but they have different numbers of axes
            --
        "#]],
    );
    // A row variable cannot contain itself and more.
    let (mut s, _, r) = solver(0, 1);
    let res = s.unify_row(&Row::of_var(r[0], id()), &open(vec![], r[0], vec![n(2)]), &origin());
    assert!(res.is_err());
}

// ---------------------------------------------------------------------------------------------
// solve_dim_ineq

#[test]
fn dim_ineq_ground_cases_follow_broadcasting() {
    // For ground dimensions n >= m means n = m or m = 1.
    let (mut s, _, _) = solver(0, 0);
    assert!(s.solve_dim_ineq(&n(5), &n(5), &origin()).unwrap().is_empty());
    assert!(s.solve_dim_ineq(&n(5), &n(1), &origin()).unwrap().is_empty());
    let r = s.solve_dim_ineq(&n(5), &n(3), &origin());
    check(
        show(&s, r),
        expect![[r#"
            error: dimension 3 cannot broadcast to 5 (5 >= 3 fails: only a dimension of 1 broadcasts)
            --
        "#]],
    );
    // 1 is below everything, and nothing but 1 is below 1.
    assert!(s.solve_dim_ineq(&n(1), &n(3), &origin()).is_err());
}

#[test]
fn dim_ineq_records_bounds_and_the_least_upper_bound() {
    let (mut s, d, _) = solver(3, 0);
    // d0 >= d1, d1 >= d2: bounds between variables.
    s.solve_dim_ineq(&d[0], &d[1], &origin()).unwrap();
    s.solve_dim_ineq(&d[1], &d[2], &origin()).unwrap();
    // 8 >= d1: the least upper bound of d1 is 8, passed on to d2.
    let r = s.solve_dim_ineq(&n(8), &d[1], &origin());
    check(
        show(&s, r),
        expect![[r#"
            derived 8 >= $d2
            --
            $d0: subr [$d1]
            $d1: cur [$d0] subr [$d2] lub 8
            $d2: cur [$d1]
        "#]],
    );
    // Already implied (transitively): nothing new.
    assert!(s.solve_dim_ineq(&d[0], &d[2], &origin()).unwrap().is_empty());
    // A cycle means equality.
    let r = s.solve_dim_ineq(&d[2], &d[0], &origin());
    check(
        show(&s, r),
        expect![[r#"
            derived $d2 = $d0
            --
            $d0: subr [$d1]
            $d1: cur [$d0] subr [$d2] lub 8
            $d2: cur [$d1]
        "#]],
    );
}

#[test]
fn a_second_different_lub_forces_dimension_one() {
    // d broadcasts to both 3 and 4: only 1 does, so d = 1 (documented choice; an axis that
    // is used at two different sizes is a broadcast axis).
    let (mut s, d, _) = solver(1, 0);
    s.solve_dim_ineq(&n(3), &d[0], &origin()).unwrap();
    let r = s.solve_dim_ineq(&n(4), &d[0], &origin());
    check(
        show(&s, r),
        expect![[r#"
            derived $d0 = 1
            --
            $d0: lub 1
        "#]],
    );
    // The same bound again changes nothing.
    let (mut s, d, _) = solver(1, 0);
    s.solve_dim_ineq(&n(3), &d[0], &origin()).unwrap();
    assert!(s.solve_dim_ineq(&n(3), &d[0], &origin()).unwrap().is_empty());
}

/// A concatenation above a variable is its upper bound (the variable may still broadcast as
/// 1). Once the concatenation's parts are solved, a second bound is compared with its size:
/// the same size is no news, another size forces 1.
#[test]
fn an_arithmetic_upper_bound_is_compared_once_its_parts_are_known() {
    let (mut s, d, _) = solver(3, 0);
    let cat = Dim::Concat(vec![d[1].clone(), d[2].clone()]);
    assert!(s.solve_dim_ineq(&cat, &d[0], &origin()).unwrap().is_empty());
    let eq = |v: &Dim, k| Constraint::DimEq { d1: v.clone(), d2: n(k) };
    solve_at(&mut s, Stage::Online, vec![eq(&d[1], 2), eq(&d[2], 3)]);
    assert!(s.solve_dim_ineq(&n(5), &d[0], &origin()).unwrap().is_empty());
    let r = s.solve_dim_ineq(&n(4), &d[0], &origin());
    check(
        show(&s, r),
        expect![[r#"
            derived $d0 = 1
            --
            $d0: lub 1
            $d1 = 2
            $d2 = 3
        "#]],
    );
}

#[test]
fn dim_ineq_variable_above_a_known_size_equals_it() {
    // cur >= 5 with cur unknown: a super-tensor axis cannot be smaller, and 5 is not 1.
    let (mut s, d, _) = solver(1, 0);
    let r = s.solve_dim_ineq(&d[0], &n(5), &origin());
    check(
        show(&s, r),
        expect![[r#"
            derived $d0 = 5
            --
        "#]],
    );
}

// ---------------------------------------------------------------------------------------------
// solve_row_ineq

#[test]
fn row_ineq_expands_cur_with_a_variables_only_template() {
    // [..r0..] >= [2, 3]: cur must have at least subr's two axes.
    let (mut s, _, r) = solver(0, 1);
    let res = s.solve_row_ineq(&Row::of_var(r[0], id()), &fixed(vec![n(2), n(3)]), &origin());
    check(
        show(&s, res),
        expect![[r#"
            derived [..$r0..] >= [2,3]
            --
            $r0 = [..$r1..,$d0,$d1]
        "#]],
    );
    // Solving to a fixed point: the template's axes are at least 2 and 3, so they are 2 and 3.
    let cs = vec![Constraint::RowIneq {
        cur: Row::of_var(r[0], id()).into(),
        subr: fixed(vec![n(2), n(3)]).into(),
    }];
    check(
        solve_at(&mut s, Stage::Online, cs),
        expect![[r#"
            solved
            --
            $d0 = 2
            $d1 = 3
            $r0 = [..$r1..,$d0,$d1]
        "#]],
    );
}

#[test]
fn row_ineq_pairs_trailing_axes_and_broadcasts_missing_ones() {
    // [2, 5] >= [5]: subr has fewer axes (broadcast on the left), the trailing axes pair up.
    let (mut s, _, _) = solver(0, 0);
    let res = s.solve_row_ineq(&fixed(vec![n(2), n(5)]), &fixed(vec![n(5)]), &origin());
    check(
        show(&s, res),
        expect![[r#"
            derived 5 >= 5
            --
        "#]],
    );
    // [5] >= [2, 5]: a sub-tensor cannot have more axes than the result.
    let res = s.solve_row_ineq(&fixed(vec![n(5)]), &fixed(vec![n(2), n(5)]), &origin());
    check(
        show(&s, res),
        expect![[r#"
            error: [2,5] has more axes than [5]: a sub-tensor cannot have more axes than the result (maybe use pointmul instead of matmul?)
            --
        "#]],
    );
}

#[test]
fn row_ineq_between_row_variables_keeps_bounds_and_meets_lubs() {
    let (mut s, _, r) = solver(0, 2);
    // r0 >= r1
    s.solve_row_ineq(&Row::of_var(r[0], id()), &Row::of_var(r[1], id()), &origin()).unwrap();
    // [4, 3] >= r1 and [2, 3] >= r1: the LUB is the axis-wise meet [1, 3].
    s.solve_row_ineq(&fixed(vec![n(4), n(3)]), &Row::of_var(r[1], id()), &origin()).unwrap();
    let res = s.solve_row_ineq(&fixed(vec![n(2), n(3)]), &Row::of_var(r[1], id()), &origin());
    check(
        show(&s, res),
        expect![[r#"
            derived nothing
            --
            $r0: subr [$r1]
            $r1: cur [$r0] lub [1,3]
        "#]],
    );
    // [] >= r1 leaves nothing but no axes for r1.
    let (mut s, _, r) = solver(0, 1);
    let res = s.solve_row_ineq(&fixed(vec![]), &Row::of_var(r[0], id()), &origin());
    check(
        show(&s, res),
        expect![[r#"
            derived [..$r0..] = []
            --
            $r0: lub []
        "#]],
    );
}

#[test]
fn row_ineq_with_leading_axes_broadcasts_in_the_middle() {
    // [7, ..r0.., 5] >= [7, 2, 5] where the first row is an einsum pattern: its leading and
    // trailing axes stay fixed (anchored at the start and the end of the row it is matched
    // with), r0 must supply the middle axis.
    let (mut s, _, r) = solver(0, 1);
    s.mark_template_row(r[0]);
    let cs = vec![Constraint::RowIneq {
        cur: open(vec![n(7)], r[0], vec![n(5)]).into(),
        subr: fixed(vec![n(7), n(2), n(5)]).into(),
    }];
    check(
        solve_at(&mut s, Stage::Online, cs),
        expect![[r#"
            solved
            --
            $d0 = 2
            $r0 = [..$r1..,$d0]
        "#]],
    );
}

#[test]
fn row_ineq_between_tensors_lines_up_from_the_right() {
    // The same between two tensors' rows: broadcasting lines rows up from the right, and where
    // the 7 of [7, 2, 5] falls in [7, ..r0.., 5] depends on r0 ([7, x, 5] puts it on the first
    // 7, [7, x, y, 5] on x), so it waits.
    let (mut s, _, r) = solver(0, 1);
    let cs = vec![Constraint::RowIneq {
        cur: open(vec![n(7)], r[0], vec![n(5)]).into(),
        subr: fixed(vec![n(7), n(2), n(5)]).into(),
    }];
    check(
        solve_at(&mut s, Stage::Online, cs),
        expect![[r#"
            remains [7,..$r0..,5] >= [7,2,5]
            --
        "#]],
    );
    // A tensor known to start with 2 (its row variable after it), added to [3, 2]: the 2 is its
    // last axis once the variable closes, as NumPy lines up [2] with [3, 2].
    let (mut s, _, r) = solver(0, 2);
    let cs = vec![
        Constraint::RowIneq {
            cur: Row::of_var(r[1], id()).into(),
            subr: open(vec![n(2)], r[0], vec![]).into(),
        },
        Constraint::RowIneq {
            cur: Row::of_var(r[1], id()).into(),
            subr: fixed(vec![n(3), n(2)]).into(),
        },
    ];
    check(
        solve_at(&mut s, Stage::RowsToNoMoreAxes, cs),
        expect![[r#"
            solved
            --
            $d0 = 3
            $d1 = 2
            $r0 = []
            $r1 = [..$r2..,$d0,$d1]
        "#]],
    );
}

#[test]
fn dim_ineq_known_size_above_a_convolution_that_may_be_one_waits() {
    // 5 >= d0+d1 (stride 1): once d0 and d1 are known it is either 5 or 1 (broadcast), so it
    // waits; 5 >= 2^d0 cannot be 1 (two parts), so it is an equation.
    let (mut s, d, _) = solver(2, 0);
    let cs = vec![Constraint::DimIneq { cur: n(5), subr: conv(1, d[0].clone(), 1, d[1].clone()) }];
    check(
        solve_at(&mut s, Stage::Online, cs),
        expect![[r#"
            remains 5 >= $d0+$d1
            --
        "#]],
    );
    let cs = vec![
        Constraint::DimIneq { cur: n(5), subr: conv(1, d[0].clone(), 1, d[1].clone()) },
        Constraint::DimEq { d1: d[0].clone(), d2: n(1) },
        Constraint::DimEq { d1: d[1].clone(), d2: n(1) },
    ];
    check(
        solve_at(&mut s, Stage::Online, cs),
        expect![[r#"
            solved
            --
            $d0 = 1
            $d1 = 1
        "#]],
    );
    let (mut s, d, _) = solver(1, 0);
    let r = s.solve_dim_ineq(&n(5), &Dim::Concat(vec![n(2), d[0].clone()]), &origin());
    check(
        show(&s, r),
        expect![[r#"
            derived 5 = 2^$d0
            --
        "#]],
    );
}

#[test]
fn row_lub_meet_with_an_arithmetic_axis_is_that_axis() {
    // [d0^d1] >= r0 and [d2] >= r0: below a concatenation is only itself, so the meet is
    // d0^d1, below d2.
    let (mut s, d, r) = solver(3, 1);
    let cat = Dim::Concat(vec![d[0].clone(), d[1].clone()]);
    s.solve_row_ineq(&fixed(vec![cat]), &Row::of_var(r[0], id()), &origin()).unwrap();
    let res = s.solve_row_ineq(&fixed(vec![d[2].clone()]), &Row::of_var(r[0], id()), &origin());
    check(
        show(&s, res),
        expect![[r#"
            derived $d2 >= $d0^$d1
            --
            $r0: lub [$d0^$d1]
        "#]],
    );
}

#[test]
fn row_ineq_a_known_pattern_keeps_its_leading_axes_anchored() {
    // The einsum pattern [d0, ..r0.., d1] with r0 = [3] (fixed by another operand) against the
    // argument [4, 3, 2]: d0 pairs with the first axis and d1 with the last, r0 with the rest;
    // substituted, the pattern would be the ordinary row [d0, 3, d1].
    let (mut s, d, r) = solver(2, 1);
    s.mark_template_row(r[0]);
    s.unify_row(&Row::of_var(r[0], id()), &fixed(vec![n(3)]), &origin()).unwrap();
    let pattern = open(vec![d[0].clone()], r[0], vec![d[1].clone()]);
    let cs = vec![Constraint::RowIneq {
        cur: pattern.clone().into(),
        subr: fixed(vec![n(4), n(3), n(2)]).into(),
    }];
    check(
        solve_at(&mut s, Stage::Online, cs),
        expect![[r#"
            solved
            --
            $d0 = 4
            $d1 = 2
            $r0 = [3]
        "#]],
    );
    let (mut s, d, r) = solver(2, 2);
    s.mark_template_row(r[0]);
    s.unify_row(&Row::of_var(r[0], id()), &fixed(vec![n(3)]), &origin()).unwrap();
    let pattern = open(vec![d[0].clone()], r[0], vec![d[1].clone()]);
    // An argument whose row does not show its first axis yet: pairing waits, and a bare row
    // variable learns the pattern as its upper bound.
    let cs =
        vec![Constraint::RowIneq { cur: pattern.into(), subr: Row::of_var(r[1], id()).into() }];
    check(
        solve_at(&mut s, Stage::Online, cs),
        expect![[r#"
            remains [$d0,..$r0..,$d1] >= [..$r1..]
            --
            $r0 = [3]
            $r1: lub [$d0,3,$d1]
        "#]],
    );
}

// ---------------------------------------------------------------------------------------------
// apply_dim_constraint and apply_rows_constraint

#[test]
fn dim_constraint_lower_bound_from_fixed_indexing() {
    let (mut s, d, _) = solver(1, 0);
    let r = s.apply_dim_constraint(&d[0], &DimConstraint::AtLeast(3), &origin());
    check(
        show(&s, r),
        expect![[r#"
            derived nothing
            --
            $d0: constr >= 3 positions
        "#]],
    );
    // An upper bound below the lower bound is an error.
    let r = s.solve_dim_ineq(&n(2), &d[0], &origin());
    check(
        show(&s, r),
        expect![[r#"
            error: an axis indexed at position 2 cannot be at most 2
            --
            $d0: constr >= 3 positions
        "#]],
    );
    // A known size checks directly.
    assert!(s.apply_dim_constraint(&n(2), &DimConstraint::AtLeast(3), &origin()).is_err());
    assert!(s.apply_dim_constraint(&n(3), &DimConstraint::AtLeast(3), &origin()).is_ok());
}

#[test]
fn total_elems_solves_the_single_unknown() {
    // [2, d0] [3] hold 24 elements: d0 = 4.
    let (mut s, d, _) = solver(1, 0);
    let rows = vec![fixed(vec![n(2), d[0].clone()]), fixed(vec![n(3)])];
    let constr =
        RowConstraint::TotalElems { numerator: TotalElems::NumElems(24), divided_by: vec![] };
    let r = s.apply_rows_constraint(&rows, &constr, &origin());
    check(
        show(&s, r),
        expect![[r#"
            derived $d0 = 4
            --
        "#]],
    );
    // 25 elements cannot be split that way.
    let (mut s, d, _) = solver(1, 0);
    let rows = vec![fixed(vec![n(2), d[0].clone()]), fixed(vec![n(3)])];
    let constr =
        RowConstraint::TotalElems { numerator: TotalElems::NumElems(25), divided_by: vec![] };
    assert!(s.apply_rows_constraint(&rows, &constr, &origin()).is_err());
}

#[test]
fn exact_rows_constraint_fixes_the_axes() {
    let (mut s, d, r) = solver(1, 1);
    let rows = vec![open(vec![], r[0], vec![d[0].clone()])];
    let constr = RowConstraint::Exact(vec![n(2), n(3), n(4)]);
    let cs = vec![Constraint::RowsConstr { rows, constr }];
    check(
        solve_at(&mut s, Stage::Online, cs),
        expect![[r#"
            solved
            --
            $d0 = 4
            $r0 = [2,3]
        "#]],
    );
}

#[test]
fn dim_constraint_lower_bounds_propagate_upward_and_check_empty_axes() {
    // d1 >= d0 and d0 is indexed at position 2: no broadcasting, so d1 has 3 positions too.
    let (mut s, d, _) = solver(2, 0);
    s.solve_dim_ineq(&d[1], &d[0], &origin()).unwrap();
    let r = s.apply_dim_constraint(&d[0], &DimConstraint::AtLeast(3), &origin());
    check(
        show(&s, r),
        expect![[r#"
            derived $d1 >= 3 positions
            --
            $d0: cur [$d1] constr >= 3 positions
            $d1: subr [$d0]
        "#]],
    );
    // Position 0 does not exist in an axis of 0.
    let r = s.apply_dim_constraint(&n(0), &DimConstraint::AtLeast(1), &origin());
    check(
        show(&s, r),
        expect![[r#"
            error: fixed index 0 is out of range for an axis of size 0
            --
            $d0: cur [$d1] constr >= 3 positions
            $d1: subr [$d0]
        "#]],
    );
}

#[test]
fn total_elems_checks_counts_without_overflow() {
    let total =
        |k| RowConstraint::TotalElems { numerator: TotalElems::NumElems(k), divided_by: vec![] };
    // The product of the known axes does not fit in usize: an error, not a wrapped count.
    let (mut s, _, _) = solver(0, 0);
    let rows = vec![fixed(vec![n(usize::MAX / 2), n(4)])];
    let r = s.apply_rows_constraint(&rows, &total(1), &origin());
    check(
        show(&s, r),
        expect![[r#"
            error: the number of elements is too large to represent
            --
        "#]],
    );
    // Zero elements: an axis of 0 accounts for them, whatever the other axes are.
    let (mut s, d, _) = solver(1, 0);
    let rows = vec![fixed(vec![n(0), d[0].clone()])];
    let r = s.apply_rows_constraint(&rows, &total(0), &origin());
    check(
        show(&s, r),
        expect![[r#"
            derived nothing
            --
        "#]],
    );
    // Two different counts for the axes of one row variable conflict at once.
    let (mut s, _, r) = solver(0, 1);
    let rows = vec![fixed(vec![n(2)]), Row::of_var(r[0], id())];
    s.apply_rows_constraint(&rows, &total(6), &origin()).unwrap();
    let res = s.apply_rows_constraint(&rows, &total(8), &origin());
    check(
        show(&s, res),
        expect![[r#"
            error: the axes of row variable $r0 would have to hold both 3 and 4 elements
            --
            $r0: constr elements = 3
        "#]],
    );
}

// ---------------------------------------------------------------------------------------------
// solve_batch_slice

#[test]
fn batch_slice_waits_for_a_batch_row_with_a_known_number_of_axes() {
    // [..r1..] = s, [..r0..]: both rows can grow; the argument has at least one axis.
    let (mut s, d, r) = solver(1, 2);
    let slice = Constraint::BatchSlice {
        cur: Row::of_var(r[0], id()).into(),
        arg: Row::of_var(r[1], id()).into(),
        slot: d[0].clone(),
    };
    let rest = s.solve(Stage::Online, at(vec![slice.clone()])).unwrap();
    check(
        format!(
            "{}\n--\n{}",
            rest.iter().map(|c| c.c.to_string()).collect::<Vec<_>>().join("\n"),
            s.env
        ),
        expect![[r#"
            [..$r2..,$d1] = $d0, [..$r0..]
            --
            $r1 = [..$r2..,$d1]
        "#]],
    );
    // Once the argument is known, the slice is an equation: the result gets the rest.
    let cs = vec![
        slice.clone(),
        Constraint::RowEq {
            r1: Row::of_var(r[1], id()).into(),
            r2: fixed(vec![n(4), n(2), n(3)]).into(),
        },
    ];
    check(
        solve_at(&mut s, Stage::Online, cs),
        expect![[r#"
            solved
            --
            $d0 = 4
            $d1 = 3
            $r0 = [2,3]
            $r1 = [..$r2..,$d1]
            $r2 = [4,2]
        "#]],
    );
    // With neither known, stage 6 closes the row with more known axes: the argument's (with
    // the one axis it is known to have), and the result has none.
    let (mut s, d, r) = solver(1, 2);
    let slice = Constraint::BatchSlice {
        cur: Row::of_var(r[0], id()).into(),
        arg: Row::of_var(r[1], id()).into(),
        slot: d[0].clone(),
    };
    check(
        solve_at(&mut s, Stage::RowsToNoMoreAxes, vec![slice]),
        expect![[r#"
            solved
            --
            $d0 = $d1
            $r0 = []
            $r1 = [..$r2..,$d1]
            $r2 = []
        "#]],
    );
}

// ---------------------------------------------------------------------------------------------
// Closing: one test per stage

#[test]
fn stage_1_never_closes() {
    let (mut s, d, r) = solver(1, 1);
    let cs = vec![
        Constraint::TerminalDim(d[0].clone()),
        Constraint::TerminalRow((Row::of_var(r[0], id())).into()),
    ];
    check(
        solve_at(&mut s, Stage::Online, cs),
        expect![[r#"
            remains terminal $d0
            remains terminal [..$r0..]
            --
        "#]],
    );
}

#[test]
fn stage_2_closes_unbounded_unrelated_leaf_dims_to_one() {
    let (mut s, d, _) = solver(3, 0);
    // d1 has an upper bound, d2 is related to another variable: both wait.
    s.solve_dim_ineq(&n(6), &d[1], &origin()).unwrap();
    s.solve_dim_ineq(&d[2], &Dim::Var(DimVar(99)), &origin()).unwrap();
    let cs = (0..3).map(|i| Constraint::TerminalDim(d[i].clone())).collect();
    check(
        solve_at(&mut s, Stage::TerminalDimsToOne, cs),
        expect![[r#"
            remains terminal $d1
            remains terminal $d2
            --
            $d0 = 1
            $d1: lub 6
            $d2: subr [$d99]
            $d99: cur [$d2]
        "#]],
    );
    assert!(s.guessed_dims.contains(&DimVar(0)), "closing an unbounded leaf dim is a guess");
}

#[test]
fn stage_3_closes_leaves_to_their_least_upper_bounds() {
    let (mut s, d, r) = solver(1, 1);
    s.solve_dim_ineq(&n(6), &d[0], &origin()).unwrap();
    s.solve_row_ineq(&fixed(vec![n(2), n(3)]), &Row::of_var(r[0], id()), &origin()).unwrap();
    let cs = vec![
        Constraint::TerminalDim(d[0].clone()),
        Constraint::TerminalRow((Row::of_var(r[0], id())).into()),
    ];
    check(
        solve_at(&mut s, Stage::TerminalsToLub, cs),
        expect![[r#"
            solved
            --
            $d0 = 6
            $r0 = [2,3]
        "#]],
    );
    assert!(s.guessed_dims.is_empty() && s.guessed_rows.is_empty());
}

#[test]
fn stage_4_closes_unbounded_leaf_rows_and_lower_bounded_dims() {
    let (mut s, d, r) = solver(1, 1);
    s.apply_dim_constraint(&d[0], &DimConstraint::AtLeast(3), &origin()).unwrap();
    s.solve_dim_ineq(&n(8), &d[0], &origin()).unwrap();
    let cs = vec![
        Constraint::ShapeRow { row: fixed(vec![d[0].clone()]).into(), from: 0 },
        Constraint::TerminalRow((Row::of_var(r[0], id())).into()),
    ];
    check(
        solve_at(&mut s, Stage::TerminalRowsClosed, cs),
        expect![[r#"
            solved
            --
            $d0 = 8
            $r0 = []
        "#]],
    );
    assert!(s.guessed_rows.contains(&r[0]));
}

#[test]
fn stage_5_gives_row_constraints_their_remaining_axes() {
    // [..r0..] holds 12 elements: before stage 5 it waits, at stage 5 r0 gets one axis of 12.
    let (mut s, _, r) = solver(0, 1);
    let constr =
        RowConstraint::TotalElems { numerator: TotalElems::NumElems(12), divided_by: vec![] };
    let cs = vec![Constraint::RowsConstr { rows: vec![Row::of_var(r[0], id())], constr }];
    let rest = s.solve(Stage::TerminalRowsClosed, at(cs)).unwrap();
    assert!(s.env.to_string().contains("elements = 12"), "{}", s.env);
    check(
        solve_at(&mut s, Stage::RowConstraints, rest.into_iter().map(|c| c.c).collect()),
        expect![[r#"
            solved
            --
            $r0 = [12]
        "#]],
    );
}

fn at(cs: Vec<Constraint>) -> Vec<Constr> {
    cs.into_iter().map(|c| c.at(&origin())).collect()
}

/// Solves `cs` through the stages up to `before`, then the constraints that remain at `stage`.
fn solve_after(s: &mut Solver, before: Stage, stage: Stage, cs: Vec<Constraint>) -> String {
    let rest = s.solve(before, at(cs)).unwrap();
    solve_at(s, stage, rest.into_iter().map(|c| c.c).collect())
}

#[test]
fn stage_6_closes_every_row_variable_to_no_more_axes() {
    // [..r0.., 2] >= [..r1.., 2] with nothing else known: both close to no further axes.
    let (mut s, _, r) = solver(0, 2);
    let cs = vec![
        Constraint::RowIneq {
            cur: open(vec![], r[0], vec![n(2)]).into(),
            subr: open(vec![], r[1], vec![n(2)]).into(),
        },
        Constraint::ShapeRow { row: (open(vec![], r[0], vec![n(2)])).into(), from: 0 },
        Constraint::ShapeRow { row: (open(vec![], r[1], vec![n(2)])).into(), from: 0 },
    ];
    check(
        solve_after(&mut s, Stage::RowConstraints, Stage::RowsToNoMoreAxes, cs),
        expect![[r#"
            solved
            --
            $r0 = []
            $r1 = []
        "#]],
    );
}

#[test]
fn stage_7_closes_every_dim_to_its_lower_bound_or_one() {
    let (mut s, d, _) = solver(2, 0);
    s.apply_dim_constraint(&d[1], &DimConstraint::AtLeast(4), &origin()).unwrap();
    let cs =
        vec![Constraint::ShapeRow { row: fixed(vec![d[0].clone(), d[1].clone()]).into(), from: 0 }];
    check(
        solve_after(&mut s, Stage::RowsToNoMoreAxes, Stage::DimsToLowerBound, cs),
        expect![[r#"
            solved
            --
            $d0 = 1
            $d1 = 4
        "#]],
    );
}

#[test]
fn stage_3_gives_a_leaf_row_without_bound_the_axis_its_values_need() {
    // [3] [..r0..] hold 12 values and nothing bounds r0: at stage 3 it gets one axis of 4.
    let (mut s, _, r) = solver(0, 1);
    let total =
        RowConstraint::TotalElems { numerator: TotalElems::NumElems(12), divided_by: vec![] };
    let rows = vec![fixed(vec![n(3)]), Row::of_var(r[0], id())];
    let cs = vec![
        Constraint::RowsConstr { rows, constr: total },
        Constraint::TerminalRow((Row::of_var(r[0], id())).into()),
    ];
    check(
        solve_after(&mut s, Stage::TerminalDimsToOne, Stage::TerminalsToLub, cs),
        expect![[r#"
            solved
            --
            $r0 = [4]
        "#]],
    );
}

#[test]
fn stage_5_with_several_row_variables_the_output_row_takes_the_elements() {
    // A reshape's result rows share 6 elements; of its row variables the output row's takes
    // them, the others get no axes.
    let (mut s, _, r) = solver(0, 3);
    let row = |v: RowVar, kind| Row::of_var(v, RowId { shape: ShapeId(0), kind });
    let rows = vec![row(r[0], Kind::Batch), row(r[1], Kind::Output), row(r[2], Kind::Input)];
    let total =
        RowConstraint::TotalElems { numerator: TotalElems::NumElems(6), divided_by: vec![] };
    let cs = vec![Constraint::RowsConstr { rows, constr: total }];
    check(
        solve_after(&mut s, Stage::TerminalRowsClosed, Stage::RowConstraints, cs),
        expect![[r#"
            solved
            --
            $r0 = []
            $r1 = [6]
            $r2 = []
        "#]],
    );
}

#[test]
fn stage_7_closes_the_parts_of_an_arithmetic_axis_one_at_a_time() {
    // 2*d0+d1 = 2 (valid): closing both parts to 1 at once would give 1; one at a time, d0
    // closes to 1 and then d1 = 2 follows.
    let (mut s, d, _) = solver(2, 0);
    let axis = conv(2, d[0].clone(), 1, d[1].clone());
    let cs = vec![
        Constraint::DimEq { d1: axis.clone(), d2: n(2) },
        Constraint::ShapeRow { row: fixed(vec![axis]).into(), from: 0 },
    ];
    check(
        solve_after(&mut s, Stage::RowsToNoMoreAxes, Stage::DimsToLowerBound, cs),
        expect![[r#"
            solved
            --
            $d0 = 1
            $d1 = 2
        "#]],
    );
}

#[test]
fn a_guess_covers_the_variables_below_it() {
    // r0 >= r1, both leaf rows without any upper bound: closing r0 first (a guess) forces r1
    // to no axes as well, and r1 counts as guessed too, whichever closes first.
    let (mut s, _, r) = solver(0, 2);
    s.solve_row_ineq(&Row::of_var(r[0], id()), &Row::of_var(r[1], id()), &origin()).unwrap();
    let cs = vec![
        Constraint::TerminalRow((Row::of_var(r[0], id())).into()),
        Constraint::TerminalRow((Row::of_var(r[1], id())).into()),
    ];
    check(
        solve_at(&mut s, Stage::RowsToNoMoreAxes, cs),
        expect![[r#"
            solved
            --
            $r0 = []
            $r1 = []
        "#]],
    );
    assert!(s.guessed_rows.contains(&r[0]) && s.guessed_rows.contains(&r[1]));
}

#[test]
fn constraint_display_is_stable() {
    let (_, d, r) = solver(1, 2);
    let shown: Vec<String> = [
        Constraint::RowIneq {
            cur: open(vec![n(2)], r[0], vec![d[0].clone()]).into(),
            subr: fixed(vec![n(3)]).into(),
        },
        Constraint::BatchSlice {
            cur: Row::of_var(r[0], id()).into(),
            arg: open(vec![], r[1], vec![n(5)]).into(),
            slot: d[0].clone(),
        },
    ]
    .iter()
    .map(|c| c.to_string())
    .collect();
    check(
        shown.join("\n"),
        expect![[r#"
            [2,..$r0..,$d0] >= [3]
            [..$r1..,5] = $d0, [..$r0..]"#]],
    );
}

#[test]
fn the_solver_trace_is_a_stable_snapshot() {
    let (mut s, d, r) = solver(1, 1);
    s.trace = Some(Vec::new());
    let cs = vec![
        Constraint::RowIneq { cur: Row::of_var(r[0], id()).into(), subr: fixed(vec![n(3)]).into() },
        Constraint::DimIneq { cur: n(3), subr: d[0].clone() },
        Constraint::TerminalDim(d[0].clone()),
    ];
    s.solve(Stage::TerminalsToLub, at(cs)).unwrap();
    check(
        s.trace.unwrap().join("\n"),
        expect![[r#"
            TerminalsToLub: [..$r0..] >= [3]
            TerminalsToLub: 3 >= $d0
            TerminalsToLub: [..$r0..] >= [3]
            TerminalsToLub: $d1 >= 3
            TerminalsToLub: $d1 = 3
            TerminalsToLub: terminal $d0
            TerminalsToLub: $d0 = 3
            TerminalsToLub: 3 >= 3"#]],
    );
}

#[test]
fn a_leaf_row_closed_without_an_upper_bound_is_a_guess() {
    // sum >= [] (the known input row of data) and sum >= b (a bias whose input row was not
    // given); h >= w with nothing known anywhere. Neither b nor w has a least upper bound, so
    // closing either to no axes is a guess, warned about by the driver (a bias states its
    // empty input row to avoid it). Leaf rows close before composite rows at stage 6.
    let (mut s, _, r) = solver(0, 4);
    let (sum, b, h, w) = (r[0], r[1], r[2], r[3]);
    let var = |v| Row::of_var(v, id());
    let cs = vec![
        Constraint::RowIneq { cur: var(sum).into(), subr: fixed(vec![]).into() },
        Constraint::RowIneq { cur: var(sum).into(), subr: var(b).into() },
        Constraint::RowIneq { cur: var(h).into(), subr: var(w).into() },
        Constraint::TerminalRow((var(b)).into()),
        Constraint::TerminalRow((var(w)).into()),
        Constraint::ShapeRow { row: (var(sum)).into(), from: 0 },
        Constraint::ShapeRow { row: (var(h)).into(), from: 0 },
    ];
    let mut rest = at(cs);
    for stage in [Stage::Online, Stage::TerminalRowsClosed, Stage::RowConstraints] {
        rest = s.solve(stage, rest).unwrap();
    }
    check(
        s.env.to_string(),
        expect![[r#"
            $r0: subr [$r1]
            $r1: cur [$r0]
            $r2: subr [$r3]
            $r3: cur [$r2]
        "#]],
    );
    check(
        solve_at(&mut s, Stage::RowsToNoMoreAxes, rest.into_iter().map(|c| c.c).collect()),
        expect![[r#"
            solved
            --
            $r0 = []
            $r1 = []
            $r2 = []
            $r3 = []
        "#]],
    );
    // The solver records every unbounded closing; the driver warns only about parameters.
    assert!(s.guessed_rows.contains(&b) && s.guessed_rows.contains(&w));
}

//! Unit and snapshot tests of each solver function and each closing stage.
//!
//! Every test drives one function of [`Solver`] on hand-built rows and dimensions, then
//! snapshots what it derived and the environment it left (both through their stable printers).
//! `UPDATE_EXPECT=1 cargo test -p rocannl-shape --test solver` regenerates the snapshots; a
//! changed snapshot is a changed solver and deserves a look.

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
    Dim::Conv(Box::new(ConvDim { stride, output, dilation, kernel, padded: false }))
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
    let cs =
        vec![Constraint::RowIneq { cur: Row::of_var(r[0], id()), subr: fixed(vec![n(2), n(3)]) }];
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
    // [7, ..r0.., 5] >= [7, 2, 5]: the given leading and trailing axes stay fixed, r0 must
    // supply the middle axis.
    let (mut s, _, r) = solver(0, 1);
    let cs = vec![Constraint::RowIneq {
        cur: open(vec![n(7)], r[0], vec![n(5)]),
        subr: fixed(vec![n(7), n(2), n(5)]),
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

// ---------------------------------------------------------------------------------------------
// Closing: one test per stage

#[test]
fn stage_1_never_closes() {
    let (mut s, d, r) = solver(1, 1);
    let cs = vec![
        Constraint::TerminalDim(d[0].clone()),
        Constraint::TerminalRow(Row::of_var(r[0], id())),
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
        Constraint::TerminalRow(Row::of_var(r[0], id())),
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
        Constraint::ShapeRow(fixed(vec![d[0].clone()])),
        Constraint::TerminalRow(Row::of_var(r[0], id())),
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

#[test]
fn stage_6_closes_every_row_variable_to_no_more_axes() {
    // [..r0.., 2] >= [..r1.., 2] with nothing else known: both close to no further axes.
    let (mut s, _, r) = solver(0, 2);
    let cs = vec![
        Constraint::RowIneq {
            cur: open(vec![], r[0], vec![n(2)]),
            subr: open(vec![], r[1], vec![n(2)]),
        },
        Constraint::ShapeRow(open(vec![], r[0], vec![n(2)])),
        Constraint::ShapeRow(open(vec![], r[1], vec![n(2)])),
    ];
    let rest = s.solve(Stage::RowConstraints, at(cs)).unwrap();
    check(
        solve_at(&mut s, Stage::RowsToNoMoreAxes, rest.into_iter().map(|c| c.c).collect()),
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
    let cs = vec![Constraint::ShapeRow(fixed(vec![d[0].clone(), d[1].clone()]))];
    let rest = s.solve(Stage::RowsToNoMoreAxes, at(cs)).unwrap();
    check(
        solve_at(&mut s, Stage::DimsToLowerBound, rest.into_iter().map(|c| c.c).collect()),
        expect![[r#"
            solved
            --
            $d0 = 1
            $d1 = 4
        "#]],
    );
}

#[test]
fn the_solver_trace_is_a_stable_snapshot() {
    let (mut s, d, r) = solver(1, 1);
    s.trace = Some(Vec::new());
    let cs = vec![
        Constraint::RowIneq { cur: Row::of_var(r[0], id()), subr: fixed(vec![n(3)]) },
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
        Constraint::RowIneq { cur: var(sum), subr: fixed(vec![]) },
        Constraint::RowIneq { cur: var(sum), subr: var(b) },
        Constraint::RowIneq { cur: var(h), subr: var(w) },
        Constraint::TerminalRow(var(b)),
        Constraint::TerminalRow(var(w)),
        Constraint::ShapeRow(var(sum)),
        Constraint::ShapeRow(var(h)),
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

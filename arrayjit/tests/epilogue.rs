//! Epilogues (`low_level::Epilogue`): pointwise work on a product's result run by the product's
//! call. A layer `h = relu(x·W + b)`, and the next layer's product reading `relu(x·W + b)`
//! inline (an operand buffer the first product's epilogue fills), at edge sizes, in f32 and
//! f64, on 1–3 threads: the interpreter's bits, with and without epilogues; the schedule's
//! choice, and the cases it must refuse (a tensor the nest reads written in between, the
//! result read at two cells).

mod common;

use common::*;
use rocannl_arrayjit::assignments::{Asgn, ScalarExpr};
use rocannl_arrayjit::backend::Backend;
use rocannl_arrayjit::backend::interp::Interp;
use rocannl_arrayjit::indexing::{AxisIndex::Iterator as It, Symbol};
use rocannl_arrayjit::low_level::schedule::{CpuSchedule, schedule_cpu};
use rocannl_arrayjit::low_level::verify::verify;
use rocannl_arrayjit::low_level::{Program, Stmt};
use rocannl_arrayjit::ops::{BinOp, Prec, UnOp};
use rocannl_arrayjit::tnode::NodeTable;
use rocannl_arrayjit::{BackendKind, CompileOptions, NdArray, compile_program};

/// What follows the product `p = x·w` (`[m, k] · [k, n]`).
#[derive(Copy, Clone, Debug, PartialEq)]
enum Then {
    /// `h = relu(p + b)`, stored.
    Layer,
    /// `y = relu(p + b) · w2`, the activation inline (`w2` is `[n, n2]`).
    NextLayer(usize),
    /// `c = b·2` first, then `h = relu(p + c)`: the nest reads what is written in between.
    WrittenBetween,
    /// `h = p + pᵀ` (square): the result read at two cells.
    Transposed,
}

fn layer(m: usize, k: usize, n: usize, prec: Prec, then: Then) -> Case {
    let mut nodes = NodeTable::default();
    let x = host(&mut nodes, "x", &[m, k], prec);
    let w = host(&mut nodes, "w", &[k, n], prec);
    let b = host(&mut nodes, "b", &[n], prec);
    let p = host(&mut nodes, "p", &[m, n], prec);
    let (i, j, q) = (Symbol(0), Symbol(1), Symbol(2));
    let product = |lhs, rhs: Vec<_>, (m, k, n), a_dims: Vec<usize>, b_dims: Vec<usize>| {
        let pr = proj(
            &[(i, m), (j, n), (q, k)],
            &[m, n],
            vec![It(i), It(j)],
            vec![(a_dims, vec![It(i), It(q)]), (b_dims, vec![It(q), It(j)])],
        );
        let expr = ScalarExpr::bin(BinOp::Mul, ScalarExpr::Arg(0), ScalarExpr::Arg(1));
        accum(lhs, Some(BinOp::Add), rhs, expr, pr, true)
    };
    let bias_relu = ScalarExpr::un(
        UnOp::Relu,
        ScalarExpr::bin(BinOp::Add, ScalarExpr::Arg(0), ScalarExpr::Arg(1)),
    );
    let cell = |args: Vec<(Vec<usize>, Vec<_>)>| {
        proj(&[(i, m), (j, n)], &[m, n], vec![It(i), It(j)], args)
    };
    let mut code = vec![product(p, vec![x, w], (m, k, n), vec![m, k], vec![k, n])];
    let mut inputs = vec![
        (x, data(m * k, 1, -1.0, 1.0)),
        (w, data(k * n, 2, -0.5, 0.5)),
        (b, data(n, 3, -0.5, 0.5)),
    ];
    let mut outputs = vec![p];
    match then {
        Then::Layer => {
            let h = host(&mut nodes, "h", &[m, n], prec);
            let args = vec![(vec![m, n], vec![It(i), It(j)]), (vec![n], vec![It(j)])];
            code.push(accum(h, None, vec![p, b], bias_relu, cell(args), false));
            outputs.push(h);
        }
        Then::NextLayer(n2) => {
            let h = virt(&mut nodes, "h", &[m, n], prec);
            let w2 = host(&mut nodes, "w2", &[n, n2], prec);
            let y = host(&mut nodes, "y", &[m, n2], prec);
            let args = vec![(vec![m, n], vec![It(i), It(j)]), (vec![n], vec![It(j)])];
            code.push(accum(h, None, vec![p, b], bias_relu, cell(args), false));
            code.push(product(y, vec![h, w2], (m, n, n2), vec![m, n], vec![n, n2]));
            inputs.push((w2, data(n * n2, 4, -0.5, 0.5)));
            outputs.push(y);
        }
        Then::WrittenBetween => {
            let c = host(&mut nodes, "c", &[n], prec);
            let h = host(&mut nodes, "h", &[m, n], prec);
            let twice = ScalarExpr::bin(BinOp::Mul, ScalarExpr::Arg(0), ScalarExpr::Const(2.0));
            let pr = proj(&[(j, n)], &[n], vec![It(j)], vec![(vec![n], vec![It(j)])]);
            code.push(accum(c, None, vec![b], twice, pr, false));
            let args = vec![(vec![m, n], vec![It(i), It(j)]), (vec![n], vec![It(j)])];
            code.push(accum(h, None, vec![p, c], bias_relu, cell(args), false));
            outputs.extend([c, h]);
        }
        Then::Transposed => {
            assert_eq!(m, n);
            let h = host(&mut nodes, "h", &[m, n], prec);
            let add = ScalarExpr::bin(BinOp::Add, ScalarExpr::Arg(0), ScalarExpr::Arg(1));
            let args = vec![(vec![m, n], vec![It(i), It(j)]), (vec![m, n], vec![It(j), It(i)])];
            code.push(accum(h, None, vec![p, p], add, cell(args), false));
            outputs.push(h);
        }
    }
    for (_, v) in inputs.iter_mut() {
        v.iter_mut().for_each(|x| *x = prec.round(*x));
    }
    Case {
        name: format!("{then:?}_{m}x{k}x{n}_{}", prec.name()),
        nodes,
        asgn: Asgn::Seq(code),
        inputs,
        outputs,
        bindings: vec![],
        expected: None,
    }
}

/// The program after the CPU schedule, verified.
fn scheduled(case: &Case, epilogues: bool) -> Program {
    let mut prog =
        compile_program(&case.name, &case.asgn, &case.nodes, &CompileOptions::default()).unwrap();
    schedule_cpu(&mut prog, &CpuSchedule { threads: 2, epilogues, ..CpuSchedule::default() });
    verify(&prog, "schedule").unwrap();
    prog
}

fn epilogues(prog: &Program) -> usize {
    let mut n = 0;
    for s in &prog.body {
        s.visit(&mut |s| n += usize::from(matches!(s, Stmt::Gemm(g) if g.epilogue.is_some())));
    }
    n
}

fn bits(a: &[f64]) -> Vec<u64> {
    a.iter().map(|x| x.to_bits()).collect()
}

/// gccjit with and without epilogues, on 1, 2 and 3 threads, gives the interpreter's bits.
fn check(case: &Case) {
    let want = run_case(BackendKind::Interp, CompileOptions::default(), case);
    for epilogues in [true, false] {
        for threads in [1, 2, 3] {
            let opts = CompileOptions {
                threads: Some(threads),
                min_parallel_work: 1,
                epilogues,
                ..CompileOptions::default()
            };
            let got = run_case(BackendKind::Gccjit, opts, case);
            for (k, (g, w)) in got.iter().zip(&want).enumerate() {
                assert_eq!(bits(g), bits(w), "{} output {k}, {threads} threads", case.name);
            }
        }
    }
}

/// The scheduled program on the interpreter (its epilogues run by the interpreter's own
/// semantics), against the unscheduled program.
fn interpreted(case: &Case, prog: &Program) -> Vec<Vec<f64>> {
    let mut be = Interp::new(&CompileOptions::default());
    for node in prog.nodes.values() {
        be.alloc(node).unwrap();
    }
    for (id, vals) in &case.inputs {
        let node = case.nodes.get(*id).unwrap();
        be.write(*id, &NdArray::from_f64(node.prec, &node.dims, vals).unwrap()).unwrap();
    }
    let routine = be
        .compile(
            prog,
            &rocannl_arrayjit::backend::BuildRequest::from_options(&CompileOptions::default()),
        )
        .unwrap()
        .routine;
    be.run(routine, &[]).unwrap();
    case.outputs.iter().map(|o| be.read(*o).unwrap().to_f64_vec()).collect()
}

#[test]
fn a_layers_bias_and_activation_run_in_the_products_call() {
    for prec in [Prec::F32, Prec::F64] {
        for (m, k, n) in [(128, 256, 64), (37, 131, 19), (2, 257, 160), (200, 128, 33)] {
            let case = layer(m, k, n, prec, Then::Layer);
            assert_eq!(epilogues(&scheduled(&case, true)), 1, "{}", case.name);
            assert_eq!(epilogues(&scheduled(&case, false)), 0, "{}", case.name);
            check(&case);
        }
    }
}

#[test]
fn the_next_products_operand_is_filled_by_the_epilogue() {
    for prec in [Prec::F32, Prec::F64] {
        for (m, k, n, n2) in [(128, 256, 256, 10), (61, 129, 131, 17)] {
            let case = layer(m, k, n, prec, Then::NextLayer(n2));
            let prog = scheduled(&case, true);
            assert_eq!(epilogues(&prog), 1, "{}", case.name);
            check(&case);
            // The interpreter runs the scheduled program's epilogue as the nest it stands for.
            let want = run_case(BackendKind::Interp, CompileOptions::default(), &case);
            let got = interpreted(&case, &prog);
            for (g, w) in got.iter().zip(&want) {
                assert_eq!(bits(g), bits(w), "{}", case.name);
            }
        }
    }
}

#[test]
fn nests_that_must_not_move_stay_where_they_are() {
    for case in [
        layer(64, 256, 64, Prec::F32, Then::WrittenBetween),
        layer(64, 256, 64, Prec::F32, Then::Transposed),
    ] {
        assert_eq!(epilogues(&scheduled(&case, true)), 0, "{}", case.name);
        check(&case);
    }
}

#[test]
fn snapshot_of_a_layer() {
    let case = layer(128, 256, 64, Prec::F32, Then::Layer);
    let text = scheduled(&case, true).to_string();
    let start = text.find("for").unwrap();
    expect_test::expect![[r#"
        for v5 in 0..2 par {
          gemm f32 fma n3[@0; 64, 1] := n0[@0; 256, 1] · n1[@0; 64, 1] (m 128 in blocks v5*64, n 64, k 256) then per cell (v3 < 128; v4 < 64) {
            n4[v3, v4] := relu(add(n3[v3, v4], n2[v4]))
          }
        }
    "#]]
    .assert_eq(&text[start..]);
}

//! Bounds-check mode: a planted out-of-range index is reported, not executed.

mod common;

use common::*;
use rocannl_arrayjit::backend::interp::Interp;
use rocannl_arrayjit::backend::{Backend, BuildRequest};
use rocannl_arrayjit::low_level::{Index, Program, Stmt};
use rocannl_arrayjit::ops::Prec;
use rocannl_arrayjit::{CompileOptions, Error, NdArray, compile_program};

/// A copy of a matmul whose read of `b` is shifted one row down: the last rows read past `b`.
fn planted() -> (Case, Program) {
    let case = matmul_case(4, 3, 5, Prec::F32);
    let mut prog =
        compile_program("planted", &case.asgn, &case.nodes, &CompileOptions::default()).unwrap();
    fn shift(stmts: &mut [Stmt]) {
        for s in stmts {
            match s {
                Stmt::For { body, .. } | Stmt::If { body, .. } => shift(body),
                Stmt::SetLocal { value, .. } => {
                    let v = std::mem::replace(value, rocannl_arrayjit::low_level::Expr::Const(0.0));
                    *value = v.rewrite(&mut |e| match e {
                        rocannl_arrayjit::low_level::Expr::Get(n, mut idx) if n.0 == 1 => {
                            idx[0] = Index::new(idx[0].terms.clone(), idx[0].offset + 1);
                            rocannl_arrayjit::low_level::Expr::Get(n, idx)
                        }
                        e => e,
                    });
                }
                _ => {}
            }
        }
    }
    shift(&mut prog.body);
    (case, prog)
}

fn run_planted(backend: &mut dyn Backend) -> Result<(), Error> {
    let (case, prog) = planted();
    for id in prog.materialized_nodes() {
        backend.alloc(&prog.nodes[&id])?;
    }
    for (id, vals) in &case.inputs {
        let node = case.nodes.get(*id).unwrap();
        backend.write(*id, &NdArray::from_f64(node.prec, &node.dims, vals).unwrap())?;
    }
    let r =
        backend.compile(&prog, &BuildRequest::from_options(&CompileOptions::default()))?.routine;
    backend.run(r, &[])
}

#[test]
fn interp_reports_the_planted_index() {
    let opts = CompileOptions { bounds_check: true, ..CompileOptions::default() };
    let err = run_planted(&mut Interp::new(&opts)).unwrap_err();
    assert!(
        matches!(&err, Error::OutOfBounds { node: 1, axis: 0, index: 3, bound: 3, label } if label == "b"),
        "{err}"
    );
    assert_eq!(err.to_string(), "index out of bounds: n1 `b` axis 0: index 3 not in 0..3");
}

#[cfg(feature = "gccjit")]
#[test]
fn gccjit_reports_the_planted_index() {
    use rocannl_arrayjit::backend::gccjit::Gccjit;
    for threads in [1, 2] {
        let opts = CompileOptions {
            bounds_check: true,
            threads: Some(threads),
            min_parallel_work: 1,
            ..CompileOptions::default()
        };
        let mut backend = Gccjit::new(&opts);
        let src = backend.render(&planted().1).unwrap();
        assert!(src.contains("rc_report(err, 1, 0,"), "{src}");
        let err = run_planted(&mut backend).unwrap_err();
        assert!(
            matches!(&err, Error::OutOfBounds { node: 1, axis: 0, index: 3, bound: 3, label } if label == "b"),
            "{err}"
        );
    }
}

/// Two matmuls of one shape, `c2 = a2·b2` (nodes 3–5) first, then `c = a·b` (nodes 0–2), with
/// every read of `b` and `b2` shifted one row down. Both are the same code, compiled once by
/// gccjit.
#[cfg(feature = "gccjit")]
fn planted_twice() -> Program {
    use rocannl_arrayjit::assignments::{Asgn, ScalarExpr};
    use rocannl_arrayjit::indexing::{AxisIndex::Iterator as It, Symbol};
    use rocannl_arrayjit::low_level::Expr;
    use rocannl_arrayjit::ops::BinOp;
    use rocannl_arrayjit::tnode::NodeTable;
    let (m, k, n) = (4, 3, 5);
    let mut nodes = NodeTable::default();
    let mut ids = Vec::new();
    for suffix in ["", "2"] {
        let a = host(&mut nodes, &format!("a{suffix}"), &[m, k], Prec::F32);
        let b = host(&mut nodes, &format!("b{suffix}"), &[k, n], Prec::F32);
        let c = host(&mut nodes, &format!("c{suffix}"), &[m, n], Prec::F32);
        ids.push((a, b, c));
    }
    let (i, j, kk) = (Symbol(0), Symbol(1), Symbol(2));
    let mul = ScalarExpr::bin(BinOp::Mul, ScalarExpr::Arg(0), ScalarExpr::Arg(1));
    let asgn = Asgn::Seq(
        [ids[1], ids[0]]
            .iter()
            .map(|&(a, b, c)| {
                let p = proj(
                    &[(i, m), (j, n), (kk, k)],
                    &[m, n],
                    vec![It(i), It(j)],
                    vec![(vec![m, k], vec![It(i), It(kk)]), (vec![k, n], vec![It(kk), It(j)])],
                );
                accum(c, Some(BinOp::Add), vec![a, b], mul.clone(), p, true)
            })
            .collect(),
    );
    let mut prog = compile_program("planted2", &asgn, &nodes, &CompileOptions::default()).unwrap();
    let bs = [ids[0].1, ids[1].1];
    fn shift(stmts: &mut [Stmt], bs: &[rocannl_arrayjit::tnode::NodeId]) {
        for s in stmts {
            match s {
                Stmt::For { body, .. } | Stmt::If { body, .. } => shift(body, bs),
                Stmt::SetLocal { value, .. } => {
                    let v = std::mem::replace(value, Expr::Const(0.0));
                    *value = v.rewrite(&mut |e| match e {
                        Expr::Get(n, mut idx) if bs.contains(&n) => {
                            idx[0] = Index::new(idx[0].terms.clone(), idx[0].offset + 1);
                            Expr::Get(n, idx)
                        }
                        e => e,
                    });
                }
                _ => {}
            }
        }
    }
    shift(&mut prog.body, &bs);
    prog
}

#[cfg(feature = "gccjit")]
#[test]
fn a_bad_index_in_a_shared_step_names_the_tensor_of_that_call() {
    use rocannl_arrayjit::backend::gccjit::Gccjit;
    // Parallel steps are one loop nest each, so the two copies are two calls of one step.
    let opts = CompileOptions {
        bounds_check: true,
        threads: Some(2),
        min_parallel_work: 1,
        ..CompileOptions::default()
    };
    let mut backend = Gccjit::new(&opts);
    let prog = planted_twice();
    let src = backend.render(&prog).unwrap();
    assert_eq!(src.matches("\nvoid step_").count(), 1, "{src}");
    assert!(src.contains("   step_0(n3, n4, n5)\n   step_0(n0, n1, n2)\n"), "{src}");
    for id in prog.materialized_nodes() {
        backend.alloc(&prog.nodes[&id]).unwrap();
    }
    let r = backend.compile(&prog, &BuildRequest::from_options(&opts)).unwrap().routine;
    let err = backend.run(r, &[]).unwrap_err();
    assert!(
        matches!(&err, Error::OutOfBounds { node: 4, axis: 0, index: 3, bound: 3, label } if label == "b2"),
        "{err}"
    );
}

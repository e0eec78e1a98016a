//! Bounds-check mode: a planted out-of-range index is reported, not executed.

mod common;

use common::*;
use rocannl_arrayjit::backend::Backend;
use rocannl_arrayjit::backend::interp::Interp;
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
    let (r, _) = backend.compile(&prog)?;
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

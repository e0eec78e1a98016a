//! Lowering and optimization: snapshots of the low-level IR, virtualization, errors.

mod common;

use common::*;
use expect_test::expect;
use rocannl_arrayjit::assignments::{Asgn, ScalarExpr};
use rocannl_arrayjit::indexing::{Projections, Symbol, SymbolGen};
use rocannl_arrayjit::ops::{BinOp, Prec, UnOp};
use rocannl_arrayjit::tnode::{MemoryMode, NodeTable};
use rocannl_arrayjit::{BackendKind, CompileOptions, Context, Error, NdArray, compile_program};

fn optimized(case: &Case) -> String {
    compile_program(&case.name, &case.asgn, &case.nodes, &CompileOptions::default())
        .unwrap()
        .to_string()
}

#[test]
fn matmul_lowered_and_optimized() {
    let case = matmul_case(4, 3, 5, Prec::F32);
    expect![[r#"
        n2[i0, i1] add= mul(n0[i0, i2], n1[i2, i1])  over [i0:4, i1:5, i2:3]  init
    "#]]
    .assert_eq(&case.asgn.to_string());
    expect![[r#"
        # c matmul
        for v0 in 0..4 par {
          for v1 in 0..5 par {
            t0 := 0
            for v2 in 0..3 {
              t0 := fma(n0[v0, v2], n1[v2, v1], t0)
            }
            n2[v0, v1] := t0
          }
        }
    "#]]
    .assert_eq(&optimized(&case));
}

#[test]
fn padded_convolution_is_guarded() {
    let case = conv_case(Prec::F32, 2, 1);
    expect![[r#"
        # y conv
        for v0 in 0..5 par {
          t0 := 0
          for v1 in 0..3 {
            if 0 <= 2*v0 + v1 - 1 < 10 {
              t0 := fma(n0[2*v0 + v1 - 1], n1[v1], t0)
            }
          }
          n2[v0] := t0
        }
    "#]]
    .assert_eq(&optimized(&case));
}

#[test]
fn softmax_keeps_the_expensive_exponentials_read_twice() {
    let case = softmax_case(Prec::F32, 2, 8);
    expect![[r#"
        # softmax
        for v0 in 0..2 par {
          t0 := -inf
          for v1 in 0..8 {
            t0 := max(t0, n0[v0, v1])
          }
          n1[v0, 0] := t0
        }
        for v2 in 0..2 par {
          for v3 in 0..8 par {
            n2[v2, v3] := exp(sub(n0[v2, v3], n1[v2, 0]))
          }
        }
        for v4 in 0..2 par {
          t1 := 0
          for v5 in 0..8 {
            t1 := add(t1, n2[v4, v5])
          }
          n3[v4, 0] := t1
        }
        for v6 in 0..2 par {
          for v7 in 0..8 par {
            n4[v6, v7] := div(n2[v6, v7], n3[v6, 0])
          }
        }
    "#]]
    .assert_eq(&optimized(&case));
}

/// A chain of pointwise operations: every intermediate is inlined into the last one.
fn pointwise_chain(mode: MemoryMode) -> (NodeTable, Asgn, Vec<rocannl_arrayjit::NodeId>) {
    let n = 16;
    let mut nodes = NodeTable::default();
    let x = host(&mut nodes, "x", &[n], Prec::F64);
    let a = nodes.add("a", &[n], Prec::F64, mode);
    let b = nodes.add("b", &[n], Prec::F64, mode);
    let c = nodes.add("c", &[n], Prec::F64, mode);
    let y = host(&mut nodes, "y", &[n], Prec::F64);
    let mut g = SymbolGen::default();
    let mut p = || Projections::identity(&[n], 1, &mut g);
    let asgn = Asgn::Seq(vec![
        accum(a, None, vec![x], ScalarExpr::un(UnOp::Exp, ScalarExpr::Arg(0)), p(), false),
        accum(
            b,
            None,
            vec![a],
            ScalarExpr::bin(BinOp::Mul, ScalarExpr::Arg(0), ScalarExpr::Const(3.0)),
            p(),
            false,
        ),
        accum(c, None, vec![b], ScalarExpr::un(UnOp::Tanh, ScalarExpr::Arg(0)), p(), false),
        accum(
            y,
            None,
            vec![c],
            ScalarExpr::bin(BinOp::Add, ScalarExpr::Arg(0), ScalarExpr::Const(1.0)),
            p(),
            false,
        ),
    ]);
    (nodes, asgn, vec![x, a, b, c, y])
}

#[test]
fn virtualization_removes_intermediate_buffers_without_changing_results() {
    let mut results = Vec::new();
    for mode in [MemoryMode::Virtual, MemoryMode::OnDevice] {
        let (nodes, asgn, ids) = pointwise_chain(mode);
        let mut ctx = Context::new(BackendKind::Interp, CompileOptions::default()).unwrap();
        let r = ctx.compile("chain", &asgn, &nodes).unwrap();
        let xs = data(16, 3, -1.0, 1.0);
        ctx.write(ids[0], &NdArray::from_f64(Prec::F64, &[16], &xs).unwrap()).unwrap();
        ctx.run(&r, &[]).unwrap();
        let virtual_count = r.virtual_nodes().len();
        let buffered = ids.iter().filter(|id| ctx.has_buffer(**id)).count();
        if mode == MemoryMode::Virtual {
            assert_eq!(r.virtual_nodes(), &ids[1..4]);
            assert_eq!(buffered, 2, "only x and y keep buffers");
            assert!(matches!(ctx.read(ids[2]), Err(Error::NotMaterialized { .. })));
            expect![[r#"
                for v3 in 0..16 par {
                  n4[v3] := add(tanh(mul(exp(n0[v3]), 3)), 1)
                }
            "#]]
            .assert_eq(r.low_level_text());
        } else {
            assert_eq!(virtual_count, 0);
            assert_eq!(buffered, 5);
        }
        let ys = ctx.read(ids[4]).unwrap().to_f64_vec();
        let want: Vec<f64> = xs.iter().map(|x| (x.exp() * 3.0).tanh() + 1.0).collect();
        assert_close("chain", &ys, &want, 1e-14);
        results.push(ys);
    }
    assert_eq!(results[0], results[1]);
}

#[test]
fn cse_shares_repeated_inlined_subexpressions() {
    let n = 4;
    let mut nodes = NodeTable::default();
    let x = host(&mut nodes, "x", &[n], Prec::F32);
    let s = virt(&mut nodes, "s", &[n], Prec::F32);
    let y = host(&mut nodes, "y", &[n], Prec::F32);
    let mut g = SymbolGen::default();
    let p1 = Projections::identity(&[n], 1, &mut g);
    let p2 = Projections::identity(&[n], 2, &mut g);
    let asgn = Asgn::Seq(vec![
        accum(
            s,
            None,
            vec![x],
            ScalarExpr::bin(BinOp::Add, ScalarExpr::Arg(0), ScalarExpr::Const(1.0)),
            p1,
            false,
        ),
        accum(
            y,
            None,
            vec![s, s],
            ScalarExpr::bin(BinOp::Mul, ScalarExpr::Arg(0), ScalarExpr::Arg(1)),
            p2,
            false,
        ),
    ]);
    let prog = compile_program("sq", &asgn, &nodes, &CompileOptions::default()).unwrap();
    expect![[r#"
        for v1 in 0..4 par {
          t0 := add(n0[v1], 1)
          n2[v1] := mul(t0, t0)
        }
    "#]]
    .assert_eq(&prog.to_string());
}

#[test]
fn dead_intermediates_are_removed() {
    let n = 4;
    let mut nodes = NodeTable::default();
    let x = host(&mut nodes, "x", &[n], Prec::F32);
    let dead = nodes.add("unused", &[n], Prec::F32, MemoryMode::Local);
    let p = Projections::identity(&[n], 1, &mut SymbolGen::default());
    let asgn = accum(dead, None, vec![x], ScalarExpr::un(UnOp::Exp, ScalarExpr::Arg(0)), p, false);
    let prog = compile_program("dead", &asgn, &nodes, &CompileOptions::default()).unwrap();
    assert_eq!(prog.to_string(), "");
    assert_eq!(prog.virtual_nodes, vec![dead]);
}

#[test]
fn injective_initialized_accumulation_assigns() {
    let n = 3;
    let mut nodes = NodeTable::default();
    let x = host(&mut nodes, "x", &[n], Prec::F32);
    let y = host(&mut nodes, "y", &[n], Prec::F32);
    let p = Projections::identity(&[n], 1, &mut SymbolGen::default());
    let asgn = accum(y, Some(BinOp::Add), vec![x], ScalarExpr::Arg(0), p.clone(), true);
    let prog = compile_program("r", &asgn, &nodes, &CompileOptions::default()).unwrap();
    expect![[r#"
        for v0 in 0..3 par {
          n1[v0] := n0[v0]
        }
    "#]]
    .assert_eq(&prog.to_string());
    let asgn = accum(y, Some(BinOp::Add), vec![x], ScalarExpr::Arg(0), p, false);
    let prog = compile_program("r", &asgn, &nodes, &CompileOptions::default()).unwrap();
    expect![[r#"
        for v0 in 0..3 par {
          n1[v0] := add(n1[v0], n0[v0])
        }
    "#]]
    .assert_eq(&prog.to_string());
}

#[test]
fn bad_input_is_a_typed_error() {
    let case = matmul_case(2, 3, 4, Prec::F32);
    let mut ctx = Context::new(BackendKind::Interp, CompileOptions::default()).unwrap();
    // Unknown node.
    let mut nodes = case.nodes.clone();
    let missing = rocannl_arrayjit::NodeId(99);
    let p = Projections::identity(&[2], 1, &mut SymbolGen::default());
    let asgn = accum(missing, None, vec![case.outputs[0]], ScalarExpr::Arg(0), p, false);
    assert!(matches!(ctx.compile("bad", &asgn, &nodes), Err(Error::UnknownNode(99))));
    // Wrong arity.
    let y = host(&mut nodes, "y", &[2], Prec::F32);
    let p = Projections::identity(&[2], 1, &mut SymbolGen::default());
    let asgn = accum(y, None, vec![], ScalarExpr::Arg(0), p, false);
    assert!(matches!(ctx.compile("bad", &asgn, &nodes), Err(Error::InvalidAssignment { .. })));
    // Initialization with an operator that has no neutral element.
    let p = Projections::identity(&[2], 1, &mut SymbolGen::default());
    let asgn = accum(y, Some(BinOp::Sub), vec![y], ScalarExpr::Arg(0), p, true);
    assert!(matches!(ctx.compile("bad", &asgn, &nodes), Err(Error::NoNeutral("sub"))));
    // Data of the wrong shape.
    let r = ctx.compile("mm", &case.asgn, &case.nodes).unwrap();
    let wrong = NdArray::from_f64(Prec::F32, &[3], &[1.0, 2.0, 3.0]).unwrap();
    assert!(matches!(ctx.write(case.inputs[0].0, &wrong), Err(Error::ShapeMismatch { .. })));
    ctx.run(&r, &[]).unwrap();
    // A routine of another context.
    let mut other = Context::new(BackendKind::Interp, CompileOptions::default()).unwrap();
    assert!(matches!(other.run(&r, &[]), Err(Error::ForeignRoutine(_))));
    assert!(matches!(BackendKind::from_name("tpu"), Err(Error::UnknownBackend(_))));
}

#[test]
fn runtime_symbols_are_bound_and_range_checked() {
    let case = batch_slice_case(Prec::F32, 3);
    let mut ctx = Context::new(BackendKind::Interp, CompileOptions::default()).unwrap();
    let r = ctx.compile("slice", &case.asgn, &case.nodes).unwrap();
    assert_eq!(r.runtime_symbols(), &[Symbol(50)]);
    assert!(matches!(ctx.run(&r, &[]), Err(Error::MissingBinding(Symbol(50)))));
    let err = ctx.run(&r, &[(Symbol(50), 4)]).unwrap_err();
    assert!(matches!(err, Error::SymbolOutOfRange { value: 4, bound: 4, axis: 0, .. }), "{err}");
    ctx.run(&r, &[(Symbol(50), 3)]).unwrap();
}

#[test]
fn debug_dir_receives_ir_and_source() {
    let dir =
        rocannl_arrayjit::env::temp_dir().join(format!("rocannl-debug-{}", std::process::id()));
    let opts = CompileOptions { debug_dir: Some(dir.clone()), ..CompileOptions::default() };
    let case = matmul_case(2, 2, 2, Prec::F32);
    let mut ctx = Context::new(BackendKind::Interp, opts).unwrap();
    ctx.compile("mm", &case.asgn, &case.nodes).unwrap();
    let ll = std::fs::read_to_string(dir.join("mm.ll.txt")).unwrap();
    assert!(ll.contains("fma(n0[v0, v2], n1[v2, v1], t0)"));
    assert!(std::fs::read_to_string(dir.join("mm.asgn.txt")).unwrap().contains("add="));
    assert!(dir.join("mm.interp.txt").exists());
    std::fs::remove_dir_all(&dir).unwrap();
}

/// The simulator's debug output holds the kernels it runs and, for reading or compiling on a
/// machine without a GPU, the CUDA C the cuda backend prints for the same kernels.
#[cfg(feature = "cuda")]
#[test]
fn debug_dir_of_the_simulator_holds_the_cuda_source() {
    let dir =
        rocannl_arrayjit::env::temp_dir().join(format!("rocannl-debug-sim-{}", std::process::id()));
    let opts = CompileOptions { debug_dir: Some(dir.clone()), ..CompileOptions::default() };
    let case = matmul_case(2, 2, 2, Prec::F32);
    let mut ctx = Context::new(BackendKind::CudaSim, opts).unwrap();
    ctx.compile("mm", &case.asgn, &case.nodes).unwrap();
    let cu = std::fs::read_to_string(dir.join("mm.cu")).unwrap();
    let prog = compile_program("mm", &case.asgn, &case.nodes, &CompileOptions::default()).unwrap();
    assert_eq!(cu, rocannl_arrayjit::backend::cuda::render::render(&prog).source);
    assert!(cu.contains("__global__ void k0("), "{cu}");
    assert!(dir.join("mm.kernels.txt").exists());
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn matmul_cpu_schedule() {
    let case = matmul_case(8, 8, 16, Prec::F32);
    let mut prog =
        compile_program(&case.name, &case.asgn, &case.nodes, &CompileOptions::default()).unwrap();
    rocannl_arrayjit::low_level::schedule::schedule_cpu(&mut prog, &Default::default());
    rocannl_arrayjit::low_level::verify::verify(&prog, "schedule").unwrap();
    expect![[r#"
        # c matmul
        for v3 in 0..2 par {
          t1 := n0[4*v3, 0]
          t2 := n0[4*v3, 1]
          t3 := n0[4*v3, 2]
          t4 := n0[4*v3, 3]
          t5 := n0[4*v3 + 1, 0]
          t6 := n0[4*v3 + 1, 1]
          t7 := n0[4*v3 + 1, 2]
          t8 := n0[4*v3 + 1, 3]
          t9 := n0[4*v3 + 2, 0]
          t10 := n0[4*v3 + 2, 1]
          t11 := n0[4*v3 + 2, 2]
          t12 := n0[4*v3 + 2, 3]
          t13 := n0[4*v3 + 3, 0]
          t14 := n0[4*v3 + 3, 1]
          t15 := n0[4*v3 + 3, 2]
          t16 := n0[4*v3 + 3, 3]
          for v8 in 0..16 par {
            t17 := n1[3, v8]
            t18 := n1[2, v8]
            t19 := n1[1, v8]
            t20 := n1[0, v8]
            n2[4*v3, v8] := fma(t4, t17, fma(t3, t18, fma(t2, t19, fma(t1, t20, 0))))
            n2[4*v3 + 1, v8] := fma(t8, t17, fma(t7, t18, fma(t6, t19, fma(t5, t20, 0))))
            n2[4*v3 + 2, v8] := fma(t12, t17, fma(t11, t18, fma(t10, t19, fma(t9, t20, 0))))
            n2[4*v3 + 3, v8] := fma(t16, t17, fma(t15, t18, fma(t14, t19, fma(t13, t20, 0))))
          }
          t1 := n0[4*v3, 4]
          t2 := n0[4*v3, 5]
          t3 := n0[4*v3, 6]
          t4 := n0[4*v3, 7]
          t5 := n0[4*v3 + 1, 4]
          t6 := n0[4*v3 + 1, 5]
          t7 := n0[4*v3 + 1, 6]
          t8 := n0[4*v3 + 1, 7]
          t9 := n0[4*v3 + 2, 4]
          t10 := n0[4*v3 + 2, 5]
          t11 := n0[4*v3 + 2, 6]
          t12 := n0[4*v3 + 2, 7]
          t13 := n0[4*v3 + 3, 4]
          t14 := n0[4*v3 + 3, 5]
          t15 := n0[4*v3 + 3, 6]
          t16 := n0[4*v3 + 3, 7]
          for v8 in 0..16 par {
            t17 := n1[7, v8]
            t18 := n1[6, v8]
            t19 := n1[5, v8]
            t20 := n1[4, v8]
            n2[4*v3, v8] := fma(t4, t17, fma(t3, t18, fma(t2, t19, fma(t1, t20, n2[4*v3, v8]))))
            n2[4*v3 + 1, v8] := fma(t8, t17, fma(t7, t18, fma(t6, t19, fma(t5, t20, n2[4*v3 + 1, v8]))))
            n2[4*v3 + 2, v8] := fma(t12, t17, fma(t11, t18, fma(t10, t19, fma(t9, t20, n2[4*v3 + 2, v8]))))
            n2[4*v3 + 3, v8] := fma(t16, t17, fma(t15, t18, fma(t14, t19, fma(t13, t20, n2[4*v3 + 3, v8]))))
          }
        }
    "#]].assert_eq(&prog.to_string());
}

#[test]
fn schedule_leaves_small_nests_alone() {
    for case in [conv_case(Prec::F32, 1, 1), matmul_case(4, 3, 5, Prec::F32)] {
        let mut prog =
            compile_program(&case.name, &case.asgn, &case.nodes, &CompileOptions::default())
                .unwrap();
        let before = prog.to_string();
        rocannl_arrayjit::low_level::schedule::schedule_cpu(&mut prog, &Default::default());
        assert_eq!(prog.to_string(), before);
    }
}

#[test]
fn a_huge_sum_is_split_where_inlining_would_pass_the_cost_cap() {
    use rocannl_arrayjit::low_level::Stmt;
    use rocannl_arrayjit::low_level::virtualize::MAX_INLINED_COST;
    let n = 4;
    let mut nodes = NodeTable::default();
    let leaves: Vec<_> =
        (0..512).map(|k| host(&mut nodes, &format!("x{k}"), &[n], Prec::F32)).collect();
    let mut g = SymbolGen::default();
    let mut code = Vec::new();
    let mut level = leaves.clone();
    let mut root = None;
    while level.len() > 1 {
        let mut next = Vec::new();
        for pair in level.chunks(2) {
            let last = level.len() == 2;
            let out = if last {
                *root.insert(host(&mut nodes, "y", &[n], Prec::F32))
            } else {
                virt(&mut nodes, "s", &[n], Prec::F32)
            };
            let add = ScalarExpr::bin(BinOp::Add, ScalarExpr::Arg(0), ScalarExpr::Arg(1));
            code.push(accum(
                out,
                None,
                pair.to_vec(),
                add,
                Projections::identity(&[n], 2, &mut g),
                false,
            ));
            next.push(out);
        }
        level = next;
    }
    let asgn = Asgn::Seq(code);
    let prog = compile_program("sum", &asgn, &nodes, &CompileOptions::default()).unwrap();
    let mut statements = 0;
    for s in &prog.body {
        s.visit(&mut |s| {
            if let Stmt::Set { value, .. } = s {
                statements += 1;
                assert!(value.cost() <= MAX_INLINED_COST, "{}", value.cost());
            }
        });
    }
    // 511 adds: inlined into a few statements, not one.
    assert!((2..=8).contains(&statements), "{statements} statements:\n{prog}");
    let mut ctx = Context::new(BackendKind::Interp, CompileOptions::default()).unwrap();
    let r = ctx.compile("sum", &asgn, &nodes).unwrap();
    let mut want = vec![0.0f32; n];
    for (k, x) in leaves.iter().enumerate() {
        let xs = data(n, k as u64, -1.0, 1.0);
        ctx.write(*x, &NdArray::from_f64(Prec::F32, &[n], &xs).unwrap()).unwrap();
        want.iter_mut().zip(&xs).for_each(|(w, v)| *w += *v as f32);
    }
    ctx.run(&r, &[]).unwrap();
    let got = ctx.read(root.unwrap()).unwrap().to_f64_vec();
    let want: Vec<f64> = want.iter().map(|v| *v as f64).collect();
    assert_close("sum", &got, &want, 1e-4);
}

/// Backpropagation's shape: both gradients zeroed up front, each summed onto once much later
/// and read once. The first sum reads `+0` instead of its gradient and the fill goes, so the
/// gradient is one pointwise definition (`0 + x`, which simplification makes `x` as it does
/// every `x + 0`) and is inlined into its reader; `g2`, read between its fill and its sum,
/// keeps both. Every backend gives the interpreter's bits.
#[test]
fn zero_fill_folds_into_the_first_sum() {
    use rocannl_arrayjit::assignments::FetchOp;
    let n = 16;
    let mut nodes = NodeTable::default();
    let x = host(&mut nodes, "x", &[n], Prec::F32);
    let g1 = nodes.add("g1", &[n], Prec::F32, MemoryMode::Virtual);
    let g2 = nodes.add("g2", &[n], Prec::F32, MemoryMode::Virtual);
    let y1 = host(&mut nodes, "y1", &[n], Prec::F32);
    let y2 = host(&mut nodes, "y2", &[n], Prec::F32);
    let mut g = SymbolGen::default();
    let mut p = || Projections::identity(&[n], 1, &mut g);
    let zero = |lhs| Asgn::Fetch { lhs, fetch: FetchOp::Constant(0.0) };
    let twice = ScalarExpr::bin(BinOp::Mul, ScalarExpr::Arg(0), ScalarExpr::Const(2.0));
    let asgn = Asgn::Seq(vec![
        zero(g1),
        zero(g2),
        accum(y2, None, vec![g2], ScalarExpr::Arg(0), p(), false),
        accum(g1, Some(BinOp::Add), vec![x], ScalarExpr::Arg(0), p(), false),
        accum(g2, Some(BinOp::Add), vec![x], ScalarExpr::Arg(0), p(), false),
        accum(y1, None, vec![g1], twice.clone(), p(), false),
        accum(y2, Some(BinOp::Add), vec![g2], twice, p(), false),
    ]);
    let prog = compile_program("grads", &asgn, &nodes, &CompileOptions::default()).unwrap();
    assert!(prog.virtual_nodes.contains(&g1), "{prog}");
    assert!(!prog.virtual_nodes.contains(&g2), "{prog}");
    expect![[r#"
        for v1 in 0..16 par {
          n2[v1] := 0
        }
        for v2 in 0..16 par {
          n4[v2] := n2[v2]
        }
        for v4 in 0..16 par {
          n2[v4] := add(n2[v4], n0[v4])
        }
        for v5 in 0..16 par {
          n3[v5] := mul(n0[v5], 2)
        }
        for v6 in 0..16 par {
          n4[v6] := fma(n2[v6], 2, n4[v6])
        }
    "#]]
    .assert_eq(&prog.to_string());
    let mut xs = data(n, 7, -1.0, 1.0);
    xs.iter_mut().step_by(3).for_each(|v| *v = -0.0);
    let run = |kind| {
        let mut ctx = Context::new(kind, CompileOptions::default()).unwrap();
        let r = ctx.compile("grads", &asgn, &nodes).unwrap();
        ctx.write(x, &NdArray::from_f64(Prec::F32, &[n], &xs).unwrap()).unwrap();
        ctx.run(&r, &[]).unwrap();
        let bits = |y| -> Vec<u32> {
            ctx.read(y).unwrap().to_f64_vec().iter().map(|&v| (v as f32).to_bits()).collect()
        };
        (bits(y1), bits(y2))
    };
    let want = run(BackendKind::Interp);
    let twice: Vec<f32> = xs.iter().map(|&v| v as f32 * 2.0).collect();
    assert_eq!(want.0.iter().map(|&b| f32::from_bits(b)).collect::<Vec<_>>(), twice);
    for kind in BackendKind::available().into_iter().filter(|k| *k != BackendKind::Cuda) {
        assert_eq!(run(kind), want, "{kind:?}");
    }
}

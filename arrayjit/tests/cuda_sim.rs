//! The kernel simulator (`cuda-sim`) on kernels written by hand: a block tree sum in shared
//! memory with barriers and an atomic sum run right and race-free; a missing barrier, threads
//! writing one cell, an index past the end, a barrier inside a branch and too much shared
//! memory are each reported. (The lowered kernels of every conformance case run in
//! `conformance.rs`.)

mod common;

use rocannl_arrayjit::backend::Backend;
use rocannl_arrayjit::backend::cuda_sim::CudaSim;
use rocannl_arrayjit::backend::kernel_ir::{BLOCK, KStmt, Kernel, SharedArray};
use rocannl_arrayjit::low_level::{Arena, Expr, Guard, IdxVar, Index, LocalId, Program, Stmt, Var};
use rocannl_arrayjit::ops::{BinOp, Prec};
use rocannl_arrayjit::tnode::{MemoryMode, NodeId, TensorNode};
use rocannl_arrayjit::{Error, NdArray};
use rustc_hash::FxHashMap;

const X: NodeId = NodeId(0);
const Y: NodeId = NodeId(1);
const S: NodeId = NodeId(2);
const N: usize = 1000;

/// The tensors `x[N]`, `y[4]`, the shared array `s[BLOCK]` and one local `t0`, all f64.
fn program() -> Program {
    let mut nodes = FxHashMap::default();
    nodes.insert(X, TensorNode::new(X, "x", &[N], Prec::F64, MemoryMode::HostVisible));
    nodes.insert(Y, TensorNode::new(Y, "y", &[4], Prec::F64, MemoryMode::HostVisible));
    nodes.insert(S, TensorNode::new(S, "s", &[BLOCK as usize], Prec::F64, MemoryMode::Local));
    Program {
        name: "hand".into(),
        body: vec![],
        locals: vec![Prec::F64],
        next_var: 10,
        nodes,
        virtual_nodes: vec![],
        runtime_symbols: vec![],
        runtime_checks: vec![],
        scratch: vec![],
        arena: Arena::default(),
    }
}

fn sim(prog: &Program) -> (CudaSim, Vec<f64>) {
    let mut sim = CudaSim::new();
    for n in [X, Y] {
        sim.alloc(&prog.nodes[&n]).unwrap();
    }
    let x: Vec<f64> = (0..N).map(|i| ((i * 37) % 101) as f64 / 8.0 - 6.0).collect();
    sim.write(X, &NdArray::from_f64(Prec::F64, &[N], &x).unwrap()).unwrap();
    (sim, x)
}

const T: Var = Var(0);

fn v(var: Var) -> Index {
    Index::var(var)
}

fn below(i: Index, bound: usize) -> Vec<Guard> {
    vec![Guard { index: i, bound }]
}

fn get(n: NodeId, i: Index) -> Expr {
    Expr::Get(n, vec![i])
}

fn set(n: NodeId, i: Index, value: Expr) -> KStmt {
    KStmt::Run(Stmt::Set { node: n, idx: vec![i], value })
}

/// One block: each thread sums its strided share of `x` into `s[t]`, then a tree halves the
/// live threads at each step, a barrier after each; thread 0 writes `y[0]`. `skip` leaves out
/// the barrier after that tree step.
fn tree_sum(skip: Option<usize>) -> Kernel {
    let mut body = vec![
        KStmt::ThreadInBlock { var: T },
        KStmt::Run(Stmt::SetLocal { local: LocalId(0), value: Expr::Const(0.0) }),
        KStmt::Run(Stmt::For {
            var: Var(1),
            extent: N.div_ceil(BLOCK as usize),
            limit: None,
            parallel: false,
            body: vec![Stmt::If {
                guards: below(
                    Index::new(vec![(BLOCK as i64, IdxVar::Loop(Var(1))), (1, IdxVar::Loop(T))], 0),
                    N,
                ),
                body: vec![Stmt::SetLocal {
                    local: LocalId(0),
                    value: Expr::bin(
                        BinOp::Add,
                        Expr::Local(LocalId(0)),
                        get(
                            X,
                            Index::new(
                                vec![(BLOCK as i64, IdxVar::Loop(Var(1))), (1, IdxVar::Loop(T))],
                                0,
                            ),
                        ),
                    ),
                }],
            }],
        }),
        set(S, v(T), Expr::Local(LocalId(0))),
        KStmt::Barrier,
    ];
    let mut stride = BLOCK as usize / 2;
    let mut step = 0;
    while stride > 0 {
        body.push(KStmt::If {
            guards: below(v(T), stride),
            body: vec![set(
                S,
                v(T),
                Expr::bin(
                    BinOp::Add,
                    get(S, v(T)),
                    get(S, Index::new(vec![(1, IdxVar::Loop(T))], stride as i64)),
                ),
            )],
        });
        if skip != Some(step) {
            body.push(KStmt::Barrier);
        }
        stride /= 2;
        step += 1;
    }
    body.push(KStmt::If {
        guards: below(v(T), 1),
        body: vec![set(Y, Index::fixed(0), get(S, Index::fixed(0)))],
    });
    Kernel {
        name: "tree_sum".into(),
        buffers: vec![X, Y],
        threads: u64::from(BLOCK),
        block: BLOCK,
        shared: vec![SharedArray { node: S, prec: Prec::F64, len: BLOCK as usize }],
        scratch: vec![],
        locals: vec![],
        body,
    }
}

/// The tree's order of additions, on the host.
fn tree_order(x: &[f64]) -> f64 {
    let b = BLOCK as usize;
    let mut s: Vec<f64> =
        (0..b).map(|t| (t..N).step_by(b).fold(0.0, |acc, i| acc + x[i])).collect();
    let mut stride = b / 2;
    while stride > 0 {
        for t in 0..stride {
            s[t] += s[t + stride];
        }
        stride /= 2;
    }
    s[0]
}

fn one_block(name: &str, threads: u32, body: Vec<KStmt>) -> Kernel {
    Kernel {
        name: name.into(),
        buffers: vec![X, Y],
        threads: u64::from(threads),
        block: threads,
        shared: vec![],
        scratch: vec![],
        locals: vec![],
        body,
    }
}

fn check_error(result: Result<(), Error>, want: &str) -> String {
    match result {
        Err(e @ Error::KernelCheck { .. }) => {
            let text = e.to_string();
            assert!(text.contains(want), "{text}");
            text
        }
        other => panic!("expected a kernel check with `{want}`, got {other:?}"),
    }
}

#[test]
fn a_block_tree_sum_in_shared_memory_is_race_free_and_right() {
    let prog = program();
    let (mut sim, x) = sim(&prog);
    sim.launch(&prog, &[tree_sum(None)], &[]).unwrap();
    let y = sim.read(Y).unwrap().to_f64_vec();
    assert_eq!(y[0].to_bits(), tree_order(&x).to_bits());
    assert!((y[0] - x.iter().sum::<f64>()).abs() < 1e-9);
}

#[test]
fn a_missing_barrier_is_a_race_in_shared_memory() {
    let prog = program();
    let (mut sim, _) = sim(&prog);
    let text = check_error(sim.launch(&prog, &[tree_sum(Some(0))], &[]), "data race");
    assert!(text.contains("shared array n2") && text.contains("since the last barrier"), "{text}");
}

#[test]
fn threads_writing_one_cell_race_and_atomic_adds_do_not() {
    let prog = program();
    let (mut sim, x) = sim(&prog);
    let plain = one_block(
        "plain",
        64,
        vec![KStmt::ThreadInBlock { var: T }, set(Y, Index::fixed(1), get(X, v(T)))],
    );
    let text = check_error(sim.launch(&prog, &[plain], &[]), "data race");
    assert!(text.contains("cell 1 of tensor n1"), "{text}");
    let atomic = one_block(
        "atomic",
        64,
        vec![
            KStmt::ThreadInBlock { var: T },
            KStmt::AtomicAdd { node: Y, idx: vec![Index::fixed(2)], value: get(X, v(T)) },
        ],
    );
    sim.launch(&prog, &[atomic], &[]).unwrap();
    let want: f64 = x[..64].iter().sum();
    assert!((sim.read(Y).unwrap().to_f64_vec()[2] - want).abs() < 1e-12);
}

#[test]
fn an_index_past_the_end_is_out_of_bounds() {
    let prog = program();
    let (mut sim, _) = sim(&prog);
    // y has 4 cells; thread 3 writes y[4].
    let k = one_block(
        "past_the_end",
        4,
        vec![
            KStmt::ThreadInBlock { var: T },
            set(Y, Index::new(vec![(1, IdxVar::Loop(T))], 1), Expr::Const(1.0)),
        ],
    );
    match sim.launch(&prog, &[k], &[]) {
        Err(Error::OutOfBounds { node: 1, index: 4, bound: 4, .. }) => {}
        other => panic!("expected an out-of-bounds error, got {other:?}"),
    }
}

#[test]
fn a_barrier_inside_a_branch_is_an_error() {
    let prog = program();
    let (mut sim, _) = sim(&prog);
    let k = one_block(
        "divergent",
        32,
        vec![
            KStmt::ThreadInBlock { var: T },
            KStmt::If { guards: below(v(T), 5), body: vec![KStmt::Barrier] },
        ],
    );
    check_error(sim.launch(&prog, &[k], &[]), "barrier not reached by thread 5");
    // A branch no thread takes holds a barrier no thread reaches: fine.
    let k = one_block(
        "untaken",
        32,
        vec![
            KStmt::ThreadInBlock { var: T },
            KStmt::If { guards: below(v(T), 0), body: vec![KStmt::Barrier] },
        ],
    );
    sim.launch(&prog, &[k], &[]).unwrap();
    // Threads that stopped before it do not count: a barrier after an early exit is fine.
    let k = one_block(
        "exited",
        32,
        vec![
            KStmt::ThreadInBlock { var: T },
            KStmt::ExitUnless(rocannl_arrayjit::backend::kernel_ir::KCond::GlobalBelow(5)),
            KStmt::Barrier,
        ],
    );
    sim.launch(&prog, &[k], &[]).unwrap();
}

#[test]
fn shared_memory_past_the_limit_is_an_error() {
    let prog = program();
    let (mut sim, _) = sim(&prog);
    let mut k = tree_sum(None);
    k.shared[0].len = 7000; // 56 000 bytes of f64
    check_error(sim.launch(&prog, &[k], &[]), "past the limit of 49152");
}

/// The hand-written kernels print as CUDA C that NVRTC compiles to PTX (where NVRTC is
/// installed; `ROCANNL_REQUIRE_NVRTC` makes its absence a failure, as in CI), and the shared
/// array, barriers and atomic are spelled as CUDA spells them.
#[cfg(feature = "cuda")]
#[test]
fn the_hand_written_kernels_compile_to_ptx() {
    use rocannl_arrayjit::backend::cuda::nvrtc::Nvrtc;
    use rocannl_arrayjit::backend::cuda::{PTX_ARCH, render};
    let prog = program();
    let atomic = one_block(
        "atomic",
        64,
        vec![
            KStmt::ThreadInBlock { var: T },
            KStmt::AtomicAdd { node: Y, idx: vec![Index::fixed(2)], value: get(X, v(T)) },
        ],
    );
    let src = render::render_kernels(&prog, vec![tree_sum(None), atomic]);
    for want in ["__shared__ double p_n2[256];", "__syncthreads();", "atomicAdd(&p_n1[2LL]"] {
        assert!(src.source.contains(want), "no `{want}` in\n{}", src.source);
    }
    let nvrtc = match Nvrtc::load() {
        Ok(n) => n,
        Err(e) if rocannl_arrayjit::env::var_os("ROCANNL_REQUIRE_NVRTC").is_some() => {
            panic!("NVRTC is required (run scripts/setup.sh --cuda): {e}")
        }
        Err(_) => return,
    };
    let ptx = nvrtc
        .compile("hand", &src.source, PTX_ARCH, false)
        .unwrap_or_else(|e| panic!("{e}\n{}", src.source));
    let ptx = String::from_utf8_lossy(&ptx);
    for k in ["tree_sum", "atomic"] {
        assert!(ptx.contains(&format!(".entry {k}(")), "no kernel {k}");
    }
    // The lowered block reductions too.
    for prec in [Prec::F32, Prec::F64] {
        for case in
            [reduce_case_sized(BinOp::Max, prec, 3, 5000), matmul_onto_case(2, 4096, 2, prec)]
        {
            let prog =
                compile_program(&case.name, &case.asgn, &case.nodes, &CompileOptions::default())
                    .unwrap();
            let src = render::render(&prog);
            assert!(src.source.contains("__syncthreads();"), "{}", src.source);
            nvrtc
                .compile(&case.name, &src.source, PTX_ARCH, false)
                .unwrap_or_else(|e| panic!("{}: {e}\n{}", case.name, src.source));
        }
    }
}

use common::{assert_close, matmul_case, matmul_onto_case, reduce_case_sized, run_case, tolerance};
use rocannl_arrayjit::backend::kernel_ir::lower;
use rocannl_arrayjit::{BackendKind, CompileOptions, compile_program};

/// Long reductions into few cells run a block per cell — a tree in shared memory with a
/// barrier after each halving — race-free, and agree with the interpreter and the reference:
/// sums, maxima and minima of 3 rows of 5000, products of 2 × 4096 by 4096 × 2 from zero and
/// onto old values, in f32 and f64.
#[test]
fn long_reductions_run_a_block_per_cell() {
    for prec in [Prec::F32, Prec::F64] {
        let mut cases: Vec<_> = [BinOp::Add, BinOp::Max, BinOp::Min]
            .map(|op| reduce_case_sized(op, prec, 3, 5000))
            .into();
        cases.push(matmul_case(2, 4096, 2, prec));
        cases.push(matmul_onto_case(2, 4096, 2, prec));
        for case in cases {
            let prog =
                compile_program(&case.name, &case.asgn, &case.nodes, &CompileOptions::default())
                    .unwrap();
            let kernels = lower(&prog);
            assert!(
                kernels.iter().any(|k| k.body.contains(&KStmt::Barrier) && k.shared.len() == 1),
                "{}: no block reduction in\n{}",
                case.name,
                kernels.iter().map(|k| k.to_string()).collect::<String>()
            );
            let got = run_case(BackendKind::CudaSim, CompileOptions::default(), &case);
            let want = run_case(BackendKind::Interp, CompileOptions::default(), &case);
            // Sums in another order: the tolerance of a 5000-term sum.
            let tol = tolerance(prec) * 50.0;
            assert_close(&case.name, &got[0], &want[0], tol);
            if let Some(expected) = &case.expected {
                assert_close(&format!("{} vs reference", case.name), &got[0], &expected[0], tol);
            }
        }
    }
}

/// The kernel IR's printer, on a block reduction (the snapshot is the format).
#[test]
fn snapshot_block_reduction_kernel() {
    let case = reduce_case_sized(BinOp::Add, Prec::F32, 2, 2048);
    let prog =
        compile_program(&case.name, &case.asgn, &case.nodes, &CompileOptions::default()).unwrap();
    let text: String = lower(&prog).iter().map(|k| k.to_string()).collect();
    expect_test::expect![[r#"
        kernel k0(n0, n4) threads 1024 in blocks of 256
          shared f64 n2[256]
          scratch f64 n4[4]
          local f64 t2
          v2 := thread in block
          v4 := gid / 256 % 2
          v0 := gid / 512 % 2
          t0 := 0
          for v3 in 0..4 {
            if 0 <= 512*v3 + v2 + 256*v4 < 2048 {
              t1 := n0[v0, 512*v3 + v2 + 256*v4]
              t0 := add(t0, t1)
            }
          }
          n2[v2] := t0
          barrier
          if 0 <= v2 < 128 {
            n2[v2] := add(n2[v2], n2[v2 + 128])
          }
          barrier
          if 0 <= v2 < 64 {
            n2[v2] := add(n2[v2], n2[v2 + 64])
          }
          barrier
          if 0 <= v2 < 32 {
            t0 := add(n2[v2], n2[v2 + 32])
            t2 := shuffle down 16 of t0
            t0 := add(t0, t2)
            t2 := shuffle down 8 of t0
            t0 := add(t0, t2)
            t2 := shuffle down 4 of t0
            t0 := add(t0, t2)
            t2 := shuffle down 2 of t0
            t0 := add(t0, t2)
            t2 := shuffle down 1 of t0
            t0 := add(t0, t2)
            if 0 <= v2 < 1 {
              n4[2*v0 + v4] := t0
            }
          }
        kernel k1(n1, n4) threads 512 in blocks of 256
          shared f64 n2[256]
          scratch f64 n4[4]
          local f64 t2
          v2 := thread in block
          v0 := gid / 256 % 2
          t0 := 0
          if 0 <= v2 < 2 {
            t0 := n4[2*v0 + v2]
          }
          n2[v2] := t0
          barrier
          if 0 <= v2 < 128 {
            n2[v2] := add(n2[v2], n2[v2 + 128])
          }
          barrier
          if 0 <= v2 < 64 {
            n2[v2] := add(n2[v2], n2[v2 + 64])
          }
          barrier
          if 0 <= v2 < 32 {
            t0 := add(n2[v2], n2[v2 + 32])
            t2 := shuffle down 16 of t0
            t0 := add(t0, t2)
            t2 := shuffle down 8 of t0
            t0 := add(t0, t2)
            t2 := shuffle down 4 of t0
            t0 := add(t0, t2)
            t2 := shuffle down 2 of t0
            t0 := add(t0, t2)
            t2 := shuffle down 1 of t0
            t0 := add(t0, t2)
            if 0 <= v2 < 1 {
              n1[v0] := t0
            }
          }
    "#]]
    .assert_eq(&text);
}

/// Warp shuffles: a warp's sum by five shuffles gives the tree order's bits; a shuffle that some
/// lane of the warp skips is reported.
#[test]
fn warp_shuffles_sum_a_warp_and_need_every_lane() {
    let mut prog = program();
    prog.locals.push(Prec::F64);
    let (mut sim, x) = sim(&prog);
    let (t, u) = (LocalId(0), LocalId(1));
    let mut body = vec![
        KStmt::ThreadInBlock { var: T },
        KStmt::Run(Stmt::SetLocal { local: t, value: get(X, v(T)) }),
    ];
    for offset in [16, 8, 4, 2, 1] {
        body.push(KStmt::ShuffleDown { dst: u, src: t, offset });
        body.push(KStmt::Run(Stmt::SetLocal {
            local: t,
            value: Expr::bin(BinOp::Add, Expr::Local(t), Expr::Local(u)),
        }));
    }
    body.push(KStmt::If {
        guards: below(v(T), 1),
        body: vec![set(Y, Index::fixed(3), Expr::Local(t))],
    });
    sim.launch(&prog, &[one_block("warp_sum", 64, body)], &[]).unwrap();
    let mut lanes: Vec<f64> = x[..32].to_vec();
    for offset in [16, 8, 4, 2, 1] {
        let old = lanes.clone();
        for l in 0..32 {
            lanes[l] = old[l] + if l + offset < 32 { old[l + offset] } else { old[l] };
        }
    }
    assert_eq!(sim.read(Y).unwrap().to_f64_vec()[3].to_bits(), lanes[0].to_bits());
    let partial = vec![
        KStmt::ThreadInBlock { var: T },
        KStmt::Run(Stmt::SetLocal { local: t, value: get(X, v(T)) }),
        KStmt::If {
            guards: below(v(T), 20),
            body: vec![KStmt::ShuffleDown { dst: u, src: t, offset: 1 }],
        },
    ];
    check_error(
        sim.launch(&prog, &[one_block("partial_warp", 32, partial)], &[]),
        "warp shuffle without lane 20",
    );
}

/// Products run as tiles staged in shared memory (16 × 16 cells, or 64 × 64 with a 4 × 4
/// register tile per thread where both sides have 64 cells), and give the interpreter's bits
/// (each cell's multiply-adds in the same order): odd sizes, `A·B`, `A·Bᵀ`, onto old values,
/// f32, f64 and bf16 operands.
#[test]
fn products_run_in_shared_memory_tiles_with_the_interpreters_bits() {
    use common::matmul_bt_case;
    for prec in [Prec::F32, Prec::F64, Prec::Bf16] {
        for case in [
            matmul_case(33, 47, 65, prec),
            matmul_bt_case(40, 17, 31, prec),
            matmul_onto_case(64, 64, 64, prec),
            // Register tiles of 4 × 4 cells per thread, sizes no tile divides.
            matmul_case(70, 33, 130, prec),
            matmul_bt_case(65, 40, 66, prec),
        ] {
            let prog =
                compile_program(&case.name, &case.asgn, &case.nodes, &CompileOptions::default())
                    .unwrap();
            let kernels = lower(&prog);
            let tiled4 = ["64x64x64", "70x33x130", "65x40x66"];
            let registers = if tiled4.iter().any(|s| case.name.contains(s)) { 16 } else { 0 };
            assert!(
                kernels.iter().any(|k| k.shared.len() == 2 && k.locals.len() == registers),
                "{}: no tiled kernel in\n{}",
                case.name,
                kernels.iter().map(|k| k.to_string()).collect::<String>()
            );
            let got = run_case(BackendKind::CudaSim, CompileOptions::default(), &case);
            let want = run_case(BackendKind::Interp, CompileOptions::default(), &case);
            let bits = |v: &[f64]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
            assert_eq!(bits(&got[0]), bits(&want[0]), "{}", case.name);
        }
    }
}

/// The kernel IR's printer, on a tiled product (the snapshot is the format).
#[test]
fn snapshot_tiled_product_kernel() {
    let case = matmul_case(32, 16, 32, Prec::F32);
    let prog =
        compile_program(&case.name, &case.asgn, &case.nodes, &CompileOptions::default()).unwrap();
    let text: String = lower(&prog).iter().map(|k| k.to_string()).collect();
    expect_test::expect![[r#"
        kernel k0(n0, n1, n2) threads 1024 in blocks of 256
          shared f32 n3[256]
          shared f32 n4[256]
          v3 := thread in block
          v4 := thread in block / 16 % 16
          v5 := thread in block / 1 % 16
          v6 := gid / 512 % 2
          v7 := gid / 256 % 2
          t0 := 0
          for v8 in 0..1 together {
            if 0 <= 16*v6 + v4 < 32 && 0 <= 16*v8 + v5 < 16 {
              n3[16*v4 + v5] := n0[16*v6 + v4, 16*v8 + v5]
            }
            if 0 <= 16*v8 + v4 < 16 && 0 <= 16*v7 + v5 < 32 {
              n4[16*v4 + v5] := n1[16*v8 + v4, 16*v7 + v5]
            }
            barrier
            for v9 in 0..16 {
              if 0 <= 16*v8 + v9 < 16 {
                t0 := fma(n3[16*v4 + v9], n4[16*v9 + v5], t0)
              }
            }
            barrier
          }
          if 0 <= 16*v6 + v4 < 32 && 0 <= 16*v7 + v5 < 32 {
            n2[16*v6 + v4, 16*v7 + v5] := t0
          }
    "#]]
    .assert_eq(&text);
}

/// Consecutive nests over the same cells fuse into one kernel when each thread touches only
/// its own cells of what they share; a nest reading another thread's cell starts a new kernel.
#[test]
fn nests_over_the_same_cells_fuse_when_threads_keep_to_their_cells() {
    let i = Var(5);
    let nest = |var: Var, node: NodeId, value: Expr| Stmt::For {
        var,
        extent: 64,
        limit: None,
        parallel: true,
        body: vec![Stmt::Set { node, idx: vec![Index::var(var)], value }],
    };
    let mut prog = program();
    let z = NodeId(3);
    prog.nodes.insert(z, TensorNode::new(z, "z", &[64], Prec::F64, MemoryMode::HostVisible));
    prog.nodes.insert(X, TensorNode::new(X, "x", &[64], Prec::F64, MemoryMode::HostVisible));
    prog.nodes.insert(Y, TensorNode::new(Y, "y", &[64], Prec::F64, MemoryMode::HostVisible));
    let first = nest(i, Y, Expr::bin(BinOp::Add, get(X, v(i)), Expr::Const(1.0)));
    // Same cells (its own loop variable, renamed when fused).
    let same = nest(Var(6), z, Expr::bin(BinOp::Mul, get(Y, v(Var(6))), Expr::Const(2.0)));
    // The mirror cell: written by another thread.
    let mirror = nest(Var(6), z, get(Y, Index::new(vec![(-1, IdxVar::Loop(Var(6)))], 63)));
    let xs: Vec<f64> = (0..64).map(|k| k as f64 * 0.5).collect();
    for (second, kernels, want) in [
        (same, 1, (0..64).map(|k| (xs[k] + 1.0) * 2.0).collect::<Vec<_>>()),
        (mirror, 2, (0..64).map(|k| xs[63 - k] + 1.0).collect::<Vec<_>>()),
    ] {
        prog.body = vec![first.clone(), second];
        assert_eq!(lower(&prog).len(), kernels, "{}", prog);
        let mut sim = CudaSim::new();
        for n in [X, Y, z] {
            sim.alloc(&prog.nodes[&n]).unwrap();
        }
        sim.write(X, &NdArray::from_f64(Prec::F64, &[64], &xs).unwrap()).unwrap();
        let r = sim
            .compile(
                &prog,
                &rocannl_arrayjit::backend::BuildRequest::from_options(&CompileOptions::default()),
            )
            .unwrap()
            .routine;
        sim.run(r, &[]).unwrap();
        assert_eq!(sim.read(z).unwrap().to_f64_vec(), want);
    }
}

/// Intermediates of consecutive statements may share arena bytes (they never run at the same
/// time); fused into one kernel they would, so nests touching such a pair stay apart.
#[test]
fn nests_whose_intermediates_share_arena_bytes_do_not_fuse() {
    use rocannl_arrayjit::low_level::ArenaSlot;
    let (a, b, c) = (NodeId(10), NodeId(11), NodeId(12));
    let mut prog = program();
    for (n, label) in [(a, "a"), (b, "b"), (c, "c")] {
        prog.nodes.insert(n, TensorNode::new(n, label, &[64], Prec::F64, MemoryMode::Virtual));
    }
    let i = Var(5);
    let nest = |node: NodeId, value: Expr| Stmt::For {
        var: i,
        extent: 64,
        limit: None,
        parallel: true,
        body: vec![Stmt::Set { node, idx: vec![Index::var(i)], value }],
    };
    // c[i] := a[63 - i] (a's last use); b[i] := 2·c[i] (b's first).
    prog.body = vec![
        nest(c, get(a, Index::new(vec![(-1, IdxVar::Loop(i))], 63))),
        nest(b, Expr::bin(BinOp::Mul, get(c, v(i)), Expr::Const(2.0))),
    ];
    for (b_offset, kernels) in [(0, 2), (512, 1)] {
        prog.arena.slots = vec![
            ArenaSlot { node: a, offset: 0, live: (0, 0) },
            ArenaSlot { node: b, offset: b_offset, live: (1, 1) },
            ArenaSlot { node: c, offset: 1024, live: (0, 1) },
        ];
        prog.arena.bytes = 1536;
        assert_eq!(lower(&prog).len(), kernels, "b at {b_offset}");
    }
    // Fused by hand anyway, the simulator sees the collision: thread i writes b[i] over a[i],
    // which thread 63 - i read in the same launch.
    prog.arena.slots[1].offset = 0;
    let (mut sim, _) = sim(&prog);
    let fused = one_block(
        "fused_by_hand",
        64,
        vec![
            KStmt::ThreadInBlock { var: i },
            KStmt::Run(Stmt::Set {
                node: c,
                idx: vec![v(i)],
                value: get(a, Index::new(vec![(-1, IdxVar::Loop(i))], 63)),
            }),
            KStmt::Run(Stmt::Set {
                node: b,
                idx: vec![v(i)],
                value: Expr::bin(BinOp::Mul, get(c, v(i)), Expr::Const(2.0)),
            }),
        ],
    );
    check_error(sim.launch(&prog, &[fused], &[]), "data race in the arena");
}

//! Products, convolutions and reductions through the schedule's kernels (the shape-generic
//! product, packed operands, lanes, in place, interleaved short reductions) against the
//! interpreter.

use super::*;

#[test]
fn transposed_operands_are_packed() {
    for (m, k, n) in [(128, 256, 256), (17, 19, 31), (8, 16, 16), (64, 7, 33), (9, 64, 128)] {
        let case = abt(m, k, n, Prec::F32, true);
        assert_eq!(generated_kernel(&case, false), "packed", "{}", case.name);
        check(&case);
    }
    for prec in [Prec::F64, Prec::F16, Prec::Bf16] {
        check(&abt(24, 40, 48, prec, true));
    }
    check(&abt(16, 33, 20, Prec::F32, false));
}

#[test]
fn transposed_left_operands_accumulate_in_place() {
    for (m, k, n) in [(256, 128, 784), (10, 128, 256), (13, 5, 17), (1, 64, 16), (256, 1, 16)] {
        let case = atb(m, k, n, Prec::F32, false);
        check(&case);
    }
    assert_eq!(generated_kernel(&atb(16, 16, 16, Prec::F32, true), false), "in place");
    check(&atb(12, 31, 40, Prec::F64, true));
}

#[test]
fn narrow_outputs_use_lanes() {
    for (m, k, n) in [(128, 256, 10), (3, 1400, 1), (5, 301, 3), (7, 100, 15), (2, 1030, 2)] {
        let case = abt(m, k, n, Prec::F32, true);
        assert_eq!(generated_kernel(&case, false), "lanes", "{}", case.name);
        check(&case);
    }
    // Long reductions: partial sums instead of a packed copy, 4 × 4 cells at a time.
    for (m, k, n) in [(128, 784, 256), (33, 600, 20), (6, 513, 17)] {
        let case = abt(m, k, n, Prec::F32, true);
        assert_eq!(generated_kernel(&case, false), "lanes", "{}", case.name);
        check(&case);
    }
    // Too little work to be worth the compile time.
    assert_eq!(generated_kernel(&abt(3, 16, 1, Prec::F32, true), false), "as lowered");
    check(&abt(4, 373, 3, Prec::F64, false));
    check(&abt(4, 373, 3, Prec::F16, true));
    // A matrix-vector product: too few rows to pack.
    let mv = contraction(
        "matvec",
        "ik",
        &[37, 120],
        Arg(&[37], "i", Prec::F32),
        &[Arg(&[37, 120], "i,k", Prec::F32), Arg(&[120], "k", Prec::F32)],
        BinOp::Add,
        true,
    );
    assert_eq!(generated_kernel(&mv, false), "lanes");
    check(&mv);
}

#[test]
fn row_reductions_of_every_operator() {
    for op in [BinOp::Add, BinOp::Mul, BinOp::Max, BinOp::Min] {
        for init in [true, false] {
            let rows = contraction(
                &format!("rows_{}_{init}", op.name()),
                "ik",
                &[6, 701],
                Arg(&[6], "i", Prec::F32),
                &[Arg(&[6, 701], "i,k", Prec::F32)],
                op,
                init,
            );
            assert_eq!(generated_kernel(&rows, false), "lanes");
            check(&rows);
            let cols = contraction(
                &format!("cols_{}_{init}", op.name()),
                "kj",
                &[9, 64],
                Arg(&[64], "j", Prec::F32),
                &[Arg(&[9, 64], "k,j", Prec::F32)],
                op,
                init,
            );
            assert_eq!(generated_kernel(&cols, false), "in place");
            check(&cols);
        }
    }
}

/// A column sum of 1024 rows or more (a bias gradient over a large batch) accumulates in f64
/// (docs/lowering.md, "Accurate sums"): the schedule gives it an f64 copy of its result, which
/// the in-place kernel takes, and every backend configuration gives the interpreter's bits.
#[test]
fn long_column_sums_accumulate_in_an_f64_copy_with_the_interpreters_bits() {
    for (rows, init) in [(1024, true), (1500, false), (4096, true)] {
        let cols = contraction(
            &format!("long_cols_{rows}_{init}"),
            "kj",
            &[rows, 48],
            Arg(&[48], "j", Prec::F32),
            &[Arg(&[rows, 48], "k,j", Prec::F32)],
            BinOp::Add,
            init,
        );
        let mut prog =
            compile_program(&cols.name, &cols.asgn, &cols.nodes, &CompileOptions::default())
                .unwrap();
        schedule_cpu(&mut prog, &CpuSchedule::default());
        verify(&prog, "schedule").unwrap();
        let text = prog.to_string();
        assert!(
            prog.nodes.values().any(|n| n.prec == Prec::F64 && n.label.ends_with(".f64")),
            "{text}"
        );
        let want = run_case(BackendKind::Interp, CompileOptions::default(), &cols);
        for threads in [1, 3] {
            let opts = CompileOptions { threads: Some(threads), ..CompileOptions::default() };
            let got = run_case(BackendKind::Gccjit, opts, &cols);
            assert_eq!(bits(&got[0]), bits(&want[0]), "{} on {threads} threads", cols.name);
        }
    }
}

#[test]
fn attention_scores_and_batched_products() {
    let scores = contraction(
        "scores",
        "bhqkd",
        &[2, 3, 17, 33, 19],
        Arg(&[2, 3, 17, 33], "b,h,q,k", Prec::F32),
        &[Arg(&[2, 3, 17, 19], "b,h,q,d", Prec::F32), Arg(&[2, 3, 33, 19], "b,h,k,d", Prec::F32)],
        BinOp::Add,
        true,
    );
    assert_eq!(generated_kernel(&scores, false), "packed");
    check(&scores);
    let bmm = contraction(
        "bmm",
        "bijk",
        &[5, 12, 16, 7],
        Arg(&[5, 12, 16], "b,i,j", Prec::F32),
        &[Arg(&[5, 12, 7], "b,i,k", Prec::F32), Arg(&[5, 7, 16], "b,k,j", Prec::F32)],
        BinOp::Add,
        true,
    );
    assert_eq!(generated_kernel(&bmm, false), "in place");
    check(&bmm);
}

#[test]
fn convolutions_forward() {
    for (b, hw, c, d, s, pad) in
        [(4, 8, 1, 16, 1, 1), (3, 4, 16, 32, 1, 1), (2, 7, 3, 17, 2, 1), (2, 9, 5, 16, 1, 0)]
    {
        let case = conv2d(b, hw, c, d, s, pad, Prec::F32);
        assert_eq!(generated_kernel(&case, false), "packed", "{}", case.name);
        check(&case);
    }
    check(&conv2d(2, 5, 4, 16, 1, 1, Prec::F64));
}

#[test]
fn convolution_gradients() {
    // Input gradient: the output index is affine (a scatter), accumulated in place.
    let dx = contraction(
        "conv_dx",
        "nhwijcd",
        &[3, 4, 4, 3, 3, 16, 32],
        Arg(&[3, 4, 4, 16], "n,h+i-1,w+j-1,c", Prec::F32),
        &[Arg(&[3, 4, 4, 32], "n,h,w,d", Prec::F32), Arg(&[32, 3, 3, 16], "d,i,j,c", Prec::F32)],
        BinOp::Add,
        false,
    );
    assert_eq!(generated_kernel(&dx, false), "in place");
    check(&dx);
    // Kernel gradient: reductions over the batch and the image, guarded.
    let dk = contraction(
        "conv_dk",
        "dijcnhw",
        &[32, 3, 3, 16, 5, 4, 4],
        Arg(&[32, 3, 3, 16], "d,i,j,c", Prec::F32),
        &[
            Arg(&[5, 4, 4, 32], "n,h,w,d", Prec::F32),
            Arg(&[5, 4, 4, 16], "n,h+i-1,w+j-1,c", Prec::F32),
        ],
        BinOp::Add,
        false,
    );
    assert_eq!(generated_kernel(&dk, false), "in place");
    check(&dk);
    // Kernel gradient with one input channel: `dk` is contiguous along no loop, so it
    // accumulates in a packed copy.
    for init in [false, true] {
        let dk1 = contraction(
            &format!("conv_dk1_{init}"),
            "dijnhw",
            &[16, 3, 3, 6, 8, 8],
            Arg(&[16, 3, 3, 1], "d,i,j,0", Prec::F32),
            &[
                Arg(&[6, 8, 8, 16], "n,h,w,d", Prec::F32),
                Arg(&[6, 8, 8, 1], "n,h+i-1,w+j-1,0", Prec::F32),
            ],
            BinOp::Add,
            init,
        );
        assert_eq!(generated_kernel(&dk1, false), "packed");
        check(&dk1);
    }
    // Bias gradient: three reduction loops.
    let db = contraction(
        "conv_db",
        "cnhw",
        &[32, 7, 4, 4],
        Arg(&[32], "c", Prec::F32),
        &[Arg(&[7, 4, 4, 32], "n,h,w,c", Prec::F32)],
        BinOp::Add,
        false,
    );
    assert_eq!(generated_kernel(&db, false), "in place");
    check(&db);
}

#[test]
fn maxima_propagate_nan() {
    for op in [BinOp::Max, BinOp::Min] {
        // Rows of 1000 (lanes), and columns (in place).
        for (letters, ext, out, arg, want) in [
            ("ik", [5, 1000], Arg(&[5], "i", Prec::F32), "i,k", "lanes"),
            ("kj", [16, 64], Arg(&[64], "j", Prec::F32), "k,j", "in place"),
        ] {
            let mut case = contraction(
                &format!("nan_{}_{letters}", op.name()),
                letters,
                &ext,
                out,
                &[Arg(&ext, arg, Prec::F32)],
                op,
                true,
            );
            assert_eq!(generated_kernel(&case, false), want);
            // NaN first, last and in the middle of some reductions; infinities elsewhere.
            let x = &mut case.inputs[0].1;
            for (i, v) in [(0, f64::NAN), (63, f64::NAN), (77, f64::NAN), (999, f64::NAN)] {
                x[i] = v;
            }
            x[100] = f64::INFINITY;
            x[150] = f64::NEG_INFINITY;
            check(&case);
        }
    }
}

#[test]
fn products_with_rows_and_columns_call_the_shape_generic_kernel() {
    // Every layout of a training step's products, batched products and attention scores, at
    // sizes no tile or block divides: one call each, and the interpreter's bits exactly.
    let cases = [
        abt(128, 256, 256, Prec::F32, true),
        abt(97, 131, 61, Prec::F64, true),
        abt(128, 256, 10, Prec::F32, true),
        atb(256, 128, 784, Prec::F32, false),
        atb(10, 128, 256, Prec::F32, true),
        abt(64, 130, 48, Prec::Bf16, true),
        abt(40, 128, 48, Prec::F16, false),
        contraction(
            "scores_big",
            "bhqkd",
            &[2, 3, 33, 35, 129],
            Arg(&[2, 3, 33, 35], "b,h,q,k", Prec::F32),
            &[
                Arg(&[2, 3, 33, 129], "b,h,q,d", Prec::F32),
                Arg(&[2, 3, 35, 129], "b,h,k,d", Prec::F32),
            ],
            BinOp::Add,
            true,
        ),
        // Rows over two loops (a batch of sequences through a dense layer): one product of
        // 4·37 rows.
        contraction(
            "dense_seq",
            "bsoi",
            &[4, 37, 45, 150],
            Arg(&[4, 37, 45], "b,s,o", Prec::F32),
            &[Arg(&[4, 37, 150], "b,s,i", Prec::F32), Arg(&[45, 150], "o,i", Prec::F32)],
            BinOp::Add,
            true,
        ),
    ];
    for case in &cases {
        assert_eq!(kernel(case), "gemm", "{}", case.name);
        check(case);
    }
    // The batch of sequences is one call over merged rows, split in two blocks.
    let text = scheduled(&cases[8]);
    assert!(text.contains("(m 148 in blocks"), "{text}");
    // A reduction with too little work or too few steps, and a matrix-vector product, stay
    // generated.
    assert_ne!(kernel(&abt(8, 16, 16, Prec::F32, true)), "gemm");
    assert_ne!(kernel(&abt(64, 64, 64, Prec::F32, true)), "gemm");
    assert_ne!(kernel(&abt(300, 300, 1, Prec::F32, true)), "gemm");
    // A shallow reduction is called when each call is wide (`MIN_WIDE_CELLS`), with the
    // interpreter's bits.
    let wide = abt(160, 64, 130, Prec::F32, true);
    assert_eq!(kernel(&wide), "gemm");
    check(&wide);
    assert_ne!(kernel(&abt(128, 48, 128, Prec::F32, true)), "gemm");
}

/// Products of two bf16 tensors call the bf16 dot-product kernel where the host has it
/// (`kernels::bf16`: the factors read as they are, no f32 copies), which rounds each cell of
/// the bf16 result once when it stores it (and reads the result when the product adds onto
/// it). The interpreter running the scheduled program computes the kernel's pairwise product
/// and gives its bits; both are within one rounding of the nest's sequential product.
#[test]
fn bf16_products_use_the_pairwise_kernel_and_the_interpreter_agrees() {
    use rocannl_arrayjit::Backend;
    use rocannl_arrayjit::backend::interp::Interp;
    use rocannl_arrayjit::kernels::bf16::has_native;
    for case in [
        matmul_case(64, 256, 48, Prec::Bf16),
        matmul_bt_case(33, 301, 40, Prec::Bf16),
        matmul_onto_case(40, 130, 33, Prec::Bf16),
        // Depth 64: called too (`MIN_PAIR_DEPTH`), reading row-major `A` in place.
        matmul_case(70, 64, 40, Prec::Bf16),
    ] {
        let mut prog =
            compile_program(&case.name, &case.asgn, &case.nodes, &CompileOptions::default())
                .unwrap();
        schedule_cpu(
            &mut prog,
            &CpuSchedule {
                threads: 2,
                kernel_calls: true,
                bf16_pairs: true,
                ..CpuSchedule::default()
            },
        );
        verify(&prog, "schedule").unwrap();
        let text = prog.to_string();
        // The kernel rounds into the bf16 result (and reads it when accumulating onto it): no
        // f32 copy of the result, no copy back.
        assert!(text.contains("gemm bf16 bf16-pairs"), "{text}");
        assert!(!text.contains(".f32"), "no f32 copy of the result: {text}");
        assert!(!text.contains("gemm operand"), "no f32 copies of the factors: {text}");
        // The scheduled program on the interpreter.
        let mut interp = Interp::new(&CompileOptions::default());
        // Every tensor gets a buffer.
        for node in prog.nodes.values() {
            if !prog.virtual_nodes.contains(&node.id) {
                interp.alloc(node).unwrap();
            }
        }
        for (id, vals) in &case.inputs {
            let node = case.nodes.get(*id).unwrap();
            interp.write(*id, &NdArray::from_f64(node.prec, &node.dims, vals).unwrap()).unwrap();
        }
        let r = interp
            .compile(
                &prog,
                &rocannl_arrayjit::backend::BuildRequest::from_options(&CompileOptions::default()),
            )
            .unwrap()
            .routine;
        interp.run(r, &[]).unwrap();
        let pairs = interp.read(case.outputs[0]).unwrap().to_f64_vec();
        let sequential = run_case(BackendKind::Interp, CompileOptions::default(), &case);
        assert_close(&case.name, &pairs, &sequential[0], tolerance(Prec::Bf16));
        if cfg!(feature = "gccjit") && has_native() {
            let got = run_case(BackendKind::Gccjit, CompileOptions::default(), &case);
            assert_eq!(bits(&got[0]), bits(&pairs), "{}: gccjit and the interpreter", case.name);
        }
    }
}

/// A bf16 product shallower than `MIN_PAIR_DEPTH` stays generated code.
#[test]
fn shallow_bf16_products_stay_generated() {
    use rocannl_arrayjit::low_level::schedule::MIN_PAIR_DEPTH;
    let case = matmul_case(70, MIN_PAIR_DEPTH - 16, 40, Prec::Bf16);
    let mut prog =
        compile_program(&case.name, &case.asgn, &case.nodes, &CompileOptions::default()).unwrap();
    let opts = CpuSchedule { threads: 2, bf16_pairs: true, ..CpuSchedule::default() };
    schedule_cpu(&mut prog, &opts);
    let text = prog.to_string();
    assert!(!text.contains("gemm"), "{text}");
}

/// `c := 0` then `c += a·b` (a gradient's fill and its first accumulation): the product starts
/// from 0 and the fill goes, with the interpreter's bits; not when `c` is read in between.
#[test]
fn a_sum_onto_a_zeroed_tensor_starts_from_zero() {
    use rocannl_arrayjit::assignments::FetchOp;
    for prec in [Prec::F32, Prec::F64, Prec::Bf16] {
        for read_between in [false, true] {
            let mut case = matmul_onto_case(48, 160, 40, prec);
            let c = case.outputs[0];
            case.inputs.retain(|(id, _)| *id != c);
            let product = case.asgn.clone();
            let mut steps = vec![Asgn::Fetch { lhs: c, fetch: FetchOp::Constant(0.0) }];
            if read_between {
                let d = host(&mut case.nodes, "d", &[48, 40], prec);
                let mut g = rocannl_arrayjit::indexing::SymbolGen::default();
                let p = rocannl_arrayjit::indexing::Projections::identity(&[48, 40], 1, &mut g);
                steps.push(accum(d, None, vec![c], ScalarExpr::Arg(0), p, false));
                case.outputs.push(d);
            }
            steps.push(product);
            case.asgn = Asgn::Seq(steps);
            case.name = format!("zeroed_{}_{read_between}", prec.name());
            let text = scheduled(&case);
            let folded = text.contains("the next reduction starts from 0");
            assert_eq!(folded, !read_between, "{}:\n{text}", case.name);
            let want = run_case(BackendKind::Interp, CompileOptions::default(), &case);
            let got = run_case(BackendKind::Gccjit, CompileOptions::default(), &case);
            for (g, w) in got.iter().zip(&want) {
                if prec == Prec::Bf16 {
                    assert_close(&case.name, g, w, tolerance(prec));
                } else {
                    assert_eq!(bits(g), bits(w), "{}", case.name);
                }
            }
        }
    }
}

/// The same with a dynamic number of rows: the sum starts from 0 on the rows it writes, and the
/// fill keeps only the rows past the runtime size (still zero afterwards).
#[test]
fn a_sum_with_dynamic_rows_onto_zeros_keeps_the_fill_past_them() {
    use rocannl_arrayjit::assignments::FetchOp;
    for rows in [1, 17, 48] {
        let mut case = matmul_onto_case(48, 160, 40, Prec::F32);
        let c = case.outputs[0];
        case.inputs.retain(|(id, _)| *id != c);
        let Asgn::Accum { lhs, accum, rhs, expr, projections, initialize_neutral } = case.asgn
        else {
            unreachable!()
        };
        let size = Symbol(60);
        let mut p = (*projections).clone();
        p.dynamic = vec![(Symbol(0), size)];
        let product =
            Asgn::Accum { lhs, accum, rhs, expr, projections: Arc::new(p), initialize_neutral };
        case.asgn = Asgn::Seq(vec![Asgn::Fetch { lhs: c, fetch: FetchOp::Constant(0.0) }, product]);
        case.bindings = vec![(size, rows as i64)];
        case.name = format!("zeroed_dynamic_{rows}");
        let text = scheduled(&case);
        assert!(text.contains("if 0 <= v0 - i60 < 48") && text.contains("1] := n0["), "{text}");
        let want = run_case(BackendKind::Interp, CompileOptions::default(), &case);
        let got = run_case(BackendKind::Gccjit, CompileOptions::default(), &case);
        assert_eq!(bits(&got[0]), bits(&want[0]), "{}", case.name);
        assert!(want[0][rows * 40..].iter().all(|x| *x == 0.0));
    }
}

/// `g := 0` then `g += x` then `g += 2y` (a gradient's fill and its contributions): the first
/// accumulation reads `+0` instead of `g` and the fill goes (kept past a dynamic number of
/// rows), with the interpreter's bits — a `-0` contribution gives `+0`, as the read zeros did;
/// not when `g` is read in between.
#[test]
fn an_accumulation_onto_a_zeroed_tensor_reads_zero() {
    use rocannl_arrayjit::assignments::FetchOp;
    use rocannl_arrayjit::indexing::{Projections, SymbolGen};
    let (m, n) = (48, 40);
    for prec in [Prec::F32, Prec::F64, Prec::Bf16] {
        for read_between in [false, true] {
            for rows in [None, Some(1), Some(17), Some(48)] {
                let mut nodes = NodeTable::default();
                let x = host(&mut nodes, "x", &[m, n], prec);
                let y = host(&mut nodes, "y", &[m, n], prec);
                let g = host(&mut nodes, "g", &[m, n], prec);
                let size = Symbol(60);
                let onto = |rhs, expr| {
                    let mut p = Projections::identity(&[m, n], 1, &mut SymbolGen::default());
                    if rows.is_some() {
                        p.dynamic = vec![(p.product_iterators[0], size)];
                    }
                    accum(g, Some(BinOp::Add), vec![rhs], expr, p, false)
                };
                let mut steps = vec![Asgn::Fetch { lhs: g, fetch: FetchOp::Constant(0.0) }];
                let mut outputs = vec![g];
                if read_between {
                    let d = host(&mut nodes, "d", &[m, n], prec);
                    let p = Projections::identity(&[m, n], 1, &mut SymbolGen::default());
                    steps.push(accum(d, None, vec![g], ScalarExpr::Arg(0), p, false));
                    outputs.push(d);
                }
                steps.push(onto(x, ScalarExpr::Arg(0)));
                let twice = ScalarExpr::bin(BinOp::Mul, ScalarExpr::Arg(0), ScalarExpr::Const(2.0));
                steps.push(onto(y, twice));
                let mut xs = data(m * n, 1, -1.0, 1.0);
                // Negative zeros: `+0 + -0` is `+0`.
                xs.iter_mut().step_by(7).for_each(|v| *v = -0.0);
                let ys = data(m * n, 2, -1.0, 1.0).iter().map(|v| prec.round(*v)).collect();
                let case = Case {
                    name: format!("accumulated_{}_{read_between}_{rows:?}", prec.name()),
                    nodes,
                    asgn: Asgn::Seq(steps),
                    inputs: vec![(x, xs.iter().map(|v| prec.round(*v)).collect()), (y, ys)],
                    outputs,
                    bindings: rows.map(|r| vec![(size, r as i64)]).unwrap_or_default(),
                    expected: None,
                };
                let text = scheduled(&case);
                // The fill goes, or stays guarded for the rows past the dynamic size.
                let fills = text.lines().any(|l| {
                    l.trim_start().starts_with(&format!("{g}[")) && l.trim_end().ends_with(":= 0")
                });
                let folded = match rows {
                    None => !fills,
                    Some(_) => text.contains("if "),
                };
                assert_eq!(folded, !read_between, "{}:\n{text}", case.name);
                let want = run_case(BackendKind::Interp, CompileOptions::default(), &case);
                for threads in [1, 2] {
                    let opts = CompileOptions {
                        threads: Some(threads),
                        min_parallel_work: 1,
                        ..CompileOptions::default()
                    };
                    let got = run_case(BackendKind::Gccjit, opts, &case);
                    for (g, w) in got.iter().zip(&want) {
                        assert_eq!(bits(g), bits(w), "{} ({threads} threads)", case.name);
                    }
                }
            }
        }
    }
}

/// A row's variance, `d := x - m` then `t := t + d·d` over 48 steps per cell, for `rows`.
fn variance(rows: usize, prec: Prec) -> Case {
    let d = || ScalarExpr::bin(BinOp::Sub, ScalarExpr::Arg(0), ScalarExpr::Arg(1));
    accumulation(
        &format!("variance_{}", prec.name()),
        "ik",
        &[rows, 48],
        Arg(&[rows], "i", prec),
        &[Arg(&[rows, 48], "i,k", prec), Arg(&[rows], "i", prec)],
        ScalarExpr::bin(BinOp::Mul, d(), d()),
        BinOp::Add,
        true,
    )
}

/// A short reduction over many cells that no kernel takes (a row's variance) runs 8 cells at a
/// time, each cell's steps in the nest's order: the interpreter's bits exactly, in every
/// precision and thread count. A tiny one (64 rows × 48 steps) stays as lowered.
#[test]
fn short_reductions_interleave_their_cells() {
    assert!(!scheduled(&variance(64, Prec::F32)).contains("8*v"));
    for prec in [Prec::F32, Prec::F64, Prec::Bf16] {
        let case = variance(128, prec);
        let text = scheduled(&case);
        // Eight accumulators, eight stores per block of cells.
        assert_eq!(text.matches("n2[8*v2").count(), 8, "{text}");
        if prec == Prec::F32 {
            expect![[r#"
                # y variance_f32
                for v2 in 0..16 par {
                  t2 := 0
                  t4 := 0
                  t6 := 0
                  t8 := 0
                  t10 := 0
                  t12 := 0
                  t14 := 0
                  t16 := 0
                  for v1 in 0..48 {
                    t3 := sub(n0[8*v2, v1], n1[8*v2])
                    t2 := fma(t3, t3, t2)
                    t5 := sub(n0[8*v2 + 1, v1], n1[8*v2 + 1])
                    t4 := fma(t5, t5, t4)
                    t7 := sub(n0[8*v2 + 2, v1], n1[8*v2 + 2])
                    t6 := fma(t7, t7, t6)
                    t9 := sub(n0[8*v2 + 3, v1], n1[8*v2 + 3])
                    t8 := fma(t9, t9, t8)
                    t11 := sub(n0[8*v2 + 4, v1], n1[8*v2 + 4])
                    t10 := fma(t11, t11, t10)
                    t13 := sub(n0[8*v2 + 5, v1], n1[8*v2 + 5])
                    t12 := fma(t13, t13, t12)
                    t15 := sub(n0[8*v2 + 6, v1], n1[8*v2 + 6])
                    t14 := fma(t15, t15, t14)
                    t17 := sub(n0[8*v2 + 7, v1], n1[8*v2 + 7])
                    t16 := fma(t17, t17, t16)
                  }
                  n2[8*v2] := t2
                  n2[8*v2 + 1] := t4
                  n2[8*v2 + 2] := t6
                  n2[8*v2 + 3] := t8
                  n2[8*v2 + 4] := t10
                  n2[8*v2 + 5] := t12
                  n2[8*v2 + 6] := t14
                  n2[8*v2 + 7] := t16
                }
            "#]]
            .assert_eq(&text);
        }
        let want = run_case(BackendKind::Interp, CompileOptions::default(), &case);
        for opts in [
            CompileOptions::default(),
            CompileOptions { threads: Some(1), ..CompileOptions::default() },
            CompileOptions { threads: Some(3), min_parallel_work: 1, ..CompileOptions::default() },
        ] {
            let got = run_case(BackendKind::Gccjit, opts, &case);
            assert_eq!(bits(&got[0]), bits(&want[0]), "{}", case.name);
        }
    }
}

/// A weight's gradient whose second factor is an expression (an activation's gradient times
/// the incoming one): `c[i,j] = Σ_k a[k,i]·(g[k,j]·h[k,j])`. The factor is computed into a
/// buffer laid out as `g` and `h` are (`[k, j]`: the fill reads and writes memory in order,
/// not one cell per cache line as in the nest's order `[j, k]` it used to take), and the call
/// gives the interpreter's bits.
#[test]
fn an_expression_operand_takes_the_layout_of_what_it_reads() {
    let (m, k, n) = (48, 160, 96);
    let case = accumulation(
        "atb_of_an_expression",
        "ijk",
        &[m, n, k],
        Arg(&[m, n], "i,j", Prec::F32),
        &[
            Arg(&[k, m], "k,i", Prec::F32),
            Arg(&[k, n], "k,j", Prec::F32),
            Arg(&[k, n], "k,j", Prec::F32),
        ],
        ScalarExpr::bin(
            BinOp::Mul,
            ScalarExpr::Arg(0),
            ScalarExpr::bin(BinOp::Mul, ScalarExpr::Arg(1), ScalarExpr::Arg(2)),
        ),
        BinOp::Add,
        true,
    );
    assert_eq!(kernel(&case), "gemm");
    check(&case);
    let text = scheduled(&case);
    let call = text.lines().find(|l| l.contains("gemm f32")).unwrap_or_else(|| panic!("{text}"));
    // `B`, the buffer: a row of `n` cells per reduction step, its columns contiguous.
    assert!(call.contains(&format!("[@0; {n}, 1] (m {m}")), "{call}");
}

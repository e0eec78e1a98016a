//! Parallel groups (`backend::gccjit::group`): consecutive parallel nests over the same rows run
//! as one job of the pool, each chunk of rows going through every nest in order. A chain of
//! nests over the rows of intermediates in the routine's arena runs as one job; a nest that
//! reads other rows of what the chain wrote (a transpose), or whose rows are wider than the
//! bytes it may reuse in the arena, does not join it. Every case gives the interpreter's bits,
//! with and without groups, on 1–3 threads, at edge sizes and with a dynamic batch.

mod common;

use common::*;
use rocannl_arrayjit::assignments::{Asgn, ScalarExpr};
use rocannl_arrayjit::indexing::{AxisIndex::Fixed, AxisIndex::Iterator as It, Symbol};
use rocannl_arrayjit::ops::{BinOp, Prec, UnOp};
use rocannl_arrayjit::tnode::{MemoryMode, NodeTable};
use rocannl_arrayjit::{BackendKind, CompileOptions, Context};

/// What follows the chain `t1 = 2x + b`, `t2 = relu(t1) + 1`, `y = t2 · t1` (cell by cell).
#[derive(Copy, Clone, Debug, PartialEq)]
enum Tail {
    /// `z = t2ᵀ + y`: reads rows of `t2` other than its own.
    Transposed,
    /// `w[i, j, q] = 3y[i, j]` (rows three times as wide, possibly over the bytes of `t1` and
    /// `t2`), then `s[i, j] = Σ_q w[i, j, q]`.
    Wider,
}

fn chain(m: usize, n: usize, prec: Prec, tail: Tail) -> Case {
    let mut nodes = NodeTable::default();
    let local = |nodes: &mut NodeTable, label: &str, dims: &[usize]| {
        nodes.add(label, dims, prec, MemoryMode::Local)
    };
    let x = host(&mut nodes, "x", &[m, n], prec);
    let b = host(&mut nodes, "b", &[n], prec);
    let t1 = local(&mut nodes, "t1", &[m, n]);
    let t2 = local(&mut nodes, "t2", &[m, n]);
    let y = host(&mut nodes, "y", &[m, n], prec);
    let (i, j, q) = (Symbol(0), Symbol(1), Symbol(2));
    let cell = |args: Vec<(Vec<usize>, Vec<_>)>| {
        proj(&[(i, m), (j, n)], &[m, n], vec![It(i), It(j)], args)
    };
    let mn = || (vec![m, n], vec![It(i), It(j)]);
    let (a0, a1) = (ScalarExpr::Arg(0), ScalarExpr::Arg(1));
    let twice_plus = ScalarExpr::bin(
        BinOp::Add,
        ScalarExpr::bin(BinOp::Mul, a0.clone(), ScalarExpr::Const(2.0)),
        a1.clone(),
    );
    let relu_plus =
        ScalarExpr::bin(BinOp::Add, ScalarExpr::un(UnOp::Relu, a0.clone()), ScalarExpr::Const(1.0));
    let times = ScalarExpr::bin(BinOp::Mul, a0.clone(), a1.clone());
    let mut code = vec![
        accum(t1, None, vec![x, b], twice_plus, cell(vec![mn(), (vec![n], vec![It(j)])]), false),
        accum(t2, None, vec![t1], relu_plus, cell(vec![mn()]), false),
        accum(y, None, vec![t2, t1], times, cell(vec![mn(), mn()]), false),
    ];
    let mut outputs = vec![y];
    match tail {
        Tail::Transposed => {
            assert_eq!(m, n);
            let z = host(&mut nodes, "z", &[m, n], prec);
            let add = ScalarExpr::bin(BinOp::Add, a0.clone(), a1.clone());
            let args = vec![(vec![m, n], vec![It(j), It(i)]), mn()];
            code.push(accum(z, None, vec![t2, y], add, cell(args), false));
            outputs.push(z);
        }
        Tail::Wider => {
            let w = local(&mut nodes, "w", &[m, n, 3]);
            let s = host(&mut nodes, "s", &[m, n], prec);
            let thrice = ScalarExpr::bin(BinOp::Mul, a0.clone(), ScalarExpr::Const(3.0));
            let pw =
                proj(&[(i, m), (j, n), (q, 3)], &[m, n, 3], vec![It(i), It(j), It(q)], vec![mn()]);
            code.push(accum(w, None, vec![y], thrice, pw, false));
            let ps = proj(
                &[(i, m), (j, n), (q, 3)],
                &[m, n],
                vec![It(i), It(j)],
                vec![(vec![m, n, 3], vec![It(i), It(j), It(q)])],
            );
            code.push(accum(s, Some(BinOp::Add), vec![w], a0.clone(), ps, true));
            outputs.push(s);
        }
    }
    let mut inputs = vec![(x, data(m * n, 1, -1.0, 1.0)), (b, data(n, 2, -0.5, 0.5))];
    for (_, v) in inputs.iter_mut() {
        v.iter_mut().for_each(|x| *x = prec.round(*x));
    }
    Case {
        name: format!("{tail:?}_{m}x{n}_{}", prec.name()),
        nodes,
        asgn: Asgn::Seq(code),
        inputs,
        outputs,
        bindings: vec![],
        expected: None,
    }
}

fn opts(threads: usize, groups: bool) -> CompileOptions {
    CompileOptions {
        threads: Some(threads),
        min_parallel_work: 1,
        parallel_groups: groups,
        cache: rocannl_arrayjit::cache::CacheMode::Off,
        ..CompileOptions::default()
    }
}

fn bits(a: &[f64]) -> Vec<u64> {
    a.iter().map(|x| x.to_bits()).collect()
}

/// The number of calls in each job of two or more, from the compiled routine's listing.
fn jobs(case: &Case, threads: usize) -> Vec<usize> {
    let mut ctx = Context::new(BackendKind::Gccjit, opts(threads, true)).unwrap();
    let r = ctx.compile(&case.name, &case.asgn, &case.nodes).unwrap();
    let src = r.source_text();
    let listing = src.split("/* calls, in order:").nth(1).unwrap();
    let mut sizes: Vec<usize> = Vec::new();
    for l in listing.lines() {
        if let Some(job) = l.split("[job ").nth(1) {
            let job: usize = job.trim_end_matches(']').parse().unwrap();
            if sizes.len() <= job {
                sizes.resize(job + 1, 0);
            }
            sizes[job] += 1;
        }
    }
    sizes
}

/// gccjit with and without groups, on 1, 2 and 3 threads, gives the interpreter's bits.
fn check(case: &Case) {
    let want = run_case(BackendKind::Interp, CompileOptions::default(), case);
    for groups in [true, false] {
        for threads in [1, 2, 3] {
            let got = run_case(BackendKind::Gccjit, opts(threads, groups), case);
            for (k, (g, w)) in got.iter().zip(&want).enumerate() {
                assert_eq!(
                    bits(g),
                    bits(w),
                    "{} output {k}, {threads} threads, groups {groups}",
                    case.name
                );
            }
        }
    }
}

#[test]
fn a_chain_of_nests_over_the_same_rows_runs_as_one_job() {
    for prec in [Prec::F32, Prec::Bf16] {
        for (m, n) in [(64, 64), (37, 37), (2, 2), (131, 131)] {
            let case = chain(m, n, prec, Tail::Transposed);
            // t1, t2 and y: three calls in one job; the transpose runs on its own.
            assert_eq!(jobs(&case, 2), [3], "{}", case.name);
            check(&case);
        }
    }
}

#[test]
fn wider_rows_over_reused_bytes_do_not_join_the_chain() {
    for (m, n) in [(64, 64), (37, 19), (3, 130)] {
        let case = chain(m, n, Prec::F32, Tail::Wider);
        // The chain's job ends before `w`, whose rows would cross those of `t1` and `t2`
        // (dead by then, so the arena may give their bytes to `w`).
        assert_eq!(jobs(&case, 2)[0], 3, "{}", case.name);
        check(&case);
    }
}

#[test]
fn every_conformance_case_gives_the_same_bits_with_groups() {
    for case in all_cases(&[Prec::F32, Prec::Bf16]) {
        let want = run_case(BackendKind::Gccjit, opts(2, false), &case);
        for threads in [2, 3] {
            let got = run_case(BackendKind::Gccjit, opts(threads, true), &case);
            for (k, (g, w)) in got.iter().zip(&want).enumerate() {
                assert_eq!(bits(g), bits(w), "{} output {k}, {threads} threads", case.name);
            }
        }
    }
}

#[test]
fn a_dynamic_batch_gives_the_same_bits_with_groups() {
    for n_value in [1, 7, 13, 24] {
        let case = dynamic_case(Prec::F32, n_value);
        check(&case);
    }
}

/// A nest too small for a job of its own (`min_parallel_work`) between two big ones over the
/// same rows: it joins their job instead of running on the calling thread between two jobs.
/// Alone (no big neighbour), it runs on the calling thread as before.
#[test]
fn a_small_nest_between_big_ones_shares_their_job() {
    for (m, n, joined) in [(256, 256, true), (37, 300, true), (8, 8, false)] {
        let prec = Prec::F32;
        let mut nodes = NodeTable::default();
        let x = host(&mut nodes, "x", &[m, n], prec);
        let t1 = nodes.add("t1", &[m, n], prec, MemoryMode::Local);
        let s = nodes.add("s", &[m], prec, MemoryMode::Local);
        let y = host(&mut nodes, "y", &[m, n], prec);
        let (i, j) = (Symbol(0), Symbol(1));
        let cell = |args| proj(&[(i, m), (j, n)], &[m, n], vec![It(i), It(j)], args);
        let (a0, a1) = (ScalarExpr::Arg(0), ScalarExpr::Arg(1));
        let twice = ScalarExpr::bin(BinOp::Mul, a0.clone(), ScalarExpr::Const(2.0));
        let first = proj(&[(i, m)], &[m], vec![It(i)], vec![(vec![m, n], vec![It(i), Fixed(0)])]);
        let thrice = ScalarExpr::bin(BinOp::Mul, a0.clone(), ScalarExpr::Const(3.0));
        let plus = ScalarExpr::bin(BinOp::Add, ScalarExpr::un(UnOp::Relu, a0.clone()), a1);
        let code = vec![
            accum(t1, None, vec![x], twice, cell(vec![(vec![m, n], vec![It(i), It(j)])]), false),
            accum(s, None, vec![t1], thrice, first, false),
            accum(
                y,
                None,
                vec![t1, s],
                plus,
                cell(vec![(vec![m, n], vec![It(i), It(j)]), (vec![m], vec![It(i)])]),
                false,
            ),
        ];
        let case = Case {
            name: format!("small_between_{m}x{n}"),
            nodes,
            asgn: Asgn::Seq(code),
            inputs: vec![(x, data(m * n, 1, -1.0, 1.0))],
            outputs: vec![y],
            bindings: vec![],
            expected: None,
        };
        let default_work = CompileOptions {
            threads: Some(2),
            cache: rocannl_arrayjit::cache::CacheMode::Off,
            ..CompileOptions::default()
        };
        let mut ctx = Context::new(BackendKind::Gccjit, default_work.clone()).unwrap();
        let r = ctx.compile(&case.name, &case.asgn, &case.nodes).unwrap();
        let listing = r.source_text().split("/* calls, in order:").nth(1).unwrap().to_string();
        let in_job = listing.lines().filter(|l| l.contains("[job 0]")).count();
        assert_eq!(in_job, if joined { 3 } else { 0 }, "{}:\n{listing}", case.name);
        let want = run_case(BackendKind::Interp, CompileOptions::default(), &case);
        for threads in [1, 2, 3] {
            let opts = CompileOptions { threads: Some(threads), ..default_work.clone() };
            let got = run_case(BackendKind::Gccjit, opts, &case);
            assert_eq!(bits(&got[0]), bits(&want[0]), "{} ({threads} threads)", case.name);
        }
    }
}

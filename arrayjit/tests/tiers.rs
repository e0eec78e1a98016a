//! Tiered builds (gccjit): a routine first runs a quick `-O0` build while the optimized one is
//! made in the background, and small run-once routines run on the interpreter. Neither may
//! change a value: every result here is compared bit for bit with the optimized build.
#![cfg(feature = "gccjit")]

mod common;

use std::path::{Path, PathBuf};

use common::*;
use rocannl_arrayjit::cache::{CacheMode, CacheOutcome};
use rocannl_arrayjit::ops::Prec;
use rocannl_arrayjit::{BackendKind, CompileOptions, Context, NdArray};

fn fresh_dir(name: &str) -> PathBuf {
    let d = rocannl_arrayjit::env::temp_dir()
        .join(format!("rocannl-tiers-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    d
}

fn opts(dir: &Path, tiered: bool) -> CompileOptions {
    CompileOptions { tiered, cache: CacheMode::Dir(dir.to_path_buf()), ..CompileOptions::default() }
}

fn bits(v: &[Vec<f64>]) -> Vec<Vec<u64>> {
    v.iter().map(|o| o.iter().map(|x| x.to_bits()).collect()).collect()
}

/// Compiles a case, writes its inputs; returns the context and routine.
fn setup(case: &Case, opts: CompileOptions) -> (Context, rocannl_arrayjit::Routine) {
    let mut ctx = Context::new(BackendKind::Gccjit, opts).unwrap();
    let r = ctx.compile(&case.name, &case.asgn, &case.nodes).unwrap();
    for (id, vals) in &case.inputs {
        let node = case.nodes.get(*id).unwrap();
        ctx.ensure_buffer(node).unwrap();
        ctx.write(*id, &NdArray::from_f64(node.prec, &node.dims, vals).unwrap()).unwrap();
    }
    (ctx, r)
}

fn outputs(ctx: &Context, case: &Case) -> Vec<Vec<f64>> {
    case.outputs.iter().map(|o| ctx.read(*o).unwrap().to_f64_vec()).collect()
}

/// The files of the cache's own folder in `dir` whose name ends with `ext`.
fn entries(dir: &Path, ext: &str) -> usize {
    std::fs::read_dir(dir.join(rocannl_arrayjit::cache::ENTRIES))
        .map(|r| r.flatten().filter(|e| e.path().to_string_lossy().ends_with(ext)).count())
        .unwrap_or(0)
}

#[test]
fn a_tiered_routine_computes_the_optimized_bits_before_and_after_the_swap() {
    let mut cases = vec![
        matmul_case(64, 200, 48, Prec::F32),
        softmax_case(Prec::F32, 9, 33),
        conv_case(Prec::F32, 2, 2),
        reduce_case(rocannl_arrayjit::ops::BinOp::Max, Prec::F64),
    ];
    cases.push(matmul_case(33, 47, 65, Prec::Bf16));
    for case in cases {
        let dir = fresh_dir(&format!("swap-{}", case.name));
        let want = run_case(BackendKind::Gccjit, opts(&dir, false), &case);
        let _ = std::fs::remove_dir_all(&dir);

        let (mut ctx, r) = setup(&case, opts(&dir, true));
        assert!(!ctx.runs_optimized(&r), "{}: the first tier runs first", case.name);
        assert!(ctx.builds_pending(), "{}: its optimized build is pending", case.name);
        ctx.run(&r, &case.bindings).unwrap();
        assert_eq!(bits(&outputs(&ctx, &case)), bits(&want), "{}: first tier", case.name);
        ctx.finish_builds();
        assert!(ctx.runs_optimized(&r), "{}: swapped in", case.name);
        assert!(!ctx.builds_pending(), "{}: nothing pending", case.name);
        ctx.run(&r, &case.bindings).unwrap();
        assert_eq!(bits(&outputs(&ctx, &case)), bits(&want), "{}: optimized", case.name);

        // The background build stored the optimized code: a second context loads it.
        let (mut again, r2) = setup(&case, opts(&dir, true));
        assert_eq!(r2.report().cache, CacheOutcome::Hit, "{}", case.name);
        assert!(again.runs_optimized(&r2), "{}: nothing to build", case.name);
        again.run(&r2, &case.bindings).unwrap();
        assert_eq!(bits(&outputs(&again, &case)), bits(&want), "{}: from the cache", case.name);
        assert_eq!(entries(&dir, ".tmp"), 0, "{}: no temporary files left", case.name);
        let _ = std::fs::remove_dir_all(&dir);
    }
}

#[test]
fn a_routine_swaps_its_optimized_build_in_by_itself() {
    let case = softmax_case(Prec::F32, 40, 100);
    let dir = fresh_dir("by-itself");
    let (mut ctx, r) = setup(&case, opts(&dir, true));
    let first = {
        ctx.run(&r, &case.bindings).unwrap();
        outputs(&ctx, &case)
    };
    // Runs go on while the build is made; one of them swaps it in.
    let started = std::time::Instant::now();
    while !ctx.runs_optimized(&r) {
        assert!(started.elapsed().as_secs() < 120, "the optimized build never came");
        std::thread::sleep(std::time::Duration::from_millis(5));
        ctx.run(&r, &case.bindings).unwrap();
        assert_eq!(bits(&outputs(&ctx, &case)), bits(&first));
    }
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn dropping_a_context_stops_its_background_build_and_leaves_the_cache_valid() {
    let case = matmul_case(96, 520, 104, Prec::F32);
    let dir = fresh_dir("drop");
    for _ in 0..3 {
        let (mut ctx, r) = setup(&case, opts(&dir, true));
        ctx.run(&r, &case.bindings).unwrap();
        drop(ctx);
        assert_eq!(entries(&dir, ".tmp"), 0, "a stopped build leaves no temporary file");
    }
    // Whatever the stopped builds left is a valid cache.
    let want = run_case(BackendKind::Gccjit, opts(&fresh_dir("drop-ref"), false), &case);
    let got = run_case(BackendKind::Gccjit, opts(&dir, false), &case);
    assert_eq!(bits(&got), bits(&want));
    let _ = std::fs::remove_dir_all(&dir);
    let _ = std::fs::remove_dir_all(fresh_dir("drop-ref"));
}

#[test]
fn small_run_once_routines_run_on_the_interpreter_and_are_built_for_the_next_process() {
    for prec in [Prec::F32, Prec::Bf16, Prec::F64] {
        let case = fetch_case(prec);
        let oracle = run_case(BackendKind::Interp, CompileOptions::default(), &case);
        let dir = fresh_dir(&format!("once-{}", prec.name()));
        let once = |dir: &Path| {
            let mut ctx = Context::new(BackendKind::Gccjit, opts(dir, true)).unwrap();
            let r = ctx.compile_once(&case.name, &case.asgn, &case.nodes).unwrap();
            ctx.run(&r, &case.bindings).unwrap();
            let got = outputs(&ctx, &case);
            ctx.finish_builds();
            (r.report().clone(), got)
        };
        // First process: interpreted (no GCC at all), the same bits as the interpreter.
        let (report, got) = once(&dir);
        assert_eq!(report.cache, CacheOutcome::Off, "{prec:?}");
        assert!(report.phases.iter().all(|(p, _)| *p != "c compile"), "{:?}", report.phases);
        assert_eq!(bits(&got), bits(&oracle), "{prec:?}: interpreted");
        // Its native code was built in the background; the next process loads it.
        let (report, got) = once(&dir);
        assert_eq!(report.cache, CacheOutcome::Hit, "{prec:?}");
        assert_eq!(bits(&got), bits(&oracle), "{prec:?}: native");
        let _ = std::fs::remove_dir_all(&dir);
    }
}

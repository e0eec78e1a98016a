//! Releasing routines (`Context::release`) on every backend, and the device memory pool behind
//! the CUDA backend, exercised through its simulator: released memory is reused, zeroed, by the
//! next routine, and the values stay the interpreter's.

mod common;

use common::*;
use rocannl_arrayjit::ops::Prec;
use rocannl_arrayjit::{BackendKind, CompileOptions, Context, Error, NdArray};

fn context(kind: BackendKind, case: &Case) -> Context {
    let mut ctx = Context::new(kind, CompileOptions::default()).unwrap();
    for (id, vals) in &case.inputs {
        let node = case.nodes.get(*id).unwrap();
        ctx.ensure_buffer(node).unwrap();
        ctx.write(*id, &NdArray::from_f64(node.prec, &node.dims, vals).unwrap()).unwrap();
    }
    ctx
}

fn outputs(ctx: &Context, case: &Case) -> Vec<Vec<f64>> {
    case.outputs.iter().map(|o| ctx.read(*o).unwrap().to_f64_vec()).collect()
}

#[test]
fn a_released_routine_cannot_run_and_others_still_do() {
    // Softmax keeps intermediates in the routine's arena (and, on the GPU, reduction scratch).
    let case = softmax_case(Prec::F32, 37, 300);
    let want = run_case(BackendKind::Interp, CompileOptions::default(), &case);
    for kind in [BackendKind::Interp, BackendKind::Gccjit, BackendKind::CudaSim] {
        let mut ctx = context(kind, &case);
        let first = ctx.compile("softmax", &case.asgn, &case.nodes).unwrap();
        let second = ctx.compile("again", &case.asgn, &case.nodes).unwrap();
        ctx.run(&first, &[]).unwrap();
        ctx.release(&first).unwrap();
        ctx.release(&first).unwrap();
        match ctx.run(&first.clone(), &[]) {
            Err(e @ Error::ReleasedRoutine(_)) => {
                assert_eq!(e.to_string(), "routine `softmax` was released", "{kind:?}")
            }
            other => panic!("{kind:?}: {other:?}"),
        }
        ctx.run(&second, &[]).unwrap();
        assert_eq!(outputs(&ctx, &case), want, "{kind:?}");
        let third = ctx.compile("third", &case.asgn, &case.nodes).unwrap();
        ctx.run(&third, &[]).unwrap();
        assert_eq!(outputs(&ctx, &case), want, "{kind:?}");
        assert_eq!(ctx.device_pool_stats().is_some(), kind == BackendKind::CudaSim);
    }
}

#[test]
fn the_device_pool_reuses_what_a_released_routine_held() {
    let case = softmax_case(Prec::F32, 64, 513);
    let want = run_case(BackendKind::Interp, CompileOptions::default(), &case);
    let mut ctx = context(BackendKind::CudaSim, &case);
    let r = ctx.compile("first", &case.asgn, &case.nodes).unwrap();
    ctx.run(&r, &[]).unwrap();
    let before = ctx.device_pool_stats().unwrap();
    assert!(before.in_use_bytes > 0 && before.cached_bytes == 0, "{before:?}");
    ctx.release(&r).unwrap();
    let released = ctx.device_pool_stats().unwrap();
    assert!(released.cached_bytes > 0, "{released:?}");
    assert_eq!(released.in_use_bytes + released.cached_bytes, before.in_use_bytes);
    // The same routine again: every block of its arena and scratch comes from the cache, and
    // the cached blocks it used were zeroed (the values are the interpreter's).
    let again = ctx.compile("second", &case.asgn, &case.nodes).unwrap();
    ctx.run(&again, &[]).unwrap();
    assert_eq!(outputs(&ctx, &case), want);
    let after = ctx.device_pool_stats().unwrap();
    assert_eq!(after.allocations, before.allocations, "{after:?}");
    assert!(after.reuses >= 1);
    assert_eq!(after.cached_bytes, 0);
    assert_eq!(after.peak_bytes, before.peak_bytes);
}

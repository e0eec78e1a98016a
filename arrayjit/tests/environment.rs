//! Compiling never changes this process's environment, so a program may read it with
//! `std::env` from any thread while routines compile. GCC's embedded driver sets variables
//! such as `COLLECT_GCC` and `COMPILER_PATH` while it runs; builds in forked children keep
//! that out of this process, and a build made here uses libgccjit's external driver. (With
//! the embedded driver in this process, this test dies of a segmentation fault: a read of the
//! environment racing the driver's `putenv`.)
//!
//! Alone in its test binary, since it points the temporary folder somewhere unwritable to force
//! builds in this process (the library has nowhere to be written, so it is compiled in memory).

#![cfg(feature = "gccjit")]

mod common;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};

use common::*;
use rocannl_arrayjit::cache::CacheMode;
use rocannl_arrayjit::ops::Prec;
use rocannl_arrayjit::{BackendKind, CompileOptions};

/// Variables GCC's driver sets while it runs, and which are unset in a plain test run.
const DRIVER_VARIABLES: [&str; 3] = ["COLLECT_GCC", "COLLECT_GCC_OPTIONS", "COMPILER_PATH"];

#[test]
fn builds_in_this_process_leave_the_environment_alone() {
    if DRIVER_VARIABLES.iter().any(|v| std::env::var_os(v).is_some()) {
        eprintln!("run under GCC's driver: nothing to observe");
        return;
    }
    // SAFETY: the only thread of this test binary so far (one test, run before any other
    // thread starts).
    unsafe { std::env::set_var("TMPDIR", "/nonexistent/rocannl-no-temp") };
    let stop = Arc::new(AtomicBool::new(false));
    let seen = Arc::new(AtomicUsize::new(0));
    let reader = {
        let (stop, seen) = (stop.clone(), seen.clone());
        std::thread::spawn(move || {
            while !stop.load(Ordering::Relaxed) {
                for v in DRIVER_VARIABLES {
                    if std::env::var_os(v).is_some() {
                        seen.fetch_add(1, Ordering::Relaxed);
                    }
                }
            }
        })
    };
    let opts = CompileOptions { cache: CacheMode::Off, ..CompileOptions::default() };
    for m in 0..3 {
        let case = matmul_case(8 + m, 16, 24, Prec::F32);
        let got = run_case(BackendKind::Gccjit, opts.clone(), &case);
        let want = run_case(BackendKind::Interp, opts.clone(), &case);
        assert_close(&case.name, &got[0], &want[0], tolerance(Prec::F32));
    }
    stop.store(true, Ordering::Relaxed);
    reader.join().unwrap();
    assert_eq!(seen.load(Ordering::Relaxed), 0, "GCC's driver changed this process's environment");
}

//! Compiling while another thread of the process is panicking: GCC's builds run in forked
//! children, and a child must not wait for a lock that the panicking thread held at the fork
//! (the panic hook's). Alone in its test binary, since it replaces the process's panic hook.

#![cfg(feature = "gccjit")]

mod common;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use common::*;
use rocannl_arrayjit::cache::CacheMode;
use rocannl_arrayjit::ops::Prec;
use rocannl_arrayjit::{BackendKind, CompileOptions};

#[test]
fn compiles_finish_while_another_thread_panics() {
    // A slow hook keeps the hook's lock taken most of the time.
    std::panic::set_hook(Box::new(|_| std::thread::sleep(Duration::from_millis(5))));
    let stop = Arc::new(AtomicBool::new(false));
    let panicking = {
        let stop = stop.clone();
        std::thread::spawn(move || {
            while !stop.load(Ordering::Relaxed) {
                let _ = std::panic::catch_unwind(|| panic!("a panic elsewhere in the process"));
            }
        })
    };
    let (done, finished) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let opts = CompileOptions { cache: CacheMode::Off, ..CompileOptions::default() };
        for m in 0..4 {
            let case = matmul_case(8 + m, 16, 24, Prec::F32);
            let got = run_case(BackendKind::Gccjit, opts.clone(), &case);
            let want = run_case(BackendKind::Interp, opts.clone(), &case);
            assert_close(&case.name, &got[0], &want[0], tolerance(Prec::F32));
        }
        let _ = done.send(());
    });
    let result = finished.recv_timeout(Duration::from_secs(120));
    stop.store(true, Ordering::Relaxed);
    panicking.join().unwrap();
    assert!(result.is_ok(), "compiles hung while another thread was panicking");
}

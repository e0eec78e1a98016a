//! libgccjit's external driver, which the `gccjit` crate does not bind.
//!
//! libgccjit assembles and links with GCC's driver, run inside the process by default (the
//! embedded driver), which sets and restores environment variables with `putenv` and
//! `unsetenv` around its run (`COLLECT_GCC`, `COLLECT_GCC_OPTIONS`, `COMPILER_PATH`,
//! `LIBRARY_PATH` and others) — a race with any other thread reading the environment. Builds in
//! forked children may use it (their environment is their own); a build in the calling process
//! switches to the external driver, which starts `gcc` as a program and changes nothing there
//! ([`crate::env`], docs/backends.md).

use gccjit::Context;

/// The pointer behind a `gccjit::Context`, which the crate does not expose: the context is a
/// single pointer-sized field beside a zero-sized marker (checked at compile time below), so
/// that field is the whole value.
fn raw_context(ctx: &Context<'_>) -> *mut std::ffi::c_void {
    const _: () = assert!(
        std::mem::size_of::<Context<'static>>() == std::mem::size_of::<*mut std::ffi::c_void>()
    );
    // SAFETY: `Context` holds exactly one non-null pointer (its size is a pointer's, and its
    // other field is a zero-sized marker), so its bytes are that pointer.
    unsafe { *(ctx as *const Context<'_> as *const *mut std::ffi::c_void) }
}

unsafe extern "C" {
    /// libgccjit's switch between the embedded and the external driver (ABI 5, GCC 7 on),
    /// which the `gccjit` crate does not bind.
    fn gcc_jit_context_set_bool_use_external_driver(
        ctxt: *mut std::ffi::c_void,
        bool_value: std::ffi::c_int,
    );
}

/// Makes `ctx` run GCC's driver as a program rather than inside this process: the embedded
/// driver sets and restores environment variables with `putenv`/`unsetenv` around its run
/// (`COLLECT_GCC_OPTIONS`, `COMPILER_PATH`, `LIBRARY_PATH` and others), racing with any other
/// thread reading the environment; the external one changes nothing here.
pub(super) fn use_external_driver(ctx: &Context<'_>) {
    // SAFETY: a live context of this thread, and a documented libgccjit entry point.
    unsafe { gcc_jit_context_set_bool_use_external_driver(raw_context(ctx), 1) }
}

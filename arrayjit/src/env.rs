//! The process environment as this crate reads it: the one place that names the variables it
//! reads (`ROCANNL_CACHE`, `ROCANNL_CACHE_DIR`, `ROCANNL_CACHE_MAX_BYTES`, `ROCANNL_ISA`,
//! `ROCANNL_NVRTC_DIR`, `LD_LIBRARY_PATH`, the temporary folder).
//!
//! Compiling never changes the environment of this process, so code anywhere — this crate,
//! the user's, another thread while a routine compiles — reads it with `std::env` safely.
//! That is a property of how the native backend runs GCC, not of a lock: libgccjit's embedded
//! driver sets and restores variables (`COLLECT_GCC`, `COLLECT_GCC_OPTIONS`, `COMPILER_PATH`,
//! `LIBRARY_PATH`, …) with `putenv` and `unsetenv` around each build, which races with any
//! `getenv` of another thread, so it runs only in forked children, whose environment is their
//! own; a build made in this process (when a fork fails, or a library cannot be written or
//! loaded) uses libgccjit's external driver instead, which starts `gcc` as a program and
//! changes nothing here (docs/backends.md).
//!
//! ```
//! let tmp = rocannl_arrayjit::env::temp_dir();
//! assert!(tmp.is_absolute());
//! let _isa = rocannl_arrayjit::env::var("ROCANNL_ISA");
//! ```

use std::ffi::OsString;
use std::path::PathBuf;

/// `std::env::var_os`.
pub fn var_os(name: &str) -> Option<OsString> {
    std::env::var_os(name)
}

/// `std::env::var`: `None` when unset or not Unicode.
pub fn var(name: &str) -> Option<String> {
    std::env::var(name).ok()
}

/// `std::env::temp_dir`.
pub fn temp_dir() -> PathBuf {
    std::env::temp_dir()
}

//! The process environment, read safely while GCC may be compiling in this process.
//!
//! libgccjit runs GCC's driver inside the calling process to assemble and link what it
//! compiles, and the driver sets and restores environment variables (`COLLECT_GCC_OPTIONS` and
//! others) around each run. The C library's `getenv` is not safe against a concurrent `setenv`
//! or `putenv`: a thread that reads the environment at that moment can crash (a test binary did,
//! in `std::env::temp_dir`, while another test's routine was being linked).
//!
//! So GCC runs in forked children wherever it can (their environment is their own), and the
//! builds that must run in this process — when a fork fails, or a routine has nowhere to write a
//! library and is compiled in memory — hold [`lock`]. Every read of the environment by this crate
//! goes through this module, which takes the same lock; code outside the crate that reads the
//! environment from another thread while a routine compiles should do the same (the examples and
//! the command-line tool do).
//!
//! ```
//! let tmp = rocannl_arrayjit::env::temp_dir();
//! assert!(tmp.is_absolute());
//! let _isa = rocannl_arrayjit::env::var("ROCANNL_ISA");
//! ```

use std::cell::Cell;
use std::ffi::OsString;
use std::path::PathBuf;
use std::sync::{Mutex, MutexGuard, OnceLock};

/// Held around every libgccjit compile in this process, around forking, and around reads of
/// the environment.
static LOCK: Mutex<()> = Mutex::new(());

thread_local! {
    /// Whether this thread holds [`LOCK`] (a read of the environment under it reads directly).
    static HELD: Cell<bool> = const { Cell::new(false) };
}

/// [`lock`]'s guard: the lock, and this thread's record of holding it.
#[derive(Debug)]
pub struct Guard {
    _inner: MutexGuard<'static, ()>,
}

impl Drop for Guard {
    fn drop(&mut self) {
        HELD.with(|h| h.set(false));
    }
}

/// Takes the lock that keeps GCC's driver and readers of the environment apart (a panic
/// elsewhere while holding it leaves nothing to repair). Not reentrant: a thread that holds it
/// reads the environment through this module without taking it again, but must not call
/// `lock` again. Never read the environment inside a one-time initializer (`OnceLock`) that
/// another thread may wait on while holding this lock: read first, then initialize.
pub fn lock() -> Guard {
    let inner = LOCK.lock().unwrap_or_else(|e| e.into_inner());
    HELD.with(|h| h.set(true));
    Guard { _inner: inner }
}

/// Runs `f` with the environment stable: under [`lock`] unless this thread holds it already.
pub fn with_lock<T>(f: impl FnOnce() -> T) -> T {
    if HELD.with(Cell::get) {
        f()
    } else {
        let _guard = lock();
        f()
    }
}

/// `std::env::var_os`, under the lock.
#[allow(clippy::disallowed_methods)]
pub fn var_os(name: &str) -> Option<OsString> {
    with_lock(|| std::env::var_os(name))
}

/// `std::env::var`, under the lock: `None` when unset or not Unicode.
#[allow(clippy::disallowed_methods)]
pub fn var(name: &str) -> Option<String> {
    with_lock(|| std::env::var(name).ok())
}

/// `std::env::temp_dir`, read once per process under the lock.
///
/// The read happens before the one-time initializer, not inside it: a thread holding the lock
/// must never wait for an initializer that another thread runs while it waits for the lock.
#[allow(clippy::disallowed_methods)]
pub fn temp_dir() -> PathBuf {
    static DIR: OnceLock<PathBuf> = OnceLock::new();
    if let Some(d) = DIR.get() {
        return d.clone();
    }
    let d = with_lock(std::env::temp_dir);
    DIR.get_or_init(|| d).clone()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_under_the_lock_do_not_take_it_again() {
        let _guard = lock();
        // Would deadlock if the read took the lock this thread holds.
        assert_eq!(var("ROCANNL_SURELY_UNSET_VARIABLE"), None);
        assert!(temp_dir().is_absolute());
    }
}

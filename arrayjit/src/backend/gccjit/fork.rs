//! Builds in child processes: the only way to run GCC on several cores at once.
//!
//! libgccjit compiles one context at a time per process (GCC's global state sits behind a lock
//! inside the library), and GCC's time dominates a routine's compile. A routine's builds are
//! therefore spread over forked children, one per worker, each writing shared libraries that
//! the parent then loads. A child inherits the whole address space (copy on write), so it
//! builds from the same program in memory with no serialization; it runs only libgccjit and
//! leaves with `_exit`, running no destructors and flushing nothing of the parent's.
//!
//! Forking while another thread of this process is inside libgccjit would leave the child a
//! copy of GCC's lock, held by a thread that does not exist there. Every compile of this crate
//! takes [`gcc_lock`], and so does every fork, which rules that out for this crate's builds.
//!
//! Children also keep GCC's embedded driver away from this process's environment, which the
//! driver sets and restores around each run with `putenv` and `unsetenv` ([`crate::env`]): a
//! build that runs here (when a fork fails) uses the external driver, which changes nothing.
//!
//! For the same reason a child takes no lock of the standard library either. A panic inside a
//! child is silenced by a hook installed once in the parent, before the first fork, which stays
//! quiet in children: setting a hook in the child would wait forever for the hook's lock if
//! another thread of the parent was running a panic hook at the moment of the fork. (A program
//! that installs its own hook after its first compile replaces this one; its children then run
//! that hook if a build panics. Install hooks before compiling, or build with one thread.)

use std::sync::Once;
use std::sync::atomic::{AtomicBool, Ordering};

/// Held around every libgccjit compile of this process and around forking.
static GCC_LOCK: std::sync::Mutex<()> = std::sync::Mutex::new(());

/// Takes the lock held around every libgccjit compile of this process and around forking (a
/// panic elsewhere while holding it leaves nothing to repair). Not reentrant.
pub fn gcc_lock() -> std::sync::MutexGuard<'static, ()> {
    GCC_LOCK.lock().unwrap_or_else(|e| e.into_inner())
}

/// Set in a child right after the fork: its panics are failed jobs, reported by the exit status.
static IN_CHILD: AtomicBool = AtomicBool::new(false);

/// Wraps the process's panic hook (once, in the parent) so that it stays silent in children:
/// the default hook would write to the parent's stderr, whose lock another thread may have held
/// at the fork. Elsewhere it calls the hook that was installed before.
fn quiet_in_children() {
    static ONCE: Once = Once::new();
    ONCE.call_once(|| {
        let previous = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            if !IN_CHILD.load(Ordering::Relaxed) {
                previous(info);
            }
        }));
    });
}

/// A running child.
#[derive(Debug)]
pub struct Child(libc::pid_t);

/// Starts one child per job; each runs its job and exits with status 0 when it returns true.
/// A job whose fork failed is returned instead, for the caller to run itself.
pub fn spawn<'a>(
    jobs: Vec<Box<dyn FnOnce() -> bool + 'a>>,
) -> Vec<Result<Child, Box<dyn FnOnce() -> bool + 'a>>> {
    quiet_in_children();
    let _guard = gcc_lock();
    // SAFETY: no preconditions.
    let parent = unsafe { libc::getpid() };
    let mut out = Vec::with_capacity(jobs.len());
    for job in jobs {
        // SAFETY: the child runs only the job (libgccjit and file writes, which need no lock
        // another thread could hold: allocation is fork-safe in the C library, and GCC's own
        // lock is free because this crate's compile lock is held) and then `_exit`.
        match unsafe { libc::fork() } {
            0 => {
                // The child dies with the thread that forked it (with the process, or with a
                // background build's thread), so that nobody is left compiling for nothing.
                #[cfg(target_os = "linux")]
                // SAFETY: plain system calls on this process.
                unsafe {
                    libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL);
                    if libc::getppid() != parent {
                        libc::_exit(1);
                    }
                }
                #[cfg(not(target_os = "linux"))]
                let _ = parent;
                // A panic (libgccjit errors are panics in debug builds) is a failed job.
                IN_CHILD.store(true, Ordering::Relaxed);
                let ok =
                    std::panic::catch_unwind(std::panic::AssertUnwindSafe(job)).unwrap_or(false);
                // SAFETY: ends the child at once, as a child of `fork` must.
                unsafe { libc::_exit(if ok { 0 } else { 1 }) }
            }
            pid if pid > 0 => out.push(Ok(Child(pid))),
            _ => out.push(Err(job)),
        }
    }
    out
}

impl Child {
    /// The child's process id.
    pub fn pid(&self) -> libc::pid_t {
        self.0
    }

    /// Waits until the child has ended without reaping it (its process id stays reserved, so
    /// that it can still be signalled safely until [`Child::wait`]).
    pub fn wait_ended(&self) {
        loop {
            // SAFETY: an all-zero `siginfo_t` is valid; waits for our own child.
            let r = unsafe {
                let mut info: libc::siginfo_t = std::mem::zeroed();
                libc::waitid(
                    libc::P_PID,
                    self.0 as libc::id_t,
                    &mut info,
                    libc::WEXITED | libc::WNOWAIT,
                )
            };
            if r == 0 || std::io::Error::last_os_error().kind() != std::io::ErrorKind::Interrupted {
                return;
            }
        }
    }

    /// Waits for the child; whether it exited with status 0.
    pub fn wait(self) -> bool {
        let mut status = 0;
        loop {
            // SAFETY: waits for our own child, writing its status into a local.
            let r = unsafe { libc::waitpid(self.0, &mut status, 0) };
            if r == self.0 {
                return libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 0;
            }
            if r < 0 && std::io::Error::last_os_error().kind() != std::io::ErrorKind::Interrupted {
                return false;
            }
        }
    }
}

/// A private temporary folder where GCC writes the libraries of one compile: created with a
/// random name and mode 0700 (`tempfile`), so that nobody else can plant a link or a file where
/// GCC will write or where the library is loaded from; removed, with what is in it, when
/// dropped (a loaded library stays mapped). Children write into it; only the parent drops it.
#[derive(Debug)]
pub struct Scratch(tempfile::TempDir);

impl Scratch {
    /// A fresh folder in the temporary folder; `None` where none can be made there, or where its
    /// path is not UTF-8 (libgccjit takes the path of its output as text).
    pub fn new() -> Option<Scratch> {
        let dir = tempfile::Builder::new().prefix("rocannl-").tempdir_in(crate::env::temp_dir());
        let dir = dir.ok()?;
        dir.path().to_str()?;
        Some(Scratch(dir))
    }

    /// Where build `i` writes its library.
    pub fn library(&self, i: usize) -> std::path::PathBuf {
        self.0.path().join(format!("{i}.so"))
    }
}

//! A persistent pool of worker threads for parallel loop nests.
//!
//! A training step runs thousands of times, so threads are spawned once per context and reused:
//! a job is published by bumping an epoch counter; workers spin briefly on it (a step's nests
//! follow each other closely) and then sleep on a condition variable. The calling thread takes
//! the first chunk itself and waits for the others, so a job on `n` threads has `n - 1` workers.

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::thread::JoinHandle;

/// The signature of a compiled step: `(buffers, symbols, lo, hi, error slot)`.
pub type StepFn = unsafe extern "C" fn(*const *mut u8, *const i64, i64, i64, *mut u8);

/// One parallel job: run `f` over `0..extent` split into `parts` contiguous chunks.
#[derive(Clone, Copy)]
struct Job {
    f: StepFn,
    bufs: *const *mut u8,
    syms: *const i64,
    err: *mut u8,
    extent: i64,
    parts: usize,
}

// SAFETY: the pointers are only dereferenced by the compiled code while the submitting thread
// waits for every chunk to finish, so they outlive all uses.
unsafe impl Send for Job {}

impl Job {
    fn run_chunk(&self, part: usize) {
        let lo = self.extent * part as i64 / self.parts as i64;
        let hi = self.extent * (part as i64 + 1) / self.parts as i64;
        if lo < hi {
            // SAFETY: the compiled function only touches buffers through `bufs`, within the
            // bounds established at compile time (or checked in bounds-check mode).
            unsafe { (self.f)(self.bufs, self.syms, lo, hi, self.err) };
        }
    }
}

struct Shared {
    epoch: AtomicU64,
    pending: AtomicUsize,
    job: Mutex<Option<Job>>,
    wake: Condvar,
    shutdown: std::sync::atomic::AtomicBool,
}

/// The worker threads of one context.
pub struct Pool {
    shared: Arc<Shared>,
    workers: Vec<JoinHandle<()>>,
}

impl std::fmt::Debug for Pool {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Pool({} threads)", self.threads())
    }
}

const SPINS: u32 = 20_000;

impl Pool {
    /// A pool using `threads` threads in all (the caller counts as one).
    pub fn new(threads: usize) -> Pool {
        let shared = Arc::new(Shared {
            epoch: AtomicU64::new(0),
            pending: AtomicUsize::new(0),
            job: Mutex::new(None),
            wake: Condvar::new(),
            shutdown: std::sync::atomic::AtomicBool::new(false),
        });
        let workers = (1..threads.max(1))
            .map(|id| {
                let shared = shared.clone();
                std::thread::spawn(move || worker(&shared, id))
            })
            .collect();
        Pool { shared, workers }
    }

    /// The number of threads a job is split across.
    pub fn threads(&self) -> usize {
        self.workers.len() + 1
    }

    /// Runs `f` over `0..extent`, split across all threads; returns when every chunk is done.
    ///
    /// # Safety
    /// `f` must be a compiled step whose buffer, symbol and error pointers are valid for the
    /// duration of the call.
    pub unsafe fn run(
        &self,
        f: StepFn,
        bufs: *const *mut u8,
        syms: *const i64,
        err: *mut u8,
        extent: i64,
    ) {
        let parts = self.threads().min(extent.max(1) as usize);
        let job = Job { f, bufs, syms, err, extent, parts };
        if parts <= 1 {
            job.run_chunk(0);
            return;
        }
        {
            let mut slot = self.shared.job.lock().unwrap_or_else(|e| e.into_inner());
            *slot = Some(job);
            self.shared.pending.store(self.workers.len(), Ordering::SeqCst);
            self.shared.epoch.fetch_add(1, Ordering::SeqCst);
        }
        self.shared.wake.notify_all();
        job.run_chunk(0);
        let mut spins = 0u32;
        while self.shared.pending.load(Ordering::Acquire) > 0 {
            spins += 1;
            if spins < SPINS {
                std::hint::spin_loop();
            } else {
                std::thread::yield_now();
            }
        }
    }
}

fn worker(shared: &Shared, id: usize) {
    let mut seen = 0u64;
    loop {
        let mut spins = 0u32;
        while shared.epoch.load(Ordering::Acquire) == seen
            && !shared.shutdown.load(Ordering::Acquire)
        {
            spins += 1;
            if spins < SPINS {
                std::hint::spin_loop();
            } else {
                let guard = shared.job.lock().unwrap_or_else(|e| e.into_inner());
                if shared.epoch.load(Ordering::Acquire) == seen
                    && !shared.shutdown.load(Ordering::Acquire)
                {
                    drop(shared.wake.wait(guard).unwrap_or_else(|e| e.into_inner()));
                }
            }
        }
        if shared.shutdown.load(Ordering::Acquire) {
            return;
        }
        seen = shared.epoch.load(Ordering::Acquire);
        let job = *shared.job.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(job) = job {
            if id < job.parts {
                job.run_chunk(id);
            }
            shared.pending.fetch_sub(1, Ordering::AcqRel);
        }
    }
}

impl Drop for Pool {
    fn drop(&mut self) {
        {
            let _guard = self.shared.job.lock().unwrap_or_else(|e| e.into_inner());
            self.shared.shutdown.store(true, Ordering::SeqCst);
        }
        self.shared.wake.notify_all();
        for w in self.workers.drain(..) {
            let _ = w.join();
        }
    }
}

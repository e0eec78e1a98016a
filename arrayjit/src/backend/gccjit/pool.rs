//! A persistent pool of worker threads for parallel loop nests.
//!
//! A training step runs thousands of times, so threads are spawned once per context and reused:
//! a job is published by bumping an epoch counter; workers spin briefly on it (a step's nests
//! follow each other closely) and then sleep on a condition variable.
//!
//! A job's range is cut into [`CHUNKS_PER_THREAD`] chunks per thread. Each thread — the
//! calling one is thread 0 — first runs its own chunks, the same part of the range in every
//! job, so consecutive nests over the same rows find their data in the same core's cache. Then
//! it takes any chunk nobody has claimed yet. On a quiet machine every thread ends with its own
//! share; on a busy one (the machine is shared, and a worker may not get a core for
//! milliseconds) the calling thread runs the chunks of a late worker instead of waiting for it.
//!
//! A chunk is claimed by raising its slot to the job's epoch (as `fetch_max`): only one thread
//! sees a lower value, and a worker that wakes up late with an older job cannot claim anything,
//! since every chunk of that job was claimed before it completed.
//!
//! The jobs of a small model's step take microseconds, so the pool's own traffic matters: every
//! claim slot and the completion counter sit on cache lines of their own (a claim does not
//! bounce the line the caller is polling), each thread adds its finished chunks to the counter
//! once per job, and the condition variable is signalled only when a worker is asleep on it.

use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::thread::JoinHandle;

/// The signature of a compiled step: `(buffers, symbols, lo, hi, error slot)`.
pub type StepFn = unsafe extern "C" fn(*const *mut u8, *const i64, i64, i64, *mut u8);

/// Chunks per thread a job is cut into (fewer when the range is shorter).
pub const CHUNKS_PER_THREAD: usize = 4;

/// One step of a job: a compiled function and its buffer table.
pub type Part = (StepFn, *const *mut u8);

/// One parallel job: run each of `count` steps (`steps`) over `0..extent` split into `parts`
/// contiguous chunks; a chunk runs every step over its rows, in order.
#[derive(Clone, Copy)]
struct Job {
    steps: *const Part,
    count: usize,
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
            // SAFETY: `steps` points to `count` entries alive for the whole job.
            let steps = unsafe { std::slice::from_raw_parts(self.steps, self.count) };
            for (f, bufs) in steps {
                // SAFETY: the compiled function only touches buffers through `bufs`, within
                // the bounds established at compile time (or checked in bounds-check mode).
                unsafe { f(*bufs, self.syms, lo, hi, self.err) };
            }
        }
    }
}

/// A value alone on its cache lines (two, for the adjacent-line prefetcher).
#[repr(align(128))]
struct Padded<T>(T);

impl<T> std::ops::Deref for Padded<T> {
    type Target = T;
    fn deref(&self) -> &T {
        &self.0
    }
}

struct Shared {
    threads: usize,
    epoch: Padded<AtomicU64>,
    /// Per chunk, the epoch of the last job that claimed it.
    claimed: Vec<Padded<AtomicU64>>,
    /// Chunks of the current job finished.
    done: Padded<AtomicUsize>,
    job: Mutex<Option<(u64, Job)>>,
    /// Workers waiting on `wake` (changed only under `job`'s lock).
    sleepers: AtomicUsize,
    wake: Condvar,
    shutdown: AtomicBool,
}

impl Shared {
    /// Runs the chunks of `job` (published at `epoch`) that thread `id` claims: its own first,
    /// then any left.
    fn work(&self, id: usize, epoch: u64, job: &Job) {
        let own = job.parts * id / self.threads..job.parts * (id + 1) / self.threads;
        let others = (own.end..job.parts).chain(0..own.start);
        let mut ran = 0;
        for part in own.clone().chain(others) {
            if claim(&self.claimed[part], epoch) {
                job.run_chunk(part);
                ran += 1;
            }
        }
        if ran > 0 {
            self.done.fetch_add(ran, Ordering::AcqRel);
        }
    }
}

/// Raises `slot` to `epoch` when it is lower; whether this call did. As `fetch_max`, but a
/// chunk already claimed is only read: its cache line is not taken from the thread that claimed
/// it (a failed claim used to cost two transfers of the line).
fn claim(slot: &AtomicU64, epoch: u64) -> bool {
    let mut seen = slot.load(Ordering::Acquire);
    while seen < epoch {
        match slot.compare_exchange_weak(seen, epoch, Ordering::AcqRel, Ordering::Acquire) {
            Ok(_) => return true,
            Err(now) => seen = now,
        }
    }
    false
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
        let threads = threads.max(1);
        let shared = Arc::new(Shared {
            threads,
            epoch: Padded(AtomicU64::new(0)),
            claimed: (0..threads * CHUNKS_PER_THREAD).map(|_| Padded(AtomicU64::new(0))).collect(),
            done: Padded(AtomicUsize::new(0)),
            job: Mutex::new(None),
            sleepers: AtomicUsize::new(0),
            wake: Condvar::new(),
            shutdown: AtomicBool::new(false),
        });
        let workers = (1..threads)
            .map(|id| {
                let shared = shared.clone();
                std::thread::spawn(move || worker(&shared, id))
            })
            .collect();
        Pool { shared, workers }
    }

    /// The number of threads a job is split across.
    pub fn threads(&self) -> usize {
        self.shared.threads
    }

    /// Runs the steps of a parallel group ([`super::group`]) over `0..extent`, split across
    /// all threads: each chunk of rows runs every step in order. Returns when every chunk is
    /// done.
    ///
    /// # Safety
    /// Every step must be a compiled step whose buffer, symbol and error pointers are valid for
    /// the duration of the call, and no step may touch, for a row of one chunk, bytes another
    /// step touches for a row of another chunk (one of them writing).
    pub unsafe fn run_group(&self, steps: &[Part], syms: *const i64, err: *mut u8, extent: i64) {
        let parts = self.shared.claimed.len().min(extent.max(1) as usize);
        let job = Job { steps: steps.as_ptr(), count: steps.len(), syms, err, extent, parts };
        if self.workers.is_empty() || parts <= 1 {
            (0..parts).for_each(|p| job.run_chunk(p));
            return;
        }
        let (epoch, asleep) = {
            let mut slot = self.shared.job.lock().unwrap_or_else(|e| e.into_inner());
            let epoch = self.shared.epoch.load(Ordering::Relaxed) + 1;
            self.shared.done.store(0, Ordering::Relaxed);
            *slot = Some((epoch, job));
            self.shared.epoch.store(epoch, Ordering::Release);
            // A worker goes to sleep only under this lock, after seeing the old epoch: either
            // it is counted here, or it sees the new epoch and does not sleep.
            (epoch, self.shared.sleepers.load(Ordering::Relaxed) > 0)
        };
        if asleep {
            self.shared.wake.notify_all();
        }
        self.shared.work(0, epoch, &job);
        let mut spins = 0u32;
        while self.shared.done.load(Ordering::Acquire) < parts {
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
                    shared.sleepers.fetch_add(1, Ordering::Relaxed);
                    let guard = shared.wake.wait(guard).unwrap_or_else(|e| e.into_inner());
                    shared.sleepers.fetch_sub(1, Ordering::Relaxed);
                    drop(guard);
                }
            }
        }
        if shared.shutdown.load(Ordering::Acquire) {
            return;
        }
        let current = *shared.job.lock().unwrap_or_else(|e| e.into_inner());
        if let Some((epoch, job)) = current {
            seen = epoch;
            shared.work(id, epoch, &job);
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

#[cfg(test)]
mod tests {
    use super::*;

    /// Adds one to `counts[i]` for every `i` in `lo..hi` (`bufs[0]` points to the counters).
    unsafe extern "C" fn bump(bufs: *const *mut u8, _: *const i64, lo: i64, hi: i64, _: *mut u8) {
        // SAFETY: the test passes a table whose first entry points to enough `AtomicU64`s.
        let counts = unsafe { *bufs } as *const AtomicU64;
        for i in lo..hi {
            // SAFETY: `i` is below the job's extent, the number of counters.
            unsafe { &*counts.add(i as usize) }.fetch_add(1, Ordering::Relaxed);
        }
    }

    #[test]
    fn every_index_runs_once_per_step_of_each_job() {
        for threads in [1, 2, 3, 5] {
            let pool = Pool::new(threads);
            for extent in [1usize, 2, 3, 7, 8, 64, 1000] {
                let counts: Vec<AtomicU64> = (0..extent).map(|_| AtomicU64::new(0)).collect();
                let table = [counts.as_ptr() as *mut u8];
                let jobs = 50u64;
                for job in 0..jobs {
                    // Jobs of one step and of a group of two, alternately.
                    let steps = [(bump as StepFn, table.as_ptr()); 2];
                    let count = 1 + (job % 2) as usize;
                    // SAFETY: `bump` only touches the counters, alive for the whole call.
                    unsafe {
                        pool.run_group(
                            &steps[..count],
                            std::ptr::null(),
                            std::ptr::null_mut(),
                            extent as i64,
                        )
                    };
                }
                // Each index once per step of each job.
                for c in &counts {
                    assert_eq!(
                        c.load(Ordering::Relaxed),
                        jobs + jobs / 2,
                        "{threads} threads, extent {extent}"
                    );
                }
            }
        }
    }
}

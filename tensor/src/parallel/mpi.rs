//! MPI ranks: processes started by `mpirun` on one host or many.
//!
//! Built on rsmpi over the system's Open MPI (what Horovod and `torch.distributed`'s MPI
//! backend use). Every collective is started non-blocking (`MPI_Iallreduce`, `MPI_Ibcast`,
//! `MPI_Iallgather`, `MPI_Ibarrier`) and polled until it completes or the timeout passes, so a
//! rank that hangs or never arrives is an error on every rank waiting for it rather than a hang.
//! MPI's errors are returned, not fatal (`MPI_ERRORS_RETURN`). After a failure the buffers
//! handed to MPI may still be written, so they are leaked, and MPI is not finalized (finalizing
//! waits for the missing peers): the process ends with the error, and the launcher ends the
//! others.

use std::cell::{Cell, RefCell};
use std::ffi::c_void;
use std::time::{Duration, Instant};

use mpi::ffi;
use mpi::topology::Communicator;

use super::Collective;
use crate::error::{Error, Result};

/// This process's rank in `MPI_COMM_WORLD`.
pub(super) struct Mpi {
    universe: Option<mpi::environment::Universe>,
    rank: usize,
    size: usize,
    /// Whether an operation failed (MPI is then left unfinalized).
    failed: Cell<bool>,
    /// The send and receive buffers of all-reduces, kept from call to call: a fresh buffer of
    /// a large model's gradients would be page-faulted in again on every step.
    staging: RefCell<(Vec<u8>, Vec<u8>)>,
}

impl std::fmt::Debug for Mpi {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Mpi(rank {} of {})", self.rank, self.size)
    }
}

impl Drop for Mpi {
    fn drop(&mut self) {
        if self.failed.get()
            && let Some(u) = self.universe.take()
        {
            std::mem::forget(u);
        }
    }
}

impl Mpi {
    pub(super) fn init() -> Result<Mpi> {
        let universe = mpi::initialize().ok_or_else(|| {
            Error::usage(
                "MPI is already initialized in this process: make one Group::mpi() and clone it",
            )
        })?;
        let world = universe.world();
        // SAFETY: the world communicator is valid from initialization to finalization.
        unsafe {
            ffi::MPI_Comm_set_errhandler(ffi::RSMPI_COMM_WORLD, ffi::RSMPI_ERRORS_RETURN);
        }
        let (rank, size) = (world.rank() as usize, world.size() as usize);
        Ok(Mpi {
            universe: Some(universe),
            rank,
            size,
            failed: Cell::new(false),
            staging: RefCell::new((Vec::new(), Vec::new())),
        })
    }

    fn error(&self, message: String) -> Error {
        self.failed.set(true);
        Error::Distributed { rank: self.rank, size: self.size, message }
    }

    /// Starts an operation with `start` (which fills in the request) and polls it until it
    /// completes or `timeout` passes.
    fn run(
        &self,
        what: &str,
        timeout: Duration,
        start: impl FnOnce(&mut ffi::MPI_Request) -> i32,
    ) -> Result<()> {
        // SAFETY: `MPI_Request` is a handle; `start` initializes it before it is tested.
        let mut request: ffi::MPI_Request = unsafe { std::mem::zeroed() };
        let code = start(&mut request);
        if code != 0 {
            return Err(self.error(format!("the {what} failed to start: MPI error {code}")));
        }
        let started = Instant::now();
        let mut polls = 0u32;
        loop {
            let mut flag = 0;
            // SAFETY: `request` is the live request of the operation just started.
            let code = unsafe { ffi::MPI_Test(&mut request, &mut flag, ffi::RSMPI_STATUS_IGNORE) };
            if code != 0 {
                return Err(self
                    .error(format!("the {what} failed: MPI error {code} (a rank may have died)")));
            }
            if flag != 0 {
                return Ok(());
            }
            if started.elapsed() >= timeout {
                return Err(self.error(format!(
                    "the {what} did not complete within {timeout:?}: another rank did not take \
                     part (it hung, died or runs a different program)"
                )));
            }
            polls += 1;
            if polls < 64 {
                std::thread::yield_now();
            } else {
                std::thread::sleep(Duration::from_micros(20));
            }
        }
    }

    /// A copy of `data` on the heap that is leaked if the operation fails (MPI may still write
    /// into it), or copied back into `data` when it completes.
    fn with_buffer<T: Copy>(
        &self,
        data: &mut [T],
        op: impl FnOnce(*mut c_void) -> Result<()>,
    ) -> Result<()> {
        let mut staged: Vec<T> = data.to_vec();
        match op(staged.as_mut_ptr().cast()) {
            Ok(()) => {
                data.copy_from_slice(&staged);
                Ok(())
            }
            Err(e) => {
                std::mem::forget(staged);
                Err(e)
            }
        }
    }

    /// Sums `buf` over the ranks: the values are sent from a staging copy and received into
    /// another (both kept for the next call, and leaked if the operation fails).
    fn all_reduce<T: Copy>(
        &self,
        buf: &mut [T],
        dtype: ffi::MPI_Datatype,
        timeout: Duration,
    ) -> Result<()> {
        let count = i32::try_from(buf.len()).map_err(|_| {
            self.error(format!("an all-reduce of {} values is too long", buf.len()))
        })?;
        let bytes = std::mem::size_of_val(buf);
        let mut staging = self.staging.borrow_mut();
        let (send, recv) = &mut *staging;
        send.resize(bytes, 0);
        recv.resize(bytes, 0);
        // SAFETY: `buf` is `bytes` bytes of plain values (f32 or f64).
        let raw = unsafe { std::slice::from_raw_parts_mut(buf.as_mut_ptr().cast::<u8>(), bytes) };
        send.copy_from_slice(raw);
        let (sp, rp): (*const c_void, *mut c_void) =
            (send.as_ptr().cast(), recv.as_mut_ptr().cast());
        let res = self.run("all-reduce", timeout, |req| {
            // SAFETY: both buffers hold `count` values of `dtype` and outlive the request
            // (they are leaked on failure).
            unsafe {
                ffi::MPI_Iallreduce(
                    sp,
                    rp,
                    count,
                    dtype,
                    ffi::RSMPI_SUM,
                    ffi::RSMPI_COMM_WORLD,
                    req,
                )
            }
        });
        match res {
            Ok(()) => {
                raw.copy_from_slice(recv);
                Ok(())
            }
            Err(e) => {
                std::mem::forget(std::mem::take(send));
                std::mem::forget(std::mem::take(recv));
                Err(e)
            }
        }
    }
}

impl Collective for Mpi {
    fn rank(&self) -> usize {
        self.rank
    }
    fn size(&self) -> usize {
        self.size
    }
    fn engine(&self) -> &'static str {
        "mpi"
    }

    fn all_reduce_f32(&self, buf: &mut [f32], timeout: Duration) -> Result<()> {
        // SAFETY: reading a constant handle of MPI.
        self.all_reduce(buf, unsafe { ffi::RSMPI_FLOAT }, timeout)
    }

    fn all_reduce_f64(&self, buf: &mut [f64], timeout: Duration) -> Result<()> {
        // SAFETY: reading a constant handle of MPI.
        self.all_reduce(buf, unsafe { ffi::RSMPI_DOUBLE }, timeout)
    }

    fn broadcast(&self, root: usize, buf: &mut [u8], timeout: Duration) -> Result<()> {
        let count = i32::try_from(buf.len())
            .map_err(|_| self.error(format!("a broadcast of {} bytes is too long", buf.len())))?;
        self.with_buffer(buf, |p| {
            self.run("broadcast", timeout, |req| {
                // SAFETY: `p` holds `count` bytes and outlives the request.
                unsafe {
                    ffi::MPI_Ibcast(
                        p,
                        count,
                        ffi::RSMPI_UINT8_T,
                        root as i32,
                        ffi::RSMPI_COMM_WORLD,
                        req,
                    )
                }
            })
        })
    }

    fn all_gather_u64(&self, value: u64, timeout: Duration) -> Result<Vec<u64>> {
        let mut out = vec![0u64; self.size];
        let mine = Box::new(value);
        let mine_ptr: *const u64 = &*mine;
        let res = self.with_buffer(&mut out, |p| {
            self.run("all-gather", timeout, |req| {
                // SAFETY: `mine` holds one value and `p` one per rank; both outlive the request.
                unsafe {
                    ffi::MPI_Iallgather(
                        mine_ptr.cast(),
                        1,
                        ffi::RSMPI_UINT64_T,
                        p,
                        1,
                        ffi::RSMPI_UINT64_T,
                        ffi::RSMPI_COMM_WORLD,
                        req,
                    )
                }
            })
        });
        match res {
            Ok(()) => Ok(out),
            Err(e) => {
                std::mem::forget(mine);
                Err(e)
            }
        }
    }

    fn barrier(&self, timeout: Duration) -> Result<()> {
        self.run("barrier", timeout, |req| {
            // SAFETY: a barrier has no buffers.
            unsafe { ffi::MPI_Ibarrier(ffi::RSMPI_COMM_WORLD, req) }
        })
    }
}

//! NCCL ranks: one GPU per process.
//!
//! Built on cudarc's NCCL bindings, loaded at run time (as the CUDA backend loads the driver),
//! so the feature compiles on a machine without CUDA and fails with an error, not at link time,
//! where NCCL is missing. The NCCL unique id is made by rank 0 and shared by the caller (over
//! MPI in [`super::Group::nccl_over_mpi`]). Host buffers are staged through the device: the
//! values are copied in, reduced by NCCL on the rank's stream, and copied back; completion is
//! polled against the timeout, and a communicator that timed out is aborted when dropped.

use std::sync::Arc;
use std::time::{Duration, Instant};

use cudarc::driver::{CudaContext, CudaStream, DeviceRepr, ValidAsZeroBits};
use cudarc::nccl::{Comm, Id, NcclType, ReduceOp};

use super::Collective;
use crate::error::{Error, Result};

pub(super) struct Nccl {
    comm: Comm,
    stream: Arc<CudaStream>,
    rank: usize,
    size: usize,
}

impl std::fmt::Debug for Nccl {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Nccl(rank {} of {})", self.rank, self.size)
    }
}

fn nccl_error(rank: usize, size: usize, what: &str, e: impl std::fmt::Debug) -> Error {
    Error::Distributed { rank, size, message: format!("{what}: {e:?}") }
}

/// An error unless the CUDA driver and NCCL libraries can be loaded (cudarc panics on a
/// missing library; this keeps it an error).
fn probe(rank: usize, size: usize) -> Result<()> {
    let missing = |what: &str| Error::Distributed {
        rank,
        size,
        message: format!("{what} is not installed (or not on the library path)"),
    };
    // SAFETY: only probes whether the libraries can be opened.
    if !unsafe { cudarc::driver::sys::is_culib_present() } {
        return Err(missing("the CUDA driver library (libcuda)"));
    }
    // SAFETY: as above.
    if !unsafe { cudarc::nccl::sys::is_culib_present() } {
        // cudarc opens the development name; the runtime packages install only `.so.2`.
        return Err(Error::Distributed {
            rank,
            size,
            message: "NCCL is not found as libnccl.so on the library path (where only \
                      libnccl.so.2 is installed, link it as libnccl.so in a folder on \
                      LD_LIBRARY_PATH)"
                .into(),
        });
    }
    Ok(())
}

/// A new NCCL unique id, as bytes.
pub(super) fn new_id() -> Result<[u8; 128]> {
    probe(0, 1)?;
    let id = Id::new().map_err(|e| nccl_error(0, 1, "NCCL could not make a unique id", e))?;
    Ok(id.internal().map(|c| c as u8))
}

/// The number of CUDA devices (for placing MPI ranks on them).
#[cfg(feature = "mpi")]
pub(super) fn device_count() -> Result<usize> {
    probe(0, 1)?;
    let n = CudaContext::device_count()
        .map_err(|e| nccl_error(0, 1, "no CUDA driver to count devices", e))?;
    Ok(n.max(0) as usize)
}

impl Nccl {
    pub(super) fn new(rank: usize, size: usize, device: usize, id: [u8; 128]) -> Result<Nccl> {
        probe(rank, size)?;
        let ctx = CudaContext::new(device)
            .map_err(|e| nccl_error(rank, size, &format!("CUDA device {device}"), e))?;
        let stream = ctx.default_stream();
        let id = Id::uninit(id.map(|b| b as std::ffi::c_char));
        let comm = Comm::from_rank(stream.clone(), rank, size, id)
            .map_err(|e| nccl_error(rank, size, "NCCL could not join the group", e))?;
        Ok(Nccl { comm, stream, rank, size })
    }

    fn fail(&self, what: &str, e: impl std::fmt::Debug) -> Error {
        nccl_error(self.rank, self.size, what, e)
    }

    /// Waits for the stream's work so far, or fails after `timeout`.
    fn wait(&self, what: &str, timeout: Duration) -> Result<()> {
        let done = self.stream.record_event(None).map_err(|e| self.fail(what, e))?;
        let started = Instant::now();
        while !done.try_is_complete().map_err(|e| self.fail(what, e))? {
            if started.elapsed() >= timeout {
                return Err(Error::Distributed {
                    rank: self.rank,
                    size: self.size,
                    message: format!(
                        "the {what} did not complete within {timeout:?}: another rank did not \
                         take part"
                    ),
                });
            }
            std::thread::sleep(Duration::from_micros(20));
        }
        Ok(())
    }

    /// `op` on a device copy of `buf`, then the result copied back.
    fn staged<T: DeviceRepr + ValidAsZeroBits + NcclType + Copy>(
        &self,
        what: &str,
        buf: &mut [T],
        timeout: Duration,
        op: impl FnOnce(&Comm, &mut cudarc::driver::CudaSlice<T>) -> Result<()>,
    ) -> Result<()> {
        if buf.is_empty() {
            return Ok(());
        }
        let mut dev = self.stream.clone_htod(buf).map_err(|e| self.fail(what, e))?;
        op(&self.comm, &mut dev)?;
        self.wait(what, timeout)?;
        self.stream.memcpy_dtoh(&dev, buf).map_err(|e| self.fail(what, e))?;
        self.stream.synchronize().map_err(|e| self.fail(what, e))
    }

    fn sum<T: DeviceRepr + ValidAsZeroBits + NcclType + Copy>(
        &self,
        buf: &mut [T],
        timeout: Duration,
    ) -> Result<()> {
        self.staged("all-reduce", buf, timeout, |comm, dev| {
            comm.all_reduce_in_place(dev, &ReduceOp::Sum)
                .map(|_| ())
                .map_err(|e| self.fail("the all-reduce", e))
        })
    }
}

impl Collective for Nccl {
    fn rank(&self) -> usize {
        self.rank
    }
    fn size(&self) -> usize {
        self.size
    }
    fn engine(&self) -> &'static str {
        "nccl"
    }
    fn all_reduce_f32(&self, buf: &mut [f32], timeout: Duration) -> Result<()> {
        self.sum(buf, timeout)
    }
    fn all_reduce_f64(&self, buf: &mut [f64], timeout: Duration) -> Result<()> {
        self.sum(buf, timeout)
    }
    fn broadcast(&self, root: usize, buf: &mut [u8], timeout: Duration) -> Result<()> {
        self.staged("broadcast", buf, timeout, |comm, dev| {
            comm.broadcast_in_place(dev, root as i32)
                .map(|_| ())
                .map_err(|e| self.fail("the broadcast", e))
        })
    }
    fn all_gather_u64(&self, value: u64, timeout: Duration) -> Result<Vec<u64>> {
        // Each rank's value in its own slot, zeros elsewhere: the sum is the gathered values.
        let mut slots = vec![0u64; self.size];
        slots[self.rank] = value;
        self.sum(&mut slots, timeout)?;
        Ok(slots)
    }
    fn barrier(&self, timeout: Duration) -> Result<()> {
        self.sum(&mut [0.0f32], timeout)
    }
}

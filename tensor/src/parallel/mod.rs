//! Data parallelism: the same training step on several workers, gradients averaged.
//!
//! Users who outgrow one process run one copy of their program per worker (`mpirun -np 4 …`),
//! each on its own shard of every batch, as PyTorch's DDP or JAX's multi-process runtime do.
//! This module is the layer between those workers and the training step:
//!
//! - [`Collective`] is the one contract a transport fulfils — rank, size, all-reduce, broadcast,
//!   all-gather, barrier — each bounded by a timeout, so that a missing or dead worker is an
//!   error naming the rank and the operation, never a hang.
//! - Engines: [`Group::single`] (one process: every code path runs without a transport),
//!   [`Group::in_process`] (ranks as threads of one process, for tests and for trying a
//!   configuration on one machine), MPI over the system's Open MPI (`Group::mpi`, feature
//!   `mpi`) for processes on one or many hosts, and NCCL (`Group::nccl`, feature `nccl`) for
//!   GPUs.
//! - A [`Group`] given to a session ([`crate::SessionOptions::data_parallel`]) makes its
//!   training steps data-parallel (the step's side is in `step.rs`).
//!
//! The reduction is a sum in the engine's order (rank order for the in-process group; MPI and
//! NCCL choose theirs), so results equal one process's up to the rounding of that order.

mod in_process;
#[cfg(feature = "mpi")]
mod mpi;
#[cfg(feature = "nccl")]
mod nccl;
pub(crate) mod step;

pub use step::ReduceStats;

use std::ops::Range;
use std::rc::Rc;
use std::time::Duration;

pub use in_process::InProcessRank;

use crate::error::{Error, Result};

/// A transport for collective operations among the ranks of a group.
///
/// Every operation is called by every rank in the same order (as in MPI); it returns when all
/// ranks have taken part, or an error once `timeout` has passed without them.
pub trait Collective: std::fmt::Debug {
    /// This worker's rank, `0 .. size`.
    fn rank(&self) -> usize;
    /// The number of ranks.
    fn size(&self) -> usize;
    /// The engine's name, for messages (`single`, `in-process`, `mpi`, `nccl`).
    fn engine(&self) -> &'static str;
    /// Sums `buf` element-wise over the ranks, in place on every rank.
    fn all_reduce_f32(&self, buf: &mut [f32], timeout: Duration) -> Result<()>;
    /// Sums `buf` element-wise over the ranks, in place on every rank.
    fn all_reduce_f64(&self, buf: &mut [f64], timeout: Duration) -> Result<()>;
    /// Copies rank `root`'s `buf` into every rank's `buf` (of the same length everywhere).
    fn broadcast(&self, root: usize, buf: &mut [u8], timeout: Duration) -> Result<()>;
    /// Every rank's `value`, in rank order.
    fn all_gather_u64(&self, value: u64, timeout: Duration) -> Result<Vec<u64>>;
    /// Returns when every rank has called it.
    fn barrier(&self, timeout: Duration) -> Result<()>;
}

/// A handle on one rank of a group of workers, cheap to clone.
///
/// ```
/// use rocannl_tensor::parallel::Group;
/// let g = Group::single();
/// assert_eq!((g.rank(), g.size(), g.is_root()), (0, 1, true));
/// assert_eq!(g.shard(10), 0..10);
/// ```
#[derive(Clone, Debug)]
pub struct Group {
    engine: Rc<dyn Collective>,
    timeout: Duration,
}

/// How long a collective operation waits for the other ranks by default.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(300);

impl Group {
    /// A group over any engine.
    pub fn new(engine: Rc<dyn Collective>) -> Group {
        Group { engine, timeout: DEFAULT_TIMEOUT }
    }

    /// One process alone: rank 0 of 1. A data-parallel session on it takes every step of the
    /// data-parallel path (gradients gathered, reduced and written back) with nothing to send.
    pub fn single() -> Group {
        Group::new(Rc::new(Single))
    }

    /// `n` ranks as threads of this process: one [`InProcessRank`] to move into each thread,
    /// made a [`Group`] there with [`Group::from`]. The reduction adds the ranks' values in
    /// rank order, so the results are the same bits on every run.
    ///
    /// ```
    /// use rocannl_tensor::parallel::Group;
    /// let ranks = Group::in_process(3);
    /// let sums: Vec<Vec<f32>> = std::thread::scope(|s| {
    ///     let handles: Vec<_> = ranks
    ///         .into_iter()
    ///         .map(|r| s.spawn(move || {
    ///             let g = Group::from(r);
    ///             let mut buf = vec![g.rank() as f32, 1.0];
    ///             g.all_reduce_f32(&mut buf).unwrap();
    ///             buf
    ///         }))
    ///         .collect();
    ///     handles.into_iter().map(|h| h.join().unwrap()).collect()
    /// });
    /// assert!(sums.iter().all(|s| s == &vec![3.0, 3.0]));
    /// ```
    pub fn in_process(n: usize) -> Vec<InProcessRank> {
        in_process::ranks(n)
    }

    /// The ranks of `mpirun` (or any MPI launcher): initializes MPI (once per process) and
    /// returns this process's rank in `MPI_COMM_WORLD`. A process started without a launcher
    /// is rank 0 of 1.
    #[cfg(feature = "mpi")]
    pub fn mpi() -> Result<Group> {
        Ok(Group::new(Rc::new(mpi::Mpi::init()?)))
    }

    /// [`Group::mpi`] when this process was started by an MPI launcher (`mpirun`, `mpiexec`,
    /// `srun`: it sets `OMPI_COMM_WORLD_SIZE`, `PMI_SIZE` or `PMIX_RANK`); `None` otherwise,
    /// without initializing MPI — a program that may run either way stays a plain process when
    /// started alone (MPI's singleton start would launch a daemon and may bind the process to
    /// one core).
    #[cfg(feature = "mpi")]
    pub fn mpi_if_launched() -> Result<Option<Group>> {
        let launched = ["OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "PMIX_RANK"]
            .iter()
            .any(|v| std::env::var_os(v).is_some());
        if launched { Group::mpi().map(Some) } else { Ok(None) }
    }

    /// GPUs with NCCL, one rank per process on device `device`; `id` is the NCCL unique id,
    /// made by rank 0 ([`Group::nccl_id`]) and shared with the others (over MPI with
    /// [`Group::nccl_over_mpi`], or any other way).
    #[cfg(feature = "nccl")]
    pub fn nccl(rank: usize, size: usize, device: usize, id: [u8; 128]) -> Result<Group> {
        Ok(Group::new(Rc::new(nccl::Nccl::new(rank, size, device, id)?)))
    }

    /// A fresh NCCL unique id (rank 0 makes it; every rank passes it to [`Group::nccl`]).
    #[cfg(feature = "nccl")]
    pub fn nccl_id() -> Result<[u8; 128]> {
        nccl::new_id()
    }

    /// NCCL over the GPUs of the MPI ranks: rank 0's unique id broadcast over MPI, each rank on
    /// device `rank % devices`.
    #[cfg(all(feature = "nccl", feature = "mpi"))]
    pub fn nccl_over_mpi() -> Result<Group> {
        let world = Group::mpi()?;
        let mut id = if world.is_root() { Group::nccl_id()? } else { [0u8; 128] };
        world.broadcast(0, &mut id)?;
        let devices = nccl::device_count()?;
        Group::nccl(world.rank(), world.size(), world.rank() % devices.max(1), id)
    }

    /// The same group with another timeout for each collective operation (by default
    /// [`DEFAULT_TIMEOUT`], 300 s: longer than any step, shorter than forever).
    pub fn with_timeout(mut self, timeout: Duration) -> Group {
        self.timeout = timeout;
        self
    }

    /// This worker's rank.
    pub fn rank(&self) -> usize {
        self.engine.rank()
    }

    /// The number of ranks.
    pub fn size(&self) -> usize {
        self.engine.size()
    }

    /// Whether this is rank 0 (which writes checkpoints and prints).
    pub fn is_root(&self) -> bool {
        self.rank() == 0
    }

    /// The engine's name.
    pub fn engine(&self) -> &'static str {
        self.engine.engine()
    }

    /// The timeout of each collective operation.
    pub fn timeout(&self) -> Duration {
        self.timeout
    }

    /// This rank's part of `n` items (the examples of a global batch): contiguous shards in
    /// rank order, the first `n % size` ranks one item longer, so the shards of all ranks
    /// together are `0..n` in order — the same global order as one process.
    ///
    /// ```
    /// use rocannl_tensor::parallel::Group;
    /// let shards: Vec<_> = Group::in_process(3).into_iter().map(|r| Group::from(r).shard(10)).collect();
    /// assert_eq!(shards, vec![0..4, 4..7, 7..10]);
    /// ```
    pub fn shard(&self, n: usize) -> Range<usize> {
        shard_of(n, self.rank(), self.size())
    }

    /// Sums `buf` over the ranks, in place.
    pub fn all_reduce_f32(&self, buf: &mut [f32]) -> Result<()> {
        self.engine.all_reduce_f32(buf, self.timeout)
    }

    /// Sums `buf` over the ranks, in place.
    pub fn all_reduce_f64(&self, buf: &mut [f64]) -> Result<()> {
        self.engine.all_reduce_f64(buf, self.timeout)
    }

    /// Copies rank `root`'s bytes to every rank.
    pub fn broadcast(&self, root: usize, buf: &mut [u8]) -> Result<()> {
        if root >= self.size() {
            return Err(Error::usage(format!(
                "broadcast from rank {root} in a group of {} ranks",
                self.size()
            )));
        }
        self.engine.broadcast(root, buf, self.timeout)
    }

    /// Every rank's value, in rank order.
    pub fn all_gather_u64(&self, value: u64) -> Result<Vec<u64>> {
        self.engine.all_gather_u64(value, self.timeout)
    }

    /// Waits for every rank.
    pub fn barrier(&self) -> Result<()> {
        self.engine.barrier(self.timeout)
    }

    /// A [`Error::Distributed`] of this rank.
    pub(crate) fn error(&self, message: impl Into<String>) -> Error {
        Error::Distributed { rank: self.rank(), size: self.size(), message: message.into() }
    }
}

impl From<InProcessRank> for Group {
    fn from(r: InProcessRank) -> Group {
        Group::new(Rc::new(r))
    }
}

/// Rank `rank`'s contiguous part of `0..n` among `size` ranks.
pub(crate) fn shard_of(n: usize, rank: usize, size: usize) -> Range<usize> {
    let (base, extra) = (n / size, n % size);
    let start = rank * base + rank.min(extra);
    start..start + base + usize::from(rank < extra)
}

/// Rank 0 of 1: every operation leaves the values as they are.
#[derive(Debug)]
struct Single;

impl Collective for Single {
    fn rank(&self) -> usize {
        0
    }
    fn size(&self) -> usize {
        1
    }
    fn engine(&self) -> &'static str {
        "single"
    }
    fn all_reduce_f32(&self, _: &mut [f32], _: Duration) -> Result<()> {
        Ok(())
    }
    fn all_reduce_f64(&self, _: &mut [f64], _: Duration) -> Result<()> {
        Ok(())
    }
    fn broadcast(&self, _: usize, _: &mut [u8], _: Duration) -> Result<()> {
        Ok(())
    }
    fn all_gather_u64(&self, value: u64, _: Duration) -> Result<Vec<u64>> {
        Ok(vec![value])
    }
    fn barrier(&self, _: Duration) -> Result<()> {
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::shard_of;

    #[test]
    fn shards_cover_the_items_in_order() {
        for n in 0..20 {
            for size in 1..6 {
                let parts: Vec<usize> = (0..size).flat_map(|r| shard_of(n, r, size)).collect();
                assert_eq!(parts, (0..n).collect::<Vec<_>>(), "n {n} size {size}");
            }
        }
    }
}

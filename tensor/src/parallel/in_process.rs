//! Ranks as threads of one process.
//!
//! The in-process group runs the data-parallel path with several ranks where no MPI launcher
//! is at hand: in the tests of every build, and to try a configuration on one machine. Each
//! operation is a rendezvous: every rank deposits its contribution; the last to arrive combines
//! them (sums in rank order, so the bits are the same on every run) and wakes the others. A
//! rank that does not arrive within the timeout is named in the error of every rank waiting
//! for it, and a rank whose handle is dropped (its thread ended or panicked) makes the others'
//! operations fail at once instead of waiting.

use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use super::Collective;
use crate::error::{Error, Result};

/// One rank's contribution to an operation, and the combined result.
#[derive(Clone, Debug)]
enum Payload {
    F32(Vec<f32>),
    F64(Vec<f64>),
    Bytes(Vec<u8>),
    U64s(Vec<u64>),
    Unit,
}

/// The rendezvous state shared by the ranks.
#[derive(Debug)]
struct Round {
    /// The number of completed operations.
    generation: u64,
    /// What each rank brought to the current operation, and its name.
    arrived: Vec<Option<(&'static str, Payload)>>,
    /// The result of operation `generation` (kept until the next one completes).
    result: Option<Arc<Payload>>,
    /// Ranks whose handle was dropped.
    left: Vec<usize>,
}

#[derive(Debug)]
struct Shared {
    size: usize,
    round: Mutex<Round>,
    wake: Condvar,
}

/// One rank of a group made by [`super::Group::in_process`]; move it into its thread and make
/// it a [`super::Group`] there.
#[derive(Debug)]
pub struct InProcessRank {
    rank: usize,
    shared: Arc<Shared>,
}

pub(super) fn ranks(n: usize) -> Vec<InProcessRank> {
    let n = n.max(1);
    let round = Round { generation: 0, arrived: vec![None; n], result: None, left: vec![] };
    let shared = Arc::new(Shared { size: n, round: Mutex::new(round), wake: Condvar::new() });
    (0..n).map(|rank| InProcessRank { rank, shared: shared.clone() }).collect()
}

impl Drop for InProcessRank {
    fn drop(&mut self) {
        let mut round = lock(&self.shared);
        round.left.push(self.rank);
        self.shared.wake.notify_all();
    }
}

fn lock(shared: &Shared) -> MutexGuard<'_, Round> {
    // A rank that panicked while holding the lock left the state consistent (every update is
    // a single assignment): go on with it.
    shared.round.lock().unwrap_or_else(|e| e.into_inner())
}

impl InProcessRank {
    fn error(&self, message: String) -> Error {
        Error::Distributed { rank: self.rank, size: self.shared.size, message }
    }

    /// Deposits `mine` for operation `what`, waits for every rank, and returns the combined
    /// result (`combine` runs once, on the last rank to arrive, over the payloads in rank
    /// order).
    fn exchange(
        &self,
        what: &'static str,
        mine: Payload,
        timeout: Duration,
        combine: impl FnOnce(Vec<Payload>) -> Payload,
    ) -> Result<Arc<Payload>> {
        let shared = &self.shared;
        let mut round = lock(shared);
        if let Some(r) = round.left.first() {
            return Err(self.error(format!("rank {r} has left the group before the {what}")));
        }
        if let Some((other, _)) = round.arrived.iter().flatten().next()
            && *other != what
        {
            return Err(self.error(format!(
                "this rank called {what} while another called {other}: the ranks' programs \
                 differ"
            )));
        }
        let generation = round.generation;
        round.arrived[self.rank] = Some((what, mine));
        if round.arrived.iter().all(Option::is_some) {
            let payloads: Vec<Payload> =
                round.arrived.iter_mut().filter_map(|p| p.take().map(|p| p.1)).collect();
            round.result = Some(Arc::new(combine(payloads)));
            round.generation += 1;
            shared.wake.notify_all();
            return Ok(round.result.clone().unwrap_or_else(|| Arc::new(Payload::Unit)));
        }
        let deadline = Instant::now() + timeout;
        while round.generation == generation {
            if let Some(r) = round.left.first() {
                return Err(self.error(format!("rank {r} has left the group during the {what}")));
            }
            let now = Instant::now();
            if now >= deadline {
                let missing: Vec<usize> =
                    (0..shared.size).filter(|r| round.arrived[*r].is_none()).collect();
                round.arrived[self.rank] = None;
                return Err(self.error(format!(
                    "the {what} did not complete within {timeout:?}: rank(s) {missing:?} did \
                     not take part"
                )));
            }
            round = shared
                .wake
                .wait_timeout(round, deadline - now)
                .unwrap_or_else(|e| e.into_inner())
                .0;
        }
        Ok(round.result.clone().unwrap_or_else(|| Arc::new(Payload::Unit)))
    }
}

/// The element-wise sum of the vectors `pick` takes from each payload, in rank order.
fn sum<T: Copy + std::ops::AddAssign>(
    parts: Vec<Payload>,
    pick: impl Fn(Payload) -> Option<Vec<T>>,
) -> Vec<T> {
    let mut it = parts.into_iter().filter_map(pick);
    let mut acc = it.next().unwrap_or_default();
    for v in it {
        acc.iter_mut().zip(&v).for_each(|(a, b)| *a += *b);
    }
    acc
}

fn sum_f32(parts: Vec<Payload>) -> Payload {
    Payload::F32(sum(parts, |p| if let Payload::F32(v) = p { Some(v) } else { None }))
}

fn sum_f64(parts: Vec<Payload>) -> Payload {
    Payload::F64(sum(parts, |p| if let Payload::F64(v) = p { Some(v) } else { None }))
}

impl Collective for InProcessRank {
    fn rank(&self) -> usize {
        self.rank
    }
    fn size(&self) -> usize {
        self.shared.size
    }
    fn engine(&self) -> &'static str {
        "in-process"
    }

    fn all_reduce_f32(&self, buf: &mut [f32], timeout: Duration) -> Result<()> {
        let what = "all-reduce (f32)";
        let r = self.exchange(what, Payload::F32(buf.to_vec()), timeout, sum_f32)?;
        match &*r {
            Payload::F32(v) if v.len() == buf.len() => buf.copy_from_slice(v),
            _ => {
                return Err(
                    self.error(format!("the ranks' buffers of the {what} differ in length"))
                );
            }
        }
        Ok(())
    }

    fn all_reduce_f64(&self, buf: &mut [f64], timeout: Duration) -> Result<()> {
        let what = "all-reduce (f64)";
        let r = self.exchange(what, Payload::F64(buf.to_vec()), timeout, sum_f64)?;
        match &*r {
            Payload::F64(v) if v.len() == buf.len() => buf.copy_from_slice(v),
            _ => {
                return Err(
                    self.error(format!("the ranks' buffers of the {what} differ in length"))
                );
            }
        }
        Ok(())
    }

    fn broadcast(&self, root: usize, buf: &mut [u8], timeout: Duration) -> Result<()> {
        let what = "broadcast";
        let pick = move |mut parts: Vec<Payload>| parts.swap_remove(root);
        let r = self.exchange(what, Payload::Bytes(buf.to_vec()), timeout, pick)?;
        match &*r {
            Payload::Bytes(v) if v.len() == buf.len() => buf.copy_from_slice(v),
            _ => {
                return Err(
                    self.error(format!("the ranks' buffers of the {what} differ in length"))
                );
            }
        }
        Ok(())
    }

    fn all_gather_u64(&self, value: u64, timeout: Duration) -> Result<Vec<u64>> {
        let gather = |parts: Vec<Payload>| {
            Payload::U64s(
                parts
                    .into_iter()
                    .flat_map(|p| if let Payload::U64s(v) = p { v } else { vec![] })
                    .collect(),
            )
        };
        let r = self.exchange("all-gather", Payload::U64s(vec![value]), timeout, gather)?;
        match &*r {
            Payload::U64s(v) => Ok(v.clone()),
            _ => Err(self.error("the all-gather returned no values".into())),
        }
    }

    fn barrier(&self, timeout: Duration) -> Result<()> {
        self.exchange("barrier", Payload::Unit, timeout, |_| Payload::Unit).map(|_| ())
    }
}

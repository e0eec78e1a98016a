//! The data-parallel training step: what a session does between its two routines.
//!
//! A data-parallel step is compiled as two routines, as a loss-scaled one is: forward and
//! backpropagation (the gradients kept), then clipping and the optimizer's update. Between
//! them every rank gathers its gradients into buckets, scales them by its weight (its share of
//! the global batch), and the group sums the buckets; each rank divides by the summed weights
//! and writes the mean back. Every rank then applies the same update to the same parameters,
//! so they stay equal without being sent again. The loss travels in the last bucket, so the
//! loss a step reports is the global batch's.
//!
//! At the start (when the step is compiled) the ranks compare a hash of the compiled step —
//! a rank with another graph or other parameter shapes is an error on every rank, naming it —
//! and rank 0's parameters and buffers are broadcast, so ranks that initialized differently
//! start equal.
//!
//! Gradients are reduced in f32 (f64 in an f64 session). The reduction's order is the
//! engine's, so the mean differs from one process's in the last bits of f32.

use std::hash::{Hash, Hasher};
use std::time::{Duration, Instant};

use rocannl_arrayjit::Error as CompileError;
use rocannl_arrayjit::ndarray::{NdArray, Storage};
use rocannl_arrayjit::ops::Prec;
use rocannl_arrayjit::tnode::NodeId;

use super::Group;
use crate::error::Result;
use crate::graph::Tensor;
use crate::session::Session;

/// The largest bucket, in values: a step's gradients are reduced in buckets of at most this
/// many values (16 MiB of f32), so that no staging buffer is larger than it.
const BUCKET: usize = 1 << 22;

/// A data-parallel step's state.
#[derive(Debug)]
pub(crate) struct Parallel {
    pub(crate) group: Group,
    /// Each trained parameter's gradient node, its dims and precision.
    grads: Vec<(NodeId, Vec<usize>, Prec)>,
    /// Reduce in f64 (an f64 session) rather than f32.
    wide: bool,
    /// This rank's weight in the mean over ranks.
    pub(crate) weight: f64,
    /// The global batch's loss after the last step.
    pub(crate) loss: Option<f64>,
    /// Figures of the reductions so far.
    pub(crate) stats: ReduceStats,
    /// The buckets' values, kept from step to step (a fresh buffer of a large model's
    /// gradients would be page-faulted in again every step).
    flat32: Vec<f32>,
    flat64: Vec<f64>,
}

/// What the gradient reductions of a data-parallel step cost.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct ReduceStats {
    /// Steps whose gradients were reduced.
    pub steps: u64,
    /// Bytes each rank contributes to one step's reductions.
    pub bytes_per_step: usize,
    /// Time spent gathering, reducing and writing back the gradients, over every step.
    pub total: Duration,
    /// The same, of the last step.
    pub last: Duration,
}

impl Session {
    /// Sets up a data-parallel step over `group`: checks that every rank compiled the same
    /// step and broadcasts rank 0's parameters and buffers.
    pub(crate) fn parallel_setup(
        &mut self,
        group: Group,
        trained: &[&Tensor],
        listing: &str,
    ) -> Result<Parallel> {
        let mut h = std::collections::hash_map::DefaultHasher::new();
        listing.hash(&mut h);
        let mut grads = Vec::new();
        for p in trained {
            let dims = p.dims()?;
            (p.label(), &dims).hash(&mut h);
            grads.push((self.grad_node(p), dims, self.master_prec()));
        }
        let mine = h.finish();
        let all = group.all_gather_u64(mine)?;
        let differ: Vec<usize> = (0..all.len()).filter(|r| all[*r] != all[0]).collect();
        if !differ.is_empty() {
            return Err(group.error(format!(
                "rank(s) {differ:?} compiled a different training step than rank 0 (another \
                 graph, other shapes or other options): every rank must build the same model \
                 (shards of unequal size need a dynamic batch axis, Graph::dynamic)"
            )));
        }
        self.broadcast_params(&group)?;
        let wide = self.master_prec() == Prec::F64;
        Ok(Parallel {
            group,
            grads,
            wide,
            weight: 1.0,
            loss: None,
            stats: ReduceStats::default(),
            flat32: Vec::new(),
            flat64: Vec::new(),
        })
    }

    /// Rank 0's parameters and buffers, in the master precision's bytes, on every rank.
    fn broadcast_params(&mut self, group: &Group) -> Result<()> {
        let mut leaves = self.graph().params();
        leaves.extend(self.graph().buffers());
        for t in leaves {
            let Ok(arr) = self.read_array(&t) else { continue };
            let mut bytes = arr.to_bytes();
            group.broadcast(0, &mut bytes)?;
            let arr = NdArray::from_bytes(arr.prec(), arr.dims(), &bytes)?;
            self.write_array(&t, &arr)?;
        }
        Ok(())
    }

    /// Replaces every gradient by the weighted mean over the ranks and records the global
    /// loss. Returns whether every reduced gradient is finite (a loss-scaled step is skipped
    /// on every rank alike when one is not).
    pub(crate) fn reduce_grads(&mut self, par: &mut Parallel, local_loss: f64) -> Result<bool> {
        let started = Instant::now();
        let total: usize = par.grads.iter().map(|(_, d, _)| d.iter().product::<usize>()).sum();
        let mut values = std::mem::take(&mut par.flat64);
        let mut flat32 = std::mem::take(&mut par.flat32);
        values.clear();
        flat32.clear();
        match par.wide {
            true => values.reserve(total + 2),
            false => flat32.reserve(total + 2),
        }
        for (node, dims, _) in &par.grads {
            if par.weight == 0.0 {
                // A rank without examples in this batch (a small last batch) adds nothing,
                // whatever its padding row computed.
                let n: usize = dims.iter().product();
                match par.wide {
                    true => values.resize(values.len() + n, 0.0),
                    false => flat32.resize(flat32.len() + n, 0.0),
                }
                continue;
            }
            let arr = self.read_node(*node)?;
            match (arr.storage(), par.wide) {
                (Storage::F32(v), false) => flat32.extend(v.iter().map(|g| g * par.weight as f32)),
                (_, false) => {
                    flat32.extend(arr.to_f64_vec().iter().map(|g| (g * par.weight) as f32))
                }
                (_, true) => values.extend(arr.to_f64_vec().iter().map(|g| g * par.weight)),
            }
        }
        let loss = if par.weight == 0.0 { 0.0 } else { par.weight * local_loss };
        let tail = [par.weight, loss];
        let finite = if par.wide {
            values.extend(tail);
            reduce_buckets(&mut values, |b| par.group.all_reduce_f64(b))?;
            let w = values[total];
            par.loss = Some(values[total + 1] / w);
            let finite = divide(&mut values[..total], w);
            self.write_grads(&par.grads, |range, dims, prec| {
                NdArray::from_f64(prec, dims, &values[range])
            })?;
            finite
        } else {
            flat32.extend(tail.map(|t| t as f32));
            reduce_buckets(&mut flat32, |b| par.group.all_reduce_f32(b))?;
            let w = flat32[total];
            par.loss = Some(f64::from(flat32[total + 1]) / f64::from(w));
            let finite = divide(&mut flat32[..total], w);
            self.write_grads(&par.grads, |range, dims, prec| match prec {
                Prec::F32 => NdArray::from_f32(dims, &flat32[range]),
                _ => {
                    let wide: Vec<f64> = flat32[range].iter().map(|g| f64::from(*g)).collect();
                    NdArray::from_f64(prec, dims, &wide)
                }
            })?;
            finite
        };
        (par.flat32, par.flat64) = (flat32, values);
        let spent = started.elapsed();
        let width = if par.wide { 8 } else { 4 };
        par.stats = ReduceStats {
            steps: par.stats.steps + 1,
            bytes_per_step: (total + 2) * width,
            total: par.stats.total + spent,
            last: spent,
        };
        Ok(finite)
    }

    /// Writes each gradient's part of the reduced values (`part` makes the array of a range
    /// in the gradient's dims and precision).
    fn write_grads(
        &mut self,
        grads: &[(NodeId, Vec<usize>, Prec)],
        part: impl Fn(std::ops::Range<usize>, &[usize], Prec) -> Result<NdArray, CompileError>,
    ) -> Result<()> {
        let mut at = 0;
        for (node, dims, prec) in grads {
            let n: usize = dims.iter().product();
            let arr = part(at..at + n, dims, *prec)?;
            self.write_node_array(*node, &arr)?;
            at += n;
        }
        Ok(())
    }
}

/// Divides every value by `w` in one pass; whether all are finite.
fn divide<T: Copy + std::ops::DivAssign + Into<f64>>(values: &mut [T], w: T) -> bool {
    let mut finite = true;
    for g in values.iter_mut() {
        *g /= w;
        finite &= (*g).into().is_finite();
    }
    finite
}

/// Sums `values` over the ranks, [`BUCKET`] values at a time.
fn reduce_buckets<T>(
    values: &mut [T],
    mut reduce: impl FnMut(&mut [T]) -> Result<()>,
) -> Result<()> {
    for chunk in values.chunks_mut(BUCKET) {
        reduce(chunk)?;
    }
    Ok(())
}

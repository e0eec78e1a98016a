//! Checks of what a user hands a session, before anything runs: tensors of another graph,
//! ids out of the range of the lookups that read them, data never written.
//!
//! Each would otherwise give a silently wrong value — another tensor's cells (ids are per
//! graph), a zero embedding row and a zero loss, a step computed on zeros — so each is a usage
//! error naming the user's tensor.

use rocannl_arrayjit::Routine; // the compiler's: checked as the session runs it

use crate::error::{Error, Result};
use crate::graph::Tensor;
use crate::session::Session;

impl Session {
    /// An error unless every data tensor the routine reads has been written: a step on data
    /// never written would silently compute on zeros.
    pub(crate) fn check_written(&self, r: &Routine) -> Result<()> {
        let Some(reads) = self.data_reads.get(&r.index()) else { return Ok(()) };
        match reads.iter().find(|t| !self.written.contains(t)) {
            None => Ok(()),
            Some(t) => Err(Error::usage(format!(
                "routine '{}' reads '{}', which was never written: write its values first \
                 (Session::write, write_ids, or a Loader's load)",
                r.name(),
                self.graph().tensor(*t).label()
            ))),
        }
    }

    /// An error unless `t` is a tensor of this session's graph: ids are per graph, so another
    /// graph's tensor would silently stand for one of this graph's.
    pub(crate) fn own(&self, t: &Tensor) -> Result<()> {
        if self.graph().same(&t.graph) {
            return Ok(());
        }
        Err(Error::usage(format!(
            "'{}' is a tensor of another graph than this session's: a session reads, writes \
             and computes only the tensors of the graph it was made from",
            t.label()
        )))
    }

    /// An error unless every value written into `t` is an id in the range of each lookup that
    /// reads `t` as ids (an embedding's rows, a sparse loss's classes): an id out of range, a
    /// fraction, a negative number or NaN would select no row and silently count as zero.
    pub(crate) fn check_ids(&self, t: &Tensor, values: &[f64]) -> Result<()> {
        let Some((n, reader)) = self.graph().id_range(t.id) else { return Ok(()) };
        let bad = values
            .iter()
            .enumerate()
            .find(|(_, v)| !(v.fract() == 0.0 && **v >= 0.0 && **v < n as f64));
        match bad {
            None => Ok(()),
            Some((pos, v)) => Err(Error::usage(format!(
                "'{}' is read as ids by {reader} (ids 0..{n}), but position {pos} holds {v}",
                t.label()
            ))),
        }
    }
}

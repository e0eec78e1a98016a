//! The code of buffer updates in a compiled routine ([`crate::buffer`]): which updates a
//! routine performs, and their copies `buffer := value` at its end.

use rustc_hash::FxHashSet;

use rocannl_arrayjit::assignments::{Asgn, ScalarExpr};

use crate::error::{Error, Result};
use crate::graph::{Leaf, Source, TensorId, Update};
use crate::mode::Mode;

use super::Session;

impl Session {
    /// The updates a routine of `mode` whose forward pass computes `order` performs: none in
    /// eval mode; in train mode, those whose value reads only data tensors the routine reads.
    pub(crate) fn performed_updates(&self, mode: Mode, order: &[TensorId]) -> Vec<Update> {
        if mode == Mode::Eval {
            return vec![];
        }
        let computed: FxHashSet<TensorId> = order.iter().copied().collect();
        let updates = self.graph().borrow().updates.clone();
        updates
            .into_iter()
            .filter(|u| {
                self.topo_in(&[u.value], Some(Mode::Train)).into_iter().all(|t| {
                    computed.contains(&t)
                        || !matches!(
                            self.graph().tensor(t).info().source,
                            Source::Leaf(Leaf::Data(_))
                        )
                })
            })
            .collect()
    }

    /// The copies `buffer := value` of `updates`, in order.
    pub(crate) fn buffer_update_code(&mut self, updates: &[Update]) -> Result<Vec<Asgn>> {
        let mut code = Vec::new();
        for u in updates {
            let (buffer, value) = (self.graph().tensor(u.buffer), self.graph().tensor(u.value));
            let (dims, value_dims) = (buffer.dims()?, value.dims()?);
            if dims != value_dims {
                return Err(Error::usage(format!(
                    "the buffer '{}' has dims {dims:?}, but its update '{}' has dims \
                     {value_dims:?}",
                    buffer.label(),
                    value.label()
                )));
            }
            let (b, v) = (self.node(&buffer), self.node(&value));
            code.push(Asgn::Comment(format!("update of the buffer '{}'", buffer.label())));
            code.push(self.update(b, vec![(v, false)], ScalarExpr::Arg(0), &dims));
        }
        Ok(code)
    }
}

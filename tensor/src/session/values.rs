//! Host values in and out of a session's buffers: writing data and parameters, reading values
//! and gradients, and the nodes that are not tensors of the graph (optimizer state, scalars).
//!
//! Every write checks what the tensor promises (its cell count, ids in range, a dynamic axis's
//! current size) before anything reaches the buffer, and every read trims a dynamic axis to its
//! current size, so a caller sees the tensor's shape, never the buffer's.

use rocannl_arrayjit::NdArray;
use rocannl_arrayjit::ops::Prec;
use rocannl_arrayjit::tnode::{MemoryMode, NodeId, TensorNode};

use super::Session;
use crate::error::{Error, Result};
use crate::graph::Tensor;

impl Session {
    pub(super) fn write_node(
        &mut self,
        n: NodeId,
        prec: Prec,
        dims: &[usize],
        values: &[f64],
    ) -> Result<()> {
        let arr = NdArray::from_f64(prec, dims, values)?;
        self.ctx.write(n, &arr)?;
        Ok(())
    }

    /// Waits until every compiled routine runs its optimized native code. A routine first
    /// runs a quick build while the optimized one is made in the background
    /// ([`crate::CompileOptions::tiered`], on by default), so the first step comes sooner; the values
    /// are the same bits either way. Call this before timing steady-state speed.
    ///
    /// ```
    /// use rocannl_tensor::{Graph, Session};
    /// let g = Graph::new();
    /// let x = g.vector("x", &[1.0, -2.0]);
    /// let y = x.relu();
    /// let mut s = Session::new(&g).unwrap();
    /// let r = s.forward(&[&y]).unwrap();
    /// s.finish_builds();
    /// s.run(&r).unwrap();
    /// assert_eq!(s.read(&y).unwrap(), vec![1.0, 0.0]);
    /// ```
    pub fn finish_builds(&mut self) {
        self.ctx.finish_builds();
    }

    /// Whether some routine of this session still runs its quick first build while its
    /// optimized build is made in the background ([`crate::CompileOptions::tiered`]); false once every
    /// routine compiled so far has run its optimized code. It does not wait, so a program can
    /// time when the optimized code starts serving ([`Session::finish_builds`] waits for it).
    ///
    /// ```
    /// use rocannl_tensor::{Graph, Session};
    /// let g = Graph::new();
    /// let x = g.vector("x", &[1.0, -2.0]);
    /// let y = x.relu();
    /// let mut s = Session::new(&g).unwrap();
    /// let r = s.forward(&[&y]).unwrap();
    /// s.finish_builds();
    /// assert!(!s.builds_pending());
    /// ```
    pub fn builds_pending(&self) -> bool {
        self.ctx.builds_pending()
    }

    /// Writes host values (in memory order) into a data or parameter tensor.
    /// A tensor with a dynamic axis ([`crate::Axes::dynamic_batch`]) takes the cells of its
    /// current size ([`Session::set_size`]).
    pub fn write(&mut self, t: &Tensor, values: &[f64]) -> Result<()> {
        self.own(t)?;
        self.check_ids(t, values)?;
        let dims = t.dims()?;
        let n = self.node_of(t.id);
        let prec = self.prec_of(t.id);
        if prec == Prec::U32
            && let Some((pos, v)) =
                values.iter().enumerate().find(|(_, v)| !Prec::is_u32_value(**v))
        {
            return Err(Error::usage(format!(
                "'{}' holds ids, but position {pos} is {v}, not an unsigned 32-bit integer",
                t.label()
            )));
        }
        let node = TensorNode::new(n, &t.label(), &dims, prec, MemoryMode::HostVisible);
        let spread = self.spread_dynamic(t, &dims, values)?;
        let cells: usize = dims.iter().product();
        if spread.is_none() && values.len() != cells {
            return Err(Error::usage(format!(
                "'{}' holds {cells} values (dims {dims:?}), but {} were given",
                t.label(),
                values.len()
            )));
        }
        self.ctx.ensure_buffer(&node)?;
        self.ready.insert(t.id);
        self.written.insert(t.id);
        self.write_node(n, prec, &dims, spread.as_deref().unwrap_or(values))
    }

    /// Writes integer ids (tokens, class labels) into a data tensor, checking each against the
    /// number of ids `bound` (a vocabulary's size): an id out of range is an error naming the
    /// tensor, the position and the id, and nothing is written. A tensor made with
    /// [`crate::Graph::ids`] stores them as u32 (exact up to 2²⁴, the compute precision's
    /// integers); any other stores them as values of its precision, exact up to its largest
    /// consecutive integer (2²⁴ in f32, 2⁵³ in f64, 256 in bf16, 2048 in f16). A bound beyond
    /// it is an error too.
    ///
    /// ```
    /// use rocannl_tensor::{Axes, Graph, Session};
    /// let g = Graph::new();
    /// let ids = g.data("ids", Axes::new().batch(&[3]));
    /// let _ = ids.scale(1.0);
    /// let mut s = Session::new(&g).unwrap();
    /// s.write_ids(&ids, &[0, 4, 2], 5).unwrap();
    /// let err = s.write_ids(&ids, &[0, 5, 2], 5).unwrap_err().to_string();
    /// assert!(err.contains("'ids'") && err.contains("position 1") && err.contains("5"), "{err}");
    /// ```
    pub fn write_ids(&mut self, t: &Tensor, ids: &[u32], bound: usize) -> Result<()> {
        self.own(t)?;
        // Arithmetic on the ids is carried out in the compute precision (f32 but in f64
        // sessions), whatever they are stored in.
        let stored = self.prec_of(t.id);
        let exact: u64 = match (stored, self.prec) {
            (Prec::U32, Prec::F64) => 1 << 32,
            (Prec::U32, _) | (Prec::F32, _) => 1 << 24,
            (Prec::Bf16, _) => 1 << 8,
            (Prec::F16, _) => 1 << 11,
            (Prec::F64, _) => 1 << 53,
        };
        if bound as u64 > exact {
            let hint = if stored == Prec::U32 { "" } else { " (store them as ids: Graph::ids)" };
            return Err(Error::usage(format!(
                "ids of '{}' go up to {bound}, but {:?} holds integers exactly only up to \
                 {exact}{hint}",
                t.label(),
                stored
            )));
        }
        if let Some((pos, id)) = ids.iter().enumerate().find(|(_, id)| **id as usize >= bound) {
            return Err(Error::usage(format!(
                "id {id} at position {pos} of '{}' is out of range (ids are 0..{bound})",
                t.label()
            )));
        }
        let values: Vec<f64> = ids.iter().map(|i| *i as f64).collect();
        self.write(t, &values)
    }

    /// Writes a host array into a tensor.
    pub fn write_array(&mut self, t: &Tensor, arr: &NdArray) -> Result<()> {
        self.write(t, &arr.to_f64_vec())
    }

    /// The buffer holding `t`'s values in this session.
    fn computed(&self, t: &Tensor) -> Result<NodeId> {
        self.own(t)?;
        let n = self.value.get(&t.id).copied();
        n.ok_or_else(|| Error::usage(format!("'{}' was not computed by this session", t.label())))
    }

    /// The buffer holding `t`'s gradient in this session.
    fn gradient(&self, t: &Tensor) -> Result<NodeId> {
        self.own(t)?;
        let n = self.grad.get(&t.id).copied();
        n.ok_or_else(|| Error::usage(format!("'{}' has no gradient in this session", t.label())))
    }

    /// Reads a tensor's values in memory order (batch, output, input); a dynamic axis has its
    /// current size — the one set last with [`Session::set_size`], so read a batch's results
    /// before setting the next batch's size.
    pub fn read(&self, t: &Tensor) -> Result<Vec<f64>> {
        let n = self.computed(t)?;
        self.trim_dynamic(t.id, self.ctx.read(n)?.to_f64_vec())
    }

    /// Reads a tensor's values in the session's precision, without converting them (a copy of
    /// the buffer, allocated fallibly).
    pub fn read_array(&self, t: &Tensor) -> Result<NdArray> {
        let n = self.computed(t)?;
        self.trim_dynamic_array(t.id, self.ctx.read(n)?)
    }

    /// Reads a tensor's gradient in the session's precision, without converting it.
    pub fn read_grad_array(&self, t: &Tensor) -> Result<NdArray> {
        let n = self.gradient(t)?;
        self.trim_dynamic_array(t.id, self.ctx.read(n)?)
    }

    /// Reads a tensor's gradient (after a routine that backpropagates and keeps it).
    pub fn read_grad(&self, t: &Tensor) -> Result<Vec<f64>> {
        let n = self.gradient(t)?;
        self.trim_dynamic(t.id, self.ctx.read(n)?.to_f64_vec())
    }

    pub(crate) fn write_extra(&mut self, n: NodeId, values: &[f64]) -> Result<()> {
        let node = self.extra.get(&n).cloned().ok_or_else(|| Error::usage("unknown extra node"))?;
        self.ctx.ensure_buffer(&node)?;
        self.write_node(n, node.prec, &node.dims, values)
    }

    /// A node's buffer, in its own precision.
    pub(crate) fn read_node(&self, n: NodeId) -> Result<NdArray> {
        Ok(self.ctx.read(n)?)
    }

    /// Writes a node's buffer.
    pub(crate) fn write_node_array(&mut self, n: NodeId, arr: &NdArray) -> Result<()> {
        Ok(self.ctx.write(n, arr)?)
    }

    pub(crate) fn read_extra(&self, n: NodeId) -> Result<Vec<f64>> {
        Ok(self.ctx.read(n)?.to_f64_vec())
    }

    pub(crate) fn grad_node(&mut self, t: &Tensor) -> NodeId {
        self.grad_of(t.id)
    }
}

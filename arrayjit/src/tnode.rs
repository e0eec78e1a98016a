//! Tensor nodes: the arrays a routine reads and writes, as the compiler sees them.
//!
//! The tensor layer owns the graph; the compiler only needs, per node, its dimensions, its
//! precision and a *memory requirement*. The requirement says whether the host must be able to
//! see the node (parameters, data, outputs, anything shared between routines) or whether it is
//! an intermediate that the optimizer may inline away ("virtualize"), keep local or materialize
//! as it sees fit. Nodes live in a [`NodeTable`] keyed by [`NodeId`], a `u32` newtype.

use std::fmt;

use rustc_hash::FxHashMap;

use crate::error::Error;
use crate::ops::Prec;

/// The identity of a tensor node, printed `n{id}`.
#[derive(Copy, Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct NodeId(pub u32);

impl fmt::Display for NodeId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "n{}", self.0)
    }
}

/// Where a node must live. Ordered from the weakest to the strongest requirement.
#[derive(Copy, Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum MemoryMode {
    /// An intermediate: the optimizer inlines it into its consumers when it is computed once
    /// and read once, or is cheap; otherwise it gets a buffer.
    Virtual,
    /// An intermediate that must not be inlined (e.g. it is expensive and read many times) but
    /// need not be visible outside the routine.
    Local,
    /// Must have a buffer that persists across runs and is shared between routines of one
    /// context; the host need not read it.
    OnDevice,
    /// Must have a persistent buffer the host can write and read (parameters, inputs, outputs).
    HostVisible,
}

impl MemoryMode {
    /// Whether the optimizer may remove this node's buffer.
    pub fn may_virtualize(self) -> bool {
        self == MemoryMode::Virtual
    }

    /// Whether writes to this node are observable after the routine (so never dead).
    pub fn is_persistent(self) -> bool {
        self >= MemoryMode::OnDevice
    }
}

/// One tensor node.
#[derive(Clone, Debug, PartialEq)]
pub struct TensorNode {
    /// Its identity.
    pub id: NodeId,
    /// A human-readable label for dumps and errors.
    pub label: String,
    /// Dimensions in memory order (batch, output, input); the buffer is dense row-major.
    pub dims: Vec<usize>,
    /// Storage precision.
    pub prec: Prec,
    /// The memory requirement.
    pub memory: MemoryMode,
}

impl TensorNode {
    /// A node with the given fields.
    ///
    /// ```
    /// use rocannl_arrayjit::ops::Prec;
    /// use rocannl_arrayjit::tnode::{MemoryMode, NodeId, TensorNode};
    /// let w = TensorNode::new(NodeId(3), "w", &[2, 3], Prec::F32, MemoryMode::HostVisible);
    /// assert_eq!(w.num_elements(), 6);
    /// assert_eq!(w.strides(), vec![3, 1]);
    /// ```
    pub fn new(id: NodeId, label: &str, dims: &[usize], prec: Prec, memory: MemoryMode) -> Self {
        TensorNode { id, label: label.to_string(), dims: dims.to_vec(), prec, memory }
    }

    /// The number of cells.
    pub fn num_elements(&self) -> usize {
        self.dims.iter().product()
    }

    /// Row-major strides in elements.
    pub fn strides(&self) -> Vec<usize> {
        row_major_strides(&self.dims)
    }
}

/// Row-major strides (in elements) of dense `dims`.
pub fn row_major_strides(dims: &[usize]) -> Vec<usize> {
    let mut strides = vec![1; dims.len()];
    for i in (0..dims.len().saturating_sub(1)).rev() {
        strides[i] = strides[i + 1] * dims[i + 1];
    }
    strides
}

/// The nodes a compilation may refer to.
///
/// ```
/// use rocannl_arrayjit::ops::Prec;
/// use rocannl_arrayjit::tnode::{MemoryMode, NodeId, NodeTable, TensorNode};
/// let mut nodes = NodeTable::default();
/// let id = nodes.add("x", &[4], Prec::F32, MemoryMode::HostVisible);
/// assert_eq!(nodes.get(id).unwrap().label, "x");
/// nodes.insert(TensorNode::new(NodeId(9), "y", &[4], Prec::F64, MemoryMode::Virtual));
/// assert_eq!(nodes.len(), 2);
/// assert!(nodes.get(NodeId(5)).is_err());
/// ```
#[derive(Clone, Debug, Default)]
pub struct NodeTable {
    nodes: FxHashMap<NodeId, TensorNode>,
    next: u32,
}

impl NodeTable {
    /// Inserts (or replaces) a node under its own id.
    pub fn insert(&mut self, node: TensorNode) {
        self.next = self.next.max(node.id.0 + 1);
        self.nodes.insert(node.id, node);
    }

    /// Creates a node with a fresh id.
    pub fn add(&mut self, label: &str, dims: &[usize], prec: Prec, memory: MemoryMode) -> NodeId {
        let id = NodeId(self.next);
        self.insert(TensorNode::new(id, label, dims, prec, memory));
        id
    }

    /// The node with this id.
    pub fn get(&self, id: NodeId) -> Result<&TensorNode, Error> {
        self.nodes.get(&id).ok_or(Error::UnknownNode(id.0))
    }

    /// Mutable access, e.g. to change a memory requirement.
    pub fn get_mut(&mut self, id: NodeId) -> Result<&mut TensorNode, Error> {
        self.nodes.get_mut(&id).ok_or(Error::UnknownNode(id.0))
    }

    /// The number of nodes.
    pub fn len(&self) -> usize {
        self.nodes.len()
    }

    /// Whether there are no nodes.
    pub fn is_empty(&self) -> bool {
        self.nodes.is_empty()
    }

    /// All nodes, in id order.
    pub fn iter(&self) -> impl Iterator<Item = &TensorNode> {
        let mut v: Vec<&TensorNode> = self.nodes.values().collect();
        v.sort_by_key(|n| n.id);
        v.into_iter()
    }
}

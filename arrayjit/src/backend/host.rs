//! Host buffers shared by the CPU backends.
//!
//! Each buffer is one zeroed, 64-byte aligned allocation (a cache line, and the alignment of
//! AVX-512 vectors) that never moves, so compiled routines can keep raw pointers to it for the
//! life of the context. A routine's intermediates live in its own [`HostArena`] instead, at
//! the offsets the memory plan gave them.

use std::alloc::{Layout, alloc_zeroed, dealloc};

use rustc_hash::FxHashMap;

use crate::error::Error;
use crate::low_level::Program;
use crate::ndarray::NdArray;
use crate::ops::Prec;
use crate::tnode::{NodeId, TensorNode};

/// Alignment of every host buffer.
pub use crate::low_level::memory::ALIGN;

/// One zeroed, [`ALIGN`]-aligned allocation that never moves; `what` names it in the error
/// when it cannot be made.
#[derive(Debug)]
pub struct Allocation {
    ptr: *mut u8,
    bytes: usize,
}

// SAFETY: the allocation is exclusively owned; access is synchronized by `&`/`&mut` borrows of
// its owner.
unsafe impl Send for Allocation {}

impl Allocation {
    /// `bytes` zeroed bytes, or [`Error::Alloc`] naming `what`.
    pub fn zeroed(bytes: usize, what: impl Fn() -> String) -> Result<Allocation, Error> {
        if bytes == 0 {
            return Ok(Allocation { ptr: std::ptr::null_mut(), bytes });
        }
        let fail = || Error::Alloc { what: what(), bytes };
        let layout = Layout::from_size_align(bytes, ALIGN).map_err(|_| fail())?;
        // SAFETY: the layout has a non-zero size.
        let ptr = unsafe { alloc_zeroed(layout) };
        if ptr.is_null() {
            return Err(fail());
        }
        Ok(Allocation { ptr, bytes })
    }

    /// The start (null when empty).
    pub fn as_ptr(&self) -> *mut u8 {
        self.ptr
    }

    /// The size in bytes.
    pub fn len(&self) -> usize {
        self.bytes
    }

    /// Whether the allocation has no bytes.
    pub fn is_empty(&self) -> bool {
        self.bytes == 0
    }
}

impl Drop for Allocation {
    fn drop(&mut self) {
        if self.bytes > 0
            && let Ok(layout) = Layout::from_size_align(self.bytes, ALIGN)
        {
            // SAFETY: allocated in `zeroed` with this layout.
            unsafe { dealloc(self.ptr, layout) };
        }
    }
}

/// One node's host buffer.
#[derive(Debug)]
pub struct HostBuffer {
    /// The node.
    pub node: TensorNode,
    mem: Allocation,
}

impl HostBuffer {
    /// A zeroed buffer for `node`, or [`Error::Alloc`] when it is too large.
    pub fn new(node: &TensorNode) -> Result<HostBuffer, Error> {
        let what = || format!("tensor node {} '{}'", node.id, node.label);
        let too_big = || Error::Alloc { what: what(), bytes: usize::MAX };
        let elems =
            node.dims.iter().try_fold(1usize, |a, d| a.checked_mul(*d)).ok_or_else(too_big)?;
        let bytes = elems.checked_mul(node.prec.size_in_bytes()).ok_or_else(too_big)?;
        Ok(HostBuffer { node: node.clone(), mem: Allocation::zeroed(bytes, what)? })
    }

    /// The start of the buffer (null when empty).
    pub fn as_ptr(&self) -> *mut u8 {
        self.mem.ptr
    }

    /// The number of elements.
    pub fn len(&self) -> usize {
        self.node.num_elements()
    }

    /// Whether the buffer has no elements.
    pub fn is_empty(&self) -> bool {
        self.mem.bytes == 0
    }

    /// The precision.
    pub fn prec(&self) -> Prec {
        self.node.prec
    }

    fn bytes(&self) -> &[u8] {
        if self.mem.bytes == 0 {
            return &[];
        }
        // SAFETY: `ptr` points to `bytes` initialized bytes owned by `self`.
        unsafe { std::slice::from_raw_parts(self.mem.ptr, self.mem.bytes) }
    }

    fn bytes_mut(&mut self) -> &mut [u8] {
        if self.mem.bytes == 0 {
            return &mut [];
        }
        // SAFETY: as in `bytes`, and `&mut self` guarantees exclusivity.
        unsafe { std::slice::from_raw_parts_mut(self.mem.ptr, self.mem.bytes) }
    }

    /// Copies host data in, converting its precision.
    pub fn write(&mut self, data: &NdArray) -> Result<(), Error> {
        super::check_dims(&self.node, data)?;
        if data.prec() == self.node.prec {
            data.write_le_bytes(self.bytes_mut());
        } else {
            data.convert(self.node.prec).write_le_bytes(self.bytes_mut());
        }
        Ok(())
    }

    /// Copies the contents out.
    pub fn read(&self) -> Result<NdArray, Error> {
        NdArray::from_bytes(self.node.prec, &self.node.dims, self.bytes())
    }
}

/// The buffers of one CPU backend.
#[derive(Debug, Default)]
pub struct HostBuffers {
    map: FxHashMap<NodeId, HostBuffer>,
}

impl HostBuffers {
    /// Allocates a zeroed buffer unless the node has one.
    pub fn alloc(&mut self, node: &TensorNode) -> Result<(), Error> {
        if let std::collections::hash_map::Entry::Vacant(e) = self.map.entry(node.id) {
            e.insert(HostBuffer::new(node)?);
        }
        Ok(())
    }

    /// The buffer of a node.
    pub fn get(&self, id: NodeId) -> Option<&HostBuffer> {
        self.map.get(&id)
    }

    /// Whether the node has a buffer.
    pub fn contains(&self, id: NodeId) -> bool {
        self.map.contains_key(&id)
    }

    /// Copies host data into a node's buffer.
    pub fn write(&mut self, id: NodeId, data: &NdArray) -> Result<(), Error> {
        match self.map.get_mut(&id) {
            Some(b) => b.write(data),
            None => Err(Error::UnknownNode(id.0)),
        }
    }

    /// Copies a node's buffer out.
    pub fn read(&self, id: NodeId) -> Result<NdArray, Error> {
        match self.map.get(&id) {
            Some(b) => b.read(),
            None => Err(Error::UnknownNode(id.0)),
        }
    }
}

/// A routine's arena of intermediates ([`crate::low_level::Arena`]): one allocation, owned by
/// the compiled routine, that its intermediates share.
#[derive(Debug)]
pub struct HostArena {
    mem: Allocation,
    slots: FxHashMap<NodeId, (usize, TensorNode)>,
}

impl HostArena {
    /// Allocates the arena a program planned.
    pub fn new(prog: &Program) -> Result<HostArena, Error> {
        let what = || format!("the intermediates of routine '{}'", prog.name);
        let mem = Allocation::zeroed(prog.arena.bytes, what)?;
        let mut slots = FxHashMap::default();
        for s in &prog.arena.slots {
            let node = prog.nodes.get(&s.node).ok_or(Error::UnknownNode(s.node.0))?;
            let end = node.num_elements() * node.prec.size_in_bytes() + s.offset;
            if end > mem.bytes {
                return Err(Error::Alloc { what: what(), bytes: end });
            }
            slots.insert(s.node, (s.offset, node.clone()));
        }
        Ok(HostArena { mem, slots })
    }

    /// Where a node lives, and the node, if it lives in the arena.
    pub fn slot(&self, node: NodeId) -> Option<(*mut u8, &TensorNode)> {
        // SAFETY: `new` checked that the slot lies within the allocation.
        self.slots.get(&node).map(|(o, n)| (unsafe { self.mem.ptr.add(*o) }, n))
    }
}

//! Host buffers shared by the CPU backends.
//!
//! Each buffer is one zeroed, 64-byte aligned allocation (a cache line, and the alignment of
//! AVX-512 vectors) that never moves, so compiled routines can keep raw pointers to it for the
//! life of the context.

use std::alloc::{Layout, alloc_zeroed, dealloc};

use rustc_hash::FxHashMap;

use crate::error::Error;
use crate::ndarray::NdArray;
use crate::ops::Prec;
use crate::tnode::{NodeId, TensorNode};

/// Alignment of every host buffer.
pub const ALIGN: usize = 64;

/// One node's host buffer.
#[derive(Debug)]
pub struct HostBuffer {
    /// The node.
    pub node: TensorNode,
    ptr: *mut u8,
    bytes: usize,
}

// SAFETY: the buffer exclusively owns its allocation; access is synchronized by `&`/`&mut`
// borrows of the owning backend.
unsafe impl Send for HostBuffer {}

impl HostBuffer {
    /// A zeroed buffer for `node`, or [`Error::Alloc`] when it is too large.
    pub fn new(node: &TensorNode) -> Result<HostBuffer, Error> {
        let too_big = || Error::Alloc { id: node.id.0, bytes: usize::MAX };
        let elems =
            node.dims.iter().try_fold(1usize, |a, d| a.checked_mul(*d)).ok_or_else(too_big)?;
        let bytes = elems.checked_mul(node.prec.size_in_bytes()).ok_or_else(too_big)?;
        let ptr = if bytes == 0 {
            std::ptr::null_mut()
        } else {
            let layout = Layout::from_size_align(bytes, ALIGN)
                .map_err(|_| Error::Alloc { id: node.id.0, bytes })?;
            // SAFETY: the layout has a non-zero size.
            let p = unsafe { alloc_zeroed(layout) };
            if p.is_null() {
                return Err(Error::Alloc { id: node.id.0, bytes });
            }
            p
        };
        Ok(HostBuffer { node: node.clone(), ptr, bytes })
    }

    /// The start of the buffer (null when empty).
    pub fn as_ptr(&self) -> *mut u8 {
        self.ptr
    }

    /// The number of elements.
    pub fn len(&self) -> usize {
        self.node.num_elements()
    }

    /// Whether the buffer has no elements.
    pub fn is_empty(&self) -> bool {
        self.bytes == 0
    }

    /// The precision.
    pub fn prec(&self) -> Prec {
        self.node.prec
    }

    fn bytes(&self) -> &[u8] {
        if self.bytes == 0 {
            return &[];
        }
        // SAFETY: `ptr` points to `bytes` initialized bytes owned by `self`.
        unsafe { std::slice::from_raw_parts(self.ptr, self.bytes) }
    }

    fn bytes_mut(&mut self) -> &mut [u8] {
        if self.bytes == 0 {
            return &mut [];
        }
        // SAFETY: as in `bytes`, and `&mut self` guarantees exclusivity.
        unsafe { std::slice::from_raw_parts_mut(self.ptr, self.bytes) }
    }

    /// Copies host data in, converting its precision.
    pub fn write(&mut self, data: &NdArray) -> Result<(), Error> {
        if data.dims() != self.node.dims.as_slice() {
            return Err(Error::ShapeMismatch {
                id: self.node.id.0,
                expected: self.node.dims.clone(),
                got: data.dims().to_vec(),
            });
        }
        let bytes = data.convert(self.node.prec).to_bytes();
        self.bytes_mut().copy_from_slice(&bytes);
        Ok(())
    }

    /// Copies the contents out.
    pub fn read(&self) -> Result<NdArray, Error> {
        NdArray::from_bytes(self.node.prec, &self.node.dims, self.bytes())
    }
}

impl Drop for HostBuffer {
    fn drop(&mut self) {
        if self.bytes > 0
            && let Ok(layout) = Layout::from_size_align(self.bytes, ALIGN)
        {
            // SAFETY: allocated in `new` with this layout.
            unsafe { dealloc(self.ptr, layout) };
        }
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

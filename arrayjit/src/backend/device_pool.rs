//! A caching allocator for device memory: blocks given back are kept for the next request of
//! their size class instead of being freed.
//!
//! On a GPU, allocating and freeing device memory (`cuMemAlloc`, `cuMemFree`) is slow and
//! synchronizes the device, while a training process asks for the same sizes again and again:
//! each routine's arena and kernel scratch, a tensor freed and its successor of the same shape.
//! So, as PyTorch's caching allocator does, a block that is given back goes to a free list of
//! its size class, and the next request of that class takes it, zeroed again, with no call to
//! the driver. Sizes are rounded up to a class — a multiple of 512 bytes up to 1 MiB, of 2 MiB
//! above — so that nearby sizes share blocks at a bounded waste (under 512 bytes, or under 2 MiB
//! on blocks of over 1 MiB). When the device has no memory left for a new block, the cached
//! blocks are freed and the allocation is tried once more.
//!
//! The pool is generic over the block type: the CUDA backend keeps device slices in it, the
//! simulator host vectors (so the same accounting runs, and is tested, without a GPU).

use rustc_hash::FxHashMap;

use crate::error::Error;

/// The [`Backend`](super::Backend) methods that the backends whose buffers come from a
/// [`CachingPool`] (the CUDA backend and its simulator) answer alike: the pool's figures, and
/// whether a node has a buffer. Invoked inside such a backend's `impl Backend`; the backend has
/// a `pool` field (a [`CachingPool`]) and a `buffers` map keyed by node id.
macro_rules! pooled_buffer_queries {
    () => {
        fn pool_stats(&self) -> Option<$crate::backend::device_pool::PoolStats> {
            Some(self.pool.stats())
        }

        fn has_buffer(&self, node: $crate::tnode::NodeId) -> bool {
            self.buffers.contains_key(&node)
        }
    };
}
pub(crate) use pooled_buffer_queries;

/// Classes below this are multiples of [`SMALL_UNIT`] bytes.
pub const SMALL_LIMIT: usize = 1 << 20;
/// The unit of small classes.
pub const SMALL_UNIT: usize = 512;
/// The unit of large classes.
pub const LARGE_UNIT: usize = 2 << 20;

/// What the pool has done so far.
#[derive(Copy, Clone, Debug, Default, PartialEq, Eq)]
pub struct PoolStats {
    /// Blocks allocated from the device.
    pub allocations: u64,
    /// Requests served from the cache.
    pub reuses: u64,
    /// Bytes (by class) of the blocks handed out and not given back.
    pub in_use_bytes: usize,
    /// Bytes (by class) of the blocks kept for reuse.
    pub cached_bytes: usize,
    /// The most bytes held from the device at once (in use and cached).
    pub peak_bytes: usize,
    /// Times the cache was emptied to make room (a failed allocation, or [`CachingPool::trim`]).
    pub trims: u64,
}

/// A block of the pool: the memory and the size class it belongs to.
#[derive(Debug)]
pub struct Block<B> {
    /// The memory (at least `class` bytes).
    pub mem: B,
    /// Its size class in bytes.
    pub class: usize,
}

/// The caching allocator (see the module documentation).
#[derive(Debug)]
pub struct CachingPool<B> {
    free: FxHashMap<usize, Vec<B>>,
    stats: PoolStats,
}

impl<B> Default for CachingPool<B> {
    fn default() -> Self {
        CachingPool { free: FxHashMap::default(), stats: PoolStats::default() }
    }
}

impl<B> CachingPool<B> {
    /// The size class of a request: at least one unit.
    ///
    /// ```
    /// use rocannl_arrayjit::backend::device_pool::CachingPool;
    /// assert_eq!(CachingPool::<()>::class(1), 512);
    /// assert_eq!(CachingPool::<()>::class(1000), 1024);
    /// assert_eq!(CachingPool::<()>::class(3 << 20), 4 << 20);
    /// ```
    pub fn class(bytes: usize) -> usize {
        let unit = if bytes <= SMALL_LIMIT { SMALL_UNIT } else { LARGE_UNIT };
        bytes.max(1).div_ceil(unit) * unit
    }

    /// A block of at least `bytes`, all zero: a cached block of the class, cleared by `zero`, or
    /// a new one from `fresh(class)` (which must return zeroed memory). When `fresh` fails and
    /// blocks are cached, they are released (each dropped) and `fresh` is tried once more.
    pub fn take(
        &mut self,
        bytes: usize,
        mut fresh: impl FnMut(usize) -> Result<B, Error>,
        zero: impl FnOnce(&mut B) -> Result<(), Error>,
    ) -> Result<Block<B>, Error> {
        let class = Self::class(bytes);
        if let Some(mut mem) = self.free.get_mut(&class).and_then(Vec::pop) {
            self.stats.cached_bytes -= class;
            self.stats.reuses += 1;
            // On failure the block is dropped (freed): it is neither cached nor in use.
            zero(&mut mem)?;
            self.stats.in_use_bytes += class;
            return Ok(Block { mem, class });
        }
        let mem = match fresh(class) {
            Ok(m) => m,
            Err(_) if self.stats.cached_bytes > 0 => {
                self.trim();
                fresh(class)?
            }
            Err(e) => return Err(e),
        };
        self.stats.allocations += 1;
        self.stats.in_use_bytes += class;
        self.stats.peak_bytes =
            self.stats.peak_bytes.max(self.stats.in_use_bytes + self.stats.cached_bytes);
        Ok(Block { mem, class })
    }

    /// Gives a block back: kept for the next request of its class.
    pub fn give(&mut self, b: Block<B>) {
        self.stats.in_use_bytes -= b.class;
        self.stats.cached_bytes += b.class;
        self.free.entry(b.class).or_default().push(b.mem);
    }

    /// Releases every cached block (dropping it frees its memory); returns the bytes released.
    pub fn trim(&mut self) -> usize {
        let bytes = self.stats.cached_bytes;
        self.free.clear();
        self.stats.cached_bytes = 0;
        self.stats.trims += 1;
        bytes
    }

    /// What the pool has done so far.
    pub fn stats(&self) -> PoolStats {
        self.stats
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A device of `capacity` bytes whose blocks are byte vectors.
    struct Device {
        capacity: usize,
        used: std::rc::Rc<std::cell::Cell<usize>>,
    }

    /// A block that gives its bytes back to the device when dropped (freed).
    #[derive(Debug)]
    struct Mem {
        bytes: Vec<u8>,
        used: std::rc::Rc<std::cell::Cell<usize>>,
    }

    impl Drop for Mem {
        fn drop(&mut self) {
            self.used.set(self.used.get() - self.bytes.len());
        }
    }

    impl Device {
        fn alloc(&self, class: usize) -> Result<Mem, Error> {
            if self.used.get() + class > self.capacity {
                return Err(Error::Cuda("out of memory".into()));
            }
            self.used.set(self.used.get() + class);
            Ok(Mem { bytes: vec![0; class], used: self.used.clone() })
        }
    }

    fn zero(m: &mut Mem) -> Result<(), Error> {
        m.bytes.iter_mut().for_each(|b| *b = 0);
        Ok(())
    }

    #[test]
    fn classes_round_up_to_their_unit() {
        type P = CachingPool<()>;
        assert_eq!(P::class(0), 512);
        assert_eq!(P::class(512), 512);
        assert_eq!(P::class(513), 1024);
        assert_eq!(P::class(SMALL_LIMIT), SMALL_LIMIT);
        assert_eq!(P::class(SMALL_LIMIT + 1), LARGE_UNIT);
        assert_eq!(P::class(5 << 20), 6 << 20);
    }

    #[test]
    fn a_given_back_block_is_reused_zeroed_by_its_class_only() {
        let dev = Device { capacity: 1 << 30, used: Default::default() };
        let mut pool = CachingPool::default();
        let mut a = pool.take(1000, |c| dev.alloc(c), zero).unwrap();
        a.mem.bytes[7] = 42;
        pool.give(a);
        assert_eq!(pool.stats().cached_bytes, 1024);
        // Another class: a new block.
        let b = pool.take(2000, |c| dev.alloc(c), zero).unwrap();
        assert_eq!((pool.stats().allocations, pool.stats().reuses), (2, 0));
        // The same class (1000 and 700 both round to 1024): the cached block, zeroed.
        let c = pool.take(700, |c| dev.alloc(c), zero).unwrap();
        assert_eq!((pool.stats().allocations, pool.stats().reuses), (2, 1));
        assert!(c.mem.bytes.iter().all(|&x| x == 0));
        assert_eq!(c.class, 1024);
        assert_eq!(pool.stats().in_use_bytes, 1024 + 2048);
        assert_eq!(pool.stats().cached_bytes, 0);
        pool.give(b);
        pool.give(c);
        assert_eq!(pool.stats().peak_bytes, 3072);
        assert_eq!(dev.used.get(), 3072);
        assert_eq!(pool.trim(), 3072);
        assert_eq!(dev.used.get(), 0, "trimming frees the cached blocks");
    }

    #[test]
    fn a_full_device_empties_the_cache_and_tries_again() {
        let dev = Device { capacity: 4096, used: Default::default() };
        let mut pool = CachingPool::default();
        let a = pool.take(3000, |c| dev.alloc(c), zero).unwrap();
        pool.give(a);
        // 3072 bytes cached, 1024 free: a 2048-byte block fits only once the cache is freed.
        let b = pool.take(2048, |c| dev.alloc(c), zero).unwrap();
        assert_eq!(b.class, 2048);
        assert_eq!(pool.stats().trims, 1);
        assert_eq!(pool.stats().cached_bytes, 0);
        // Still too large with nothing cached: the device's error.
        let e = pool.take(4096, |c| dev.alloc(c), zero).unwrap_err();
        assert!(e.to_string().contains("out of memory"), "{e}");
        assert_eq!(pool.stats().in_use_bytes, 2048);
    }
}

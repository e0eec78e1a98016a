//! The CUDA backend: CUDA C rendered by the shared C-family renderer, compiled by NVRTC,
//! loaded and launched through cudarc's driver API.
//!
//! Rendering ([`render::render`]) and compiling to PTX or SASS ([`nvrtc::Nvrtc::compile`])
//! need no GPU and are tested everywhere NVRTC is installed. Creating the backend needs the
//! driver library and a device: without them [`Cuda::new`] returns [`Error::NoDevice`] before
//! any cudarc call that could panic. Compiled modules are kept in the persistent compile
//! cache ([`module_cache`]), so a process compiling a routine some earlier process compiled
//! loads its module without running NVRTC. A routine's kernels are compiled in units side by
//! side, to SASS for the device where NVRTC knows it ([`compile`]).

pub mod compile;
pub mod module_cache;
pub mod nvrtc;
pub mod render;

use std::sync::Arc;

use cudarc::driver::{
    CudaContext, CudaFunction, CudaSlice, CudaStream, LaunchConfig, PushKernelArg,
};
use rustc_hash::FxHashMap;

use super::device_pool::{Block, CachingPool};
use super::{Backend, BackendKind, BuildReport, BuildRequest, CompileOptions, Compiled};
use crate::error::Error;
use crate::low_level::Program;
use crate::ndarray::NdArray;
use crate::tnode::{NodeId, TensorNode};

/// The PTX target where NVRTC knows no architecture at or below the device's
/// ([`compile::target`]): compute capability 9.0 (H100/H200).
pub const PTX_ARCH: &str = "compute_90";
/// The SASS target checked in tests.
pub const SASS_ARCH: &str = "sm_90";

fn driver_err(e: cudarc::driver::DriverError) -> Error {
    Error::Cuda(format!("{e:?}"))
}

/// Checks for the driver library and a device without letting cudarc panic.
pub fn probe_device() -> Result<(), Error> {
    // SAFETY: only probes whether the driver library can be opened.
    if !unsafe { cudarc::driver::sys::is_culib_present() } {
        return Err(Error::NoDevice {
            reason: "the CUDA driver library (libcuda) is not installed".into(),
        });
    }
    match CudaContext::device_count() {
        Ok(n) if n > 0 => Ok(()),
        Ok(_) => Err(Error::NoDevice { reason: "the CUDA driver reports no device".into() }),
        Err(e) => Err(Error::NoDevice { reason: format!("the CUDA driver failed: {e:?}") }),
    }
}

/// Device memory from the caching pool.
type DevBlock = Block<CudaSlice<u8>>;

struct Loaded {
    kernels: Vec<(CudaFunction, crate::backend::kernel_ir::Kernel)>,
    /// The routine's intermediates ([`crate::low_level::memory`]) and where each lives in it
    /// (byte offset and length).
    arena: Option<DevBlock>,
    slots: FxHashMap<NodeId, (usize, usize)>,
    /// Global arrays its kernels keep between them (partial results of reductions).
    scratch: FxHashMap<NodeId, DevBlock>,
}

/// The CUDA backend (one device, one stream).
pub struct Cuda {
    ctx: Arc<CudaContext>,
    stream: Arc<CudaStream>,
    nvrtc: nvrtc::Nvrtc,
    buffers: FxHashMap<NodeId, (TensorNode, DevBlock)>,
    /// `None` once released.
    routines: Vec<Option<Loaded>>,
    /// Every device allocation: tensors, arenas, scratch.
    pool: CachingPool<CudaSlice<u8>>,
    cache: Option<crate::cache::Cache>,
    /// What NVRTC compiles to for this device ([`compile::target`]).
    target: (String, bool),
}

impl std::fmt::Debug for Cuda {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Cuda({} routines, {:?})", self.routines.len(), self.pool.stats())
    }
}

impl Cuda {
    /// The backend on device 0; [`Error::NoDevice`] without a driver or device.
    pub fn new(opts: &CompileOptions) -> Result<Cuda, Error> {
        probe_device()?;
        let ctx = CudaContext::new(0).map_err(driver_err)?;
        let stream = ctx.default_stream();
        let nvrtc = nvrtc::Nvrtc::load()?;
        let cc = ctx.compute_capability().map_err(driver_err)?;
        let target = compile::target(&nvrtc.supported_archs(), cc);
        Ok(Cuda {
            ctx,
            stream,
            nvrtc,
            buffers: FxHashMap::default(),
            routines: Vec::new(),
            pool: CachingPool::default(),
            cache: crate::cache::Cache::open(&opts.cache),
            target,
        })
    }

    /// A zeroed block of at least `bytes` from the pool.
    fn take(&mut self, bytes: usize) -> Result<DevBlock, Error> {
        let stream = &self.stream;
        self.pool.take(
            bytes,
            |class| stream.alloc_zeros::<u8>(class).map_err(driver_err),
            |b| stream.memset_zeros(b).map_err(driver_err),
        )
    }

    /// A compiled routine's arena and its kernels' scratch, from the pool.
    fn routine_memory(&mut self, prog: &Program, r: &mut Loaded) -> Result<(), Error> {
        if prog.arena.bytes > 0 {
            r.arena = Some(self.take(prog.arena.bytes)?);
        }
        let mut sizes: Vec<(NodeId, usize)> = Vec::new();
        for s in r.kernels.iter().flat_map(|(_, k)| &k.scratch) {
            if !sizes.iter().any(|(n, _)| *n == s.node) {
                sizes.push((s.node, s.len * s.prec.size_in_bytes()));
            }
        }
        for (node, bytes) in sizes {
            let block = self.take(bytes)?;
            r.scratch.insert(node, block);
        }
        Ok(())
    }

    /// Gives a routine's memory back to the pool.
    fn give_back(&mut self, r: Loaded) {
        for b in r.arena.into_iter().chain(r.scratch.into_values()) {
            self.pool.give(b);
        }
    }
}

impl Backend for Cuda {
    fn kind(&self) -> BackendKind {
        BackendKind::Cuda
    }

    fn render(&self, prog: &Program) -> Result<String, Error> {
        Ok(render::render(prog).source)
    }

    fn compile(&mut self, prog: &Program, _req: &BuildRequest) -> Result<Compiled, Error> {
        let clock = std::time::Instant::now();
        let src = render::render(prog);
        let units = src.units(compile::UNIT_BYTES);
        let rendered = clock.elapsed().as_secs_f64();
        let sources: Vec<&str> = units.iter().map(|(text, _)| text.as_str()).collect();
        let (arch, cubin) = (&self.target.0, self.target.1);
        let (modules, outcome) = compile::compile_units(
            &self.nvrtc,
            self.cache.as_ref(),
            &prog.name,
            &sources,
            arch,
            cubin,
        )?;
        let compiled = clock.elapsed().as_secs_f64();
        let mut kernels = Vec::with_capacity(src.kernels.len());
        let mut all = src.kernels.into_iter();
        for ((_, range), mut bytes) in units.into_iter().zip(modules) {
            if !cubin {
                // PTX is text: the driver reads it up to its terminating NUL.
                while bytes.last() == Some(&0) {
                    bytes.pop();
                }
                bytes.push(0);
            }
            let module =
                self.ctx.load_module(cudarc::nvrtc::Ptx::from_binary(bytes)).map_err(driver_err)?;
            for k in all.by_ref().take(range.len()) {
                let f = module.load_function(&k.name).map_err(driver_err)?;
                kernels.push((f, k));
            }
        }
        let phases = vec![
            ("render", rendered),
            ("nvrtc", compiled - rendered),
            ("load", clock.elapsed().as_secs_f64() - compiled),
        ];
        let mut slots = FxHashMap::default();
        for a in &prog.arena.slots {
            let node = prog.nodes.get(&a.node).ok_or(Error::UnknownNode(a.node.0))?;
            slots.insert(a.node, (a.offset, node.num_elements() * node.prec.size_in_bytes()));
        }
        let mut r = Loaded { kernels, arena: None, slots, scratch: FxHashMap::default() };
        if let Err(e) = self.routine_memory(prog, &mut r) {
            // What was taken goes back: the pool's figures stay true.
            self.give_back(r);
            return Err(e);
        }
        self.routines.push(Some(r));
        let report = BuildReport { phases, cache: outcome };
        Ok(Compiled { routine: self.routines.len() - 1, listing: src.source, report })
    }

    fn alloc(&mut self, node: &TensorNode) -> Result<(), Error> {
        if self.buffers.contains_key(&node.id) {
            return Ok(());
        }
        let buf = self.take(node.num_elements() * node.prec.size_in_bytes())?;
        self.buffers.insert(node.id, (node.clone(), buf));
        Ok(())
    }

    fn release(&mut self, routine: usize) -> Result<(), Error> {
        if !matches!(self.routines.get(routine), Some(Some(_))) {
            return Ok(());
        }
        // Kernels still queued read its memory: they finish before the blocks are reused.
        self.stream.synchronize().map_err(driver_err)?;
        if let Some(r) = self.routines[routine].take() {
            self.give_back(r);
        }
        Ok(())
    }

    super::device_pool::pooled_buffer_queries!();

    fn run(&mut self, routine: usize, symbols: &[i64]) -> Result<(), Error> {
        let r = &*super::live_routine(&mut self.routines, routine)?;
        for (f, k) in &r.kernels {
            // Intermediates are views into the routine's arena; everything else has a buffer.
            let mut views = Vec::with_capacity(k.buffers.len());
            for n in &k.buffers {
                if let (Some(&(offset, len)), Some(arena)) = (r.slots.get(n), &r.arena) {
                    views.push(Some(arena.mem.slice(offset..offset + len)));
                } else {
                    views.push(None);
                }
            }
            let mut args = self.stream.launch_builder(f);
            for (n, view) in k.buffers.iter().zip(&views) {
                match view {
                    Some(v) => {
                        args.arg(v);
                    }
                    None => match r.scratch.get(n) {
                        Some(buf) => {
                            args.arg(&buf.mem);
                        }
                        None => {
                            let (_, buf) = self.buffers.get(n).ok_or(Error::UnknownNode(n.0))?;
                            args.arg(&buf.mem);
                        }
                    },
                }
            }
            for s in symbols {
                args.arg(s);
            }
            let cfg = LaunchConfig {
                grid_dim: (k.blocks() as u32, 1, 1),
                block_dim: (k.block, 1, 1),
                shared_mem_bytes: 0,
            };
            // SAFETY: the kernel's parameters are exactly the pushed buffers (device pointers)
            // and the runtime symbols (`long long`), in that order.
            unsafe { args.launch(cfg) }.map_err(driver_err)?;
        }
        self.stream.synchronize().map_err(driver_err)
    }

    fn write(&mut self, node: NodeId, data: &NdArray) -> Result<(), Error> {
        let (n, buf) = self.buffers.get_mut(&node).ok_or(Error::UnknownNode(node.0))?;
        super::check_dims(n, data)?;
        let bytes = data.convert(n.prec).to_bytes();
        if bytes.is_empty() {
            return Ok(());
        }
        // The block may be longer than the tensor (its size class): only the tensor's bytes.
        let mut dst = buf.mem.slice_mut(0..bytes.len());
        self.stream.memcpy_htod(&bytes, &mut dst).map_err(driver_err)
    }

    fn read(&self, node: NodeId) -> Result<NdArray, Error> {
        let (n, buf) = self.buffers.get(&node).ok_or(Error::UnknownNode(node.0))?;
        // The tensor's bytes only (the block may be longer: its size class).
        let len = n.num_elements() * n.prec.size_in_bytes();
        if len == 0 {
            return NdArray::from_bytes(n.prec, &n.dims, &[]);
        }
        let bytes = self.stream.clone_dtoh(&buf.mem.slice(0..len)).map_err(driver_err)?;
        NdArray::from_bytes(n.prec, &n.dims, &bytes)
    }
}

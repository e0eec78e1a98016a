//! `cuda-sim`: the CUDA backend's kernels executed on the CPU, a test backend.
//!
//! No GPU has been available to this project, so the kernels the CUDA backend launches are run
//! here instead, from the same kernel IR the renderer prints ([`super::kernel_ir`]), with the
//! semantics of a CUDA launch: a grid of blocks of threads, each thread with its own loop
//! variables and locals, each block with its own shared arrays (filled with NaN, so a read
//! before any write shows), `__syncthreads()` as a barrier every thread of the block must reach.
//! The threads of a block run in lockstep over kernel-level statements; a per-thread statement
//! (a loop nest) runs to its end for one thread before the next thread starts it, which is one
//! of the interleavings a GPU may choose — and since any two of them give the same result only
//! for race-free code, races are detected rather than tolerated.
//!
//! What a GPU would not report, the simulator reports as [`Error::KernelCheck`]:
//! - a data race: two threads touching one cell, at least one writing, without an atomic — in
//!   global memory anywhere in a launch (blocks have no barrier between them), in shared
//!   memory between two barriers — and, for intermediates, two threads touching the same bytes
//!   of the routine's arena (where the memory plan places intermediates of different times at
//!   one offset);
//! - a barrier that a live thread of the block does not reach (inside a branch only some
//!   threads take);
//! - shared memory past [`SHARED_LIMIT`] per block;
//! - a warp shuffle that some lane of the warp does not execute (shuffles name the full warp);
//!
//! and an index outside a tensor as [`Error::OutOfBounds`], like bounds-check mode.
//!
//! Values are computed exactly as the interpreter computes them (each operation rounded to the
//! statement's precision, stores rounded to the tensor's), so results can be compared with the
//! interpreter's closely. Limits: one device, no streams, no timing; atomics are applied in
//! thread order.

use rustc_hash::FxHashMap;

use super::device_pool::{Block, CachingPool};
use super::kernel_ir::{self, KCond, KStmt, Kernel, SHARED_LIMIT};
use super::{Backend, BackendKind, BuildReport, BuildRequest, Compiled};
use crate::error::Error;
use crate::low_level::{Expr, IdxVar, Index, LocalId, Program, Stmt, Var};
use crate::ndarray::NdArray;
use crate::ops::{Prec, uniform};
use crate::tnode::{NodeId, TensorNode};

/// A buffer: its node and its values, each exactly representable in the node's precision.
#[derive(Clone, Debug)]
struct Buf {
    node: TensorNode,
    vals: Vec<f64>,
    /// The device pool's size class of its bytes (0: not from the pool, shared memory).
    class: usize,
}

impl Buf {
    /// A zeroed buffer from the pool, as the CUDA backend takes device memory: the class is
    /// that of the node's bytes on a device.
    fn pooled(pool: &mut CachingPool<Vec<f64>>, node: &TensorNode) -> Result<Buf, Error> {
        let n = node.num_elements();
        let block = pool.take(
            n * node.prec.size_in_bytes(),
            |_| Ok(vec![0.0; n]),
            |v| {
                v.clear();
                v.resize(n, 0.0);
                Ok(())
            },
        )?;
        Ok(Buf { node: node.clone(), vals: block.mem, class: block.class })
    }

    /// Gives the buffer back to the pool.
    fn give(self, pool: &mut CachingPool<Vec<f64>>) {
        if self.class > 0 {
            pool.give(Block { mem: self.vals, class: self.class });
        }
    }
}

#[derive(Debug)]
struct Routine {
    prog: Program,
    kernels: Vec<Kernel>,
    /// The routine's intermediates, each in a buffer of its own.
    arena: FxHashMap<NodeId, Buf>,
}

/// The simulator backend.
#[derive(Debug, Default)]
pub struct CudaSim {
    buffers: FxHashMap<NodeId, Buf>,
    /// `None` once released.
    routines: Vec<Option<Routine>>,
    /// Every buffer, as the CUDA backend's device memory ([`super::device_pool`]).
    pool: CachingPool<Vec<f64>>,
}

impl CudaSim {
    /// A simulator with no buffers.
    pub fn new() -> CudaSim {
        CudaSim::default()
    }

    /// Runs kernels written by hand (the simulator's own tests): the program gives the
    /// tensors, locals and runtime symbols; buffers must be allocated.
    pub fn launch(
        &mut self,
        prog: &Program,
        kernels: &[Kernel],
        symbols: &[i64],
    ) -> Result<(), Error> {
        let mut arena = routine_buffers(&mut self.pool, prog, kernels)?;
        let ran = kernels
            .iter()
            .try_for_each(|k| launch(prog, k, symbols, &mut self.buffers, &mut arena));
        arena.into_values().for_each(|b| b.give(&mut self.pool));
        ran
    }
}

impl Backend for CudaSim {
    fn kind(&self) -> BackendKind {
        BackendKind::CudaSim
    }

    fn render(&self, prog: &Program) -> Result<String, Error> {
        Ok(kernel_ir::lower(prog).iter().map(|k| k.to_string()).collect())
    }

    fn compile(&mut self, prog: &Program, _req: &BuildRequest) -> Result<Compiled, Error> {
        let kernels = kernel_ir::lower(prog);
        let listing = kernels.iter().map(|k| k.to_string()).collect();
        let arena = routine_buffers(&mut self.pool, prog, &kernels)?;
        self.routines.push(Some(Routine { prog: prog.clone(), kernels, arena }));
        Ok(Compiled { routine: self.routines.len() - 1, listing, report: BuildReport::default() })
    }

    fn alloc(&mut self, node: &TensorNode) -> Result<(), Error> {
        if !self.buffers.contains_key(&node.id) {
            let b = Buf::pooled(&mut self.pool, node)?;
            self.buffers.insert(node.id, b);
        }
        Ok(())
    }

    fn release(&mut self, routine: usize) -> Result<(), Error> {
        if let Some(Some(r)) = self.routines.get_mut(routine).map(Option::take) {
            r.arena.into_values().for_each(|b| b.give(&mut self.pool));
        }
        Ok(())
    }

    super::device_pool::pooled_buffer_queries!();

    fn run(&mut self, routine: usize, symbols: &[i64]) -> Result<(), Error> {
        let r = super::live_routine(&mut self.routines, routine)?;
        for k in &r.kernels {
            launch(&r.prog, k, symbols, &mut self.buffers, &mut r.arena)?;
        }
        Ok(())
    }

    fn write(&mut self, node: NodeId, data: &NdArray) -> Result<(), Error> {
        let b = self.buffers.get_mut(&node).ok_or(Error::UnknownNode(node.0))?;
        super::check_dims(&b.node, data)?;
        b.vals.clear();
        b.vals.extend(data.convert(b.node.prec).to_f64_vec());
        Ok(())
    }

    fn read(&self, node: NodeId) -> Result<NdArray, Error> {
        let b = self.buffers.get(&node).ok_or(Error::UnknownNode(node.0))?;
        NdArray::from_f64(b.node.prec, &b.node.dims, &b.vals)
    }
}

/// A routine's own buffers: its intermediates (each in a buffer of its own) and its kernels'
/// scratch arrays, zeroed.
fn routine_buffers(
    pool: &mut CachingPool<Vec<f64>>,
    prog: &Program,
    kernels: &[Kernel],
) -> Result<FxHashMap<NodeId, Buf>, Error> {
    let mut bufs: FxHashMap<NodeId, Buf> = FxHashMap::default();
    let fill = |bufs: &mut FxHashMap<NodeId, Buf>, pool: &mut CachingPool<Vec<f64>>| {
        for slot in &prog.arena.slots {
            let node = prog.nodes.get(&slot.node).ok_or(Error::UnknownNode(slot.node.0))?;
            bufs.insert(slot.node, Buf::pooled(pool, node)?);
        }
        for s in kernels.iter().flat_map(|k| &k.scratch) {
            if let std::collections::hash_map::Entry::Vacant(slot) = bufs.entry(s.node) {
                slot.insert(Buf::pooled(pool, &s.tensor("scratch"))?);
            }
        }
        Ok::<(), Error>(())
    };
    if let Err(e) = fill(&mut bufs, pool) {
        // What was taken goes back: the pool's figures stay true.
        bufs.into_values().for_each(|b| b.give(pool));
        return Err(e);
    }
    Ok(bufs)
}

/// Who touched a cell during a launch (global memory) or since the last barrier (shared).
#[derive(Clone, Copy, Debug, Default)]
struct Touch {
    writer: Option<u64>,
    reader: Option<u64>,
    readers: bool,
    atomic: Option<u64>,
    atomics: bool,
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Kind {
    Read,
    Write,
    Atomic,
}

impl Touch {
    /// Records an access by thread `t`; `Err` holds the other thread it races with (`None`:
    /// one of several).
    fn record(&mut self, t: u64, kind: Kind) -> Result<(), Option<u64>> {
        let other = |x: Option<u64>, many: bool| match x {
            Some(o) if o != t => Some(Some(o)),
            Some(_) if many => Some(None),
            _ => None,
        };
        let writer = other(self.writer, false);
        let conflict = match kind {
            Kind::Read => writer.or(other(self.atomic, self.atomics)),
            Kind::Write => {
                writer.or(other(self.reader, self.readers)).or(other(self.atomic, self.atomics))
            }
            Kind::Atomic => writer.or(other(self.reader, self.readers)),
        };
        if let Some(o) = conflict {
            return Err(o);
        }
        match kind {
            Kind::Read => {
                self.readers |= self.reader.is_some_and(|r| r != t);
                self.reader = Some(t);
            }
            Kind::Write => self.writer = Some(t),
            Kind::Atomic => {
                self.atomics |= self.atomic.is_some_and(|a| a != t);
                self.atomic = Some(t);
            }
        }
        Ok(())
    }
}

/// A thread's variables by number (0 where unset).
#[derive(Clone, Debug, Default)]
struct Vars(Vec<i64>);

impl Vars {
    fn set(&mut self, v: Var, x: i64) {
        let k = v.0 as usize;
        if k >= self.0.len() {
            self.0.resize(k + 1, 0);
        }
        self.0[k] = x;
    }

    fn get(&self, v: Var) -> i64 {
        self.0.get(v.0 as usize).copied().unwrap_or(0)
    }
}

/// An index's value for a thread.
fn index_value(prog: &Program, symbols: &[i64], i: &Index, t: &Thread) -> i64 {
    let mut x = i.offset;
    for (c, v) in &i.terms {
        x += c * match v {
            IdxVar::Loop(v) => t.vars.get(*v),
            IdxVar::Sym(s) => {
                prog.symbol_slot(*s).and_then(|k| symbols.get(k)).copied().unwrap_or(0)
            }
        };
    }
    x
}

/// One thread's state.
#[derive(Clone, Debug)]
struct Thread {
    gid: u64,
    tid: u32,
    /// Loop and thread variables, indexed by the variable's number.
    vars: Vars,
    locals: Vec<f64>,
    live: bool,
}

/// A launch in progress.
struct Launch<'a> {
    prog: &'a Program,
    kernel: &'a Kernel,
    symbols: &'a [i64],
    globals: &'a mut FxHashMap<NodeId, Buf>,
    arena: &'a mut FxHashMap<NodeId, Buf>,
    shared: FxHashMap<NodeId, Buf>,
    /// Per tensor, who touched each cell in this launch.
    global_log: FxHashMap<NodeId, Vec<Touch>>,
    /// Who touched each two bytes of the routine's arena in this launch.
    arena_log: Vec<Touch>,
    /// The precision each stored expression is computed in, by its address in the kernel.
    precs: FxHashMap<*const Expr, Prec>,
    /// Per shared array, who touched each cell since the last barrier.
    shared_log: FxHashMap<NodeId, Vec<Touch>>,
}

fn launch(
    prog: &Program,
    kernel: &Kernel,
    symbols: &[i64],
    globals: &mut FxHashMap<NodeId, Buf>,
    arena: &mut FxHashMap<NodeId, Buf>,
) -> Result<(), Error> {
    if kernel.shared_bytes() > SHARED_LIMIT {
        return Err(Error::KernelCheck {
            kernel: kernel.name.clone(),
            problem: format!(
                "{} bytes of shared memory per block, past the limit of {SHARED_LIMIT}",
                kernel.shared_bytes()
            ),
        });
    }
    let mut l = Launch {
        prog,
        kernel,
        symbols,
        globals,
        arena,
        shared: FxHashMap::default(),
        global_log: FxHashMap::default(),
        arena_log: Vec::new(),
        shared_log: FxHashMap::default(),
        precs: FxHashMap::default(),
    };
    for b in 0..kernel.blocks() {
        l.shared = kernel
            .shared
            .iter()
            .map(|s| {
                (s.node, Buf { node: s.tensor("shared"), vals: vec![f64::NAN; s.len], class: 0 })
            })
            .collect();
        l.shared_log.clear();
        let mut threads: Vec<Thread> = (0..kernel.block)
            .map(|t| Thread {
                gid: b * u64::from(kernel.block) + u64::from(t),
                tid: t,
                vars: Vars::default(),
                locals: vec![0.0; prog.locals.len() + kernel.locals.len()],
                live: true,
            })
            .collect();
        let all: Vec<usize> = (0..threads.len()).collect();
        l.block(&kernel.body, &all, &mut threads)?;
    }
    Ok(())
}

impl Launch<'_> {
    fn check(&self, problem: String) -> Error {
        Error::KernelCheck { kernel: self.kernel.name.clone(), problem }
    }

    /// Kernel statements for the threads `active` (in lockstep).
    fn block(
        &mut self,
        body: &[KStmt],
        active: &[usize],
        threads: &mut [Thread],
    ) -> Result<(), Error> {
        for s in body {
            let now: Vec<usize> = active.iter().copied().filter(|&t| threads[t].live).collect();
            match s {
                KStmt::Coord { var, stride, extent } => {
                    for &t in &now {
                        let th = &mut threads[t];
                        th.vars.set(*var, ((th.gid / stride) % extent) as i64);
                    }
                }
                KStmt::InBlock { var, stride, extent } => {
                    for &t in &now {
                        let th = &mut threads[t];
                        th.vars.set(*var, i64::from((th.tid / stride) % extent));
                    }
                }
                KStmt::Loop { var, extent, body } => {
                    for i in 0..*extent {
                        for &t in &now {
                            threads[t].vars.set(*var, i as i64);
                        }
                        self.block(body, &now, threads)?;
                    }
                }
                KStmt::ThreadInBlock { var } => {
                    for &t in &now {
                        let th = &mut threads[t];
                        th.vars.set(*var, i64::from(th.tid));
                    }
                }
                KStmt::ExitUnless(c) => self.exit_unless(c, &now, threads),
                KStmt::Run(s) => {
                    for &t in &now {
                        self.stmt(s, &mut threads[t])?;
                    }
                }
                KStmt::Barrier => self.barrier(&now, threads)?,
                KStmt::If { guards, body } => {
                    let inside: Vec<usize> = now
                        .iter()
                        .copied()
                        .filter(|&t| {
                            guards.iter().all(|g| {
                                (0..g.bound as i64).contains(&self.index(&g.index, &threads[t]))
                            })
                        })
                        .collect();
                    self.block(body, &inside, threads)?;
                }
                KStmt::ShuffleDown { dst, src, offset } => {
                    self.shuffle_down((*dst, *src, *offset), &now, threads)?;
                }
                KStmt::AtomicAdd { node, idx, value } => {
                    for &t in &now {
                        self.atomic_add(*node, idx, value, &threads[t])?;
                    }
                }
            }
        }
        Ok(())
    }

    /// Ends the threads `now` for which the condition does not hold.
    fn exit_unless(&self, c: &KCond, now: &[usize], threads: &mut [Thread]) {
        for &t in now {
            let go = match c {
                KCond::GlobalBelow(n) => threads[t].gid < *n,
                KCond::First => threads[t].gid == 0,
                KCond::BelowLimit(v, lim) => {
                    let size = self.symbol(lim.size);
                    let rows = (size + lim.per as i64 - 1) / lim.per as i64;
                    threads[t].vars.get(*v) < rows
                }
            };
            threads[t].live &= go;
        }
    }

    /// A barrier: reached by every live thread of the block, or by none (a branch no thread
    /// takes); it ends the shared-memory accesses that could race.
    fn barrier(&mut self, now: &[usize], threads: &[Thread]) -> Result<(), Error> {
        let live = threads.iter().filter(|t| t.live).count();
        if !now.is_empty() && now.len() != live {
            let missing = threads
                .iter()
                .find(|t| t.live && !now.contains(&(t.tid as usize)))
                .map_or(0, |t| t.tid);
            return Err(self.check(format!(
                "barrier not reached by thread {missing} of its block ({} of {live} \
                 live threads reach it)",
                now.len()
            )));
        }
        self.shared_log.clear();
        Ok(())
    }

    /// `dst := src` of the lane `offset` further in the same warp (its own `src` past the
    /// warp's end); every lane of a warp executing it must be here (the full-warp mask).
    fn shuffle_down(
        &self,
        (dst, src, offset): (LocalId, LocalId, u32),
        now: &[usize],
        threads: &mut [Thread],
    ) -> Result<(), Error> {
        let warp = kernel_ir::WARP as usize;
        for &t in now {
            let base = t - t % warp;
            let end = (base + warp).min(threads.len());
            if let Some(missing) = (base..end).find(|l| !now.contains(l)) {
                return Err(self.check(format!(
                    "warp shuffle without lane {missing} of its warp (thread {t} \
                     shuffles, thread {missing} does not)"
                )));
            }
        }
        let old: Vec<f64> = threads.iter().map(|th| th.locals[src.0 as usize]).collect();
        for &t in now {
            let from = t + offset as usize;
            let same_warp = from / warp == t / warp && from < threads.len();
            threads[t].locals[dst.0 as usize] = old[if same_warp { from } else { t }];
        }
        Ok(())
    }

    /// `node[idx] += value` for one thread, rounded to the node's precision.
    fn atomic_add(
        &mut self,
        node: NodeId,
        idx: &[Index],
        value: &Expr,
        th: &Thread,
    ) -> Result<(), Error> {
        let prec = self.prec_of(node)?;
        let compute = self.prog.compute_prec(value, prec);
        let x = self.eval(value, th, compute)?;
        let (flat, _) = self.locate(node, idx, th)?;
        self.touch(node, flat, th.gid, Kind::Atomic)?;
        let b = self.buf(node)?;
        b.vals[flat] = prec.round(b.vals[flat] + x);
        Ok(())
    }

    fn symbol(&self, s: crate::indexing::Symbol) -> i64 {
        self.prog.symbol_slot(s).and_then(|k| self.symbols.get(k)).copied().unwrap_or(0)
    }

    fn index(&self, i: &Index, t: &Thread) -> i64 {
        index_value(self.prog, self.symbols, i, t)
    }

    fn buf(&mut self, node: NodeId) -> Result<&mut Buf, Error> {
        if let Some(b) = self.shared.get_mut(&node) {
            return Ok(b);
        }
        if let Some(b) = self.arena.get_mut(&node) {
            return Ok(b);
        }
        self.globals.get_mut(&node).ok_or(Error::UnknownNode(node.0))
    }

    fn prec_of(&mut self, node: NodeId) -> Result<Prec, Error> {
        Ok(self.buf(node)?.node.prec)
    }

    /// The flat offset of a cell, each index checked against its axis.
    fn locate(&mut self, node: NodeId, idx: &[Index], t: &Thread) -> Result<(usize, Prec), Error> {
        let (symbols, prog) = (self.symbols, self.prog);
        let b = self.buf(node)?;
        let mut flat = 0usize;
        for (axis, (i, &d)) in idx.iter().zip(&b.node.dims).enumerate() {
            let i = index_value(prog, symbols, i, t);
            if i < 0 || i >= d as i64 {
                return Err(Error::OutOfBounds {
                    node: node.0,
                    label: b.node.label.clone(),
                    axis,
                    index: i,
                    bound: d,
                });
            }
            flat = flat * d + i as usize;
        }
        Ok((flat, b.node.prec))
    }

    fn touch(&mut self, node: NodeId, flat: usize, t: u64, kind: Kind) -> Result<(), Error> {
        let shared = self.shared.contains_key(&node);
        // An intermediate's cell is also bytes of the routine's arena, which other
        // intermediates may occupy at other times: touches are checked by address there too,
        // in units of two bytes.
        if !shared && let Some(offset) = self.prog.arena.offset_of(node) {
            let size = self.buf(node)?.node.prec.size_in_bytes();
            let first = (offset + flat * size) / 2;
            let words = (size / 2).max(1);
            if self.arena_log.len() < first + words {
                self.arena_log.resize(first + words, Touch::default());
            }
            for w in first..first + words {
                if let Err(other) = self.arena_log[w].record(t, kind) {
                    let whom =
                        other.map_or("another thread".to_string(), |o| format!("thread {o}"));
                    return Err(self.check(format!(
                        "data race in the arena: thread {t} touches byte {} (cell {flat} of \
                         {node}), which {whom} also touched in this launch, as this or another \
                         intermediate",
                        2 * w
                    )));
                }
            }
        }
        let log = if shared { &self.shared_log } else { &self.global_log };
        if !log.contains_key(&node) {
            let cells = self.buf(node)?.vals.len();
            let log = if shared { &mut self.shared_log } else { &mut self.global_log };
            log.insert(node, vec![Touch::default(); cells]);
        }
        let log = if shared { &mut self.shared_log } else { &mut self.global_log };
        let touches = log.get_mut(&node).ok_or(Error::UnknownNode(node.0))?;
        if let Err(other) = touches[flat].record(t, kind) {
            let what = match kind {
                Kind::Read => "reads",
                Kind::Write => "writes",
                Kind::Atomic => "atomically updates",
            };
            let block = u64::from(self.kernel.block.max(1));
            let name = |x: u64| {
                if shared { format!("thread {}", x % block) } else { format!("thread {x}") }
            };
            let (who, whom) = (name(t), other.map_or("another thread".to_string(), name));
            let place = if shared { "shared array" } else { "tensor" };
            return Err(self.check(format!(
                "data race: {who} {what} cell {flat} of {place} {node}, which {whom} also \
                 touched{}",
                if shared { " since the last barrier" } else { " in this launch" }
            )));
        }
        Ok(())
    }

    /// [`crate::low_level::Program::compute_prec`], once per expression of the kernel.
    fn compute_prec(&mut self, value: &Expr, target: Prec) -> Prec {
        let prog = self.prog;
        *self.precs.entry(value as *const Expr).or_insert_with(|| prog.compute_prec(value, target))
    }

    /// One thread runs a low-level statement to its end.
    fn stmt(&mut self, s: &Stmt, t: &mut Thread) -> Result<(), Error> {
        match s {
            Stmt::Comment(_) => {}
            Stmt::For { var, extent, limit, body, .. } => {
                let end = match limit {
                    Some(l) => {
                        let size = self.symbol(l.size);
                        (*extent as i64).min((size + l.per as i64 - 1) / l.per as i64)
                    }
                    None => *extent as i64,
                };
                for i in 0..end {
                    t.vars.set(*var, i);
                    for b in body {
                        self.stmt(b, t)?;
                    }
                }
            }
            Stmt::If { guards, body } => {
                if guards.iter().all(|g| (0..g.bound as i64).contains(&self.index(&g.index, t))) {
                    for b in body {
                        self.stmt(b, t)?;
                    }
                }
            }
            Stmt::Set { node, idx, value } => {
                let prec = self.prec_of(*node)?;
                let compute = self.compute_prec(value, prec);
                let x = self.eval(value, t, compute)?;
                let (flat, _) = self.locate(*node, idx, t)?;
                self.touch(*node, flat, t.gid, Kind::Write)?;
                self.buf(*node)?.vals[flat] = prec.round(x);
            }
            Stmt::SetLocal { local, value } => {
                // The program's locals, then the kernel's own.
                let prec = match self.prog.locals.get(local.0 as usize) {
                    Some(p) => *p,
                    None => {
                        let own = self.kernel.locals.iter().find(|(l, _)| l == local);
                        own.map(|(_, p)| *p).ok_or_else(|| {
                            self.check(format!(
                                "local {local} is neither the program's nor the kernel's"
                            ))
                        })?
                    }
                };
                let compute = self.compute_prec(value, prec);
                let x = self.eval(value, t, compute)?;
                t.locals[local.0 as usize] = prec.round(x);
            }
            Stmt::Gemm(_) | Stmt::Map(_) | Stmt::Call(_) => {
                return Err(self.check("a CPU kernel call in a GPU kernel".into()));
            }
        }
        Ok(())
    }

    /// An expression computed in `p` (f32 or f64), as the interpreter computes it.
    fn eval(&mut self, e: &Expr, t: &Thread, p: Prec) -> Result<f64, Error> {
        let single = p == Prec::F32;
        Ok(match e {
            Expr::Const(c) => p.round(*c),
            Expr::Get(n, idx) => {
                let (flat, prec) = self.locate(*n, idx, t)?;
                self.touch(*n, flat, t.gid, Kind::Read)?;
                let x = self.buf(*n)?.vals[flat];
                if single && prec == Prec::U32 { x as f32 as f64 } else { x }
            }
            Expr::Local(l) => t.locals[l.0 as usize],
            Expr::IndexValue(i) => p.round(self.index(i, t) as f64),
            Expr::Uniform { seed, offset } => p.round(uniform(*seed, self.index(offset, t) as u64)),
            Expr::Unop(op, a) => {
                let a = self.eval(a, t, p)?;
                if single { op.apply_f32(a as f32) as f64 } else { op.apply(a) }
            }
            Expr::Binop(op, a, b) => {
                let (a, b) = (self.eval(a, t, p)?, self.eval(b, t, p)?);
                if single { op.apply_f32(a as f32, b as f32) as f64 } else { op.apply(a, b) }
            }
            Expr::Ternop(op, a, b, c) => {
                let (a, b, c) = (self.eval(a, t, p)?, self.eval(b, t, p)?, self.eval(c, t, p)?);
                if single {
                    op.apply_f32(a as f32, b as f32, c as f32) as f64
                } else {
                    op.apply(a, b, c)
                }
            }
        })
    }
}

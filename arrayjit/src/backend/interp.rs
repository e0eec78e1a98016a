//! The reference interpreter: the oracle every compiled backend is tested against.
//!
//! It executes the low-level IR with the reference semantics of [`crate::ops`] in the declared
//! precision, exactly as compiled code does: every operation is performed in the statement's
//! compute precision ([`Program::compute_prec`](crate::low_level::Program::compute_prec): `f32` for `f16`, `bf16` and `f32`, `f64` when the
//! statement stores to or reads `f64`) with the same formula and the same C library functions
//! compiled code calls, and every store rounds to the storage precision. An `f32` program thus
//! computes what compiled `f32` code computes, overflow to infinity included. "Compiling" resolves the IR once into a tree with flat buffer offsets
//! and variable slots, so running does no lookups. Every access is checked: an index outside
//! its tensor is a typed [`Error::OutOfBounds`], never a stray memory access.

use half::{bf16, f16};

use super::host::{HostArena, HostBuffers};
use super::{Backend, BackendKind, BuildReport, BuildRequest, CompileOptions};
use crate::error::Error;
use crate::low_level::{Expr, IdxVar, Index, Kernel, Program, Stmt, Var};
use crate::ndarray::NdArray;
use crate::ops::{BinOp, Prec, TernOp, UnOp, uniform};
use crate::tnode::{NodeId, TensorNode, row_major_strides};

/// An affine function of variable slots.
#[derive(Clone, Debug)]
struct Lin {
    terms: Vec<(i64, usize)>,
    offset: i64,
}

impl Lin {
    #[inline]
    fn eval(&self, env: &[i64]) -> i64 {
        let mut x = self.offset;
        for &(c, s) in &self.terms {
            x += c * env[s];
        }
        x
    }
}

#[derive(Clone, Debug)]
struct Access {
    buf: usize,
    flat: Lin,
    axes: Vec<Lin>,
    dims: Vec<usize>,
}

#[derive(Clone, Debug)]
enum IExpr {
    Const(f64),
    Load(Box<Access>),
    Local(usize),
    IndexValue(Lin),
    Uniform(u64, Lin),
    Un(UnOp, Box<IExpr>),
    Bin(BinOp, Box<IExpr>, Box<IExpr>),
    Tern(TernOp, Box<IExpr>, Box<IExpr>, Box<IExpr>),
}

#[derive(Clone, Debug)]
enum IStmt {
    /// A loop; `limit` the slot of a dynamic size and the rows per iteration.
    For {
        slot: usize,
        extent: i64,
        limit: Option<(usize, i64)>,
        body: Vec<IStmt>,
    },
    If {
        guards: Vec<(Lin, i64)>,
        body: Vec<IStmt>,
    },
    Set {
        access: Access,
        compute: Prec,
        value: IExpr,
    },
    SetLocal {
        local: usize,
        prec: Prec,
        compute: Prec,
        value: IExpr,
    },
    /// A matrix product, run as the reduction nest it stands for.
    Gemm(Box<IGemm>),
    /// A call of the map kernel, run as the nest it stands for.
    Map(Box<IMap>),
    /// A kernel call (attention, a lookup): the kernel, the tensors' buffers (in the kernel's
    /// order, `None` for a gradient not wanted) and the descriptor's words.
    Call(Box<(Kernel, Vec<Option<usize>>, Vec<Lin>)>),
}

/// A [`crate::low_level::Map`] resolved: the operands' buffers and first cells (the result
/// first), and the descriptor's words.
#[derive(Clone, Debug)]
struct IMap {
    operands: Vec<(usize, Lin)>,
    desc: Vec<Lin>,
    prec: Prec,
}

/// A [`crate::low_level::Gemm`] resolved: the operands' buffers and first cells, and the
/// descriptor's fields.
#[derive(Clone, Debug)]
struct IGemm {
    /// `(buffer, offset)` of the result and the two operands.
    operands: [(usize, Lin); 3],
    desc: Vec<Lin>,
    prec: Prec,
    bf16_pairs: bool,
    /// The epilogue: the row's and the column's variable slots with their extents (outermost
    /// first), and the body each cell runs.
    epilogue: Option<IEpilogue>,
}

#[derive(Clone, Debug)]
struct IEpilogue {
    rows: Vec<(usize, i64)>,
    cols: Vec<(usize, i64)>,
    body: Vec<IStmt>,
}

#[derive(Debug)]
struct Compiled {
    body: Vec<IStmt>,
    bufs: Vec<NodeId>,
    labels: Vec<String>,
    env: Vec<i64>,
    locals: Vec<f64>,
    sym_base: usize,
    arena: HostArena,
}

/// The interpreter backend.
#[derive(Debug, Default)]
pub struct Interp {
    buffers: HostBuffers,
    /// `None` once released.
    routines: Vec<Option<Compiled>>,
    bounds_check: bool,
}

impl Interp {
    /// A new interpreter.
    pub fn new(opts: &CompileOptions) -> Interp {
        Interp {
            buffers: HostBuffers::default(),
            routines: Vec::new(),
            bounds_check: opts.bounds_check,
        }
    }
}

impl Interp {
    /// Compiles a program whose persistent buffers belong to `buffers`, another CPU backend's:
    /// the interpreter runs routines for a native backend this way when building native code
    /// would cost more than it saves ([`crate::Context::compile_once`]). Returns the routine's
    /// index for [`Interp::run_on`].
    pub fn compile_on(&mut self, prog: &Program, buffers: &HostBuffers) -> Result<usize, Error> {
        compile_in(&mut self.routines, prog, buffers)
    }

    /// Runs a routine of [`Interp::compile_on`] on the buffers it was compiled against.
    pub fn run_on(
        &mut self,
        routine: usize,
        symbols: &[i64],
        buffers: &HostBuffers,
    ) -> Result<(), Error> {
        run_in(&mut self.routines, routine, symbols, buffers, self.bounds_check)
    }

    /// Releases a routine of [`Interp::compile_on`] (its arena and code).
    pub fn release_on(&mut self, routine: usize) {
        if let Some(r) = self.routines.get_mut(routine) {
            *r = None;
        }
    }
}

fn compile_in(
    routines: &mut Vec<Option<Compiled>>,
    prog: &Program,
    buffers: &HostBuffers,
) -> Result<usize, Error> {
    let sym_base = prog.next_var as usize;
    let mut r = Resolver { prog, bufs: Vec::new(), buf_of: Default::default(), sym_base };
    let body = r.stmts(&prog.body);
    let bufs = r.bufs;
    let mut labels = Vec::with_capacity(bufs.len());
    let arena = HostArena::new(prog)?;
    for b in &bufs {
        if !buffers.contains(*b) && arena.slot(*b).is_none() {
            return Err(Error::UnknownNode(b.0));
        }
        labels.push(prog.nodes.get(b).map_or_else(String::new, |n| n.label.clone()));
    }
    routines.push(Some(Compiled {
        body,
        bufs,
        labels,
        env: vec![0; sym_base + prog.runtime_symbols.len()],
        locals: vec![0.0; prog.locals.len()],
        sym_base,
        arena,
    }));
    Ok(routines.len() - 1)
}

fn run_in(
    routines: &mut [Option<Compiled>],
    routine: usize,
    symbols: &[i64],
    buffers: &HostBuffers,
    bounds_check: bool,
) -> Result<(), Error> {
    let r = super::live_routine(routines, routine)?;
    let mut views = Vec::with_capacity(r.bufs.len());
    for b in &r.bufs {
        // A routine's intermediates live in its arena, even where a later routine gave the
        // node a buffer of its own.
        let view = match (r.arena.slot(*b), buffers.get(*b)) {
            (Some((ptr, node)), _) => View { ptr, len: node.num_elements(), prec: node.prec },
            (None, Some(buf)) => View { ptr: buf.as_ptr(), len: buf.len(), prec: buf.prec() },
            (None, None) => return Err(Error::UnknownNode(b.0)),
        };
        views.push(view);
    }
    for (k, v) in symbols.iter().enumerate() {
        if let Some(slot) = r.env.get_mut(r.sym_base + k) {
            *slot = *v;
        }
    }
    let m = Machine { views: &views, labels: &r.labels, nodes: &r.bufs, bounds_check };
    m.exec(&r.body, &mut r.env, &mut r.locals)
}

struct Resolver<'a> {
    prog: &'a Program,
    bufs: Vec<NodeId>,
    buf_of: rustc_hash::FxHashMap<NodeId, usize>,
    sym_base: usize,
}

impl Resolver<'_> {
    fn slot(&self, x: IdxVar) -> usize {
        match x {
            IdxVar::Loop(v) => v.0 as usize,
            IdxVar::Sym(s) => self.sym_base + self.prog.symbol_slot(s).unwrap_or(0),
        }
    }

    fn lin(&self, i: &Index) -> Lin {
        Lin { terms: i.terms.iter().map(|&(c, x)| (c, self.slot(x))).collect(), offset: i.offset }
    }

    fn access(&mut self, node: NodeId, idx: &[Index]) -> Access {
        let next = self.bufs.len();
        let buf = *self.buf_of.entry(node).or_insert(next);
        if buf == next {
            self.bufs.push(node);
        }
        let dims = self.prog.nodes.get(&node).map_or_else(Vec::new, |n| n.dims.clone());
        let strides = row_major_strides(&dims);
        let mut flat = Index::fixed(0);
        for (i, s) in idx.iter().zip(&strides) {
            let scaled = Index::new(i.terms.iter().map(|&(c, x)| (c * *s as i64, x)).collect(), 0);
            flat = Index::new(
                flat.terms.iter().copied().chain(scaled.terms).collect(),
                flat.offset + i.offset * *s as i64,
            );
        }
        Access { buf, flat: self.lin(&flat), axes: idx.iter().map(|i| self.lin(i)).collect(), dims }
    }

    fn expr(&mut self, e: &Expr) -> IExpr {
        match e {
            Expr::Const(c) => IExpr::Const(*c),
            Expr::Get(n, idx) => IExpr::Load(Box::new(self.access(*n, idx))),
            Expr::Local(l) => IExpr::Local(l.0 as usize),
            Expr::IndexValue(i) => IExpr::IndexValue(self.lin(i)),
            Expr::Uniform { seed, offset } => IExpr::Uniform(*seed, self.lin(offset)),
            Expr::Unop(op, a) => IExpr::Un(*op, Box::new(self.expr(a))),
            Expr::Binop(op, a, b) => {
                IExpr::Bin(*op, Box::new(self.expr(a)), Box::new(self.expr(b)))
            }
            Expr::Ternop(op, a, b, c) => IExpr::Tern(
                *op,
                Box::new(self.expr(a)),
                Box::new(self.expr(b)),
                Box::new(self.expr(c)),
            ),
        }
    }

    fn stmts(&mut self, body: &[Stmt]) -> Vec<IStmt> {
        body.iter().filter_map(|s| self.stmt(s)).collect()
    }

    fn stmt(&mut self, s: &Stmt) -> Option<IStmt> {
        Some(match s {
            Stmt::Comment(_) => return None,
            Stmt::For { var, extent, limit, body, .. } => IStmt::For {
                slot: var.0 as usize,
                extent: *extent as i64,
                limit: limit.map(|l| {
                    (self.sym_base + self.prog.symbol_slot(l.size).unwrap_or(0), l.per as i64)
                }),
                body: self.stmts(body),
            },
            Stmt::If { guards, body } => IStmt::If {
                guards: guards.iter().map(|g| (self.lin(&g.index), g.bound as i64)).collect(),
                body: self.stmts(body),
            },
            Stmt::Set { node, idx, value } => {
                let prec = self.prog.nodes.get(node).map_or(Prec::F64, |n| n.prec);
                let compute = self.prog.compute_prec(value, prec);
                let value = self.expr(value);
                IStmt::Set { access: self.access(*node, idx), compute, value }
            }
            Stmt::SetLocal { local, value } => {
                let prec = self.prog.locals[local.0 as usize];
                IStmt::SetLocal {
                    local: local.0 as usize,
                    prec,
                    compute: self.prog.compute_prec(value, prec),
                    value: self.expr(value),
                }
            }
            Stmt::Gemm(g) => {
                let operands = g.operands().map(|o| {
                    let next = self.bufs.len();
                    let buf = *self.buf_of.entry(o.node).or_insert(next);
                    if buf == next {
                        self.bufs.push(o.node);
                    }
                    (buf, self.lin(&o.offset))
                });
                let desc = g.descriptor().iter().map(|i| self.lin(i)).collect();
                let slots = |axis: &[(Var, usize)]| -> Vec<(usize, i64)> {
                    axis.iter().map(|(v, e)| (v.0 as usize, *e as i64)).collect()
                };
                let epilogue = g.epilogue.as_ref().map(|e| IEpilogue {
                    rows: slots(&e.rows),
                    cols: slots(&e.cols),
                    body: self.stmts(&e.body),
                });
                IStmt::Gemm(Box::new(IGemm {
                    operands,
                    desc,
                    prec: g.prec,
                    bf16_pairs: g.bf16_pairs,
                    epilogue,
                }))
            }
            Stmt::Map(m) => {
                let operands = m
                    .operands()
                    .map(|o| {
                        let next = self.bufs.len();
                        let buf = *self.buf_of.entry(o.node).or_insert(next);
                        if buf == next {
                            self.bufs.push(o.node);
                        }
                        (buf, self.lin(&o.offset))
                    })
                    .collect();
                let desc = m.descriptor().iter().map(|i| self.lin(i)).collect();
                IStmt::Map(Box::new(IMap { operands, desc, prec: m.prec }))
            }
            Stmt::Call(c) => {
                let bufs = c.pointers().into_iter().map(|n| {
                    n.map(|n| {
                        let next = self.bufs.len();
                        let buf = *self.buf_of.entry(n).or_insert(next);
                        if buf == next {
                            self.bufs.push(n);
                        }
                        buf
                    })
                });
                let bufs = bufs.collect();
                let desc = c.descriptor().iter().map(|i| self.lin(i)).collect();
                IStmt::Call(Box::new((c.kernel(), bufs, desc)))
            }
        })
    }
}

/// A raw view of one buffer during a run.
#[derive(Clone, Copy)]
struct View {
    ptr: *mut u8,
    len: usize,
    prec: Prec,
}

struct Machine<'a> {
    views: &'a [View],
    labels: &'a [String],
    nodes: &'a [NodeId],
    bounds_check: bool,
}

impl Machine<'_> {
    fn offset(&self, a: &Access, env: &[i64]) -> Result<usize, Error> {
        let off = a.flat.eval(env);
        let view = &self.views[a.buf];
        if self.bounds_check || off < 0 || off as usize >= view.len {
            for (axis, (lin, &d)) in a.axes.iter().zip(&a.dims).enumerate() {
                let i = lin.eval(env);
                if i < 0 || i >= d as i64 {
                    return Err(Error::OutOfBounds {
                        node: self.nodes[a.buf].0,
                        label: self.labels[a.buf].clone(),
                        axis,
                        index: i,
                        bound: d,
                    });
                }
            }
        }
        if off < 0 || off as usize >= view.len {
            return Err(Error::OutOfBounds {
                node: self.nodes[a.buf].0,
                label: self.labels[a.buf].clone(),
                axis: 0,
                index: off,
                bound: view.len,
            });
        }
        Ok(off as usize)
    }

    fn load(&self, a: &Access, env: &[i64]) -> Result<f64, Error> {
        let off = self.offset(a, env)?;
        let v = self.views[a.buf];
        // SAFETY: `off < len` was checked and the buffer holds `len` elements of `prec`.
        Ok(unsafe {
            match v.prec {
                Prec::F32 => *(v.ptr as *const f32).add(off) as f64,
                Prec::F64 => *(v.ptr as *const f64).add(off),
                Prec::F16 => f16::from_bits(*(v.ptr as *const u16).add(off)).to_f64(),
                Prec::Bf16 => bf16::from_bits(*(v.ptr as *const u16).add(off)).to_f64(),
                Prec::U32 => *(v.ptr as *const u32).add(off) as f64,
            }
        })
    }

    fn store(&self, a: &Access, env: &[i64], x: f64) -> Result<(), Error> {
        let off = self.offset(a, env)?;
        let v = self.views[a.buf];
        // SAFETY: as in `load`; no other reference to the buffer is live during a run.
        unsafe {
            match v.prec {
                Prec::F32 => *(v.ptr as *mut f32).add(off) = x as f32,
                Prec::F64 => *(v.ptr as *mut f64).add(off) = x,
                // As compiled code stores: the value (computed in f32, or in f64 for a
                // statement reading f64) goes to f32, then to nearest even.
                Prec::F16 => *(v.ptr as *mut u16).add(off) = f16::from_f32(x as f32).to_bits(),
                Prec::Bf16 => *(v.ptr as *mut u16).add(off) = bf16::from_f32(x as f32).to_bits(),
                // Toward zero, saturating, nan to 0: as compiled code (`rc_to_u32`).
                Prec::U32 => *(v.ptr as *mut u32).add(off) = x as u32,
            }
        }
        Ok(())
    }

    /// Evaluates `e` in the compute precision `p`: in `f32`, every operation is the `f32`
    /// operation compiled code performs; in `f64`, the `f64` one.
    fn eval(&self, e: &IExpr, env: &[i64], locals: &[f64], p: Prec) -> Result<f64, Error> {
        let single = p == Prec::F32;
        Ok(match e {
            IExpr::Const(c) => p.round(*c),
            // A statement computes in f32 only when it reads no f64 tensor or local, so loads and
            // locals are exact in its precision already.
            IExpr::Load(a) => {
                let x = self.load(a, env)?;
                // An id converts to the compute precision as compiled code converts it.
                if single && self.views[a.buf].prec == Prec::U32 { x as f32 as f64 } else { x }
            }
            IExpr::Local(l) => locals[*l],
            IExpr::IndexValue(i) => p.round(i.eval(env) as f64),
            IExpr::Uniform(seed, i) => p.round(uniform(*seed, i.eval(env) as u64)),
            IExpr::Un(op, a) => {
                let a = self.eval(a, env, locals, p)?;
                if single { op.apply_f32(a as f32) as f64 } else { op.apply(a) }
            }
            IExpr::Bin(op, a, b) => {
                let (a, b) = (self.eval(a, env, locals, p)?, self.eval(b, env, locals, p)?);
                if single { op.apply_f32(a as f32, b as f32) as f64 } else { op.apply(a, b) }
            }
            IExpr::Tern(op, a, b, c) => {
                let a = self.eval(a, env, locals, p)?;
                let b = self.eval(b, env, locals, p)?;
                let c = self.eval(c, env, locals, p)?;
                if single {
                    op.apply_f32(a as f32, b as f32, c as f32) as f64
                } else {
                    op.apply(a, b, c)
                }
            }
        })
    }

    fn exec(&self, body: &[IStmt], env: &mut [i64], locals: &mut [f64]) -> Result<(), Error> {
        for s in body {
            match s {
                IStmt::For { slot, extent, limit, body } => {
                    // A dynamic batch's rows past its size are not needed: stop there.
                    let end = match limit {
                        Some((size, per)) => (*extent).min((env[*size] + per - 1) / per),
                        None => *extent,
                    };
                    for i in 0..end {
                        env[*slot] = i;
                        self.exec(body, env, locals)?;
                    }
                }
                IStmt::If { guards, body } => {
                    if guards.iter().all(|(g, b)| (0..*b).contains(&g.eval(env))) {
                        self.exec(body, env, locals)?;
                    }
                }
                IStmt::Set { access, compute, value } => {
                    let x = self.eval(value, env, locals, *compute)?;
                    self.store(access, env, x)?;
                }
                IStmt::SetLocal { local, prec, compute, value } => {
                    let x = self.eval(value, env, locals, *compute)?;
                    locals[*local] = prec.round(x);
                }
                IStmt::Gemm(g) => self.gemm(g, env, locals)?,
                IStmt::Map(m) => self.map(m, env)?,
                IStmt::Call(c) => match c.0 {
                    Kernel::AttentionF32 => self.attention(&c.1, &c.2, env)?,
                    Kernel::GatherF32 => self.gather(&c.1, &c.2, env)?,
                },
            }
        }
        Ok(())
    }

    /// A product cell by cell, each a reduction in order: `t := 0` (or the cell), `t :=
    /// fma(a, b, t)` (or `t + a·b`, the product rounded) in the operands' precision.
    /// Then the epilogue on every cell of the call, row by row.
    fn gemm(&self, g: &IGemm, env: &mut [i64], locals: &mut [f64]) -> Result<(), Error> {
        let v: Vec<i64> = g.desc.iter().map(|l| l.eval(env)).collect();
        let d = crate::kernels::GemmDesc {
            rsc: v[0],
            csc: v[1],
            rsa: v[2],
            csa: v[3],
            rsb: v[4],
            csb: v[5],
            row_start: v[6],
            row_count: v[7],
            m: v[8],
            m_dyn: v[9],
            n: v[10],
            n_dyn: v[11],
            k: v[12],
            k_dyn: v[13],
            flags: v[14],
        };
        let (m, n, k, start) = d.clip();
        let [(cb, co), (ab, ao), (bb, bo)] = &g.operands;
        let (c0, a0, b0) = (co.eval(env), ao.eval(env), bo.eval(env));
        let accumulate = d.flags & crate::kernels::GEMM_ACCUMULATE != 0;
        let fused = d.flags & crate::kernels::GEMM_FUSED != 0;
        let single = g.prec == Prec::F32;
        for i in start as i64..start as i64 + m as i64 {
            for j in 0..n as i64 {
                let c = c0 + i * d.rsc + j * d.csc;
                let mut t = if accumulate { self.load_flat(*cb, c)? } else { 0.0 };
                if g.bf16_pairs {
                    // The host's bf16 dot products' pairwise order (`kernels::bf16`).
                    let factors = |p: i64| -> Result<(f32, f32), Error> {
                        if p >= k as i64 {
                            return Ok((0.0, 0.0));
                        }
                        let x = self.load_flat(*ab, a0 + i * d.rsa + p * d.csa)?;
                        let y = self.load_flat(*bb, b0 + p * d.rsb + j * d.csb)?;
                        Ok((x as f32, y as f32))
                    };
                    let mut s = t as f32;
                    for p in 0..(k as i64 + 1) / 2 {
                        s = crate::kernels::bf16::pair_step(
                            s,
                            factors(2 * p)?,
                            factors(2 * p + 1)?,
                        );
                    }
                    self.store_flat(*cb, c, s as f64)?;
                    continue;
                }
                for p in 0..k as i64 {
                    let x = self.load_flat(*ab, a0 + i * d.rsa + p * d.csa)?;
                    let y = self.load_flat(*bb, b0 + p * d.rsb + j * d.csb)?;
                    t = match (fused, single) {
                        (true, true) => (x as f32).mul_add(y as f32, t as f32) as f64,
                        (true, false) => x.mul_add(y, t),
                        (false, true) => (t as f32 + x as f32 * y as f32) as f64,
                        (false, false) => t + x * y,
                    };
                }
                self.store_flat(*cb, c, t)?;
            }
        }
        let Some(e) = &g.epilogue else { return Ok(()) };
        fn split(env: &mut [i64], axis: &[(usize, i64)], mut x: i64) {
            for &(slot, extent) in axis.iter().rev() {
                env[slot] = x % extent.max(1);
                x /= extent.max(1);
            }
        }
        for i in start as i64..start as i64 + m as i64 {
            split(env, &e.rows, i);
            for j in 0..n as i64 {
                split(env, &e.cols, j);
                self.exec(&e.body, env, locals)?;
            }
        }
        Ok(())
    }

    /// A map or reduction cell by cell, each cell's points in row-major order, every operation
    /// rounded to the call's precision — the nest the call stands for.
    fn map(&self, m: &IMap, env: &[i64]) -> Result<(), Error> {
        use crate::kernels::map::{MapAxisDesc, MapCode, MapDesc};
        let words: Vec<i64> = m.desc.iter().map(|l| l.eval(env)).collect();
        let d = MapDesc::decode(&words).ok_or_else(|| Error::Verify {
            pass: "schedule",
            reason: format!("a map call's descriptor does not decode: {words:?}"),
        })?;
        let single = m.prec == Prec::F32;
        let round = |x: f64| if single { x as f32 as f64 } else { x };
        let bases: Vec<i64> = m.operands.iter().map(|(_, l)| l.eval(env)).collect();
        // Offsets of the result and inputs at every point of `axes`, row-major.
        fn points(axes: &[MapAxisDesc], base: Vec<i64>, out: &mut Vec<Vec<i64>>) {
            match axes.split_first() {
                None => out.push(base),
                Some((a, rest)) => {
                    for i in 0..a.n as i64 {
                        let mut o = base.clone();
                        o[0] += i * a.out as i64;
                        for (x, s) in o[1..].iter_mut().zip(&a.steps) {
                            *x += i * *s as i64;
                        }
                        points(rest, o, out);
                    }
                }
            }
        }
        let value = |at: &[i64]| -> Result<f64, Error> {
            let mut stack: Vec<f64> = Vec::with_capacity(8);
            for c in &d.code {
                let x = match *c {
                    MapCode::Input(i) => self.load_flat(m.operands[1 + i].0, at[1 + i])?,
                    MapCode::Const(x) => round(x),
                    MapCode::Un(op) => {
                        let a = stack.pop().unwrap_or_default();
                        if single { op.apply_f32(a as f32) as f64 } else { op.apply(a) }
                    }
                    MapCode::Bin(op) => {
                        let b = stack.pop().unwrap_or_default();
                        let a = stack.pop().unwrap_or_default();
                        if single {
                            op.apply_f32(a as f32, b as f32) as f64
                        } else {
                            op.apply(a, b)
                        }
                    }
                    MapCode::Tern(op) => {
                        let c = stack.pop().unwrap_or_default();
                        let b = stack.pop().unwrap_or_default();
                        let a = stack.pop().unwrap_or_default();
                        if single {
                            op.apply_f32(a as f32, b as f32, c as f32) as f64
                        } else {
                            op.apply(a, b, c)
                        }
                    }
                };
                stack.push(x);
            }
            Ok(stack.pop().unwrap_or_default())
        };
        let mut cells = Vec::new();
        points(&d.cells, bases, &mut cells);
        let out_buf = m.operands[0].0;
        for cell in cells {
            let Some(r) = d.reduce else {
                let x = value(&cell)?;
                self.store_flat(out_buf, cell[0], x)?;
                continue;
            };
            let mut t = match (d.accumulate, r.neutral()) {
                (true, _) | (false, None) => self.load_flat(out_buf, cell[0])?,
                (false, Some(n)) => round(n),
            };
            let mut pts = Vec::new();
            points(&d.points, cell.clone(), &mut pts);
            for p in pts {
                let x = value(&p)?;
                t = if single { r.apply_f32(t as f32, x as f32) as f64 } else { r.apply(t, x) };
            }
            self.store_flat(out_buf, cell[0], t)?;
        }
        Ok(())
    }

    /// One part of a lookup, by the kernel itself (the nests it stands for are
    /// [`crate::low_level::expand_calls`]'s, which is what this backend's routines run): the
    /// table and output checked to be `f32`, the ids `u32` or `f32`, each holding the cells the
    /// sizes address.
    fn gather(&self, bufs: &[Option<usize>], desc: &[Lin], env: &[i64]) -> Result<(), Error> {
        use crate::kernels::gather::{DESC_LEN, Gather};
        let mut words = [0i64; DESC_LEN];
        for (w, l) in words.iter_mut().zip(desc) {
            *w = l.eval(env);
        }
        let (g, backward, start, count, used) = Gather::from_descriptor(&words);
        let table_cells =
            (g.rows.max(1) - 1) * g.row_step + (g.vocab.max(1) - 1) * g.vocab_step + 1;
        let ids_prec = if g.ids_f32 { Prec::F32 } else { Prec::U32 };
        let want = [(Prec::F32, table_cells), (ids_prec, g.tokens), (Prec::F32, g.tokens * g.rows)];
        let mut ptrs = [std::ptr::null_mut::<f32>(); 3];
        for (k, (buf, (prec, cells))) in bufs.iter().zip(want).enumerate() {
            let view = buf.map(|b| (b, &self.views[b]));
            match view {
                Some((_, v)) if v.prec == prec && v.len >= cells => ptrs[k] = v.ptr.cast(),
                _ => {
                    return Err(Error::Verify {
                        pass: "interpreter",
                        reason: format!("lookup tensor {k} does not fit {g:?}"),
                    });
                }
            }
        }
        let [table, ids, out] = ptrs;
        // SAFETY: each buffer holds the cells the sizes address in the kernel's precisions
        // (checked above); the result is a distinct node from the inputs.
        unsafe {
            if backward {
                g.backward(table, ids.cast_const().cast(), out, start, count, used);
            } else {
                g.forward(table, ids.cast_const().cast(), out, start, count, used);
            }
        }
        Ok(())
    }

    /// One pair of a fused attention, by the kernel itself (the nests it stands for are
    /// [`crate::low_level::expand_calls`]'s, which is what this backend's routines run):
    /// each tensor's buffer checked to be `f32` and to hold the cells the sizes address.
    fn attention(&self, bufs: &[Option<usize>], desc: &[Lin], env: &[i64]) -> Result<(), Error> {
        use crate::kernels::attention::{self as att, Attention, DESC_LEN, POINTERS};
        let mut words = [0i64; DESC_LEN];
        for (w, l) in words.iter_mut().zip(desc) {
            *w = l.eval(env);
        }
        let (a, backward, pair) = Attention::from_descriptor(&words);
        let (b, s, t, h) = (a.batch, a.queries, a.keys, a.heads);
        let need = [
            s * a.depth,
            t * a.depth,
            t * a.width,
            s * a.width,
            s,
            s * a.width,
            s * a.depth,
            t * a.depth,
            t * a.width,
        ];
        let mut ptrs = [std::ptr::null_mut::<f32>(); POINTERS];
        for (k, buf) in bufs.iter().enumerate().take(POINTERS) {
            let Some(buf) = *buf else { continue };
            let view = &self.views[buf];
            if view.prec != Prec::F32 || view.len < b * h * need[k] || pair >= a.pairs() {
                return Err(Error::Verify {
                    pass: "interpreter",
                    reason: format!(
                        "attention tensor n{} of {} cells in {} for {a:?}, pair {pair}",
                        self.nodes[buf].0,
                        view.len,
                        view.prec.name()
                    ),
                });
            }
            ptrs[k] = view.ptr.cast();
        }
        let isa = crate::kernels::Isa::host();
        // SAFETY: each buffer is an f32 tensor holding the cells the sizes address (checked
        // above); the results are distinct nodes from the inputs (the verifier's contract).
        unsafe {
            if backward {
                let [q, k, v, out, lse, d_out, d_q, d_k, d_v] = ptrs;
                let g = att::Backward { q, k, v, out, lse, d_out, d_q, d_k, d_v };
                att::backward(&a, g, pair..pair + 1, isa);
            } else {
                let [q, k, v, out, lse, ..] = ptrs;
                att::forward(&a, att::Forward { q, k, v, out, lse }, pair..pair + 1, isa);
            }
        }
        Ok(())
    }

    /// The flat offset `off` of buffer `buf`, checked.
    fn flat(&self, buf: usize, off: i64) -> Result<usize, Error> {
        let view = &self.views[buf];
        if off < 0 || off as usize >= view.len {
            return Err(Error::OutOfBounds {
                node: self.nodes[buf].0,
                label: self.labels[buf].clone(),
                axis: 0,
                index: off,
                bound: view.len,
            });
        }
        Ok(off as usize)
    }

    fn load_flat(&self, buf: usize, off: i64) -> Result<f64, Error> {
        let a = Access {
            buf,
            flat: Lin { terms: vec![], offset: self.flat(buf, off)? as i64 },
            axes: vec![],
            dims: vec![],
        };
        self.load(&a, &[])
    }

    fn store_flat(&self, buf: usize, off: i64, x: f64) -> Result<(), Error> {
        let a = Access {
            buf,
            flat: Lin { terms: vec![], offset: self.flat(buf, off)? as i64 },
            axes: vec![],
            dims: vec![],
        };
        self.store(&a, &[], x)
    }
}

impl Backend for Interp {
    fn kind(&self) -> BackendKind {
        BackendKind::Interp
    }

    fn render(&self, prog: &Program) -> Result<String, Error> {
        Ok(prog.to_string())
    }

    fn compile(&mut self, prog: &Program, _req: &BuildRequest) -> Result<super::Compiled, Error> {
        let routine = compile_in(&mut self.routines, prog, &self.buffers)?;
        Ok(super::Compiled { routine, listing: prog.to_string(), report: BuildReport::default() })
    }

    fn host_buffers(&self) -> Option<&HostBuffers> {
        Some(&self.buffers)
    }

    fn alloc(&mut self, node: &TensorNode) -> Result<(), Error> {
        self.buffers.alloc(node)
    }

    fn has_buffer(&self, node: NodeId) -> bool {
        self.buffers.contains(node)
    }

    fn release(&mut self, routine: usize) -> Result<(), Error> {
        self.release_on(routine);
        Ok(())
    }

    fn run(&mut self, routine: usize, symbols: &[i64]) -> Result<(), Error> {
        run_in(&mut self.routines, routine, symbols, &self.buffers, self.bounds_check)
    }

    fn write(&mut self, node: NodeId, data: &NdArray) -> Result<(), Error> {
        self.buffers.write(node, data)
    }

    fn read(&self, node: NodeId) -> Result<NdArray, Error> {
        self.buffers.read(node)
    }
}

//! Sessions: from a finished graph to compiled routines and values.
//!
//! A [`Session`] pairs a [`Graph`] with a compiler context (one backend and its buffers). It
//! gives every tensor a compiler node (and every differentiable tensor a gradient node), asks
//! each operation for its code, and compiles whole sequences — a forward pass, forward plus
//! backpropagation, or a complete training step with the optimizer's update — into one routine
//! each. Buffers are shared between the routines of a session, so parameters written by the
//! initialization routine are the ones a training step updates and an evaluation reads.
//!
//! Memory: parameters, data, requested outputs and optimizer state are host-visible; every
//! other tensor is an intermediate the compiler may inline away. Host values in and out of the
//! buffers (writes, reads, the extra nodes) are in `values.rs`.

use std::sync::Arc;

use rocannl_arrayjit::assignments::{Asgn, FetchOp, ScalarExpr};
use rocannl_arrayjit::indexing::{AxisIndex, Projections, Symbol, SymbolGen};
use rocannl_arrayjit::ops::Prec;
use rocannl_arrayjit::tnode::{MemoryMode, NodeId, NodeTable, TensorNode};
use rocannl_arrayjit::{BackendKind, CompileOptions, Context};

use crate::routine::Routine;
use rustc_hash::{FxHashMap, FxHashSet};

use crate::dynamic::DynAxes;
use crate::error::{Error, Result};
use crate::graph::{Graph, Leaf, Source, Tensor, TensorId};
use crate::init::{InitTarget, derive_seed, init_code};
use crate::mode::Mode;
use crate::op::OpCtx;

mod buffer_code;
mod run;
mod values;

/// How a session compiles.
#[derive(Clone, Debug)]
pub struct SessionOptions {
    /// The backend.
    pub backend: BackendKind,
    /// The precision of every tensor (of the activations and their gradients, under
    /// [`SessionOptions::master`]).
    pub prec: Prec,
    /// Mixed precision: parameters, their gradients and the optimizer's state are stored in
    /// this precision (f32 master weights), everything else in [`SessionOptions::prec`].
    /// Arithmetic on values of half precisions is carried out in f32 either way, and products
    /// accumulate in f32. `None`: everything in `prec`.
    pub master: Option<Prec>,
    /// Under mixed precision in bf16, products (matmul, `fma`, einsum sums and means that
    /// contract an axis) read a bf16 copy of each parameter that is one of their factors,
    /// rounded once per run of a routine, as PyTorch's autocast does: both factors in bf16, the
    /// accumulation in f32, the parameter's gradient still in the master precision. Only a
    /// parameter that is itself the factor is cast; one reached through another operation (a
    /// transpose, a slice) is read in the master precision. On a host with AVX-512 BF16, such
    /// products of at least 64 reduction steps run on its bf16 dot products (docs/models.md,
    /// "Mixed precision"); elsewhere they convert their factors to f32 and add the steps in
    /// order, as the interpreter does, so such products differ in their last bits between the
    /// two kinds of host (`ROCANNL_ISA=avx2` gives the interpreter's bits anywhere). `false`:
    /// products read the master weights themselves (more precise, slower). f16 sessions do not cast: with no f16 products on the CPU a copy would only add
    /// conversions.
    pub autocast: bool,
    /// Compiler settings.
    pub compile: CompileOptions,
    /// Data parallelism: the group of workers this session is one rank of. Its training
    /// steps then average their gradients over the group before every update, rank 0's
    /// parameters are broadcast when a step is compiled, and only rank 0 writes checkpoints
    /// (docs/distributed.md). `None`: one process.
    pub data_parallel: Option<crate::parallel::Group>,
}

impl Default for SessionOptions {
    fn default() -> Self {
        SessionOptions {
            backend: BackendKind::default(),
            prec: Prec::F32,
            master: None,
            autocast: true,
            compile: CompileOptions::default(),
            data_parallel: None,
        }
    }
}

/// A graph bound to a backend: compiled routines and the buffers they share.
pub struct Session {
    graph: Graph,
    pub(crate) ctx: Context,
    prec: Prec,
    /// The precision of parameters, their gradients and optimizer state.
    master: Prec,
    /// [`SessionOptions::autocast`].
    autocast: bool,
    /// Each parameter's copy in the session's precision, read by products under autocast.
    cast: FxHashMap<TensorId, NodeId>,
    /// The parameter of each copy.
    cast_source: FxHashMap<NodeId, TensorId>,
    /// The copies whose code the routine being generated already has.
    cast_done: FxHashSet<NodeId>,
    value: FxHashMap<TensorId, NodeId>,
    grad: FxHashMap<TensorId, NodeId>,
    /// Nodes that are not tensors of the graph (optimizer state, scratch, scalars).
    extra: FxHashMap<NodeId, TensorNode>,
    /// The nodes of the tensors each operation keeps besides its result ([`Session::aux_of`]).
    aux: FxHashMap<TensorId, Vec<NodeId>>,
    next_node: u32,
    proj: FxHashMap<TensorId, Vec<Arc<Projections>>>,
    /// Leaves whose host data or initialization has been written.
    ready: FxHashSet<TensorId>,
    /// The data tensors (written by the host) each compiled routine reads, by routine number.
    pub(crate) data_reads: FxHashMap<usize, Vec<TensorId>>,
    /// Data tensors whose values the host has written.
    pub(crate) written: FxHashSet<TensorId>,
    /// Extra nodes that are host visible.
    persistent: FxHashSet<NodeId>,
    pub(crate) symbols: SymbolGen,
    /// The dynamic axes of each tensor whose projections were derived ([`crate::dynamic`]).
    pub(crate) dyn_axes: FxHashMap<TensorId, DynAxes>,
    /// The current value of each dynamic size set with [`Session::set_size`].
    pub(crate) sizes: FxHashMap<Symbol, usize>,
    /// [`SessionOptions::data_parallel`].
    group: Option<crate::parallel::Group>,
    /// This rank's weight in a data-parallel mean ([`Session::set_local_examples`]).
    pub(crate) local_weight: f64,
    /// The value of each runtime index bound by the session's user through a handle (a
    /// loader's batch, [`crate::train::Loader::set_batch`]).
    pub(crate) bound: FxHashMap<Symbol, i64>,
    /// Runs of routines reading the graph's step counter outside training steps: each such run
    /// binds the counter to the next number.
    pub(crate) runs: u64,
}

impl std::fmt::Debug for Session {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Session({:?}, {})", self.ctx.kind(), self.prec.name())
    }
}

/// What a compiled routine needs to produce.
#[derive(Clone, Debug, Default)]
pub struct Plan {
    /// Tensors whose values must be readable afterwards.
    pub outputs: Vec<Tensor>,
    /// Backpropagate from this tensor (its gradient seeded with ones).
    pub backprop_from: Option<Tensor>,
    /// Tensors whose gradients must be readable afterwards.
    pub grads: Vec<Tensor>,
    /// The mode the routine computes in ([`Mode`]; eval unless set).
    pub mode: Mode,
}

/// A plan's code: the forward (and backward) pass, the buffers' updates that end the routine,
/// and the nodes of the buffers' new values, which must survive until then.
pub(crate) struct PlanCode {
    pub code: Vec<Asgn>,
    pub buffer_updates: Vec<Asgn>,
    pub kept: Vec<NodeId>,
}

impl Session {
    /// A session on the default backend in `f32`. Finishes shape inference first, so shape
    /// errors of the graph surface here.
    ///
    /// ```
    /// use rocannl_tensor::{Graph, Session};
    /// let g = Graph::new();
    /// let x = g.vector("x", &[1.0, 2.0, 3.0]);
    /// let y = (&x * 2.0).relu();
    /// let mut s = Session::new(&g).unwrap();
    /// let r = s.forward(&[&y]).unwrap();
    /// s.run(&r).unwrap();
    /// assert_eq!(s.read(&y).unwrap(), vec![2.0, 4.0, 6.0]);
    /// ```
    pub fn new(graph: &Graph) -> Result<Session> {
        Session::with_options(graph, SessionOptions::default())
    }

    /// A session with explicit options.
    pub fn with_options(graph: &Graph, opts: SessionOptions) -> Result<Session> {
        graph.finish()?;
        let ctx = Context::new(opts.backend, opts.compile)?;
        Ok(Session {
            graph: graph.clone(),
            ctx,
            prec: opts.prec,
            master: opts.master.unwrap_or(opts.prec),
            autocast: opts.autocast,
            cast: FxHashMap::default(),
            cast_source: FxHashMap::default(),
            cast_done: FxHashSet::default(),
            value: FxHashMap::default(),
            grad: FxHashMap::default(),
            extra: FxHashMap::default(),
            aux: FxHashMap::default(),
            next_node: 0,
            proj: FxHashMap::default(),
            ready: FxHashSet::default(),
            data_reads: FxHashMap::default(),
            written: FxHashSet::default(),
            persistent: FxHashSet::default(),
            symbols: SymbolGen::starting_at(1 << 20),
            dyn_axes: FxHashMap::default(),
            sizes: FxHashMap::default(),
            group: opts.data_parallel,
            local_weight: 1.0,
            bound: FxHashMap::default(),
            runs: 0,
        })
    }

    /// The group of workers this session is a rank of ([`SessionOptions::data_parallel`]).
    pub fn group(&self) -> Option<&crate::parallel::Group> {
        self.group.as_ref()
    }

    /// How many examples of the global batch this rank's next steps see, under data
    /// parallelism: each rank's gradients (and loss) are weighted by it in the mean over the
    /// ranks, so that shards of unequal size (a smaller last shard) give the mean over the
    /// global batch, as one process would — for a loss that is a mean over its batch, as every
    /// loss of [`crate::nn::loss`] is by default. Until it is set every rank weighs the same
    /// (as PyTorch's DDP). Without data parallelism it changes nothing.
    pub fn set_local_examples(&mut self, n: usize) -> Result<()> {
        if n == 0 {
            return Err(Error::usage(
                "a rank's shard of the global batch must hold at least one example",
            ));
        }
        self.local_weight = n as f64;
        Ok(())
    }

    /// The graph.
    pub fn graph(&self) -> &Graph {
        &self.graph
    }

    /// The backend.
    pub fn backend(&self) -> BackendKind {
        self.ctx.kind()
    }

    /// The precision of the tensors (of the activations, under mixed precision).
    pub fn prec(&self) -> Prec {
        self.prec
    }

    /// The precision parameters, their gradients and the optimizer's state are stored in
    /// ([`SessionOptions::master`]; else [`Session::prec`]).
    pub fn master_prec(&self) -> Prec {
        self.master
    }

    fn fresh_node(&mut self) -> NodeId {
        self.next_node += 1;
        NodeId(self.next_node - 1)
    }

    /// The compiler node holding a tensor's value.
    pub(crate) fn node(&mut self, t: &Tensor) -> NodeId {
        self.node_of(t.id)
    }

    /// The storage precision of a tensor's value and gradient: the master precision for
    /// parameters, f32 for the statistics a half-precision session keeps in f32
    /// (`Tensor::kept_in_f32`), the session's for everything else.
    fn prec_of(&self, t: TensorId) -> Prec {
        if self.graph.borrow().ids.contains(&t) {
            return Prec::U32;
        }
        match self.graph.tensor(t).info().source {
            Source::Leaf(Leaf::Param(_) | Leaf::Buffer(_)) => self.master,
            _ if matches!(self.prec, Prec::F16 | Prec::Bf16)
                && self.graph.borrow().f32_stats.contains(&t) =>
            {
                Prec::F32
            }
            _ => self.prec,
        }
    }

    fn node_of(&mut self, t: TensorId) -> NodeId {
        if let Some(n) = self.value.get(&t) {
            return *n;
        }
        let n = self.fresh_node();
        self.value.insert(t, n);
        n
    }

    fn grad_of(&mut self, t: TensorId) -> NodeId {
        if let Some(n) = self.grad.get(&t) {
            return *n;
        }
        let n = self.fresh_node();
        self.grad.insert(t, n);
        n
    }

    /// A node outside the graph with the given dims: optimizer state (`persistent`) or scratch.
    pub(crate) fn extra_node(&mut self, label: &str, dims: &[usize], persistent: bool) -> NodeId {
        let n = self.fresh_node();
        let mode = if persistent { MemoryMode::HostVisible } else { MemoryMode::Virtual };
        self.extra.insert(n, TensorNode::new(n, label, dims, self.master, mode));
        if persistent {
            self.persistent.insert(n);
        }
        n
    }

    fn dims(&self, t: TensorId) -> Result<Vec<usize>> {
        self.graph.tensor(t).dims()
    }

    /// The tensors `roots` depend on, each after its arguments.
    pub(crate) fn topo(&self, roots: &[TensorId]) -> Vec<TensorId> {
        self.topo_in(roots, None)
    }

    /// The tensors `roots` depend on in a routine of `mode` (every argument when `None`;
    /// else only the branch of its mode of a [`Tensor::by_mode`]), each after its arguments.
    pub(crate) fn topo_in(&self, roots: &[TensorId], mode: Option<Mode>) -> Vec<TensorId> {
        let g = self.graph.borrow();
        let mut order = Vec::new();
        let mut done = FxHashSet::default();
        let mut stack: Vec<(TensorId, bool)> = roots.iter().rev().map(|r| (*r, false)).collect();
        while let Some((t, expanded)) = stack.pop() {
            if done.contains(&t) {
                continue;
            }
            if expanded {
                done.insert(t);
                order.push(t);
                continue;
            }
            stack.push((t, true));
            if let Source::Op { op, args } = &g.nodes[t.0 as usize].source {
                let only = mode.and_then(|m| op.reads_only(m)).and_then(|i| args.get(i..=i));
                for a in only.unwrap_or(args).iter().rev() {
                    if !done.contains(a) {
                        stack.push((*a, false));
                    }
                }
            }
        }
        order
    }

    pub(crate) fn projections(&mut self, t: TensorId) -> Result<Vec<Arc<Projections>>> {
        if let Some(p) = self.proj.get(&t) {
            return Ok(p.clone());
        }
        let g = self.graph.borrow();
        let info = &g.nodes[t.0 as usize];
        let Source::Op { op, .. } = &info.source else {
            return Ok(vec![]);
        };
        let step =
            info.step.ok_or_else(|| Error::usage(format!("'{}' has no shape step", info.label)))?;
        let per_argument = op.per_argument_projections();
        let mut ps: Vec<Projections> = if per_argument {
            g.inf.derive_concat_projections(step, &mut self.symbols)?
        } else {
            vec![g.inf.derive_projections(step, &mut self.symbols)?]
        };
        let dynamic = !g.dyn_dims.is_empty();
        drop(g);
        if dynamic {
            self.mark_dynamic(t, &mut ps, per_argument)?;
        }
        let ps: Vec<Arc<Projections>> = ps.into_iter().map(Arc::new).collect();
        self.proj.insert(t, ps.clone());
        Ok(ps)
    }

    fn op_ctx(&mut self, t: TensorId, with_grads: bool, mode: Mode) -> Result<OpCtx> {
        let args = match &self.graph.borrow().nodes[t.0 as usize].source {
            Source::Op { args, .. } => args.clone(),
            Source::Leaf(_) => vec![],
        };
        let proj = self.projections(t)?;
        let out = self.node_of(t);
        let mut arg_nodes: Vec<NodeId> = args.iter().map(|a| self.node_of(*a)).collect();
        if self.autocast
            && self.prec == Prec::Bf16
            && self.master != self.prec
            && args.len() >= 2
            && contracts(&proj)
        {
            let op = match &self.graph.borrow().nodes[t.0 as usize].source {
                Source::Op { op, .. } => Some(op.clone()),
                Source::Leaf(_) => None,
            };
            for (i, a) in args.iter().enumerate() {
                if op.as_ref().is_some_and(|op| op.is_factor(i)) && self.is_param(*a) {
                    arg_nodes[i] = self.cast_of(*a)?;
                }
            }
        }
        let (out_grad, arg_grads) = if with_grads {
            let diff: Vec<bool> = args
                .iter()
                .map(|a| self.graph.borrow().nodes[a.0 as usize].differentiable)
                .collect();
            let og = Some(self.grad_of(t));
            let ag = args.iter().zip(diff).map(|(a, d)| d.then(|| self.grad_of(*a))).collect();
            (og, ag)
        } else {
            (None, vec![])
        };
        let aux = self.aux_of(t)?;
        Ok(OpCtx { out, args: arg_nodes, proj, out_grad, arg_grads, mode, aux })
    }

    /// The nodes of the tensors an operation keeps besides its result ([`crate::op::Op::aux_dims`]),
    /// made the first time they are asked for: intermediates of the result's precision.
    fn aux_of(&mut self, t: TensorId) -> Result<Vec<NodeId>> {
        if let Some(a) = self.aux.get(&t) {
            return Ok(a.clone());
        }
        let op = match &self.graph.borrow().nodes[t.0 as usize].source {
            Source::Op { op, .. } => op.clone(),
            Source::Leaf(_) => return Ok(vec![]),
        };
        let mut nodes = Vec::new();
        for (k, dims) in op.aux_dims(&self.dims(t)?).into_iter().enumerate() {
            let n = self.fresh_node();
            let label = format!("{}_kept{k}", self.graph.tensor(t).label());
            let node = TensorNode::new(n, &label, &dims, self.prec_of(t), MemoryMode::Virtual);
            self.extra.insert(n, node);
            nodes.push(n);
        }
        self.aux.insert(t, nodes.clone());
        Ok(nodes)
    }

    fn is_param(&self, t: TensorId) -> bool {
        matches!(self.graph.tensor(t).info().source, Source::Leaf(Leaf::Param(_)))
    }

    /// The node of a parameter's copy in the session's precision ([`SessionOptions::autocast`]).
    fn cast_of(&mut self, t: TensorId) -> Result<NodeId> {
        if let Some(n) = self.cast.get(&t) {
            return Ok(*n);
        }
        let n = self.fresh_node();
        let label = format!("{}_{}", self.graph.tensor(t).label(), self.prec.name());
        // Stored, so rounded: an inlined copy would be read in the master precision.
        let node = TensorNode::new(n, &label, &self.dims(t)?, self.prec, MemoryMode::Local);
        self.extra.insert(n, node);
        self.cast.insert(t, n);
        self.cast_source.insert(n, t);
        Ok(n)
    }

    /// The copies among `nodes` the routine being generated does not have yet: each rounds its
    /// parameter into the session's precision.
    fn cast_code(&mut self, nodes: &[NodeId]) -> Result<Vec<Asgn>> {
        let mut code = vec![];
        for &n in nodes {
            let Some(&t) = self.cast_source.get(&n) else { continue };
            if !self.cast_done.insert(n) {
                continue;
            }
            let dims = self.dims(t)?;
            let value = self.node_of(t);
            code.push(Asgn::Comment(format!(
                "'{}' in {}",
                self.graph.tensor(t).label(),
                self.prec.name()
            )));
            code.push(self.update(n, vec![(value, false)], ScalarExpr::Arg(0), &dims));
        }
        Ok(code)
    }

    /// The forward code of the tensors in `order`.
    fn forward_code(&mut self, order: &[TensorId], mode: Mode) -> Result<Vec<Asgn>> {
        let mut code = Vec::new();
        for &t in order {
            let source = self.graph.borrow().nodes[t.0 as usize].source.clone();
            match source {
                Source::Leaf(Leaf::Constant(v)) => {
                    let lhs = self.node_of(t);
                    code.push(Asgn::Fetch { lhs, fetch: FetchOp::Constant(v) });
                }
                Source::Leaf(Leaf::Iota) => {
                    let lhs = self.node_of(t);
                    code.push(Asgn::Fetch { lhs, fetch: FetchOp::Iota });
                }
                Source::Leaf(_) => {
                    self.node_of(t);
                }
                Source::Op { op, .. } => {
                    let cx = self.op_ctx(t, false, mode)?;
                    code.extend(self.cast_code(&cx.args)?);
                    code.push(Asgn::Comment(format!(
                        "{} '{}'",
                        op.name(),
                        self.graph.tensor(t).label()
                    )));
                    code.push(op.forward(&cx));
                }
            }
        }
        Ok(code)
    }

    /// Backpropagation from `root` over `order` (the forward order): zero every gradient, seed
    /// the root's with ones, then each operation's gradient code in reverse.
    fn backward_code(
        &mut self,
        root: TensorId,
        order: &[TensorId],
        mode: Mode,
    ) -> Result<Vec<Asgn>> {
        let diff: Vec<TensorId> = order
            .iter()
            .copied()
            .filter(|t| self.graph.borrow().nodes[t.0 as usize].differentiable)
            .collect();
        let mut code = vec![Asgn::Comment("backprop".into())];
        for &t in &diff {
            let g = self.grad_of(t);
            let v = if t == root { 1.0 } else { 0.0 };
            code.push(Asgn::Fetch { lhs: g, fetch: FetchOp::Constant(v) });
        }
        if !diff.contains(&root) {
            return Ok(code);
        }
        let live = self.reaching(root, &diff);
        for &t in diff.iter().rev().filter(|t| live.contains(t)) {
            let source = self.graph.borrow().nodes[t.0 as usize].source.clone();
            if let Source::Op { op, .. } = source {
                let cx = self.op_ctx(t, true, mode)?;
                // The forward code of the same routine made every copy the gradients read.
                debug_assert!(
                    cx.args
                        .iter()
                        .all(|n| !self.cast_source.contains_key(n) || self.cast_done.contains(n))
                );
                let grads = op.backward(&cx);
                if !grads.is_empty() {
                    code.push(Asgn::Comment(format!(
                        "gradient of {} '{}'",
                        op.name(),
                        self.graph.tensor(t).label()
                    )));
                    code.extend(grads);
                }
            }
        }
        Ok(code)
    }

    /// The tensors of `diff` (differentiable, in forward order) whose gradient `root`'s reaches:
    /// `root` and, going back, every differentiable argument of a tensor it reaches. A tensor
    /// read only through a detached one (a softmax's maximum) gets no gradient code: its
    /// gradient stays 0, and its backward pass would only add `0 · ∂` over its inputs.
    fn reaching(&self, root: TensorId, diff: &[TensorId]) -> FxHashSet<TensorId> {
        let graph = self.graph.borrow();
        let mut live = FxHashSet::default();
        live.insert(root);
        for &t in diff.iter().rev() {
            if !live.contains(&t) {
                continue;
            }
            if let Source::Op { args, .. } = &graph.nodes[t.0 as usize].source {
                live.extend(args.iter().filter(|a| graph.nodes[a.0 as usize].differentiable));
            }
        }
        live
    }

    /// The node table for compiling `asgn`, with memory modes.
    fn node_table(&mut self, asgn: &Asgn, visible: &FxHashSet<NodeId>) -> Result<NodeTable> {
        let by_node: FxHashMap<NodeId, (TensorId, bool)> = self
            .value
            .iter()
            .map(|(t, n)| (*n, (*t, false)))
            .chain(self.grad.iter().map(|(t, n)| (*n, (*t, true))))
            .collect();
        let mut table = NodeTable::default();
        // Visible nodes no code touches (an output that is itself a param or data leaf) still
        // need their buffers, to be initialized and read.
        let touched = asgn.nodes();
        let mut untouched: Vec<NodeId> = visible
            .iter()
            .copied()
            .filter(|n| by_node.contains_key(n) && touched.binary_search(n).is_err())
            .collect();
        untouched.sort();
        for n in touched.into_iter().chain(untouched) {
            if let Some(node) = self.extra.get(&n) {
                table.insert(node.clone());
                continue;
            }
            let Some((t, is_grad)) = by_node.get(&n).copied() else {
                return Err(Error::usage(format!("node {n} belongs to no tensor")));
            };
            let tensor = self.graph.tensor(t);
            let persistent = !is_grad
                && matches!(
                    tensor.info().source,
                    Source::Leaf(Leaf::Param(_) | Leaf::Buffer(_) | Leaf::Data(_))
                );
            let mode = if persistent || visible.contains(&n) {
                MemoryMode::HostVisible
            } else {
                MemoryMode::Virtual
            };
            let label = if is_grad { format!("grad_{}", tensor.label()) } else { tensor.label() };
            table.insert(TensorNode::new(n, &label, &self.dims(t)?, self.prec_of(t), mode));
        }
        Ok(table)
    }

    /// Compiles a routine for a plan: the forward code of everything the outputs (and the
    /// backprop root) need, then backpropagation if asked.
    ///
    /// A routine compiled in [`Mode::Train`] ends with the updates of the buffers its forward
    /// pass computes ([`crate::buffer`]).
    pub fn compile(&mut self, name: &str, plan: &Plan) -> Result<Routine> {
        for t in plan.outputs.iter().chain(&plan.grads).chain(&plan.backprop_from) {
            self.own(t)?;
        }
        let PlanCode { mut code, buffer_updates, kept } = self.plan_code(plan)?;
        code.extend(buffer_updates);
        let mut visible = self.visible_nodes(plan);
        visible.extend(kept);
        self.compile_code(name, Asgn::Seq(code), &visible)
    }

    pub(crate) fn plan_code(&mut self, plan: &Plan) -> Result<PlanCode> {
        self.graph.finish()?;
        self.cast_done.clear();
        let mut roots: Vec<TensorId> = plan.outputs.iter().map(|t| t.id).collect();
        roots.extend(plan.backprop_from.as_ref().map(|t| t.id));
        roots.extend(plan.grads.iter().map(|t| t.id));
        let order = self.topo_in(&roots, Some(plan.mode));
        // The new values of the buffers are computed with the forward pass and copied into the
        // buffers at the end, so that everything before reads the values the step began with.
        let updates = self.performed_updates(plan.mode, &order);
        roots.extend(updates.iter().map(|u| u.value));
        let with_updates = self.topo_in(&roots, Some(plan.mode));
        let mut code = self.forward_code(&with_updates, plan.mode)?;
        if let Some(root) = &plan.backprop_from {
            code.extend(self.backward_code(root.id, &order, plan.mode)?);
        }
        let kept = updates.iter().map(|u| self.node_of(u.value)).collect();
        let buffer_updates = self.buffer_update_code(&updates)?;
        Ok(PlanCode { code, buffer_updates, kept })
    }

    pub(crate) fn visible_nodes(&mut self, plan: &Plan) -> FxHashSet<NodeId> {
        let mut visible: FxHashSet<NodeId> =
            plan.outputs.iter().map(|t| self.node_of(t.id)).collect();
        for t in &plan.grads {
            visible.insert(self.grad_of(t.id));
        }
        visible.extend(self.persistent.iter().copied());
        visible
    }

    pub(crate) fn compile_code(
        &mut self,
        name: &str,
        code: Asgn,
        visible: &FxHashSet<NodeId>,
    ) -> Result<Routine> {
        let table = self.node_table(&code, visible)?;
        let reads: Vec<TensorId> = self
            .value
            .iter()
            .filter(|(t, n)| {
                // A tensor of no cells has nothing to write.
                table.get(**n).is_ok_and(|node| node.dims.iter().product::<usize>() > 0)
                    && matches!(
                        self.graph.tensor(**t).info().source,
                        Source::Leaf(Leaf::Data(None))
                    )
            })
            .map(|(t, _)| *t)
            .collect();
        // Compiling checks the routine's limits and allocates its buffers before any leaf is
        // initialized: a routine too big for them is refused before anything large is built.
        let routine = self.ctx.compile(name, &code, &table)?;
        self.prepare_leaves(&table)?;
        self.data_reads.insert(routine.index(), reads);
        Ok(Routine::new(routine))
    }

    /// Compiles the forward pass computing `outputs`, in eval mode ([`Mode::Eval`]: no
    /// dropout, batch norm's running statistics, no buffer updated); [`Session::forward_in`]
    /// chooses the mode.
    pub fn forward(&mut self, outputs: &[&Tensor]) -> Result<Routine> {
        self.forward_in(Mode::Eval, outputs)
    }

    /// Compiles forward and backpropagation from `root` (its gradient seeded with ones, i.e.
    /// the gradient of the sum of its cells), in train mode ([`Mode::Train`], as a training
    /// step: buffers are updated); the parameters' gradients are readable.
    pub fn backprop(&mut self, root: &Tensor, outputs: &[&Tensor]) -> Result<Routine> {
        self.own(root)?;
        let mut outs: Vec<Tensor> = outputs.iter().map(|t| (*t).clone()).collect();
        outs.push(root.clone());
        let grads = self.graph.params();
        let plan =
            Plan { outputs: outs, backprop_from: Some(root.clone()), grads, mode: Mode::Train };
        self.compile("backprop", &plan)
    }

    /// Initializes (once) every parameter and data leaf among the routine's nodes: parameters
    /// by their initialization, data by its initial values.
    fn prepare_leaves(&mut self, table: &NodeTable) -> Result<()> {
        let leaves: Vec<(TensorId, Leaf)> = self
            .value
            .iter()
            .filter(|(t, n)| !self.ready.contains(t) && table.get(**n).is_ok())
            .filter_map(|(t, _)| match self.graph.tensor(*t).info().source {
                Source::Leaf(l @ (Leaf::Param(_) | Leaf::Buffer(_) | Leaf::Data(_))) => {
                    Some((*t, l))
                }
                _ => None,
            })
            .collect();
        let mut leaves = leaves;
        leaves.sort_by_key(|(t, _)| *t);
        let mut init = Vec::new();
        let mut nodes = NodeTable::default();
        for (t, leaf) in leaves {
            let n = self.node_of(t);
            let dims = self.dims(t)?;
            let prec = self.prec_of(t);
            let node = TensorNode::new(
                n,
                &self.graph.tensor(t).label(),
                &dims,
                prec,
                MemoryMode::HostVisible,
            );
            self.ctx.ensure_buffer(&node)?;
            self.ready.insert(t);
            match leaf {
                Leaf::Data(Some(values)) => {
                    self.check_ids(&self.graph.tensor(t), &values)?;
                    self.write_node(n, prec, &dims, &values)?
                }
                Leaf::Data(None) => {}
                Leaf::Param(init_spec) | Leaf::Buffer(init_spec) => {
                    let rows = self.graph.tensor(t).rows()?;
                    let (input, output) = (rows.input, rows.output);
                    let seed = derive_seed(self.graph.seed(), t.0);
                    let mut scratch = Vec::new();
                    let next = &mut self.next_node;
                    let mut temps = || {
                        *next += 1;
                        let id = NodeId(*next - 1);
                        scratch.push(TensorNode::new(
                            id,
                            "init_scratch",
                            &dims,
                            prec,
                            MemoryMode::Virtual,
                        ));
                        id
                    };
                    let target = InitTarget {
                        node: n,
                        dims: &dims,
                        fan_in: input.iter().product(),
                        fan_out: output.iter().product(),
                        seed,
                    };
                    let code = init_code(&init_spec, &target, &mut temps, &mut self.symbols);
                    for s in scratch {
                        nodes.insert(s);
                    }
                    if let Some(values) = code.host_values {
                        self.write_node(n, prec, &dims, &values)?;
                    } else {
                        nodes.insert(node);
                        init.push(code.asgn);
                    }
                }
                Leaf::Constant(_) | Leaf::Iota => {}
            }
        }
        if !init.is_empty() {
            let r = self.ctx.compile_once("init", &Asgn::Seq(init), &nodes)?;
            self.ctx.run(&r, &[])?;
        }
        Ok(())
    }
}

/// Whether a projection sums over an axis its result does not have (a contraction).
fn contracts(proj: &[Arc<Projections>]) -> bool {
    proj.iter().any(|p| {
        p.product_iterators.iter().zip(&p.product_space).any(|(s, size)| {
            *size > 1
                && !p.project_lhs.iter().any(|i| match i {
                    AxisIndex::Iterator(v) => v == s,
                    AxisIndex::Affine { terms, .. } => terms.iter().any(|(_, v)| v == s),
                    _ => false,
                })
        })
    })
}

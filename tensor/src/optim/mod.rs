//! Optimizers, compiled into the training step.
//!
//! A training step is one routine: the forward pass, backpropagation from the loss, and the
//! optimizer's update of every parameter. The update is a few pointwise assignments per
//! parameter over persistent state (momentum, Adam's moments). The learning rate is a runtime
//! scalar written before each step, so schedules need no recompilation; Adam's bias corrections
//! are folded into two more scalars computed on the host from the step count. The formulas
//! follow PyTorch's `SGD`, `Adam` and `AdamW`. Clipping and loss scaling, which rewrite every
//! gradient before the update, are in `grad_code.rs`; under loss scaling or data parallelism
//! ([`crate::parallel`]) the step runs as two routines, the gradients, then the update.

use std::sync::Arc;

use crate::routine::Routine;
use rocannl_arrayjit::assignments::{Asgn, ScalarExpr};
use rocannl_arrayjit::indexing::{AxisIndex, Projections, Symbol};
use rocannl_arrayjit::ops::{BinOp, UnOp};
use rocannl_arrayjit::tnode::NodeId;
use rustc_hash::FxHashSet;

use crate::error::{Error, Result};
use crate::graph::Tensor;
use crate::mode::Mode;
use crate::parallel::step::{Parallel, ReduceStats};
use crate::session::{Plan, PlanCode, Session};

mod grad_code;

use grad_code::Scaler;
pub use grad_code::{LossScale, StepOptions};

/// An optimizer and its hyper-parameters (the learning rate is given per step), one variant
/// per algorithm, each with its options struct whose `Default` is PyTorch's. Its weight decay
/// applies to the params that [`crate::Graph::decays`] picks ([`crate::DecayPolicy`]).
///
/// ```
/// use rocannl_tensor::{Adam, AdamW, Optimizer, Sgd};
/// let plain = Optimizer::Sgd(Sgd::default());
/// let momentum = Optimizer::Sgd(Sgd { momentum: 0.9, nesterov: true, ..Default::default() });
/// let adam = Optimizer::Adam(Adam::default());
/// let adamw = Optimizer::AdamW(AdamW { beta2: 0.95, weight_decay: 0.1, ..Default::default() });
/// for opt in [plain, momentum, adam, adamw] {
///     assert!(opt.check().is_ok());
/// }
/// ```
#[derive(Clone, Debug, PartialEq)]
pub enum Optimizer {
    /// Stochastic gradient descent (PyTorch's `SGD`).
    Sgd(Sgd),
    /// Adam with an L2 penalty added to the gradient (PyTorch's `Adam`).
    Adam(Adam),
    /// Adam with decoupled weight decay (PyTorch's `AdamW`).
    AdamW(AdamW),
}

/// [`Optimizer::Sgd`]'s options; the default is plain SGD (no momentum, no decay).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Sgd {
    /// Momentum factor (0: none).
    pub momentum: f64,
    /// Nesterov momentum (needs a momentum).
    pub nesterov: bool,
    /// L2 penalty added to the gradient.
    pub weight_decay: f64,
}

/// [`Optimizer::Adam`]'s options; the default is PyTorch's (β = 0.9, 0.999; ε = 1e-8; no
/// weight decay).
#[derive(Clone, Debug, PartialEq)]
pub struct Adam {
    /// Decay of the first moment.
    pub beta1: f64,
    /// Decay of the second moment.
    pub beta2: f64,
    /// Added to the denominator.
    pub eps: f64,
    /// L2 penalty added to the gradient.
    pub weight_decay: f64,
}

impl Default for Adam {
    fn default() -> Self {
        Adam { beta1: 0.9, beta2: 0.999, eps: 1e-8, weight_decay: 0.0 }
    }
}

/// [`Optimizer::AdamW`]'s options; the default is PyTorch's (β = 0.9, 0.999; ε = 1e-8; weight
/// decay 0.01).
#[derive(Clone, Debug, PartialEq)]
pub struct AdamW {
    /// Decay of the first moment.
    pub beta1: f64,
    /// Decay of the second moment.
    pub beta2: f64,
    /// Added to the denominator.
    pub eps: f64,
    /// Decoupled weight decay: `p ← p · (1 − lr · weight_decay)` before the Adam step.
    pub weight_decay: f64,
}

impl Default for AdamW {
    fn default() -> Self {
        AdamW { beta1: 0.9, beta2: 0.999, eps: 1e-8, weight_decay: 0.01 }
    }
}

/// Adam's hyper-parameters as the update code reads them, for both variants.
struct Moments {
    beta1: f64,
    beta2: f64,
    eps: f64,
    weight_decay: f64,
    decoupled: bool,
}

impl Optimizer {
    /// Adam's hyper-parameters, `None` for SGD.
    fn moments(&self) -> Option<Moments> {
        match *self {
            Optimizer::Sgd(_) => None,
            Optimizer::Adam(Adam { beta1, beta2, eps, weight_decay }) => {
                Some(Moments { beta1, beta2, eps, weight_decay, decoupled: false })
            }
            Optimizer::AdamW(AdamW { beta1, beta2, eps, weight_decay }) => {
                Some(Moments { beta1, beta2, eps, weight_decay, decoupled: true })
            }
        }
    }

    /// The same optimizer without weight decay (for the params the decay policy exempts).
    fn without_decay(&self) -> Optimizer {
        let mut opt = self.clone();
        match &mut opt {
            Optimizer::Sgd(o) => o.weight_decay = 0.0,
            Optimizer::Adam(o) => o.weight_decay = 0.0,
            Optimizer::AdamW(o) => o.weight_decay = 0.0,
        }
        opt
    }

    /// Checks the hyper-parameters against PyTorch's ranges: momentum, ε and weight decay
    /// finite and at least 0, β₁ and β₂ in `[0, 1)`, Nesterov momentum only with a momentum.
    /// [`Session::train_step`] checks them; anything else is a usage error naming the value.
    ///
    /// ```
    /// use rocannl_tensor::{Adam, Optimizer, Sgd};
    /// assert!(Optimizer::Adam(Adam::default()).check().is_ok());
    /// let e = Optimizer::Adam(Adam { beta1: 1.0, ..Default::default() }).check();
    /// assert!(e.unwrap_err().to_string().contains("beta1"));
    /// let nan_decay = Optimizer::Sgd(Sgd { weight_decay: f64::NAN, ..Default::default() });
    /// assert!(nan_decay.check().is_err());
    /// ```
    pub fn check(&self) -> Result<()> {
        let at_least_0 = |x: f64| x >= 0.0 && x.is_finite();
        let beta = |x: f64| (0.0..1.0).contains(&x);
        let bad = match (self, self.moments()) {
            (Optimizer::Sgd(Sgd { momentum, nesterov, weight_decay }), _) => [
                (!at_least_0(*momentum)).then(|| format!("momentum = {momentum}")),
                (*nesterov && *momentum <= 0.0)
                    .then(|| "Nesterov momentum without a momentum".to_string()),
                (!at_least_0(*weight_decay)).then(|| format!("weight_decay = {weight_decay}")),
                None,
            ],
            (_, Some(Moments { beta1, beta2, eps, weight_decay, .. })) => [
                (!beta(beta1)).then(|| format!("beta1 = {beta1}")),
                (!beta(beta2)).then(|| format!("beta2 = {beta2}")),
                (!at_least_0(eps)).then(|| format!("eps = {eps}")),
                (!at_least_0(weight_decay)).then(|| format!("weight_decay = {weight_decay}")),
            ],
            (_, None) => [None, None, None, None],
        };
        match bad.into_iter().flatten().next() {
            None => Ok(()),
            Some(what) => Err(Error::usage(format!(
                "optimizer {self:?}: {what} is out of range (momentum, eps and weight decay are \
                 finite and at least 0, the betas in [0, 1))"
            ))),
        }
    }

    /// The runtime scalars for step `t` (1-based) with learning rate `lr`:
    /// `[lr, c1, c2]` where Adam's update is `p -= c1 · m / (√v · c2 + ε)`.
    fn scalars(&self, t: u64, lr: f64) -> [f64; 3] {
        match self.moments() {
            None => [lr, 0.0, 0.0],
            Some(Moments { beta1, beta2, .. }) => {
                let t = t.max(1) as i32;
                [lr, lr / (1.0 - beta1.powi(t)), 1.0 / (1.0 - beta2.powi(t)).sqrt()]
            }
        }
    }
}

/// A compiled training step.
#[derive(Debug)]
pub struct TrainStep {
    routine: Routine,
    /// The update routine (clipping and the optimizer) when the step runs as two routines
    /// (loss scaling, data parallelism); else the update is part of `routine`.
    update: Option<Routine>,
    /// Data parallelism's state ([`crate::parallel`]).
    parallel: Option<Parallel>,
    optimizer: Optimizer,
    scalars: [NodeId; 3],
    /// The values last written to `scalars`.
    written: [Option<f64>; 3],
    /// The squared global gradient norm of the last step, when clipping.
    grad_norm_sq: Option<NodeId>,
    scaler: Option<Scaler>,
    steps: u64,
    /// The loss tensor.
    pub loss: Tensor,
}

impl TrainStep {
    /// How many updates have been applied (a step skipped by loss scaling is not one).
    pub fn steps(&self) -> u64 {
        self.steps
    }

    /// The current loss scale, under [`StepOptions::loss_scale`].
    pub fn loss_scale(&self) -> Option<f64> {
        self.scaler.as_ref().map(|s| s.scale)
    }

    /// How many steps loss scaling skipped because a gradient was not finite.
    pub fn skipped_steps(&self) -> u64 {
        self.scaler.as_ref().map_or(0, |s| s.skipped)
    }

    /// The compiled routine (for inspecting its code: [`crate::Routine::code`]).
    pub fn routine(&self) -> &Routine {
        &self.routine
    }

    /// What the gradient reductions cost so far, under data parallelism.
    pub fn reduce_stats(&self) -> Option<ReduceStats> {
        self.parallel.as_ref().map(|p| p.stats)
    }
}

/// A pointwise projection over `dims` where each argument has `dims` or is a scalar (`[]`).
fn pointwise(
    dims: &[usize],
    rhs_scalar: &[bool],
    symbols: &mut rocannl_arrayjit::indexing::SymbolGen,
) -> Projections {
    let iters: Vec<Symbol> = dims.iter().map(|_| symbols.fresh()).collect();
    let full: Vec<AxisIndex> = iters.iter().map(|s| AxisIndex::Iterator(*s)).collect();
    Projections {
        product_space: dims.to_vec(),
        product_iterators: iters,
        lhs_dims: dims.to_vec(),
        rhs_dims: rhs_scalar.iter().map(|s| if *s { vec![] } else { dims.to_vec() }).collect(),
        project_lhs: full.clone(),
        project_rhs: rhs_scalar.iter().map(|s| if *s { vec![] } else { full.clone() }).collect(),
        debug_info: "optimizer update".into(),
        dynamic: vec![],
    }
}

fn a(i: usize) -> ScalarExpr {
    ScalarExpr::Arg(i)
}
fn k(v: f64) -> ScalarExpr {
    ScalarExpr::Const(v)
}
fn b(op: BinOp, x: ScalarExpr, y: ScalarExpr) -> ScalarExpr {
    ScalarExpr::bin(op, x, y)
}

/// A training step's code before it is compiled.
struct StepCode {
    /// The forward pass and backpropagation (with loss scaling's code).
    forward_backward: Vec<Asgn>,
    /// Clipping and the optimizer's update of every param.
    update: Vec<Asgn>,
    /// The buffers' updates.
    buffer_updates: Vec<Asgn>,
}

/// The plan of a training step: `outputs` and the loss kept, backpropagation from the loss in
/// train mode, and (`split`) the trained params' gradients kept for the update's routine.
fn step_plan(loss: &Tensor, outputs: &[&Tensor], trained: &[&Tensor], split: bool) -> Plan {
    let mut outs: Vec<Tensor> = outputs.iter().map(|t| (*t).clone()).collect();
    outs.push(loss.clone());
    let grads = if split { trained.iter().map(|p| (*p).clone()).collect() } else { vec![] };
    Plan { outputs: outs, backprop_from: Some(loss.clone()), grads, mode: Mode::Train }
}

/// The gradient (argument 1) with an L2 penalty `wd · p` (argument 0) when `wd` is not 0.
fn grad_with_l2(wd: f64) -> ScalarExpr {
    if wd == 0.0 { a(1) } else { b(BinOp::Add, a(1), b(BinOp::Mul, k(wd), a(0))) }
}

impl Session {
    /// `lhs := expr(rhs)` cell by cell over `dims`, each argument of `rhs` either of `dims` or
    /// a scalar (`true`). A copy into a node of another precision rounds.
    pub(crate) fn update(
        &mut self,
        lhs: NodeId,
        rhs: Vec<(NodeId, bool)>,
        expr: ScalarExpr,
        dims: &[usize],
    ) -> Asgn {
        let scalar: Vec<bool> = rhs.iter().map(|(_, s)| *s).collect();
        let p = pointwise(dims, &scalar, &mut self.symbols);
        Asgn::Accum {
            lhs,
            accum: None,
            rhs: rhs.into_iter().map(|(n, _)| n).collect(),
            expr,
            projections: Arc::new(p),
            initialize_neutral: false,
        }
    }

    /// The update of one parameter. `g'` is the gradient with an L2 penalty when asked.
    fn update_code(
        &mut self,
        opt: &Optimizer,
        p: &Tensor,
        scalars: [NodeId; 3],
    ) -> Result<Vec<Asgn>> {
        // Params exempt from weight decay (by the graph's `DecayPolicy`) get none.
        let opt = &if self.graph().decays(p)? { opt.clone() } else { opt.without_decay() };
        let mut code = vec![Asgn::Comment(format!("update {}", p.label()))];
        match (opt, opt.moments()) {
            (Optimizer::Sgd(sgd), _) => self.sgd_code(sgd, p, scalars, &mut code)?,
            (_, Some(adam)) => self.adam_code(&adam, p, scalars, &mut code)?,
            (_, None) => unreachable!("every optimizer but SGD has moments"),
        }
        Ok(code)
    }

    /// SGD: `p -= lr · g'`, or with momentum `v = μ v + g'; p -= lr · (nesterov ? g' + μ v : v)`.
    fn sgd_code(
        &mut self,
        sgd: &Sgd,
        p: &Tensor,
        [lr, _, _]: [NodeId; 3],
        code: &mut Vec<Asgn>,
    ) -> Result<()> {
        let dims = p.dims()?;
        let (pn, g) = (self.node(p), self.grad_node(p));
        let Sgd { momentum, nesterov, weight_decay } = *sgd;
        let grad = grad_with_l2(weight_decay);
        if momentum == 0.0 {
            let e = b(BinOp::Sub, a(0), b(BinOp::Mul, a(2), grad));
            code.push(self.update(pn, vec![(pn, false), (g, false), (lr, true)], e, &dims));
            return Ok(());
        }
        let v = self.extra_node(&format!("{}.momentum", p.label()), &dims, true);
        let ev = b(BinOp::Add, b(BinOp::Mul, k(momentum), a(2)), grad.clone());
        code.push(self.update(v, vec![(pn, false), (g, false), (v, false)], ev, &dims));
        let step =
            if nesterov { b(BinOp::Add, grad, b(BinOp::Mul, k(momentum), a(2))) } else { a(2) };
        let ep = b(BinOp::Sub, a(0), b(BinOp::Mul, a(3), step));
        let args = vec![(pn, false), (g, false), (v, false), (lr, true)];
        code.push(self.update(pn, args, ep, &dims));
        Ok(())
    }

    /// Adam and AdamW: decoupled decay first (AdamW), then the moments and the step
    /// `p -= c1 · m / (√v · c2 + ε)`.
    fn adam_code(
        &mut self,
        o: &Moments,
        p: &Tensor,
        [lr, c1, c2]: [NodeId; 3],
        code: &mut Vec<Asgn>,
    ) -> Result<()> {
        let dims = p.dims()?;
        let (pn, g, label) = (self.node(p), self.grad_node(p), p.label());
        let m = self.extra_node(&format!("{label}.adam_m"), &dims, true);
        let v = self.extra_node(&format!("{label}.adam_v"), &dims, true);
        if o.decoupled && o.weight_decay != 0.0 {
            // p = p * (1 - lr * wd)
            let shrink = b(BinOp::Sub, k(1.0), b(BinOp::Mul, a(1), k(o.weight_decay)));
            let e = b(BinOp::Mul, a(0), shrink);
            code.push(self.update(pn, vec![(pn, false), (lr, true)], e, &dims));
        }
        let gp = grad_with_l2(if o.decoupled { 0.0 } else { o.weight_decay });
        // m = β1 m + (1-β1) g';  v = β2 v + (1-β2) g'^2
        let em = b(
            BinOp::Add,
            b(BinOp::Mul, k(o.beta1), a(2)),
            b(BinOp::Mul, k(1.0 - o.beta1), gp.clone()),
        );
        code.push(self.update(m, vec![(pn, false), (g, false), (m, false)], em, &dims));
        let g2 = b(BinOp::Mul, gp.clone(), gp);
        let ev =
            b(BinOp::Add, b(BinOp::Mul, k(o.beta2), a(2)), b(BinOp::Mul, k(1.0 - o.beta2), g2));
        code.push(self.update(v, vec![(pn, false), (g, false), (v, false)], ev, &dims));
        let denom = b(BinOp::Add, b(BinOp::Mul, ScalarExpr::un(UnOp::Sqrt, a(2)), a(4)), k(o.eps));
        let e = b(BinOp::Sub, a(0), b(BinOp::Div, b(BinOp::Mul, a(3), a(1)), denom));
        let args = vec![(pn, false), (m, false), (v, false), (c1, true), (c2, true)];
        code.push(self.update(pn, args, e, &dims));
        Ok(())
    }

    /// Compiles a whole training step — forward, backpropagation from `loss`, the update of
    /// every parameter, then the updates of the buffers its forward pass computes (batch
    /// norm's running statistics, [`crate::buffer`]) — into one routine, in train mode
    /// ([`Mode::Train`]). `outputs` are also kept readable (e.g. predictions); `options` adds
    /// gradient clipping by global norm and loss scaling ([`StepOptions`]; `&Default::default()`
    /// for neither).
    ///
    /// ```
    /// use rocannl_tensor::{Axes, Graph, Init, ParamSpec, Session, optim::Optimizer};
    /// let g = Graph::new();
    /// let w = g.param("w", ParamSpec::new(Axes::new().output(&[1])).init(Init::Constant(3.0)));
    /// let loss = w.pointmul(&w); // minimize w^2
    /// let mut s = Session::new(&g).unwrap();
    /// let mut step = s.train_step(&loss, &Optimizer::Sgd(Default::default()), &[], &Default::default()).unwrap();
    /// for _ in 0..10 { s.step(&mut step, 0.25).unwrap(); }
    /// assert!(s.read(&w).unwrap()[0].abs() < 0.01); // w halves every step
    /// ```
    ///
    /// Clipping:
    ///
    /// ```
    /// use rocannl_tensor::optim::{Optimizer, StepOptions};
    /// use rocannl_tensor::{Axes, Graph, Init, ParamSpec, Session};
    /// let g = Graph::new();
    /// let w = g.param("w", ParamSpec::new(Axes::new().output(&[2])).init(Init::Values(vec![3.0, 4.0])));
    /// let loss = w.pointmul(&w).sum_all().scale(0.5); // its gradient is w: norm 5
    /// let mut s = Session::new(&g).unwrap();
    /// let clip = StepOptions { clip_grad_norm: Some(1.0), ..StepOptions::default() };
    /// let mut step = s.train_step(&loss, &Optimizer::Sgd(Default::default()), &[], &clip).unwrap();
    /// s.step(&mut step, 1.0).unwrap();
    /// assert!((s.grad_norm(&step).unwrap().unwrap() - 5.0).abs() < 1e-5);
    /// let w1 = s.read(&w).unwrap(); // moved by a gradient of norm 1: w - w/5
    /// assert!((w1[0] - 2.4).abs() < 1e-5 && (w1[1] - 3.2).abs() < 1e-5);
    /// ```
    pub fn train_step(
        &mut self,
        loss: &Tensor,
        opt: &Optimizer,
        outputs: &[&Tensor],
        options: &StepOptions,
    ) -> Result<TrainStep> {
        let params = self.step_params(loss, opt, outputs, options)?;
        let trained: Vec<&Tensor> = params.iter().filter(|p| p.info().differentiable).collect();
        // Under loss scaling and data parallelism the step runs as two routines, and the
        // gradients outlive the first.
        let split = options.loss_scale.is_some() || self.group().is_some();
        let plan = step_plan(loss, outputs, &trained, split);
        let PlanCode { mut code, buffer_updates, kept } = self.plan_code(&plan)?;
        let scalars = [
            self.extra_node("lr", &[], true),
            self.extra_node("adam_c1", &[], true),
            self.extra_node("adam_c2", &[], true),
        ];
        let scaling = match &options.loss_scale {
            Some(cfg) => Some((cfg.clone(), self.scale_code(loss, &trained, &mut code)?)),
            None => None,
        };
        let mut update = Vec::new();
        let grad_norm_sq = match options.clip_grad_norm {
            Some(max) => Some(self.clip_code(&trained, max, &mut update)?),
            None => None,
        };
        for p in &trained {
            update.extend(self.update_code(opt, p, scalars)?);
        }
        let mut visible = self.visible_nodes(&plan);
        visible.extend(kept);
        let parts = StepCode { forward_backward: code, update, buffer_updates };
        let (routine, update) = self.compile_step(parts, &visible, split)?;
        let scaler = scaling.map(|(cfg, [scale_node, inverse_node, check_node])| Scaler {
            scale: cfg.init,
            cfg,
            scale_node,
            inverse_node,
            check_node,
            good: 0,
            skipped: 0,
        });
        let parallel = match self.group().cloned() {
            Some(group) => {
                Some(self.parallel_setup(group, &trained, routine.inner.low_level_text())?)
            }
            None => None,
        };
        Ok(TrainStep {
            routine,
            update,
            parallel,
            optimizer: opt.clone(),
            scalars,
            written: [None; 3],
            grad_norm_sq,
            scaler,
            steps: 0,
            loss: loss.clone(),
        })
    }

    /// Checks a training step's arguments; the graph's params.
    fn step_params(
        &mut self,
        loss: &Tensor,
        opt: &Optimizer,
        outputs: &[&Tensor],
        options: &StepOptions,
    ) -> Result<Vec<Tensor>> {
        for t in std::iter::once(loss).chain(outputs.iter().copied()) {
            self.own(t)?;
        }
        opt.check()?;
        options.check()?;
        let params = self.graph().params();
        if params.is_empty() {
            return Err(Error::usage("the graph has no parameters to train"));
        }
        Ok(params)
    }

    /// The step as one routine, or (`split`) as the gradients' routine and the update's. The
    /// buffers' updates follow the forward pass's routine: under a split they run whether or
    /// not the update is skipped (as PyTorch's running statistics under a `GradScaler`).
    fn compile_step(
        &mut self,
        parts: StepCode,
        visible: &FxHashSet<NodeId>,
        split: bool,
    ) -> Result<(Routine, Option<Routine>)> {
        let StepCode { mut forward_backward, update, buffer_updates } = parts;
        if split {
            forward_backward.extend(buffer_updates);
            let grads = self.compile_code("train_step", Asgn::Seq(forward_backward), visible)?;
            let update = self.compile_code("train_update", Asgn::Seq(update), visible)?;
            return Ok((grads, Some(update)));
        }
        forward_backward.extend(update);
        forward_backward.extend(buffer_updates);
        Ok((self.compile_code("train_step", Asgn::Seq(forward_backward), visible)?, None))
    }

    /// The global gradient norm of the last step, before clipping, when the step clips
    /// ([`StepOptions::clip_grad_norm`]); `None` otherwise.
    pub fn grad_norm(&self, ts: &TrainStep) -> Result<Option<f64>> {
        match ts.grad_norm_sq {
            Some(n) => Ok(Some(self.read_extra(n)?[0].sqrt())),
            None => Ok(None),
        }
    }

    /// Runs one training step with learning rate `lr`.
    ///
    /// The session binds what [`Session::run`] binds, and the graph's step counter, if the step
    /// uses it, to the step's number. A learning rate that is negative, infinite or NaN (a
    /// schedule gone wrong, say) is a usage error, and the step is not run.
    pub fn step(&mut self, ts: &mut TrainStep, lr: f64) -> Result<()> {
        if !(lr >= 0.0 && lr.is_finite()) {
            return Err(Error::usage(format!(
                "the learning rate of step {} is {lr}: it must be a finite number, at least 0",
                ts.steps + 1
            )));
        }
        self.check_written(&ts.routine.inner)?;
        let number = Some(ts.steps as i64 + 1);
        let values = ts.optimizer.scalars(ts.steps + 1, lr);
        if let Some(sc) = &ts.scaler {
            self.write_extra(sc.scale_node, &[sc.scale])?;
            self.write_extra(sc.inverse_node, &[1.0 / sc.scale])?;
        }
        if ts.update.is_none() {
            ts.steps += 1;
            self.write_scalars(&ts.scalars, &mut ts.written, values)?;
            return self.run_compiled(&ts.routine.inner, number);
        }
        self.run_compiled(&ts.routine.inner, number)?;
        let finite = match &mut ts.parallel {
            Some(par) => {
                par.weight = self.local_weight;
                let local = self.read(&ts.loss)?.iter().sum();
                self.reduce_grads(par, local)?
            }
            None => match &ts.scaler {
                Some(sc) => self.read_extra(sc.check_node)?[0].is_finite(),
                None => true,
            },
        };
        if let Some(sc) = &mut ts.scaler
            && !finite
        {
            // Overflow: skip the update, lower the scale.
            sc.scale = (sc.scale * sc.cfg.backoff).max(f64::MIN_POSITIVE);
            sc.good = 0;
            sc.skipped += 1;
            return Ok(());
        }
        ts.steps += 1;
        self.write_scalars(&ts.scalars, &mut ts.written, values)?;
        if let Some(update) = &ts.update {
            self.run_compiled(&update.inner, number)?;
        }
        if let Some(sc) = &mut ts.scaler {
            sc.good += 1;
            if sc.good >= sc.cfg.growth_interval {
                sc.scale *= sc.cfg.growth;
                sc.good = 0;
            }
        }
        Ok(())
    }

    /// Writes the optimizer's runtime scalars that changed since the last step (with a
    /// constant learning rate, SGD's never do: a small model's step is microseconds, and each
    /// write is a conversion and a copy).
    fn write_scalars(
        &mut self,
        nodes: &[NodeId; 3],
        written: &mut [Option<f64>; 3],
        values: [f64; 3],
    ) -> Result<()> {
        for ((n, last), v) in nodes.iter().zip(written.iter_mut()).zip(values) {
            if last.is_none_or(|l| l.to_bits() != v.to_bits()) {
                self.write_extra(*n, &[v])?;
                *last = Some(v);
            }
        }
        Ok(())
    }

    /// The loss after the last step (its cells summed); under data parallelism, the mean
    /// over the ranks (weighted by [`Session::set_local_examples`]): the global batch's loss.
    pub fn loss(&self, ts: &TrainStep) -> Result<f64> {
        if let Some(loss) = ts.parallel.as_ref().and_then(|p| p.loss) {
            return Ok(loss);
        }
        Ok(self.read(&ts.loss)?.iter().sum())
    }
}

//! Optimizers, compiled into the training step.
//!
//! A training step is one routine: the forward pass, backpropagation from the loss, and the
//! optimizer's update of every parameter. The update is a few pointwise assignments per
//! parameter over persistent state (momentum, Adam's moments). The learning rate is a runtime
//! scalar written before each step, so schedules need no recompilation; Adam's bias corrections
//! are folded into two more scalars computed on the host from the step count. The formulas
//! follow PyTorch's `SGD`, `Adam` and `AdamW`.

use std::sync::Arc;

use rocannl_arrayjit::Routine;
use rocannl_arrayjit::assignments::{Asgn, ScalarExpr};
use rocannl_arrayjit::indexing::{AxisIndex, Projections, Symbol};
use rocannl_arrayjit::ops::{BinOp, UnOp};
use rocannl_arrayjit::tnode::NodeId;

use crate::error::{Error, Result};
use crate::graph::Tensor;
use crate::session::{Plan, Session};

/// An optimizer and its hyper-parameters (the learning rate is given per step).
#[derive(Clone, Debug, PartialEq)]
pub enum Optimizer {
    /// Stochastic gradient descent.
    Sgd {
        /// Momentum factor (0: none).
        momentum: f64,
        /// Nesterov momentum.
        nesterov: bool,
        /// L2 penalty added to the gradient.
        weight_decay: f64,
    },
    /// Adam with an L2 penalty added to the gradient.
    Adam {
        /// Decay of the first moment.
        beta1: f64,
        /// Decay of the second moment.
        beta2: f64,
        /// Added to the denominator.
        eps: f64,
        /// L2 penalty added to the gradient.
        weight_decay: f64,
    },
    /// Adam with decoupled weight decay.
    AdamW {
        /// Decay of the first moment.
        beta1: f64,
        /// Decay of the second moment.
        beta2: f64,
        /// Added to the denominator.
        eps: f64,
        /// Decoupled weight decay.
        weight_decay: f64,
    },
}

impl Optimizer {
    /// Plain SGD.
    pub fn sgd() -> Optimizer {
        Optimizer::Sgd { momentum: 0.0, nesterov: false, weight_decay: 0.0 }
    }

    /// SGD with momentum.
    pub fn sgd_momentum(momentum: f64) -> Optimizer {
        Optimizer::Sgd { momentum, nesterov: false, weight_decay: 0.0 }
    }

    /// Adam with PyTorch's defaults (β = 0.9, 0.999; ε = 1e-8).
    pub fn adam() -> Optimizer {
        Optimizer::Adam { beta1: 0.9, beta2: 0.999, eps: 1e-8, weight_decay: 0.0 }
    }

    /// AdamW with PyTorch's defaults and this weight decay.
    pub fn adamw(weight_decay: f64) -> Optimizer {
        Optimizer::AdamW { beta1: 0.9, beta2: 0.999, eps: 1e-8, weight_decay }
    }

    /// The same optimizer with Nesterov momentum (SGD only).
    pub fn nesterov(self) -> Optimizer {
        match self {
            Optimizer::Sgd { momentum, weight_decay, .. } => {
                Optimizer::Sgd { momentum, nesterov: true, weight_decay }
            }
            other => other,
        }
    }

    /// The same optimizer with this weight decay.
    pub fn with_weight_decay(self, wd: f64) -> Optimizer {
        match self {
            Optimizer::Sgd { momentum, nesterov, .. } => {
                Optimizer::Sgd { momentum, nesterov, weight_decay: wd }
            }
            Optimizer::Adam { beta1, beta2, eps, .. } => {
                Optimizer::Adam { beta1, beta2, eps, weight_decay: wd }
            }
            Optimizer::AdamW { beta1, beta2, eps, .. } => {
                Optimizer::AdamW { beta1, beta2, eps, weight_decay: wd }
            }
        }
    }

    /// The runtime scalars for step `t` (1-based) with learning rate `lr`:
    /// `[lr, c1, c2]` where Adam's update is `p -= c1 · m / (√v · c2 + ε)`.
    fn scalars(&self, t: u64, lr: f64) -> [f64; 3] {
        match self {
            Optimizer::Sgd { .. } => [lr, 0.0, 0.0],
            Optimizer::Adam { beta1, beta2, .. } | Optimizer::AdamW { beta1, beta2, .. } => {
                let t = t.max(1) as i32;
                [lr, lr / (1.0 - beta1.powi(t)), 1.0 / (1.0 - beta2.powi(t)).sqrt()]
            }
        }
    }
}

/// Settings of a training step besides the optimizer.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct StepOptions {
    /// Clip the gradients by their global norm: every gradient is multiplied by
    /// `min(1, max / (‖g‖ + 1e-6))`, `‖g‖` the 2-norm of all parameters' gradients together,
    /// before the optimizer uses them (PyTorch's `clip_grad_norm_`). `None`: no clipping.
    pub clip_grad_norm: Option<f64>,
}

/// A compiled training step.
#[derive(Debug)]
pub struct TrainStep {
    routine: Routine,
    optimizer: Optimizer,
    scalars: [NodeId; 3],
    /// The squared global gradient norm of the last step, when clipping.
    grad_norm_sq: Option<NodeId>,
    steps: u64,
    /// The loss tensor.
    pub loss: Tensor,
}

impl TrainStep {
    /// How many steps have run.
    pub fn steps(&self) -> u64 {
        self.steps
    }

    /// The compiled routine (for inspecting its code).
    pub fn routine(&self) -> &Routine {
        &self.routine
    }
}

/// A projection reducing every cell of `dims` into a scalar (`lhs` has no axes).
fn reduce_all(dims: &[usize], symbols: &mut rocannl_arrayjit::indexing::SymbolGen) -> Projections {
    let iters: Vec<Symbol> = dims.iter().map(|_| symbols.fresh()).collect();
    Projections {
        product_space: dims.to_vec(),
        product_iterators: iters.clone(),
        lhs_dims: vec![],
        rhs_dims: vec![dims.to_vec()],
        project_lhs: vec![],
        project_rhs: vec![iters.iter().map(|s| AxisIndex::Iterator(*s)).collect()],
        debug_info: "gradient norm".into(),
        dynamic: vec![],
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

impl Session {
    fn update(
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
        let dims = p.dims()?;
        let pn = self.node(p);
        let g = self.grad_node(p);
        let [lr, c1, c2] = scalars;
        // Params exempt from weight decay (biases, norm gains, embeddings) get none.
        let opt =
            &if self.graph().decays(p) { opt.clone() } else { opt.clone().with_weight_decay(0.0) };
        let label = p.label();
        let grad_with_l2 = |wd: f64| {
            if wd == 0.0 { a(1) } else { b(BinOp::Add, a(1), b(BinOp::Mul, k(wd), a(0))) }
        };
        let mut code = vec![Asgn::Comment(format!("update {label}"))];
        match *opt {
            Optimizer::Sgd { momentum, nesterov, weight_decay } => {
                if momentum == 0.0 {
                    // p = p - lr * g'
                    let e = b(BinOp::Sub, a(0), b(BinOp::Mul, a(2), grad_with_l2(weight_decay)));
                    code.push(self.update(pn, vec![(pn, false), (g, false), (lr, true)], e, &dims));
                } else {
                    let v = self.extra_node(&format!("{label}.momentum"), &dims, true);
                    // v = μ v + g'
                    let ev =
                        b(BinOp::Add, b(BinOp::Mul, k(momentum), a(2)), grad_with_l2(weight_decay));
                    code.push(self.update(v, vec![(pn, false), (g, false), (v, false)], ev, &dims));
                    // p = p - lr * (nesterov ? g' + μ v : v)
                    let step = if nesterov {
                        b(BinOp::Add, grad_with_l2(weight_decay), b(BinOp::Mul, k(momentum), a(2)))
                    } else {
                        a(2)
                    };
                    let ep = b(BinOp::Sub, a(0), b(BinOp::Mul, a(3), step));
                    code.push(self.update(
                        pn,
                        vec![(pn, false), (g, false), (v, false), (lr, true)],
                        ep,
                        &dims,
                    ));
                }
            }
            Optimizer::Adam { beta1, beta2, eps, weight_decay }
            | Optimizer::AdamW { beta1, beta2, eps, weight_decay } => {
                let decoupled = matches!(opt, Optimizer::AdamW { .. });
                let l2 = if decoupled { 0.0 } else { weight_decay };
                let m = self.extra_node(&format!("{label}.adam_m"), &dims, true);
                let v = self.extra_node(&format!("{label}.adam_v"), &dims, true);
                if decoupled && weight_decay != 0.0 {
                    // p = p * (1 - lr * wd)
                    let e = b(
                        BinOp::Mul,
                        a(0),
                        b(BinOp::Sub, k(1.0), b(BinOp::Mul, a(1), k(weight_decay))),
                    );
                    code.push(self.update(pn, vec![(pn, false), (lr, true)], e, &dims));
                }
                let gp = grad_with_l2(l2);
                // m = β1 m + (1-β1) g';  v = β2 v + (1-β2) g'^2
                let em = b(
                    BinOp::Add,
                    b(BinOp::Mul, k(beta1), a(2)),
                    b(BinOp::Mul, k(1.0 - beta1), gp.clone()),
                );
                code.push(self.update(m, vec![(pn, false), (g, false), (m, false)], em, &dims));
                let ev = b(
                    BinOp::Add,
                    b(BinOp::Mul, k(beta2), a(2)),
                    b(BinOp::Mul, k(1.0 - beta2), b(BinOp::Mul, gp.clone(), gp)),
                );
                code.push(self.update(v, vec![(pn, false), (g, false), (v, false)], ev, &dims));
                // p = p - c1 * m / (sqrt(v) * c2 + eps)
                let denom =
                    b(BinOp::Add, b(BinOp::Mul, ScalarExpr::un(UnOp::Sqrt, a(2)), a(4)), k(eps));
                let e = b(BinOp::Sub, a(0), b(BinOp::Div, b(BinOp::Mul, a(3), a(1)), denom));
                code.push(self.update(
                    pn,
                    vec![(pn, false), (m, false), (v, false), (c1, true), (c2, true)],
                    e,
                    &dims,
                ));
            }
        }
        Ok(code)
    }

    /// Compiles a whole training step — forward, backpropagation from `loss` and the update of
    /// every parameter — into one routine. `outputs` are also kept readable (e.g. predictions).
    ///
    /// ```
    /// use rocannl_tensor::{Graph, Session, ParamSpec, Init, optim::Optimizer};
    /// let g = Graph::new();
    /// let w = g.param_with("w", ParamSpec::output(&[1]).init(Init::Constant(3.0)));
    /// let loss = w.pointmul(&w); // minimize w^2
    /// let mut s = Session::new(&g).unwrap();
    /// let mut step = s.train_step(&loss, &Optimizer::sgd(), &[]).unwrap();
    /// for _ in 0..10 { s.step(&mut step, 0.25, &[]).unwrap(); }
    /// assert!(s.read(&w).unwrap()[0].abs() < 0.01); // w halves every step
    /// ```
    pub fn train_step(
        &mut self,
        loss: &Tensor,
        opt: &Optimizer,
        outputs: &[&Tensor],
    ) -> Result<TrainStep> {
        self.train_step_with(loss, opt, outputs, &StepOptions::default())
    }

    /// [`Session::train_step`] with more settings: gradient clipping by global norm.
    ///
    /// ```
    /// use rocannl_tensor::optim::{Optimizer, StepOptions};
    /// use rocannl_tensor::{Graph, Init, ParamSpec, Session};
    /// let g = Graph::new();
    /// let w = g.param_with("w", ParamSpec::output(&[2]).init(Init::Values(vec![3.0, 4.0])));
    /// let loss = w.pointmul(&w).sum_all().scale(0.5); // its gradient is w: norm 5
    /// let mut s = Session::new(&g).unwrap();
    /// let clip = StepOptions { clip_grad_norm: Some(1.0) };
    /// let mut step = s.train_step_with(&loss, &Optimizer::sgd(), &[], &clip).unwrap();
    /// s.step(&mut step, 1.0, &[]).unwrap();
    /// assert!((s.grad_norm(&step).unwrap().unwrap() - 5.0).abs() < 1e-5);
    /// let w1 = s.read(&w).unwrap(); // moved by a gradient of norm 1: w - w/5
    /// assert!((w1[0] - 2.4).abs() < 1e-5 && (w1[1] - 3.2).abs() < 1e-5);
    /// ```
    pub fn train_step_with(
        &mut self,
        loss: &Tensor,
        opt: &Optimizer,
        outputs: &[&Tensor],
        options: &StepOptions,
    ) -> Result<TrainStep> {
        if let Some(max) = options.clip_grad_norm
            && !(max > 0.0 && max.is_finite())
        {
            return Err(Error::usage(format!(
                "clip_grad_norm must be a positive number, not {max}"
            )));
        }
        let params = self.graph().params();
        if params.is_empty() {
            return Err(Error::usage("the graph has no parameters to train"));
        }
        let mut outs: Vec<Tensor> = outputs.iter().map(|t| (*t).clone()).collect();
        outs.push(loss.clone());
        let plan = Plan { outputs: outs, backprop_from: Some(loss.clone()), grads: vec![] };
        let mut code = self.plan_code(&plan)?;
        let scalars = [
            self.extra_node("lr", &[], true),
            self.extra_node("adam_c1", &[], true),
            self.extra_node("adam_c2", &[], true),
        ];
        let trained: Vec<&Tensor> = params.iter().filter(|p| p.info().differentiable).collect();
        let grad_norm_sq = match options.clip_grad_norm {
            Some(max) => Some(self.clip_code(&trained, max, &mut code)?),
            None => None,
        };
        for p in trained {
            code.extend(self.update_code(opt, p, scalars)?);
        }
        let visible = self.visible_nodes(&plan);
        let routine = self.compile_code("train_step", Asgn::Seq(code), &visible)?;
        Ok(TrainStep {
            routine,
            optimizer: opt.clone(),
            scalars,
            grad_norm_sq,
            steps: 0,
            loss: loss.clone(),
        })
    }

    /// Clipping by global norm: `n2 = Σ_p Σ g_p²`, `c = min(1, max / (√n2 + 1e-6))`, every
    /// `g_p *= c`. Returns the node of `n2` (persistent, so the norm can be read).
    fn clip_code(&mut self, params: &[&Tensor], max: f64, code: &mut Vec<Asgn>) -> Result<NodeId> {
        let n2 = self.extra_node("grad_norm_sq", &[], true);
        let c = self.extra_node("grad_clip", &[], false);
        code.push(Asgn::Comment(format!("clip gradients to global norm {max}")));
        code.push(Asgn::Fetch {
            lhs: n2,
            fetch: rocannl_arrayjit::assignments::FetchOp::Constant(0.0),
        });
        for p in params {
            let dims = p.dims()?;
            let g = self.grad_node(p);
            code.push(Asgn::Accum {
                lhs: n2,
                accum: Some(BinOp::Add),
                rhs: vec![g],
                expr: b(BinOp::Mul, a(0), a(0)),
                projections: Arc::new(reduce_all(&dims, &mut self.symbols)),
                initialize_neutral: false,
            });
        }
        let coef = b(
            BinOp::Min,
            k(1.0),
            b(BinOp::Div, k(max), b(BinOp::Add, ScalarExpr::un(UnOp::Sqrt, a(0)), k(1e-6))),
        );
        code.push(self.update(c, vec![(n2, true)], coef, &[]));
        for p in params {
            let dims = p.dims()?;
            let g = self.grad_node(p);
            code.push(self.update(
                g,
                vec![(g, false), (c, true)],
                b(BinOp::Mul, a(0), a(1)),
                &dims,
            ));
        }
        Ok(n2)
    }

    /// The global gradient norm of the last step, before clipping, when the step clips
    /// ([`StepOptions::clip_grad_norm`]); `None` otherwise.
    pub fn grad_norm(&self, ts: &TrainStep) -> Result<Option<f64>> {
        match ts.grad_norm_sq {
            Some(n) => Ok(Some(self.read_extra(n)?[0].sqrt())),
            None => Ok(None),
        }
    }

    /// Runs one training step with learning rate `lr` and runtime symbols bound.
    ///
    /// The graph's step counter ([`crate::Graph::step_symbol`]), if the step uses it, is bound
    /// to the step's number.
    pub fn step(&mut self, ts: &mut TrainStep, lr: f64, bindings: &[(Symbol, i64)]) -> Result<()> {
        ts.steps += 1;
        let values = ts.optimizer.scalars(ts.steps, lr);
        for (n, v) in ts.scalars.iter().zip(values) {
            self.write_extra(*n, &[v])?;
        }
        match self.graph().existing_step_symbol() {
            Some(sym)
                if ts.routine.runtime_symbols().contains(&sym)
                    && !bindings.iter().any(|(s, _)| *s == sym) =>
            {
                let mut all = bindings.to_vec();
                all.push((sym, ts.steps as i64));
                self.run_with(&ts.routine, &all)
            }
            _ => self.run_with(&ts.routine, bindings),
        }
    }

    /// The loss after the last step (its cells summed).
    pub fn loss(&self, ts: &TrainStep) -> Result<f64> {
        Ok(self.read(&ts.loss)?.iter().sum())
    }
}

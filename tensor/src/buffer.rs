//! Buffers: state that compiled routines update in place, without a round trip to the host.
//!
//! Batch norm keeps running estimates of its inputs' mean and variance; a model's exponential
//! moving average keeps a smoothed copy of its weights. Such state is neither a parameter (the
//! optimizer never touches it, it has no gradient) nor data (the host does not write it every
//! step): it is a *buffer*, as PyTorch calls it. A buffer is a leaf of the graph
//! ([`Graph::buffer`]) with an initialization, read like any tensor; its update is an
//! assignment recorded in the graph ([`Tensor::update_with`]), `buffer := value`, where
//! `value` is an expression of the graph (usually of the buffer itself and of the batch).
//!
//! Every routine compiled in train mode ([`crate::Mode::Train`]: the training step,
//! [`crate::Session::backprop`], a train-mode forward) performs the updates whose value it can
//! compute — those whose data tensors it reads — as part of its compiled code: each new value
//! is computed with the forward pass and copied into its buffer at the end of the routine
//! (after the optimizer's update), so everything in the routine reads the values the step began
//! with. Eval-mode routines never change a buffer.
//!
//! Buffers live with the params: created once, shared by every routine of a session, saved in
//! checkpoints under their names ([`crate::Session::save_params`]) and loaded with them. They
//! are stored in the params' precision ([`crate::Session::master_prec`]).

use crate::error::Error;
use crate::graph::{Graph, Leaf, ParamSpec, Source, Tensor, TensorId, Update};

impl Graph {
    /// A buffer: state that routines compiled in train mode update in place
    /// ([`Tensor::update_with`]), with the rows and the initialization of `spec` (sizes not
    /// given are inferred from use, as a param's; [`ParamSpec::weight_decay`] does not apply).
    /// Buffers are not trained and have no gradient; checkpoints hold them beside the params,
    /// so a buffer's name may not be a param's or another buffer's.
    ///
    /// A running mean of a batch's values, updated by every training step:
    ///
    /// ```
    /// use rocannl_tensor::{Axes, Graph, Init, ParamSpec, Session, Sgd, optim::Optimizer};
    /// let g = Graph::new();
    /// let x = g.data("x", Axes::new().batch(&[4]).output(&[2]));
    /// let w = g.param("w", ParamSpec::new(Axes::new().input(&[]).output(&[2])).init(Init::Constant(1.0)));
    /// let y = x.pointmul(&w);
    /// let mean = g.buffer("mean", ParamSpec::new(Axes::new().input(&[]).output(&[2])).init(Init::Constant(0.0)));
    /// mean.update_with(&(&mean.scale(0.5) + &y.mean("b|o => o").scale(0.5)));
    /// let loss = y.sum_all();
    /// let mut s = Session::new(&g).unwrap();
    /// let mut step = s.train_step(&loss, &Optimizer::Sgd(Sgd::default()), &[], &Default::default()).unwrap();
    /// s.write(&x, &[1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0]).unwrap();
    /// s.step(&mut step, 0.0).unwrap();
    /// assert_eq!(s.read(&mean).unwrap(), vec![2.0, 2.5]); // ½·0 + ½·(4, 5)
    /// s.step(&mut step, 0.0).unwrap();
    /// assert_eq!(s.read(&mean).unwrap(), vec![3.0, 3.75]);
    /// ```
    #[track_caller]
    pub fn buffer(&self, label: &str, spec: ParamSpec) -> Tensor {
        self.claim_name(label, "params or buffers", std::panic::Location::caller());
        self.add_leaf_given(label, &spec, Leaf::Buffer(spec.init.clone()))
    }

    /// All buffers, in creation order.
    pub fn buffers(&self) -> Vec<Tensor> {
        let ids: Vec<TensorId> = self
            .borrow()
            .nodes
            .iter()
            .enumerate()
            .filter(|(_, n)| matches!(n.source, Source::Leaf(Leaf::Buffer(_))))
            .map(|(i, _)| TensorId(i as u32))
            .collect();
        ids.into_iter().map(|i| self.tensor(i)).collect()
    }
}

impl Tensor {
    /// Whether this is a buffer ([`Graph::buffer`]).
    pub fn is_buffer(&self) -> bool {
        matches!(self.info().source, Source::Leaf(Leaf::Buffer(_)))
    }

    /// Records the update `self := value` of a buffer, performed at the end of every routine
    /// compiled in train mode that reads the data `value` depends on (all train-mode routines
    /// when it depends on none). `value` is computed with the routine's forward pass, from the
    /// values the routine began with, and must have the buffer's dims. Several updates of one
    /// buffer are performed in the order they were recorded, each computed from the value the
    /// routine began with: the last one wins.
    ///
    /// Updating a tensor that is not a buffer is a usage error naming it, returned by
    /// [`Graph::finish`]. See [`Graph::buffer`] for an example.
    pub fn update_with(&self, value: &Tensor) {
        if !self.is_buffer() {
            self.graph.record(Error::usage(format!(
                "'{}' is updated with '{}', but only buffers (Graph::buffer) are updated by \
                 routines",
                self.label(),
                value.label()
            )));
            return;
        }
        if !value.graph.same(&self.graph) {
            self.graph.record(Error::usage(format!(
                "the buffer '{}' is updated with '{}', a tensor of another graph",
                self.label(),
                value.label()
            )));
            return;
        }
        // Running statistics stay in f32 in a half-precision session.
        let value = value.clone().kept_in_f32();
        self.graph.borrow_mut().updates.push(Update { buffer: self.id, value: value.id });
    }
}

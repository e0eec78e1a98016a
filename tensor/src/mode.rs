//! Train and eval modes: one graph, two behaviours, chosen per compiled routine.
//!
//! Some blocks compute differently while training: dropout zeroes random cells, batch norm
//! normalizes with the batch's statistics and updates its running estimates. Rather than a
//! flag threaded through every `apply` (and a second graph built by hand for evaluation), such
//! a block records both behaviours with [`Tensor::by_mode`]: a node whose value is its `train`
//! argument in routines compiled in [`Mode::Train`] and its `eval` argument in routines
//! compiled in [`Mode::Eval`]. A routine computes only the branch of its mode, and only
//! train-mode routines update buffers ([`crate::buffer`]).
//!
//! Which routine runs in which mode: a training step ([`crate::Session::train_step`]) and
//! [`crate::Session::backprop`] in train mode; [`crate::Session::forward`] in eval mode (as
//! PyTorch's `model.train()` before training and `model.eval()` before evaluating);
//! [`crate::Session::forward_in`] and [`crate::Plan::mode`] choose. The routines of a session
//! share its params and buffers whatever their modes.

use std::rc::Rc;

use rocannl_arrayjit::assignments::Asgn;
use rocannl_shape::logic::Logic;
use rocannl_shape::var::ShapeId;

use crate::graph::Tensor;
use crate::op::{G, Op, OpCtx, x};

/// Which behaviour a routine computes.
#[derive(Copy, Clone, Debug, Default, PartialEq, Eq, Hash)]
pub enum Mode {
    /// Training: dropout drops, batch norm uses the batch's statistics and updates its running
    /// estimates; buffers are updated.
    Train,
    /// Evaluation: dropout is the identity, batch norm uses its running estimates; no buffer
    /// changes. The mode of a [`crate::Plan`] unless it says otherwise.
    #[default]
    Eval,
}

/// The node of [`Tensor::by_mode`]: argument 0 in train mode, argument 1 in eval mode.
#[derive(Debug)]
pub(crate) struct ByMode;

impl ByMode {
    fn branch(mode: Mode) -> usize {
        match mode {
            Mode::Train => 0,
            Mode::Eval => 1,
        }
    }
}

impl Op for ByMode {
    fn name(&self) -> String {
        "by_mode".into()
    }
    fn logic(&self, args: &[ShapeId]) -> Logic {
        Logic::Pointwise(args.to_vec())
    }
    fn reads_only(&self, mode: Mode) -> Option<usize> {
        Some(ByMode::branch(mode))
    }
    fn forward(&self, cx: &OpCtx) -> Asgn {
        cx.out(None, &x(ByMode::branch(cx.mode)), false)
    }
    fn backward(&self, cx: &OpCtx) -> Vec<Asgn> {
        cx.grad(ByMode::branch(cx.mode), &G).into_iter().collect()
    }
}

impl Tensor {
    /// `train` in routines compiled in train mode, `eval` in those compiled in eval mode
    /// ([`Mode`]); the two broadcast to a common shape, as the arguments of a pointwise
    /// operation do. A routine computes only its mode's branch, and gradients flow into it
    /// alone.
    ///
    /// ```
    /// use rocannl_tensor::{Graph, Mode, Session, Tensor};
    /// let g = Graph::new();
    /// let x = g.vector("x", &[1.0, 2.0]);
    /// let y = Tensor::by_mode(&x.scale(10.0), &x);
    /// let mut s = Session::new(&g).unwrap();
    /// let eval = s.forward(&[&y]).unwrap(); // eval mode
    /// s.run(&eval).unwrap();
    /// assert_eq!(s.read(&y).unwrap(), vec![1.0, 2.0]);
    /// let train = s.forward_in(Mode::Train, &[&y]).unwrap();
    /// s.run(&train).unwrap();
    /// assert_eq!(s.read(&y).unwrap(), vec![10.0, 20.0]);
    /// ```
    pub fn by_mode(train: &Tensor, eval: &Tensor) -> Tensor {
        train.graph.add_op(Rc::new(ByMode), &[train, eval])
    }
}

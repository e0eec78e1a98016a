//! The operation interface: one trait, three facets defined side by side.
//!
//! Every operation is a small struct implementing [`Op`]: its *shape logic* (which constraints
//! relate its result to its arguments), its *forward* assignment and its *gradient*
//! assignments. There is no central table of derivatives: the backward pass just asks each
//! operation for its gradient code.
//!
//! Forward and backward code share the projections derived for the operation's step: the
//! gradient of an argument is an assignment over the same product space with the argument's
//! index on the left, so broadcasting in the forward direction becomes summation in the
//! backward direction for free. [`project`] re-targets a projection to any choice of sides.
//!
//! Gradient expressions are written with placeholders: [`G`] (the result's gradient), [`Y`]
//! (the result) and [`x`]`(i)` (argument `i`); [`OpCtx::grad`] turns them into an assignment
//! that reads only what the expression uses.

use std::fmt;
use std::sync::Arc;

use rocannl_arrayjit::assignments::{Asgn, ScalarExpr};
use rocannl_arrayjit::indexing::{Projections, Symbol};
use rocannl_arrayjit::ops::BinOp;
use rocannl_arrayjit::tnode::NodeId;
use rocannl_shape::logic::Logic;
use rocannl_shape::var::ShapeId;

/// An operation of the tensor graph.
pub trait Op: fmt::Debug {
    /// A short name (the default label of the result).
    fn name(&self) -> String;
    /// The shape logic of the operation, given its argument shapes.
    fn logic(&self, args: &[ShapeId]) -> Logic;
    /// Whether gradients flow through the operation at all.
    fn differentiable(&self) -> bool {
        true
    }
    /// Whether the operation combines its arguments cell by cell, broadcasting each to the
    /// result's shape (`+`, `*` by cells, …): such an operation that gives the result an axis
    /// only a param has is warned about ([`crate::Graph::warnings`]).
    fn pointwise(&self) -> bool {
        false
    }
    /// Whether the operation writes its result in parts, one projection per argument
    /// (concatenation).
    fn per_argument_projections(&self) -> bool {
        false
    }
    /// Whether argument `i` is a factor of a sum of products (an operand of a contraction):
    /// under mixed precision such an argument reads a parameter's copy in the half precision
    /// ([`crate::SessionOptions::autocast`]).
    fn is_factor(&self, _i: usize) -> bool {
        false
    }
    /// A dynamic size the operation gives the first axis of its result
    /// ([`crate::Tensor::dynamic_rows`]), whatever its argument's axis is.
    fn dynamic_rows(&self) -> Option<crate::DynDim> {
        None
    }
    /// Whether every cell of the result is a cell of the (single) argument, unchanged (a batch
    /// slice): a lookup reading the result as ids reads the argument's values as ids too.
    fn selects_cells(&self) -> bool {
        false
    }
    /// The one argument the operation reads in routines of this mode, when it reads only one
    /// ([`crate::Tensor::by_mode`]): a routine computes nothing the other arguments need.
    /// `None` (the default): every argument.
    fn reads_only(&self, _mode: crate::Mode) -> Option<usize> {
        None
    }
    /// Tensors the operation keeps besides its result, written by its forward assignment and
    /// read by its gradient (a softmax's row statistics), given the result's dims: the dims of
    /// each. The session gives each a node of the result's precision ([`OpCtx::aux`]).
    fn aux_dims(&self, _out_dims: &[usize]) -> Vec<Vec<usize>> {
        Vec::new()
    }
    /// The forward assignment(s).
    fn forward(&self, cx: &OpCtx) -> Asgn;
    /// The gradient assignments, accumulating (`+=`) into the gradients of the arguments that
    /// have one.
    fn backward(&self, cx: &OpCtx) -> Vec<Asgn>;
}

/// Which tensor of an operation an index list belongs to.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub enum Side {
    /// The result.
    Out,
    /// Argument `i`.
    Arg(usize),
}

/// The nodes and projections an operation's code is generated for.
#[derive(Clone, Debug)]
pub struct OpCtx {
    /// The result's node.
    pub out: NodeId,
    /// The arguments' nodes.
    pub args: Vec<NodeId>,
    /// The projections: one, or one per argument for [`Op::per_argument_projections`].
    pub proj: Vec<Arc<Projections>>,
    /// The result's gradient node (backward only).
    pub out_grad: Option<NodeId>,
    /// Each argument's gradient node, if it needs one (backward only).
    pub arg_grads: Vec<Option<NodeId>>,
    /// The mode of the routine being generated ([`crate::Mode`]).
    pub mode: crate::Mode,
    /// The nodes of the operation's kept tensors ([`Op::aux_dims`]), in order.
    pub aux: Vec<NodeId>,
}

const G_SLOT: usize = usize::MAX;
const Y_SLOT: usize = usize::MAX - 1;

/// The result's gradient, in gradient expressions.
pub const G: ScalarExpr = ScalarExpr::Arg(G_SLOT);
/// The result's value, in gradient expressions.
pub const Y: ScalarExpr = ScalarExpr::Arg(Y_SLOT);

/// Argument `i`'s value, in forward and gradient expressions.
pub fn x(i: usize) -> ScalarExpr {
    ScalarExpr::Arg(i)
}

/// Shorthand for a binary expression.
pub fn bin(op: BinOp, a: ScalarExpr, b: ScalarExpr) -> ScalarExpr {
    ScalarExpr::bin(op, a, b)
}

/// `a * b`.
pub fn mul(a: ScalarExpr, b: ScalarExpr) -> ScalarExpr {
    bin(BinOp::Mul, a, b)
}

/// A constant.
pub fn c(v: f64) -> ScalarExpr {
    ScalarExpr::Const(v)
}

fn side_of(placeholder: usize) -> Side {
    match placeholder {
        G_SLOT | Y_SLOT => Side::Out,
        i => Side::Arg(i),
    }
}

/// The same product space seen from other sides: `lhs` is indexed like `lhs` was in `p`,
/// and each rhs like its side was. Iterators that no index uses are dropped.
pub fn project(p: &Projections, lhs: Side, rhs: &[Side]) -> Projections {
    let idx = |s: Side| match s {
        Side::Out => (p.lhs_dims.clone(), p.project_lhs.clone()),
        Side::Arg(i) => (p.rhs_dims[i].clone(), p.project_rhs[i].clone()),
    };
    let (lhs_dims, project_lhs) = idx(lhs);
    let (rhs_dims, project_rhs): (Vec<_>, Vec<_>) = rhs.iter().map(|s| idx(*s)).unzip();
    let mut used: Vec<Symbol> = project_lhs.iter().flat_map(|i| i.symbols()).collect();
    used.extend(project_rhs.iter().flatten().flat_map(|i| i.symbols()));
    let (product_iterators, product_space): (Vec<Symbol>, Vec<usize>) = p
        .product_iterators
        .iter()
        .zip(&p.product_space)
        .filter(|(s, _)| used.contains(s))
        .map(|(s, d)| (*s, *d))
        .unzip();
    Projections {
        product_space,
        product_iterators,
        lhs_dims,
        rhs_dims,
        project_lhs,
        project_rhs,
        debug_info: p.debug_info.clone(),
        dynamic: p.dynamic.iter().filter(|(s, _)| used.contains(s)).copied().collect(),
    }
}

/// Renumbers the placeholders of an expression to positions in a list of sides, collecting
/// the sides it uses.
fn compact(e: &ScalarExpr, sides: &mut Vec<(usize, Side)>) -> ScalarExpr {
    match e {
        ScalarExpr::Arg(p) => {
            let pos = match sides.iter().position(|(q, _)| q == p) {
                Some(pos) => pos,
                None => {
                    sides.push((*p, side_of(*p)));
                    sides.len() - 1
                }
            };
            ScalarExpr::Arg(pos)
        }
        ScalarExpr::Const(v) => ScalarExpr::Const(*v),
        ScalarExpr::Symbol(s) => ScalarExpr::Symbol(*s),
        ScalarExpr::Unop(op, a) => ScalarExpr::un(*op, compact(a, sides)),
        ScalarExpr::Binop(op, a, b) => {
            let a = compact(a, sides);
            ScalarExpr::bin(*op, a, compact(b, sides))
        }
        ScalarExpr::Ternop(op, a, b, c) => {
            let a = compact(a, sides);
            let b = compact(b, sides);
            ScalarExpr::tern(*op, a, b, compact(c, sides))
        }
    }
}

impl OpCtx {
    fn node_of(&self, placeholder: usize) -> Option<NodeId> {
        match placeholder {
            G_SLOT => self.out_grad,
            Y_SLOT => Some(self.out),
            i => self.args.get(i).copied(),
        }
    }

    /// `lhs (accum)= expr` over projection `proj_index`, where `lhs` is indexed like `lhs_side`
    /// and `expr` uses the placeholders [`G`], [`Y`], [`x`].
    pub fn assign(
        &self,
        lhs: NodeId,
        lhs_side: Side,
        accum: Option<BinOp>,
        expr: &ScalarExpr,
        proj_index: usize,
        initialize_neutral: bool,
    ) -> Asgn {
        let mut sides = Vec::new();
        let expr = compact(expr, &mut sides);
        let rhs: Vec<NodeId> = sides.iter().filter_map(|(p, _)| self.node_of(*p)).collect();
        let rhs_sides: Vec<Side> = sides.iter().map(|(_, s)| *s).collect();
        let p = project(&self.proj[proj_index], lhs_side, &rhs_sides);
        Asgn::Accum { lhs, accum, rhs, expr, projections: Arc::new(p), initialize_neutral }
    }

    /// The forward result: `out (accum)= expr(args)`.
    pub fn out(&self, accum: Option<BinOp>, expr: &ScalarExpr, initialize_neutral: bool) -> Asgn {
        self.assign(self.out, Side::Out, accum, expr, 0, initialize_neutral)
    }

    /// `grad(arg i) += expr`, if argument `i` has a gradient; over projection 0.
    pub fn grad(&self, i: usize, expr: &ScalarExpr) -> Option<Asgn> {
        self.grad_over(i, expr, 0)
    }

    /// `grad(arg i) += expr` over projection `proj_index`.
    pub fn grad_over(&self, i: usize, expr: &ScalarExpr, proj_index: usize) -> Option<Asgn> {
        let g = self.arg_grads.get(i).copied().flatten()?;
        self.out_grad?;
        Some(self.assign(g, Side::Arg(i), Some(BinOp::Add), expr, proj_index, false))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rocannl_arrayjit::indexing::{AxisIndex, Symbol};

    #[test]
    fn projecting_drops_unused_iterators() {
        // out[i] += a[i, k] * b[k]; c[i] broadcast: fma's c term only needs i.
        let (i, k) = (Symbol(0), Symbol(1));
        let p = Projections {
            product_space: vec![2, 3],
            product_iterators: vec![i, k],
            lhs_dims: vec![2],
            rhs_dims: vec![vec![2, 3], vec![3], vec![2]],
            project_lhs: vec![AxisIndex::Iterator(i)],
            project_rhs: vec![
                vec![AxisIndex::Iterator(i), AxisIndex::Iterator(k)],
                vec![AxisIndex::Iterator(k)],
                vec![AxisIndex::Iterator(i)],
            ],
            debug_info: String::new(),
            dynamic: vec![],
        };
        let q = project(&p, Side::Out, &[Side::Arg(2)]);
        assert_eq!(q.to_string(), "[i0:2] lhs[i0] <- rhs0[i0]");
        let g = project(&p, Side::Arg(1), &[Side::Out, Side::Arg(0)]);
        assert_eq!(g.to_string(), "[i0:2, i1:3] lhs[i1] <- rhs0[i0], rhs1[i0, i1]");
    }

    #[test]
    fn gradient_expressions_read_only_what_they_use() {
        let p =
            Projections::identity(&[4], 2, &mut rocannl_arrayjit::indexing::SymbolGen::default());
        let cx = OpCtx {
            out: NodeId(2),
            args: vec![NodeId(0), NodeId(1)],
            proj: vec![Arc::new(p)],
            out_grad: Some(NodeId(3)),
            arg_grads: vec![Some(NodeId(4)), None],
            mode: crate::Mode::Train,
            aux: vec![],
        };
        let a = cx.grad(0, &mul(G, x(1))).unwrap();
        assert_eq!(a.to_string().trim(), "n4[i0] add= mul(n3[i0], n1[i0])  over [i0:4]");
        assert!(cx.grad(1, &G).is_none());
    }
}

//! Shared by the integration tests: random expression graphs, and independent checkers of what
//! inference promises.
//!
//! A [`Graph`] is a list of nodes, each a leaf or an operation over earlier nodes, so node order
//! is one topological order. [`Graph::build`] declares every shape first (in node order) and then
//! adds the steps in any order given, which is what order-independence varies. The checkers in
//! [`check`] re-derive each step's relation on the closed sizes from the definitions
//! (broadcasting, compose, einsum alignment) without using the solver's machinery.

#![allow(dead_code)]

pub mod check;
pub mod generate;

use std::sync::Arc;

use rocannl_shape::ShapeError;
use rocannl_shape::inference::{Inference, RowDecl, ShapeDecl};
use rocannl_shape::logic::{Logic, SliceIndex, Terminal, TerminalData};
use rocannl_shape::spec::EinsumSpec;
use rocannl_shape::var::{ShapeId, StepId};

/// One node of an expression graph; arguments are indices of earlier nodes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Node {
    /// Host data of known shape.
    Data { batch: Vec<usize>, input: Vec<usize>, output: Vec<usize> },
    /// A parameter without batch axes; `None` rows are inferred from use.
    Param { input: Option<Vec<usize>>, output: Option<Vec<usize>> },
    /// Pointwise over one to three arguments.
    Pointwise(Vec<usize>),
    /// `a * b`.
    Compose(usize, usize),
    /// `a * b + c`.
    ComposeAccumulate(usize, usize, usize),
    /// An einsum spec over the arguments.
    Einsum(String, Vec<usize>),
    /// Swap input and output.
    Transpose(usize),
    /// Remove the leftmost batch axis at a fixed position.
    BatchSlice(usize, usize),
}

impl Node {
    /// The nodes this one depends on.
    pub fn args(&self) -> Vec<usize> {
        match self {
            Node::Data { .. } | Node::Param { .. } => vec![],
            Node::Pointwise(a) | Node::Einsum(_, a) => a.clone(),
            Node::Compose(a, b) => vec![*a, *b],
            Node::ComposeAccumulate(a, b, c) => vec![*a, *b, *c],
            Node::Transpose(a) | Node::BatchSlice(a, _) => vec![*a],
        }
    }
}

/// An expression graph.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Graph {
    /// Leaves and operations, each after its arguments.
    pub nodes: Vec<Node>,
}

/// The result of building a graph.
pub struct Built {
    /// The inference problem after `finish` (or after the first failure).
    pub inf: Inference,
    /// The shape of each node.
    pub shapes: Vec<ShapeId>,
    /// The step of each node, when it was added.
    pub steps: Vec<Option<StepId>>,
    /// The first error, if any.
    pub error: Option<ShapeError>,
}

fn decl_row(r: &Option<Vec<usize>>) -> RowDecl {
    match r {
        Some(d) => RowDecl::Given(d.clone()),
        None => RowDecl::Inferred,
    }
}

impl Graph {
    /// The node order.
    pub fn natural_order(&self) -> Vec<usize> {
        (0..self.nodes.len()).collect()
    }

    /// A topological order: among the nodes whose arguments are done, the one with the smallest
    /// priority goes next.
    pub fn order_by(&self, priority: &[u32]) -> Vec<usize> {
        let n = self.nodes.len();
        let mut done = vec![false; n];
        let mut order = Vec::with_capacity(n);
        while order.len() < n {
            let next = (0..n)
                .filter(|&i| !done[i] && self.nodes[i].args().iter().all(|&a| done[a]))
                .min_by_key(|&i| (priority.get(i).copied().unwrap_or(0), i))
                .expect("a graph whose arguments come first is acyclic");
            done[next] = true;
            order.push(next);
        }
        order
    }

    /// Declares every shape in node order, adds the steps in `order`, and finishes.
    pub fn build(&self, order: &[usize]) -> Built {
        let mut inf = Inference::new();
        let shapes: Vec<ShapeId> = self
            .nodes
            .iter()
            .enumerate()
            .map(|(i, n)| {
                let decl = match n {
                    Node::Data { batch, input, output } => ShapeDecl::given(batch, input, output),
                    Node::Param { input, output } => ShapeDecl {
                        batch: RowDecl::Given(vec![]),
                        input: decl_row(input),
                        output: decl_row(output),
                    },
                    _ => ShapeDecl::inferred(),
                };
                let name = match n {
                    Node::Param { .. } => format!("p{i}"),
                    _ => format!("n{i}"),
                };
                inf.new_shape(&name, &decl)
            })
            .collect();
        let mut steps = vec![None; self.nodes.len()];
        let mut error = None;
        for &i in order {
            let s = |a: &usize| shapes[*a];
            let logic = match &self.nodes[i] {
                Node::Data { .. } => leaf(false),
                Node::Param { .. } => leaf(true),
                Node::Pointwise(a) => Logic::Pointwise(a.iter().map(s).collect()),
                Node::Compose(a, b) => Logic::Compose(s(a), s(b)),
                Node::ComposeAccumulate(a, b, c) => Logic::ComposeAccumulate(s(a), s(b), s(c)),
                Node::Einsum(spec, a) => {
                    let spec = Arc::new(EinsumSpec::parse(spec).expect("generated specs parse"));
                    Logic::Einsum(spec, a.iter().map(s).collect())
                }
                Node::Transpose(a) => Logic::Transpose(s(a)),
                Node::BatchSlice(a, k) => Logic::BatchSlice(s(a), SliceIndex::Fixed(*k)),
            };
            match inf.add_step(shapes[i], logic) {
                Ok(st) => steps[i] = Some(st),
                Err(e) => {
                    error = Some(e);
                    break;
                }
            }
        }
        if error.is_none() {
            error = inf.finish().err();
        }
        Built { inf, shapes, steps, error }
    }
}

fn leaf(param: bool) -> Logic {
    Logic::Terminal(Terminal { param, data: TerminalData::Rows, input_equals_output: false })
}

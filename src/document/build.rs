//! Building a tensor graph from a document: one tensor per expression node, params shared by
//! name, named nodes reusable through `ref`.

use std::collections::HashMap;

use crate::arrayjit::error::limit_message;
use crate::shape::ShapeError;
use crate::tensor::{Axes, Error, Graph, Init, ParamSpec, Tensor, Warnings};

use crate::document::doc::{
    CliError, Document, ErrorKind, Expr, Init as DocInit, Leaf, Rows, input_err,
};

/// The graph of a document.
pub struct Built {
    pub graph: Graph,
    pub root: Tensor,
    /// Named nodes, in order of completion.
    pub nodes: Vec<(String, Tensor)>,
    /// Params, in order of first occurrence.
    pub params: Vec<(String, Tensor)>,
    /// The number of explicit init values of each param that has them.
    pub init_counts: Vec<(String, usize)>,
}

impl Built {
    /// After shape inference: every param's explicit init values must fill its inferred shape
    /// (an `input` error naming the param, found by `shapes` as well as by `eval`).
    pub fn check_init_counts(&self) -> Result<(), CliError> {
        for (name, count) in &self.init_counts {
            let Some((_, t)) = self.params.iter().find(|(n, _)| n == name) else { continue };
            let cells = t.rows().map_err(tensor_error)?.cells();
            if cells != *count {
                return input_err(format!(
                    "param {name}: init has {count} values but its inferred shape {} holds {cells}",
                    t.shape_string()
                ));
            }
        }
        Ok(())
    }
}

/// Maps a tensor-layer error to the contract's error kinds.
pub fn tensor_error(e: Error) -> CliError {
    use crate::arrayjit::Error as J;
    let kind = match &e {
        Error::Shape(ShapeError::Spec(_)) => ErrorKind::Spec,
        Error::Shape(ShapeError::Arity(_)) => ErrorKind::Input,
        Error::Shape(_) | Error::Dynamic { .. } => ErrorKind::Shape,
        Error::Compile(
            J::UnknownBackend(_)
            | J::NotBuiltIn(_)
            | J::NoDevice { .. }
            | J::LibraryMissing { .. }
            | J::Compile { .. }
            | J::Cuda(_),
        ) => ErrorKind::Backend,
        Error::Compile(J::SymbolOutOfRange { .. } | J::OutOfBounds { .. }) => ErrorKind::Shape,
        Error::Compile(J::LimitExceeded { routine, resource, estimate, limit, default_for }) => {
            let flag = if *resource == "memory" { "--max-memory BYTES" } else { "--max-work OPS" };
            let what = limit_message(routine, resource, *estimate, *limit, *default_for);
            return CliError {
                kind: ErrorKind::Limit,
                message: format!("{what}; raise the limit with {flag} (or none)"),
            };
        }
        Error::Compile(J::Alloc { .. }) => ErrorKind::Limit,
        // Documents never run data-parallel: a collective's failure would be the backend's.
        Error::Distributed { .. } => ErrorKind::Backend,
        Error::Compile(_)
        | Error::Usage(_)
        | Error::Persist(_)
        | Error::Io { .. }
        | Error::Warnings(_) => ErrorKind::Input,
    };
    CliError { kind, message: e.to_string() }
}

struct Builder {
    graph: Graph,
    nodes: Vec<(String, Tensor)>,
    params: Vec<(String, Tensor, Rows, Option<DocInit>)>,
    /// Names of nodes being built (a ref to one of them is a ref to an incomplete node).
    open: Vec<String>,
    /// Where each name is, in `nodes` or `params`: documents may name many thousands of nodes.
    node_index: HashMap<String, usize>,
    param_index: HashMap<String, usize>,
}

pub fn build(doc: &Document, strict: bool) -> Result<Built, CliError> {
    let graph = Graph::new();
    // The contract reports warnings in its JSON (`"warnings"`), never on standard error.
    graph.set_warnings(Warnings::Collect);
    graph.set_strict(strict);
    let mut b = Builder {
        graph: graph.clone(),
        nodes: vec![],
        params: vec![],
        open: vec![],
        node_index: HashMap::new(),
        param_index: HashMap::new(),
    };
    let root = b.expr(&doc.expr)?;
    Ok(Built {
        graph,
        root,
        nodes: b.nodes,
        init_counts: b
            .params
            .iter()
            .filter_map(|(n, _, _, init)| match init {
                Some(DocInit::Values(vs)) => Some((n.clone(), vs.len())),
                _ => None,
            })
            .collect(),
        params: b.params.into_iter().map(|(n, t, _, _)| (n, t)).collect(),
    })
}

fn init_of(init: &Option<DocInit>) -> Init {
    match init {
        None => Init::Constant(0.0),
        Some(DocInit::Constant(c)) => Init::Constant(*c),
        Some(DocInit::Values(vs)) => Init::Values(vs.clone()),
        Some(DocInit::Uniform { lo, hi, seed }) => Init::Uniform { lo: *lo, hi: *hi }.seeded(*seed),
    }
}

/// The operation `op` of the arguments' tensors `a` (with the einsum spec's text and the batch
/// slice's index where the operation takes them).
fn apply_op(
    op: &str,
    a: &[Tensor],
    spec_text: &str,
    index: Option<usize>,
) -> Result<Tensor, CliError> {
    let rest: Vec<&Tensor> = a.iter().skip(1).collect();
    Ok(match op {
        "add" => &a[0] + &a[1],
        "sub" => &a[0] - &a[1],
        "pointmul" => a[0].pointmul(&a[1]),
        "div" => &a[0] / &a[1],
        "pow" => a[0].pow(&a[1]),
        "max" => a[0].max(&a[1]),
        "min" => a[0].min(&a[1]),
        "lt" => a[0].lt(&a[1]),
        "eq" => a[0].eq(&a[1]),
        "ne" => a[0].ne(&a[1]),
        "neg" => -&a[0],
        "relu" => a[0].relu(),
        "exp" => a[0].exp(),
        "log" => a[0].log(),
        "sqrt" => a[0].sqrt(),
        "tanh" => a[0].tanh(),
        "sigmoid" => a[0].sigmoid(),
        "sin" => a[0].sin(),
        "cos" => a[0].cos(),
        "recip" => a[0].recip(),
        "abs" => a[0].abs(),
        "not" => a[0].not(),
        "where" => Tensor::where_(&a[0], &a[1], &a[2]),
        "fma" => a[0].fma(&a[1], &a[2]),
        "matmul" => a[0].matmul(&a[1]),
        "transpose" => a[0].transpose(),
        "einsum" => a[0].einsum(spec_text, &a[1]),
        "einsum1" => a[0].einsum(spec_text, []),
        "einmax1" => a[0].amax(spec_text),
        "tropical" => a[0].tropical(spec_text, &a[1]),
        "concat" => a[0].concat(spec_text, &rest),
        "batch_slice" => a[0].batch_slice(index.unwrap_or(0)),
        other => return input_err(format!("unknown op \"{other}\"")),
    })
}

fn rows(r: &Rows) -> (Vec<usize>, Vec<usize>, Vec<usize>) {
    let f = |x: &Option<Vec<usize>>| x.clone().unwrap_or_default();
    (f(&r.batch), f(&r.input), f(&r.output))
}

impl Builder {
    /// The tensor of an expression node: an earlier named node, a param (shared by name), a
    /// leaf, or an operation of its arguments' tensors.
    fn expr(&mut self, e: &Expr) -> Result<Tensor, CliError> {
        match e {
            Expr::Ref(r) => self.reference(r),
            Expr::Leaf { leaf: Leaf::Param { name, rows, init }, .. } => {
                self.param(name, rows, init)
            }
            Expr::Leaf { leaf, name } => {
                self.check_new_name(name)?;
                let g = self.graph.clone();
                let t = match leaf {
                    Leaf::Number(x) => g.number(*x),
                    Leaf::Range(n) => g.range(*n),
                    Leaf::RangeOfShape(r) => {
                        let (b, i, o) = rows(r);
                        g.range_of_shape(Axes::new().batch(&b).input(&i).output(&o))
                    }
                    Leaf::Ndarray { values, rows: r } => {
                        let (b, i, o) = rows(r);
                        g.ndarray(
                            name.as_deref().unwrap_or("ndarray"),
                            Axes::new().batch(&b).input(&i).output(&o),
                            values,
                        )
                    }
                    Leaf::Param { .. } => return input_err("a param leaf in an unexpected place"),
                };
                Ok(self.finish_node(name, t))
            }
            Expr::Op { op, args, spec, index, name } => {
                self.check_new_name(name)?;
                if let Some(n) = name {
                    self.open.push(n.clone());
                }
                let a = args.iter().map(|x| self.expr(x)).collect::<Result<Vec<_>, _>>()?;
                if name.is_some() {
                    self.open.pop();
                }
                let spec_text = spec.as_ref().map(|s| s.text.clone()).unwrap_or_default();
                let t = apply_op(op, &a, &spec_text, *index)?;
                Ok(self.finish_node(name, t))
            }
        }
    }

    /// The tensor of an earlier complete node named `r`.
    fn reference(&self, r: &str) -> Result<Tensor, CliError> {
        if let Some(&k) = self.node_index.get(r) {
            return Ok(self.nodes[k].1.clone());
        }
        if self.param_index.contains_key(r) {
            return input_err(format!(
                "ref \"{r}\" names a param: params are shared by their own name"
            ));
        }
        if self.open.iter().any(|n| n == r) {
            return input_err(format!("ref \"{r}\" names a node that is not complete yet"));
        }
        input_err(format!("ref \"{r}\" names no earlier node"))
    }

    /// The param `name`: made at its first occurrence, shared by later ones (which must agree
    /// with it on the rows and init they give).
    fn param(
        &mut self,
        name: &str,
        rows: &Rows,
        init: &Option<DocInit>,
    ) -> Result<Tensor, CliError> {
        if let Some((_, t, rows0, init0)) = self.param_index.get(name).map(|&k| &self.params[k]) {
            // A later occurrence that omits a row says nothing about it; one that
            // gives the batch row must repeat the first occurrence's, where an omitted
            // batch row is the empty row (not an inferred one): `"batch": []` repeats
            // an occurrence that omitted it.
            let batch0 = Some(rows0.batch.clone().unwrap_or_default());
            let pairs = [
                (&rows.batch, &batch0),
                (&rows.input, &rows0.input),
                (&rows.output, &rows0.output),
            ];
            let rows_ok = pairs.iter().all(|(r, r0)| r.is_none() || r == r0);
            let init_ok = init.is_none() || init == init0;
            if !rows_ok || !init_ok {
                return input_err(format!(
                    "param {name} is defined twice with different {}",
                    if rows_ok { "init" } else { "rows" }
                ));
            }
            return Ok(t.clone());
        }
        if self.node_index.contains_key(name) {
            return input_err(format!("the name \"{name}\" is used by a node and a param"));
        }
        // Rows not given: no batch axes, input and output inferred (as `ParamSpec` reads them).
        let mut axes = Axes::new();
        if let Some(d) = &rows.batch {
            axes = axes.batch(d);
        }
        if let Some(d) = &rows.input {
            axes = axes.input(d);
        }
        if let Some(d) = &rows.output {
            axes = axes.output(d);
        }
        let spec = ParamSpec { axes, init: init_of(init), weight_decay: true };
        let t = self.graph.clone().param(name, spec);
        self.param_index.insert(name.to_string(), self.params.len());
        self.params.push((name.to_string(), t.clone(), rows.clone(), init.clone()));
        Ok(t)
    }

    fn check_new_name(&self, name: &Option<String>) -> Result<(), CliError> {
        if let Some(n) = name {
            if self.node_index.contains_key(n) || self.open.contains(n) {
                return input_err(format!("two nodes are named \"{n}\""));
            }
            if self.param_index.contains_key(n) {
                return input_err(format!("the name \"{n}\" is used by a node and a param"));
            }
        }
        Ok(())
    }

    fn finish_node(&mut self, name: &Option<String>, t: Tensor) -> Tensor {
        match name {
            Some(n) => {
                let t = t.named(n);
                self.node_index.insert(n.clone(), self.nodes.len());
                self.nodes.push((n.clone(), t.clone()));
                t
            }
            None => t,
        }
    }
}

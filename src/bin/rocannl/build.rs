//! Building a shape graph from a document: one shape per node, one step per operation.

use rocannl::shape::ShapeError;
use rocannl::shape::inference::{Inference, RowDecl, ShapeDecl};
use rocannl::shape::logic::{Logic, SliceIndex, Terminal, TerminalData};
use rocannl::shape::var::ShapeId;

use crate::doc::{CliError, Document, ErrorKind, Expr, Init, Leaf, Rows, input_err};

/// The graph of a document.
pub struct Built {
    pub inf: Inference,
    pub root: ShapeId,
    /// Named nodes, in order of completion.
    pub nodes: Vec<(String, ShapeId)>,
    /// Params, in order of first occurrence.
    pub params: Vec<(String, ShapeId)>,
}

pub fn shape_error(e: ShapeError) -> CliError {
    let kind = match e {
        ShapeError::Spec(_) => ErrorKind::Spec,
        ShapeError::Arity(_) => ErrorKind::Input,
        _ => ErrorKind::Shape,
    };
    CliError { kind, message: e.to_string() }
}

struct Builder {
    inf: Inference,
    nodes: Vec<(String, ShapeId)>,
    params: Vec<(String, ShapeId, Rows, Option<Init>)>,
    /// Names of nodes being built (a ref to one of them is a ref to an incomplete node).
    open: Vec<String>,
}

pub fn build(doc: &Document, strict: bool) -> Result<Built, CliError> {
    let mut b = Builder { inf: Inference::new(), nodes: vec![], params: vec![], open: vec![] };
    b.inf.set_strict(strict);
    if std::env::var_os("ROCANNL_TRACE").is_some() {
        b.inf.enable_trace();
    }
    let root = b.expr(&doc.expr)?;
    Ok(Built {
        inf: b.inf,
        root,
        nodes: b.nodes,
        params: b.params.into_iter().map(|(n, s, _, _)| (n, s)).collect(),
    })
}

fn decl(rows: &Rows, param: bool) -> ShapeDecl {
    let row = |r: &Option<Vec<usize>>, inferable: bool| match r {
        Some(ds) => RowDecl::Given(ds.clone()),
        None if inferable => RowDecl::Inferred,
        None => RowDecl::Given(vec![]),
    };
    ShapeDecl {
        batch: row(&rows.batch, false),
        input: row(&rows.input, param),
        output: row(&rows.output, param),
    }
}

impl Builder {
    fn leaf(&mut self, name: &str, decl: ShapeDecl, param: bool) -> Result<ShapeId, CliError> {
        let sh = self.inf.new_shape(name, &decl);
        let t = Terminal { param, data: TerminalData::Rows, input_equals_output: false };
        self.inf.add_step(sh, Logic::Terminal(t)).map_err(shape_error)?;
        Ok(sh)
    }

    fn expr(&mut self, e: &Expr) -> Result<ShapeId, CliError> {
        match e {
            Expr::Ref(r) => {
                if let Some((_, sh)) = self.nodes.iter().find(|(n, _)| n == r) {
                    return Ok(*sh);
                }
                if self.params.iter().any(|(n, ..)| n == r) {
                    return input_err(format!(
                        "ref \"{r}\" names a param: params are shared by their own name"
                    ));
                }
                if self.open.contains(r) {
                    return input_err(format!("ref \"{r}\" names a node that is not complete yet"));
                }
                input_err(format!("ref \"{r}\" names no earlier node"))
            }
            Expr::Leaf { leaf: Leaf::Param { name, rows, init }, .. } => {
                if let Some((_, sh, rows0, init0)) = self.params.iter().find(|(n, ..)| n == name) {
                    let rows_ok = [
                        (&rows.batch, &rows0.batch),
                        (&rows.input, &rows0.input),
                        (&rows.output, &rows0.output),
                    ]
                    .iter()
                    .all(|(r, r0)| r.is_none() || r == r0);
                    let init_ok = init.is_none() || init == init0;
                    if !rows_ok || !init_ok {
                        return input_err(format!(
                            "param {name} is defined twice with different {}",
                            if rows_ok { "init" } else { "rows" }
                        ));
                    }
                    return Ok(*sh);
                }
                if self.nodes.iter().any(|(n, _)| n == name) {
                    return input_err(format!("the name \"{name}\" is used by a node and a param"));
                }
                let sh = self.leaf(name, decl(rows, true), true)?;
                self.params.push((name.clone(), sh, rows.clone(), init.clone()));
                Ok(sh)
            }
            Expr::Leaf { leaf, name } => {
                let label = name.clone().unwrap_or_else(|| "leaf".to_string());
                let d = match leaf {
                    Leaf::Number(_) => ShapeDecl::given(&[], &[], &[]),
                    Leaf::Range(n) => ShapeDecl::given(&[], &[], &[*n]),
                    Leaf::RangeOfShape(rows) | Leaf::Ndarray { rows, .. } => decl(rows, false),
                    Leaf::Param { .. } => unreachable!("handled above"),
                };
                self.check_new_name(name)?;
                let sh = self.leaf(&label, d, false)?;
                self.finish_node(name, sh);
                Ok(sh)
            }
            Expr::Op { op, args, spec, index, name } => {
                self.check_new_name(name)?;
                if let Some(n) = name {
                    self.open.push(n.clone());
                }
                let arg_shapes =
                    args.iter().map(|a| self.expr(a)).collect::<Result<Vec<_>, _>>()?;
                if name.is_some() {
                    self.open.pop();
                }
                let logic = match op.as_str() {
                    "matmul" => Logic::Compose(arg_shapes[0], arg_shapes[1]),
                    "fma" => Logic::ComposeAccumulate(arg_shapes[0], arg_shapes[1], arg_shapes[2]),
                    "transpose" => Logic::Transpose(arg_shapes[0]),
                    "batch_slice" => {
                        Logic::BatchSlice(arg_shapes[0], SliceIndex::Fixed(index.unwrap_or(0)))
                    }
                    "einsum" | "einsum1" | "einmax1" | "tropical" | "concat" => {
                        let spec = spec
                            .clone()
                            .ok_or(())
                            .or_else(|_| input_err(format!("op \"{op}\" needs a spec")))?;
                        Logic::Einsum(spec, arg_shapes.clone())
                    }
                    _ => Logic::Pointwise(arg_shapes.clone()),
                };
                let label = name.clone().unwrap_or_else(|| op.clone());
                let sh = self.inf.new_shape(&label, &ShapeDecl::inferred());
                self.inf.add_step(sh, logic).map_err(shape_error)?;
                self.finish_node(name, sh);
                Ok(sh)
            }
        }
    }

    fn check_new_name(&self, name: &Option<String>) -> Result<(), CliError> {
        if let Some(n) = name {
            if self.nodes.iter().any(|(m, _)| m == n) || self.open.contains(n) {
                return input_err(format!("two nodes are named \"{n}\""));
            }
            if self.params.iter().any(|(m, ..)| m == n) {
                return input_err(format!("the name \"{n}\" is used by a node and a param"));
            }
        }
        Ok(())
    }

    fn finish_node(&mut self, name: &Option<String>, sh: ShapeId) {
        if let Some(n) = name {
            self.nodes.push((n.clone(), sh));
        }
    }
}

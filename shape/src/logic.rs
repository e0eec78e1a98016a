//! The shape logic of each kind of operation (`get_inequalities`).
//!
//! Every operation instance is an *update step*: a result shape (`cur`) and a [`Logic`] saying
//! how it relates to its argument shapes. [`get_inequalities`] turns a step into constraints:
//! pointwise, compose and einsum all generate inequalities `cur ≥ subr`, so arguments broadcast
//! (einsum arguments included: `result ≥ lhs template` and `rhs template ≥ argument`); batch
//! slicing generates an equation that waits for the batch rows; leaves generate terminal
//! constraints. It also returns the
//! projection-relevant facts that substitution would lose: which dimension variables are fixed
//! indices or runtime symbols, and the einsum labels.

use std::sync::Arc;

use rocannl_arrayjit::indexing::{AxisIndex, Symbol};
use rustc_hash::FxHashMap;

use crate::constraint::{Constraint, DimConstraint, RowConstraint, TotalElems};
use crate::dim::{ConvDim, Dim};
use crate::error::{ShapeError, ShapeMismatch};
use crate::reshape::{ReshapeRows, check_rows, reshape_constraints};
/// The shape every step relates, defined beside its rows.
pub use crate::row::Shape;
use crate::row::{Bcast, Kind, Row, RowId};
use crate::spec::{AxisSpec, EinsumSpec, MAX_INDEX, RowSpec, RowVarSpec, ShapePattern};
use crate::var::{DimVar, RowVar, ShapeId, VarGen};

/// Where a batch slice takes its position from.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum SliceIndex {
    /// A fixed position.
    Fixed(usize),
    /// A runtime symbol (bound when the routine runs, e.g. in a training loop).
    Runtime(Symbol),
}

/// Extra shape information of a leaf.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum TerminalData {
    /// Only what the shape's rows say.
    Rows,
    /// The leaf holds this many values (its rows may be inferred).
    Values(usize),
    /// The leaf's axes in memory order are exactly these (their split into rows is inferred).
    Exact(Vec<usize>),
}

/// A leaf tensor.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Terminal {
    /// A learnable parameter (closing guesses about it are warned about).
    pub param: bool,
    /// Extra shape information.
    pub data: TerminalData,
    /// The input row equals the output row (a square map).
    pub input_equals_output: bool,
}

/// How an operation's result shape relates to its arguments.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum Logic {
    /// A leaf.
    Terminal(Terminal),
    /// Pointwise with NumPy-style broadcasting per row (unary, binary, ternary).
    Pointwise(Vec<ShapeId>),
    /// Pointwise without broadcasting: every row of every argument equals the result's (a
    /// loss's predictions and targets, which must pair cell for cell).
    Same(Vec<ShapeId>),
    /// `a * b`: the input axes of `a` contract with the output axes of `b`.
    Compose(ShapeId, ShapeId),
    /// `a * b + c` (fused multiply-add).
    ComposeAccumulate(ShapeId, ShapeId, ShapeId),
    /// An einsum spec over one or more arguments (also permutations and concatenations).
    Einsum(Arc<EinsumSpec>, Vec<ShapeId>),
    /// Swaps input and output axes, keeps batch axes.
    Transpose(ShapeId),
    /// Removes the leftmost batch axis, taking one position.
    BatchSlice(ShapeId, SliceIndex),
    /// The same cells in memory order, regrouped into other axes: the rows it changes hold
    /// the same number of elements on both sides (see [`crate::reshape`]).
    Reshape(ShapeId, ReshapeRows),
}

impl Logic {
    /// The argument shapes.
    pub fn args(&self) -> Vec<ShapeId> {
        self.arg_ids().collect()
    }

    /// The argument shapes, in the order of [`Logic::args`], without collecting them.
    pub fn arg_ids(&self) -> impl Iterator<Item = ShapeId> + '_ {
        let (listed, fixed): (&[ShapeId], [Option<ShapeId>; 3]) = match self {
            Logic::Terminal(_) => (&[], [None; 3]),
            Logic::Pointwise(a) | Logic::Same(a) | Logic::Einsum(_, a) => (a, [None; 3]),
            Logic::Compose(a, b) => (&[], [Some(*a), Some(*b), None]),
            Logic::ComposeAccumulate(a, b, c) => (&[], [Some(*a), Some(*b), Some(*c)]),
            Logic::Transpose(a) | Logic::BatchSlice(a, _) | Logic::Reshape(a, _) => {
                (&[], [Some(*a), None, None])
            }
        };
        listed.iter().copied().chain(fixed.into_iter().flatten())
    }

    /// A short description for messages.
    pub fn describe(&self) -> String {
        match self {
            Logic::Terminal(t) if t.param => "param".into(),
            Logic::Terminal(_) => "leaf".into(),
            Logic::Pointwise(a) => format!("pointwise op of {} argument(s)", a.len()),
            Logic::Same(a) => format!("pointwise op of {} argument(s) of one shape", a.len()),
            Logic::Compose(..) => "compose (matmul)".into(),
            Logic::ComposeAccumulate(..) => "compose-accumulate (fma)".into(),
            Logic::Einsum(s, _) => format!("einsum \"{}\"", s.text),
            Logic::Transpose(_) => "transpose".into(),
            Logic::BatchSlice(_, SliceIndex::Fixed(i)) => format!("batch slice at {i}"),
            Logic::BatchSlice(_, SliceIndex::Runtime(s)) => format!("batch slice at {s}"),
            Logic::Reshape(..) => "reshape".into(),
        }
    }
}

/// The constraints of one step, with the facts projection inference needs.
#[derive(Clone, Debug, Default)]
pub struct Derivation {
    /// The constraints, in a fixed order.
    pub constraints: Vec<Constraint>,
    /// Dimension variables indexed at a fixed position or by a runtime symbol.
    pub proj_env: FxHashMap<DimVar, AxisIndex>,
    /// The einsum labels and their variables.
    pub labels: Vec<(String, DimVar)>,
    /// The row variables of einsum patterns (their leading axes anchor at the start of the row
    /// they are matched with; see [`crate::ineq`]).
    pub template_rows: Vec<RowVar>,
    /// The variables of convolution kernel labels: an argument axis matched with one is the
    /// kernel, so it is equal to it rather than broadcast against it (a kernel of size 1 is a
    /// kernel of one tap).
    pub kernel_dims: Vec<DimVar>,
}

fn ineq(cur: &Arc<Row>, subr: &Arc<Row>) -> Constraint {
    Constraint::RowIneq { cur: Arc::clone(cur), subr: Arc::clone(subr) }
}

/// Derives the constraints of a step: `cur` is the result shape, `args` the argument shapes.
pub fn get_inequalities(
    cur: &Shape,
    logic: &Logic,
    args: &[&Shape],
    vars: &mut VarGen,
) -> Result<Derivation, ShapeError> {
    let mut d = Derivation::default();
    let cs = &mut d.constraints;
    cs.reserve(match logic {
        Logic::Terminal(_) => 5,
        Logic::Pointwise(_) | Logic::Same(_) => 3 * args.len(),
        Logic::Compose(..) | Logic::ComposeAccumulate(..) => 8,
        Logic::Transpose(_) | Logic::BatchSlice(..) | Logic::Reshape(..) => 4,
        Logic::Einsum(..) => 0,
    });
    match logic {
        Logic::Terminal(t) => terminal_constraints(cur, t, cs),
        Logic::Pointwise(_) => {
            for a in args {
                for kind in Kind::ALL {
                    cs.push(ineq(cur.row(kind), a.row(kind)));
                }
            }
        }
        Logic::Same(_) => {
            for a in args {
                for kind in Kind::ALL {
                    cs.push(Constraint::RowEq {
                        r1: cur.row(kind).clone(),
                        r2: a.row(kind).clone(),
                    });
                }
            }
        }
        Logic::Compose(..) | Logic::ComposeAccumulate(..) => compose_constraints(cur, args, cs),
        Logic::Transpose(_) => {
            let a = args[0];
            cs.push(ineq(&cur.batch, &a.batch));
            cs.push(ineq(&cur.input, &a.output));
            cs.push(ineq(&cur.output, &a.input));
        }
        Logic::BatchSlice(_, index) => batch_slice_constraints(cur, args[0], index, vars, &mut d)?,
        Logic::Reshape(_, rows) => {
            check_rows(rows).map_err(|e| ShapeError::Arity(format!("reshape: {e}")))?;
            *cs = reshape_constraints(cur, args[0], rows, vars);
        }
        Logic::Einsum(spec, _) => einsum_derivation(cur, spec, args, vars, &mut d)?,
    }
    Ok(d)
}

/// A leaf: input equal to output when asked, the element count or exact axes of its data,
/// and each row marked terminal.
fn terminal_constraints(cur: &Shape, t: &Terminal, cs: &mut Vec<Constraint>) {
    if t.input_equals_output {
        cs.push(Constraint::RowEq { r1: cur.input.clone(), r2: cur.output.clone() });
    }
    let rows = || cur.memory_rows().into_iter().cloned().collect::<Vec<Row>>();
    match &t.data {
        TerminalData::Rows => {}
        TerminalData::Values(n) => cs.push(Constraint::RowsConstr {
            rows: rows(),
            constr: RowConstraint::TotalElems {
                numerator: TotalElems::NumElems(*n),
                divided_by: vec![],
            },
        }),
        TerminalData::Exact(dims) => cs.push(Constraint::RowsConstr {
            rows: rows(),
            constr: RowConstraint::Exact(dims.iter().map(|&x| Dim::of(x)).collect()),
        }),
    }
    for kind in Kind::ALL {
        cs.push(Constraint::TerminalRow(cur.row(kind).clone()));
    }
}

/// Compose (matrix product) `a · b`, and the accumulated `c` of compose-accumulate: `a`'s
/// input meets `b`'s output; the result takes the batch of both, `b`'s input and `a`'s output.
fn compose_constraints(cur: &Shape, args: &[&Shape], cs: &mut Vec<Constraint>) {
    let (a, b) = (args[0], args[1]);
    cs.push(ineq(&a.input, &b.output));
    cs.push(ineq(&cur.batch, &a.batch));
    cs.push(ineq(&cur.batch, &b.batch));
    cs.push(ineq(&cur.input, &b.input));
    cs.push(ineq(&cur.output, &a.output));
    if let Some(c) = args.get(2) {
        for kind in Kind::ALL {
            cs.push(ineq(cur.row(kind), c.row(kind)));
        }
    }
}

/// A batch slice of `a` at `index`: a fresh slot dimension (at least `i + 1` for a fixed
/// position, recorded for projections either way), input and output unchanged.
fn batch_slice_constraints(
    cur: &Shape,
    a: &Shape,
    index: &SliceIndex,
    vars: &mut VarGen,
    d: &mut Derivation,
) -> Result<(), ShapeError> {
    let s = vars.dim();
    match index {
        SliceIndex::Fixed(i) if *i > MAX_INDEX => {
            // Positions are `i64` and `i + 1` must still be a size.
            return Err(ShapeError::Mismatch(Box::new(ShapeMismatch {
                message: format!("batch slice index {i} is out of range for any axis"),
                ops: vec![],
                steps: vec![],
            })));
        }
        SliceIndex::Fixed(i) => {
            d.constraints.push(Constraint::DimConstr {
                d: Dim::Var(s),
                constr: DimConstraint::AtLeast(i + 1),
            });
            d.proj_env.insert(s, AxisIndex::Fixed(*i as i64));
        }
        SliceIndex::Runtime(sym) => {
            d.proj_env.insert(s, AxisIndex::Iterator(*sym));
        }
    }
    let cs = &mut d.constraints;
    cs.push(Constraint::BatchSlice {
        cur: cur.batch.clone(),
        arg: a.batch.clone(),
        slot: Dim::Var(s),
    });
    cs.push(Constraint::RowEq { r1: cur.input.clone(), r2: a.input.clone() });
    cs.push(Constraint::RowEq { r1: cur.output.clone(), r2: a.output.clone() });
    Ok(())
}

/// An einsum: template rows for every operand and the result, each tied to its shape by an
/// inequality, and the labels, projection facts, template rows and kernel labels they bring.
fn einsum_derivation(
    cur: &Shape,
    spec: &EinsumSpec,
    args: &[&Shape],
    vars: &mut VarGen,
    d: &mut Derivation,
) -> Result<(), ShapeError> {
    if spec.operands.len() != args.len() {
        return Err(ShapeError::Arity(format!(
            "einsum spec \"{}\" has {} operand(s) but the operation has {} argument(s)",
            spec.text,
            spec.operands.len(),
            args.len()
        )));
    }
    let mut t = Templates {
        vars,
        labels: Vec::new(),
        row_vars: Vec::new(),
        padded: spec.padded,
        extra: Vec::with_capacity(3 * (args.len() + 1) + 2),
        proj_env: FxHashMap::default(),
    };
    for (pattern, a) in spec.operands.iter().zip(args) {
        let rows = t.shape(pattern, a, None);
        for (kind, tpl) in Kind::ALL.into_iter().zip(rows) {
            t.extra.push(Constraint::RowIneq { cur: Arc::new(tpl), subr: a.row(kind).clone() });
        }
    }
    let generative = Kind::ALL.map(|k| cur.row(k).num_fixed() == 0);
    let rows = t.shape(&spec.result, cur, Some(generative));
    for (kind, tpl) in Kind::ALL.into_iter().zip(rows) {
        t.extra.push(Constraint::RowIneq { cur: cur.row(kind).clone(), subr: Arc::new(tpl) });
    }
    let mut labels: Vec<(String, DimVar)> =
        t.labels.iter().map(|(l, v)| (l.to_string(), *v)).collect();
    labels.sort();
    d.labels = labels;
    d.proj_env = t.proj_env;
    d.template_rows = t.row_vars.iter().map(|(_, v)| *v).collect();
    d.template_rows.sort();
    d.kernel_dims = kernel_labels(spec)
        .filter_map(|k| t.labels.iter().find(|(l, _)| *l == k).map(|(_, v)| *v))
        .collect();
    d.constraints = t.extra;
    Ok(())
}

/// Builds the template rows of an einsum spec, sharing variables between operands. A spec
/// has few labels and row variables, so they are looked up in short lists.
struct Templates<'a, 's> {
    vars: &'a mut VarGen,
    labels: Vec<(&'s str, DimVar)>,
    row_vars: Vec<(RowKey<'s>, RowVar)>,
    padded: bool,
    extra: Vec<Constraint>,
    proj_env: FxHashMap<DimVar, AxisIndex>,
}

/// Which row variable of a spec a row pattern uses: `...` stands for the one of its row kind.
#[derive(Copy, Clone, PartialEq, Eq)]
enum RowKey<'s> {
    Ellipsis(Kind),
    Named(&'s str),
}

impl<'s> RowKey<'s> {
    fn of(spec: &'s RowVarSpec, kind: Kind) -> RowKey<'s> {
        match spec {
            RowVarSpec::Ellipsis => RowKey::Ellipsis(kind),
            // A name spelled like an ellipsis' key names the same variable.
            RowVarSpec::Named(n) => {
                match Kind::ALL.into_iter().find(|k| n.strip_prefix("...") == Some(k.name())) {
                    Some(k) => RowKey::Ellipsis(k),
                    None => RowKey::Named(n),
                }
            }
        }
    }
}

impl<'s> Templates<'_, 's> {
    fn label(&mut self, l: &'s str) -> Dim {
        if let Some((_, v)) = self.labels.iter().find(|(n, _)| *n == l) {
            return Dim::Var(*v);
        }
        let v = self.vars.dim();
        self.labels.push((l, v));
        Dim::Var(v)
    }

    /// The three template rows of a pattern (batch, input, output), for `sh`'s row ids.
    /// `generative` is given for the result: a fixed index 0 in a row that has no axes yet is
    /// a plain axis of size 1.
    fn shape(
        &mut self,
        p: &'s ShapePattern,
        sh: &Shape,
        generative: Option<[bool; 3]>,
    ) -> [Row; 3] {
        let rows = p.rows();
        let mut row = |n: usize| {
            let gen0 = generative.is_some_and(|g| g[n]);
            self.row(rows[n], RowId { shape: sh.id, kind: Kind::ALL[n] }, gen0)
        };
        // In order: the variables are numbered as they are first met.
        let batch = row(0);
        let input = row(1);
        let output = row(2);
        [batch, input, output]
    }

    fn row(&mut self, rs: &'s RowSpec, id: RowId, generative: bool) -> Row {
        let beg: Vec<Dim> = rs.beg.iter().map(|a| self.axis(a, generative)).collect();
        let end: Vec<Dim> = rs.end.iter().map(|a| self.axis(a, generative)).collect();
        match &rs.var {
            None => Row { dims: end, bcast: Bcast::Broadcastable, id },
            Some(name) => {
                let key = RowKey::of(name, id.kind);
                let v = match self.row_vars.iter().find(|(k, _)| *k == key) {
                    Some((_, v)) => *v,
                    None => {
                        let v = self.vars.row();
                        self.row_vars.push((key, v));
                        v
                    }
                };
                Row { dims: end, bcast: Bcast::Var { v, beg_dims: beg }, id }
            }
        }
    }

    fn axis(&mut self, a: &'s AxisSpec, generative: bool) -> Dim {
        match a {
            AxisSpec::Label(l) => self.label(l),
            AxisSpec::Anonymous => Dim::Var(self.vars.dim()),
            AxisSpec::Fixed(0) if generative => Dim::of(1),
            AxisSpec::Fixed(i) => {
                let f = self.vars.dim();
                self.extra.push(Constraint::DimConstr {
                    d: Dim::Var(f),
                    constr: DimConstraint::AtLeast(i + 1),
                });
                self.proj_env.insert(f, AxisIndex::Fixed(*i as i64));
                Dim::Var(f)
            }
            AxisSpec::Conv { stride, output, dilation, kernel } => {
                let output = self.label(output);
                let kernel = match kernel {
                    Some(k) => self.label(k),
                    None => Dim::of(1),
                };
                Dim::Conv(Arc::new(ConvDim {
                    stride: *stride,
                    output,
                    dilation: if kernel_is_dummy(a) { 0 } else { *dilation },
                    kernel,
                    padded: self.padded,
                }))
            }
            AxisSpec::Concat(parts) => Dim::Concat(parts.iter().map(|p| self.label(p)).collect()),
        }
    }
}

fn kernel_is_dummy(a: &AxisSpec) -> bool {
    matches!(a, AxisSpec::Conv { kernel: None, .. })
}

/// The labels a spec uses as convolution kernels.
fn kernel_labels(spec: &EinsumSpec) -> impl Iterator<Item = &str> {
    spec.operands.iter().chain(std::iter::once(&spec.result)).flat_map(|p| {
        p.rows().into_iter().flat_map(|r| {
            r.axes().filter_map(|a| match a {
                AxisSpec::Conv { kernel: Some(k), .. } => Some(k.as_str()),
                _ => None,
            })
        })
    })
}

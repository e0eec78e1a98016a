//! The tensor-expression JSON document: parsing and validation.
//!
//! The format is a contract (`shared/spec/expr-json.md`): every rule here maps to an error
//! *kind* the command prints. This module only reads the document into an [`Expr`] tree and
//! checks what can be checked without shapes (fields, argument counts, value counts, spec
//! syntax); building the graph and inferring shapes happen elsewhere.

use std::sync::Arc;

use crate::shape::inference::MAX_SIZE;
use crate::shape::spec::EinsumSpec;
use serde_json::{Map, Value};

/// The kinds of errors of the contract.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub enum ErrorKind {
    Json,
    Input,
    Spec,
    Shape,
    Limit,
    Usage,
    Backend,
}

impl ErrorKind {
    pub fn name(self) -> &'static str {
        match self {
            ErrorKind::Json => "json",
            ErrorKind::Input => "input",
            ErrorKind::Spec => "spec",
            ErrorKind::Shape => "shape",
            ErrorKind::Limit => "limit",
            ErrorKind::Usage => "usage",
            ErrorKind::Backend => "backend",
        }
    }
}

/// An error to print as `{"error": {"kind": .., "message": ..}}`.
#[derive(Clone, Debug)]
pub struct CliError {
    pub kind: ErrorKind,
    pub message: String,
}

pub fn input_err<T>(message: impl Into<String>) -> Result<T, CliError> {
    Err(CliError { kind: ErrorKind::Input, message: message.into() })
}

/// Rows as given in a leaf; `None` when omitted.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Rows {
    pub batch: Option<Vec<usize>>,
    pub input: Option<Vec<usize>>,
    pub output: Option<Vec<usize>>,
}

impl Rows {
    /// The number of cells, or a `shape` error when it does not fit in 63 bits.
    pub fn num_elems(&self) -> Result<usize, CliError> {
        let dims = [&self.batch, &self.output, &self.input].into_iter().flatten().flatten();
        dims.clone()
            .try_fold(1usize, |acc, d| acc.checked_mul(*d))
            .filter(|n| *n <= MAX_SIZE)
            .ok_or_else(|| CliError {
                kind: ErrorKind::Shape,
                message: format!(
                    "a shape with axes {:?} has more than {MAX_SIZE} cells: element counts must \
                     fit in 63 bits",
                    dims.collect::<Vec<_>>()
                ),
            })
    }
}

/// A size given in the document, or a `shape` error when it does not fit in 63 bits.
fn size(n: u64, what: &str) -> Result<usize, CliError> {
    if n as u128 > MAX_SIZE as u128 {
        return Err(CliError {
            kind: ErrorKind::Shape,
            message: format!("{what} {n} does not fit in 63 bits (sizes are at most {MAX_SIZE})"),
        });
    }
    Ok(n as usize)
}

/// How a param is initialized.
///
/// Two inits are equal when they say the same thing: numbers compare bit for bit, except that
/// every NaN equals every NaN (`{"constant": "nan"}` repeats `{"constant": "nan"}`), and 0
/// differs from -0.
#[derive(Clone, Debug)]
pub enum Init {
    Constant(f64),
    Values(Vec<f64>),
    Uniform { lo: f64, hi: f64, seed: u64 },
}

/// The same number as written: bit for bit, or both NaN.
pub fn same_number(a: f64, b: f64) -> bool {
    a.to_bits() == b.to_bits() || (a.is_nan() && b.is_nan())
}

impl PartialEq for Init {
    fn eq(&self, other: &Init) -> bool {
        match (self, other) {
            (Init::Constant(a), Init::Constant(b)) => same_number(*a, *b),
            (Init::Values(a), Init::Values(b)) => {
                a.len() == b.len() && a.iter().zip(b).all(|(x, y)| same_number(*x, *y))
            }
            (Init::Uniform { lo, hi, seed }, Init::Uniform { lo: lo2, hi: hi2, seed: seed2 }) => {
                same_number(*lo, *lo2) && same_number(*hi, *hi2) && seed == seed2
            }
            _ => false,
        }
    }
}

impl Eq for Init {}

#[derive(Clone, Debug)]
pub enum Leaf {
    Number(f64),
    Range(usize),
    RangeOfShape(Rows),
    Ndarray { values: Vec<f64>, rows: Rows },
    Param { name: String, rows: Rows, init: Option<Init> },
}

#[derive(Clone, Debug)]
pub enum Expr {
    Ref(String),
    Leaf {
        leaf: Leaf,
        name: Option<String>,
    },
    Op {
        op: String,
        args: Vec<Expr>,
        spec: Option<Arc<EinsumSpec>>,
        index: Option<usize>,
        name: Option<String>,
    },
}

/// A whole document.
#[derive(Clone, Debug)]
pub struct Document {
    pub expr: Expr,
    pub grad: bool,
}

/// The number of arguments of each operation (`None`: any number ≥ 1).
pub fn arity(op: &str) -> Option<Option<usize>> {
    Some(match op {
        "add" | "sub" | "pointmul" | "div" | "pow" | "max" | "min" | "lt" | "eq" | "ne" => Some(2),
        "neg" | "relu" | "exp" | "log" | "sqrt" | "tanh" | "sigmoid" | "sin" | "cos" | "recip"
        | "abs" | "not" => Some(1),
        "where" | "fma" => Some(3),
        "matmul" | "einsum" | "tropical" => Some(2),
        "transpose" | "einsum1" | "einmax1" | "batch_slice" => Some(1),
        "concat" => None,
        _ => return None,
    })
}

fn takes_spec(op: &str) -> bool {
    matches!(op, "einsum" | "einsum1" | "einmax1" | "tropical" | "concat")
}

/// The deepest nesting of expressions a document may have. Documents are read without
/// serde_json's recursion limit (the parser grows its stack on the heap); the recursive passes
/// after it run on a thread whose stack holds this many levels with room to spare.
pub const MAX_DEPTH: usize = 100_000;

/// Reads JSON of any nesting depth without overflowing the stack.
fn parse_json(text: &str) -> Result<Value, CliError> {
    use serde::Deserialize as _;
    let json_err = |e: serde_json::Error| CliError {
        kind: ErrorKind::Json,
        message: format!("the document is not JSON: {e}"),
    };
    let mut de = serde_json::Deserializer::from_str(text);
    de.disable_recursion_limit();
    let v = Value::deserialize(serde_stacker::Deserializer::new(&mut de)).map_err(json_err)?;
    de.end().map_err(json_err)?;
    Ok(v)
}

/// How deeply JSON arrays and objects nest, without recursion.
fn json_depth(v: &Value) -> usize {
    let mut deepest = 0;
    let mut stack = vec![(v, 1usize)];
    while let Some((v, d)) = stack.pop() {
        deepest = deepest.max(d);
        match v {
            Value::Array(xs) => stack.extend(xs.iter().map(|x| (x, d + 1))),
            Value::Object(o) => stack.extend(o.values().map(|x| (x, d + 1))),
            _ => {}
        }
    }
    deepest
}

pub fn parse_document(text: &str) -> Result<Document, CliError> {
    let v = parse_json(text)?;
    // An operation nests two levels of JSON (its object and its "args" array).
    if json_depth(&v) > 2 * MAX_DEPTH + 4 {
        let message = format!("the document nests expressions more than {MAX_DEPTH} deep");
        drop_deep(v);
        return Err(CliError { kind: ErrorKind::Limit, message });
    }
    let Value::Object(obj) = v else { return input_err("the document must be a JSON object") };
    let Some(expr) = obj.get("expr") else {
        return input_err("the document has no \"expr\" field");
    };
    let grad = match obj.get("grad") {
        None | Some(Value::Null) => false,
        Some(Value::Bool(b)) => *b,
        Some(other) => return input_err(format!("\"grad\" must be true or false, not {other}")),
    };
    let expr = parse_expr(expr);
    drop_deep(Value::Object(obj));
    Ok(Document { expr: expr?, grad })
}

fn parse_expr(v: &Value) -> Result<Expr, CliError> {
    let Value::Object(o) = v else {
        return input_err(format!("an expression must be a JSON object, not {}", short(v)));
    };
    let name = match o.get("name") {
        None => None,
        Some(Value::String(s)) if !s.is_empty() => Some(s.clone()),
        Some(other) => {
            return input_err(format!("\"name\" must be a non-empty string, not {other}"));
        }
    };
    if let Some(r) = o.get("ref") {
        let Value::String(r) = r else { return input_err("\"ref\" must be a string") };
        return Ok(Expr::Ref(r.clone()));
    }
    if let Some(l) = o.get("leaf") {
        let Value::String(l) = l else { return input_err("\"leaf\" must be a string") };
        return parse_leaf(l, o, name);
    }
    let Some(op) = o.get("op") else {
        return input_err(format!("an expression needs \"op\", \"leaf\" or \"ref\": {}", short(v)));
    };
    let Value::String(op) = op else { return input_err("\"op\" must be a string") };
    let Some(expected) = arity(op) else { return input_err(format!("unknown op \"{op}\"")) };
    let Some(Value::Array(args)) = o.get("args") else {
        return input_err(format!("op \"{op}\" needs an \"args\" array"));
    };
    match expected {
        Some(n) if args.len() != n => {
            return input_err(format!("op \"{op}\" takes {n} argument(s), got {}", args.len()));
        }
        None if args.is_empty() => {
            return input_err(format!("op \"{op}\" needs at least one argument"));
        }
        _ => {}
    }
    let args = args.iter().map(parse_expr).collect::<Result<Vec<_>, _>>()?;
    let spec = if takes_spec(op) {
        let Some(Value::String(s)) = o.get("spec") else {
            return input_err(format!("op \"{op}\" needs a \"spec\" string"));
        };
        let spec = EinsumSpec::parse(s)
            .map_err(|e| CliError { kind: ErrorKind::Spec, message: e.to_string() })?;
        if spec.operands.len() != args.len() {
            return input_err(format!(
                "spec \"{s}\" has {} operand(s) but op \"{op}\" has {} argument(s)",
                spec.operands.len(),
                args.len()
            ));
        }
        Some(Arc::new(spec))
    } else {
        None
    };
    let index = if op == "batch_slice" {
        match o.get("index").and_then(Value::as_u64) {
            Some(i) => Some(i as usize),
            None => return input_err("op \"batch_slice\" needs a non-negative integer \"index\""),
        }
    } else {
        None
    };
    Ok(Expr::Op { op: op.clone(), args, spec, index, name })
}

fn parse_leaf(l: &str, o: &Map<String, Value>, name: Option<String>) -> Result<Expr, CliError> {
    let leaf = match l {
        "number" => Leaf::Number(number(o.get("value"), "value")?),
        "range" => {
            let Some(n) = o.get("n").and_then(Value::as_u64) else {
                return input_err("leaf \"range\" needs a non-negative integer \"n\"");
            };
            Leaf::Range(size(n, "range size")?)
        }
        "range_of_shape" => Leaf::RangeOfShape(rows(o, false)?),
        "ndarray" => {
            let rows = rows(o, false)?;
            let Some(Value::Array(vs)) = o.get("values") else {
                return input_err("leaf \"ndarray\" needs a \"values\" array");
            };
            let values =
                vs.iter().map(|v| number(Some(v), "values")).collect::<Result<Vec<_>, _>>()?;
            let count = rows.num_elems()?;
            if values.len() != count {
                return input_err(format!(
                    "ndarray has {} values but its shape holds {count}",
                    values.len()
                ));
            }
            Leaf::Ndarray { values, rows }
        }
        "param" => {
            let Some(n) = name.clone() else { return input_err("leaf \"param\" needs a \"name\"") };
            let rows = rows(o, true)?;
            let init = match o.get("init") {
                None => None,
                Some(v) => Some(init(v)?),
            };
            if let (Some(Init::Values(vs)), true) =
                (&init, rows.input.is_some() && rows.output.is_some())
            {
                let count = rows.num_elems()?;
                if vs.len() != count {
                    return input_err(format!(
                        "param {n}: init has {} values but its shape holds {count}",
                        vs.len()
                    ));
                }
            }
            return Ok(Expr::Leaf { leaf: Leaf::Param { name: n, rows, init }, name: None });
        }
        other => return input_err(format!("unknown leaf \"{other}\"")),
    };
    Ok(Expr::Leaf { leaf, name })
}

fn number(v: Option<&Value>, field: &str) -> Result<f64, CliError> {
    match v {
        Some(Value::Number(n)) => {
            n.as_f64().ok_or(()).or_else(|_| input_err(format!("\"{field}\" is not a number")))
        }
        Some(Value::String(s)) if s == "inf" => Ok(f64::INFINITY),
        Some(Value::String(s)) if s == "-inf" => Ok(f64::NEG_INFINITY),
        Some(Value::String(s)) if s == "nan" => Ok(f64::NAN),
        Some(other) => input_err(format!("\"{field}\" must be a number, not {}", short(other))),
        None => input_err(format!("missing \"{field}\"")),
    }
}

/// The rows of a leaf. For data leaves an omitted row is empty; for params (`param = true`) an
/// omitted batch row is empty and omitted input/output rows are inferred (`None`).
fn rows(o: &Map<String, Value>, param: bool) -> Result<Rows, CliError> {
    let row = |k: &str| -> Result<Option<Vec<usize>>, CliError> {
        match o.get(k) {
            None | Some(Value::Null) => Ok(None),
            Some(Value::Array(ds)) => ds
                .iter()
                .map(|d| match d.as_u64() {
                    Some(d) => size(d, &format!("row \"{k}\": axis size")),
                    None => {
                        input_err(format!("row \"{k}\" must list non-negative integers, not {d}"))
                    }
                })
                .collect::<Result<Vec<_>, _>>()
                .map(Some),
            Some(other) => input_err(format!("row \"{k}\" must be an array, not {}", short(other))),
        }
    };
    let (batch, input, output) = (row("batch")?, row("input")?, row("output")?);
    if param {
        Ok(Rows { batch, input, output })
    } else {
        Ok(Rows {
            batch: Some(batch.unwrap_or_default()),
            input: Some(input.unwrap_or_default()),
            output: Some(output.unwrap_or_default()),
        })
    }
}

fn init(v: &Value) -> Result<Init, CliError> {
    let Value::Object(o) = v else { return input_err("\"init\" must be an object") };
    if let Some(c) = o.get("constant") {
        return Ok(Init::Constant(number(Some(c), "constant")?));
    }
    if let Some(Value::Array(vs)) = o.get("values") {
        return Ok(Init::Values(
            vs.iter().map(|v| number(Some(v), "values")).collect::<Result<_, _>>()?,
        ));
    }
    if let Some(Value::Array(b)) = o.get("uniform") {
        if b.len() != 2 {
            return input_err("\"uniform\" must be [lo, hi]");
        }
        let (lo, hi) = (number(Some(&b[0]), "uniform")?, number(Some(&b[1]), "uniform")?);
        let seed = match o.get("seed") {
            None => 0,
            Some(s) => s
                .as_u64()
                .ok_or(())
                .or_else(|_| input_err("\"seed\" must be a non-negative integer"))?,
        };
        return Ok(Init::Uniform { lo, hi, seed });
    }
    input_err(format!("unknown init {}", short(v)))
}

fn short(v: &Value) -> String {
    let s = v.to_string();
    if s.chars().count() > 60 {
        format!("{}...", s.chars().take(57).collect::<String>())
    } else {
        s
    }
}

/// Drops a JSON value of any depth without recursion (the default drop recurses once per level).
pub fn drop_deep(v: Value) {
    let mut stack = vec![v];
    while let Some(v) = stack.pop() {
        match v {
            Value::Array(xs) => stack.extend(xs),
            Value::Object(o) => stack.extend(o.into_iter().map(|(_, x)| x)),
            _ => {}
        }
    }
}

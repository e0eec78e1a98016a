//! The `rocannl` command: shape inference and evaluation of tensor expressions written as JSON
//! documents (the tensor-expression JSON contract).
//!
//! - `rocannl shapes FILE`: infer and close all shapes;
//! - `rocannl eval FILE [--backend B] [--precision P]`: also compile and run once, printing
//!   values (and gradients with `"grad": true`);
//! - `rocannl explain FILE`: for people — each node's operation, inferred shape, warnings and
//!   the loop nest of its projections.
//!
//! Every JSON answer is one object on standard output; bad input is
//! `{"error": {"kind": .., "message": ..}}` with exit status 1. The command never panics: a
//! defect that would panic is caught and reported as an error object instead.

mod build;
mod doc;
mod explain;

use std::io::Read;
use std::process::ExitCode;

use clap::{Parser, Subcommand};
use rocannl::arrayjit::{BackendKind, Prec};
use rocannl::tensor::{Plan, Session, SessionOptions, Tensor};
use serde_json::{Map, Value, json};

use crate::build::{Built, tensor_error};
use crate::doc::{CliError, ErrorKind};

#[derive(Parser)]
#[command(
    name = "rocannl",
    version,
    about = "Shape inference and evaluation of tensor expressions"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(clap::Args, Clone)]
struct Common {
    /// The document (`-` for standard input).
    file: String,
    /// The backend: interp, gccjit or cuda (default: the fastest CPU backend built in).
    #[arg(long)]
    backend: Option<String>,
    /// The precision: f32 (default) or f64.
    #[arg(long)]
    precision: Option<String>,
    /// Fail instead of warning when closing has to guess a param's size.
    #[arg(long)]
    strict: bool,
}

#[derive(Subcommand)]
enum Command {
    /// Infer and close all shapes; print them as JSON.
    Shapes(Common),
    /// Infer shapes, compile and run once; print shapes and values as JSON.
    Eval(Common),
    /// Print each node's operation, shape and loop nest, for people.
    Explain(Common),
}

fn read_input(file: &str) -> Result<String, CliError> {
    let io = |e: std::io::Error| CliError {
        kind: ErrorKind::Input,
        message: format!("cannot read {file}: {e}"),
    };
    if file == "-" {
        let mut s = String::new();
        std::io::stdin().read_to_string(&mut s).map_err(io)?;
        Ok(s)
    } else {
        std::fs::read_to_string(file).map_err(io)
    }
}

fn shape_json(t: &Tensor) -> Result<Value, CliError> {
    let [b, i, o] = t.rows().map_err(tensor_error)?;
    Ok(json!({"batch": b, "input": i, "output": o}))
}

/// Numbers as JSON, non-finite ones as the strings "inf", "-inf", "nan".
fn values_json(vs: &[f64]) -> Value {
    Value::Array(
        vs.iter()
            .map(|v| {
                if v.is_nan() {
                    json!("nan")
                } else if v.is_infinite() {
                    json!(if *v > 0.0 { "inf" } else { "-inf" })
                } else {
                    json!(v)
                }
            })
            .collect(),
    )
}

fn load(c: &Common) -> Result<(doc::Document, Built), CliError> {
    let text = read_input(&c.file)?;
    let document = doc::parse_document(&text)?;
    let built = build::build(&document, c.strict)?;
    if std::env::var_os("ROCANNL_TRACE").is_some() {
        built.graph.enable_shape_trace();
    }
    let finished = built.graph.finish();
    for line in built.graph.shape_trace() {
        eprintln!("{line}");
    }
    finished.map_err(tensor_error)?;
    Ok((document, built))
}

fn shapes_answer(built: &Built) -> Result<Map<String, Value>, CliError> {
    let mut nodes = Map::new();
    for (name, t) in &built.nodes {
        nodes.insert(name.clone(), json!({"shape": shape_json(t)?}));
    }
    let mut params = Map::new();
    for (name, t) in &built.params {
        params.insert(name.clone(), json!({"shape": shape_json(t)?}));
    }
    let warnings: Vec<Value> = built.graph.warnings().into_iter().map(Value::String).collect();
    let mut out = Map::new();
    out.insert("shape".into(), shape_json(&built.root)?);
    out.insert("nodes".into(), Value::Object(nodes));
    out.insert("params".into(), Value::Object(params));
    out.insert("warnings".into(), Value::Array(warnings));
    Ok(out)
}

fn shapes(c: &Common) -> Result<Value, CliError> {
    let (_, built) = load(c)?;
    Ok(Value::Object(shapes_answer(&built)?))
}

fn options(c: &Common) -> Result<SessionOptions, CliError> {
    let backend = match &c.backend {
        None => BackendKind::default(),
        Some(b) => BackendKind::from_name(b)
            .map_err(|e| CliError { kind: ErrorKind::Backend, message: e.to_string() })?,
    };
    let prec = match c.precision.as_deref() {
        None | Some("f32") => Prec::F32,
        Some("f64") => Prec::F64,
        Some(p) => {
            return Err(CliError {
                kind: ErrorKind::Input,
                message: format!("unknown precision \"{p}\" (use f32 or f64)"),
            });
        }
    };
    let mut opts = SessionOptions { backend, prec, ..SessionOptions::default() };
    // For people debugging a document: every compiled routine's assignments, low-level IR and
    // generated source are written to this folder.
    if let Some(dir) = std::env::var_os("ROCANNL_DEBUG_DIR") {
        opts.compile.debug_dir = Some(dir.into());
    }
    Ok(opts)
}

fn eval(c: &Common) -> Result<Value, CliError> {
    let opts = options(c)?;
    let (document, built) = load(c)?;
    let mut out = shapes_answer(&built)?;
    let mut session = Session::with_options(&built.graph, opts).map_err(tensor_error)?;
    let mut outputs = vec![built.root.clone()];
    outputs.extend(built.nodes.iter().map(|(_, t)| t.clone()));
    outputs.extend(built.params.iter().map(|(_, t)| t.clone()));
    let plan = if document.grad {
        Plan {
            outputs,
            backprop_from: Some(built.root.clone()),
            grads: built.params.iter().map(|(_, t)| t.clone()).collect(),
        }
    } else {
        Plan { outputs, ..Plan::default() }
    };
    let routine = session.compile("eval", &plan).map_err(tensor_error)?;
    session.run(&routine).map_err(tensor_error)?;
    let read = |t: &Tensor| session.read(t).map(|v| values_json(&v)).map_err(tensor_error);
    out.insert("values".into(), read(&built.root)?);
    if let Some(Value::Object(nodes)) = out.get_mut("nodes") {
        for (name, t) in &built.nodes {
            if let Some(Value::Object(entry)) = nodes.get_mut(name) {
                entry.insert("values".into(), read(t)?);
            }
        }
    }
    if let Some(Value::Object(params)) = out.get_mut("params") {
        for (name, t) in &built.params {
            if let Some(Value::Object(entry)) = params.get_mut(name) {
                entry.insert("values".into(), read(t)?);
                if document.grad {
                    let g = session.read_grad(t).map_err(tensor_error)?;
                    entry.insert("grad".into(), values_json(&g));
                }
            }
        }
    }
    Ok(Value::Object(out))
}

fn run(cli: &Cli) -> Result<Option<Value>, CliError> {
    match &cli.command {
        Command::Shapes(c) => shapes(c).map(Some),
        Command::Eval(c) => eval(c).map(Some),
        Command::Explain(c) => {
            let (_, built) = load(c)?;
            print!("{}", explain::explain(&built).map_err(tensor_error)?);
            Ok(None)
        }
    }
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    std::panic::set_hook(Box::new(|_| {}));
    let result = std::panic::catch_unwind(|| run(&cli)).unwrap_or_else(|p| {
        let what = p
            .downcast_ref::<&str>()
            .map(|s| s.to_string())
            .or_else(|| p.downcast_ref::<String>().cloned())
            .unwrap_or_default();
        Err(CliError { kind: ErrorKind::Input, message: format!("internal error: {what}") })
    });
    match result {
        Ok(Some(v)) => {
            println!("{v}");
            ExitCode::SUCCESS
        }
        Ok(None) => ExitCode::SUCCESS,
        Err(e) => {
            println!("{}", json!({"error": {"kind": e.kind.name(), "message": e.message}}));
            ExitCode::from(1)
        }
    }
}

//! The `rocannl` command: shape inference (and evaluation) of tensor expressions written as
//! JSON documents, as specified by the tensor-expression JSON contract.
//!
//! Every answer is one JSON object on standard output; bad input is
//! `{"error": {"kind": .., "message": ..}}` with exit status 1. The command never panics: a
//! defect that would panic is caught and reported as an error object instead.

mod build;
mod doc;

use std::io::Read;
use std::process::ExitCode;

use clap::{Parser, Subcommand};
use serde_json::{Map, Value, json};

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
    /// The backend to run on (interp, gccjit, cuda); ignored by `shapes`.
    #[arg(long)]
    backend: Option<String>,
    /// The precision (f32 or f64); ignored by `shapes`.
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

fn shape_json(inf: &rocannl::shape::Inference, id: rocannl::shape::var::ShapeId) -> Value {
    let sh = inf.shape(id);
    let row = |r: &rocannl::shape::row::Row| json!(r.sizes().unwrap_or_default());
    json!({"batch": row(&sh.batch), "input": row(&sh.input), "output": row(&sh.output)})
}

fn shapes(c: &Common) -> Result<Value, CliError> {
    let text = read_input(&c.file)?;
    let doc = doc::parse_document(&text)?;
    let mut built = build::build(&doc, c.strict)?;
    let finished = built.inf.finish();
    for line in built.inf.trace() {
        eprintln!("{line}");
    }
    finished.map_err(build::shape_error)?;
    let mut nodes = Map::new();
    for (name, sh) in &built.nodes {
        nodes.insert(name.clone(), json!({"shape": shape_json(&built.inf, *sh)}));
    }
    let mut params = Map::new();
    for (name, sh) in &built.params {
        params.insert(name.clone(), json!({"shape": shape_json(&built.inf, *sh)}));
    }
    let warnings: Vec<Value> = built.inf.warnings().iter().map(|w| json!(w.message)).collect();
    Ok(json!({
        "shape": shape_json(&built.inf, built.root),
        "nodes": nodes,
        "params": params,
        "warnings": warnings,
    }))
}

fn run(cli: &Cli) -> Result<Value, CliError> {
    match &cli.command {
        Command::Shapes(c) => shapes(c),
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
        Ok(v) => {
            println!("{v}");
            ExitCode::SUCCESS
        }
        Err(e) => {
            println!("{}", json!({"error": {"kind": e.kind.name(), "message": e.message}}));
            ExitCode::from(1)
        }
    }
}

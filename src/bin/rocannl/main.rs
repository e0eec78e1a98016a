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

mod bench;
mod explain;
mod plot;

use std::io::{self, Read, Write};
use std::process::ExitCode;

use clap::{Parser, Subcommand};
use rocannl::arrayjit::low_level::estimate::WorkLimit;
use rocannl::arrayjit::{BackendKind, NdArray, Prec};
use rocannl::tensor::{Plan, Session, SessionOptions, Tensor};
use serde_json::json;

use rocannl::document::build::{self, Built, tensor_error};
use rocannl::document::doc::{self, CliError, ErrorKind};

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
    #[command(flatten)]
    limits: LimitArgs,
}

/// The limits of `eval` and `bench` (the contract's defaults when not given).
#[derive(clap::Args, Clone, Default)]
struct LimitArgs {
    /// The most bytes of buffers a document may need (a number, or `none`; default: the
    /// smaller of 16 GiB and the memory available).
    #[arg(long, value_parser = parse_limit)]
    max_memory: Option<Limit>,
    /// The most scalar operations (loop iterations) one run may take (a number, or `none`;
    /// default 10^11 on native backends, 10^9 on the interpreter: about a minute of each).
    #[arg(long, value_parser = parse_limit)]
    max_work: Option<Limit>,
}

/// A limit given on the command line: a number, or `none` for no limit.
#[derive(Copy, Clone, Debug)]
struct Limit(Option<u64>);

fn parse_limit(s: &str) -> Result<Limit, String> {
    if s == "none" {
        return Ok(Limit(None));
    }
    s.parse::<u64>()
        .map(|n| Limit(Some(n)))
        .map_err(|_| format!("\"{s}\" is not a whole number or none"))
}

#[derive(Subcommand)]
enum Command {
    /// Infer and close all shapes; print them as JSON.
    Shapes(Common),
    /// Infer shapes, compile and run once; print shapes and values as JSON.
    Eval(Common),
    /// Print each node's operation, shape and loop nest, for people.
    Explain(Common),
    /// Compile cold and warm and run the document repeatedly on each backend.
    Bench(BenchArgs),
}

/// The most timed runs `bench --reps` takes per backend: each run's time is kept (8 bytes a
/// run) for the median, and a million runs of even the smallest document take seconds.
const MAX_REPS: u64 = 1_000_000;

#[derive(clap::Args, Clone)]
struct BenchArgs {
    /// The document (`-` for standard input).
    file: String,
    /// A backend to benchmark (repeatable; default: every backend that can run here).
    #[arg(long)]
    backend: Vec<String>,
    /// The precision: f32 (default) or f64.
    #[arg(long)]
    precision: Option<String>,
    /// Timed runs per backend, 1 to 1000000 (default 20).
    #[arg(long, default_value_t = 20, value_parser = clap::value_parser!(u64).range(1..=MAX_REPS))]
    reps: u64,
    /// Print `{"runs": [..]}` instead of a table.
    #[arg(long)]
    json: bool,
    /// The optimization level of native code, 0 to 3 (default 3).
    #[arg(long, value_parser = clap::value_parser!(u8).range(0..=3))]
    opt_level: Option<u8>,
    /// Which nests call the shape-generic map kernel (gccjit): off, reductions (those that are
    /// not products; the default) or all (those and pointwise maps).
    #[arg(long, value_name = "off|reductions|all")]
    map_calls: Option<String>,
    /// Whether pointwise nests on a product's result run inside the product's call (gccjit):
    /// on, or off (the default).
    #[arg(long, value_name = "on|off")]
    epilogues: Option<String>,
    /// Whether consecutive parallel nests over the same rows run as one job of the thread
    /// pool (gccjit): on (the default), or off.
    #[arg(long, value_name = "on|off")]
    groups: Option<String>,
    /// Also draw compile and run times per backend and optimization level (gccjit at every
    /// level, 0 to 3) into this SVG file.
    #[arg(long, value_name = "FILE.svg")]
    plot: Option<std::path::PathBuf>,
    /// Fail instead of warning when closing has to guess a param's size.
    #[arg(long)]
    strict: bool,
    #[command(flatten)]
    limits: LimitArgs,
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
    built.check_init_counts()?;
    Ok((document, built))
}

/// The answer of `shapes` and `eval`, written as it is produced: values are streamed cell by
/// cell, never held as a JSON tree (a tree costs tens of bytes per cell).
struct Answer<W: Write> {
    w: W,
}

impl<W: Write> Answer<W> {
    fn raw(&mut self, s: &str) -> io::Result<()> {
        self.w.write_all(s.as_bytes())
    }

    fn string(&mut self, s: &str) -> io::Result<()> {
        serde_json::to_writer(&mut self.w, s).map_err(io::Error::from)
    }

    fn shape(&mut self, t: &Tensor) -> Result<(), Failure> {
        let r = t.rows().map_err(tensor_error)?;
        let v = json!({"batch": r.batch, "input": r.input, "output": r.output});
        serde_json::to_writer(&mut self.w, &v).map_err(|e| Failure::Io(io::Error::from(e)))
    }

    /// Numbers as JSON, non-finite ones as the strings "inf", "-inf", "nan".
    fn values(&mut self, vs: &NdArray) -> io::Result<()> {
        self.raw("[")?;
        for k in 0..vs.len() {
            let v = &vs.get_f64(k);
            if k > 0 {
                self.raw(",")?;
            }
            if v.is_nan() {
                self.raw("\"nan\"")?;
            } else if v.is_infinite() {
                self.raw(if *v > 0.0 { "\"inf\"" } else { "\"-inf\"" })?;
            } else {
                serde_json::to_writer(&mut self.w, v).map_err(io::Error::from)?;
            }
        }
        self.raw("]")
    }
}

/// Why a command stopped: a contract error to print, or standard output that closed.
enum Failure {
    Cli(CliError),
    Io(io::Error),
}

impl From<CliError> for Failure {
    fn from(e: CliError) -> Self {
        Failure::Cli(e)
    }
}

impl From<io::Error> for Failure {
    fn from(e: io::Error) -> Self {
        Failure::Io(e)
    }
}

/// What `eval` has computed, read tensor by tensor while the answer is written.
struct Evaluated {
    session: Session,
    grad: bool,
}

impl Evaluated {
    fn values(&self, t: &Tensor) -> Result<NdArray, CliError> {
        self.session.read_array(t).map_err(tensor_error)
    }

    fn grad(&self, t: &Tensor) -> Result<NdArray, CliError> {
        self.session.read_grad_array(t).map_err(tensor_error)
    }

    /// Checks, before the answer starts, that the largest tensor it prints can be copied out:
    /// an answer is one JSON object, never a partial one followed by an error.
    fn check_readable(&self, built: &Built) -> Result<(), CliError> {
        let cells = |t: &Tensor| t.rows().map(|rows| rows.cells());
        let mut largest = cells(&built.root).map_err(tensor_error)?;
        for (_, t) in built.nodes.iter().chain(&built.params) {
            largest = largest.max(cells(t).map_err(tensor_error)?);
        }
        let bytes = largest.saturating_mul(self.session.prec().size_in_bytes());
        let mut probe: Vec<u8> = Vec::new();
        probe.try_reserve_exact(bytes).map_err(|_| CliError {
            kind: ErrorKind::Limit,
            message: format!("cannot allocate {bytes} bytes to print the values of a tensor"),
        })
    }
}

/// Writes `{"nodes": .., "params": .., "shape": .., "values": .., "warnings": ..}`; values and
/// gradients only when evaluated.
/// `"name": {"shape": .., "values": .., "grad": ..}` for each tensor, comma-separated; values
/// when evaluated, gradients when also asked for (`params`) and computed.
fn write_entries<W: Write>(
    out: &mut Answer<W>,
    entries: &[(String, Tensor)],
    eval: Option<&Evaluated>,
    params: bool,
) -> Result<(), Failure> {
    for (k, (name, t)) in entries.iter().enumerate() {
        out.raw(if k > 0 { "," } else { "" })?;
        out.string(name)?;
        out.raw(":{\"shape\":")?;
        out.shape(t)?;
        if let Some(e) = eval {
            out.raw(",\"values\":")?;
            out.values(&e.values(t)?)?;
            if params && e.grad {
                out.raw(",\"grad\":")?;
                out.values(&e.grad(t)?)?;
            }
        }
        out.raw("}")?;
    }
    Ok(())
}

fn write_answer<W: Write>(
    out: &mut Answer<W>,
    built: &Built,
    eval: Option<&Evaluated>,
) -> Result<(), Failure> {
    out.raw("{\"nodes\":{")?;
    write_entries(out, &built.nodes, eval, false)?;
    out.raw("},\"params\":{")?;
    write_entries(out, &built.params, eval, true)?;
    out.raw("},\"shape\":")?;
    out.shape(&built.root)?;
    if let Some(e) = eval {
        out.raw(",\"values\":")?;
        out.values(&e.values(&built.root)?)?;
    }
    out.raw(",\"warnings\":[")?;
    for (k, w) in built.graph.warnings().iter().enumerate() {
        out.raw(if k > 0 { "," } else { "" })?;
        out.string(w)?;
    }
    out.raw("]}\n")?;
    Ok(())
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
                kind: ErrorKind::Usage,
                message: format!("unknown precision \"{p}\" (use f32 or f64)"),
            });
        }
    };
    let mut opts = SessionOptions { backend, prec, ..SessionOptions::default() };
    // `eval` runs a routine once and `bench` times whole builds: no quick first tier (it would
    // leave nothing optimized in the compile cache for the next process).
    opts.compile.tiered = false;
    if let Some(Limit(m)) = c.limits.max_memory {
        opts.compile.limits.max_memory = m;
    }
    if let Some(Limit(w)) = c.limits.max_work {
        opts.compile.limits.max_work = w.map_or(WorkLimit::Unlimited, WorkLimit::At);
    }
    // For people debugging a document: every compiled routine's assignments, low-level IR and
    // generated source are written to this folder.
    if let Some(dir) = std::env::var_os("ROCANNL_DEBUG_DIR") {
        opts.compile.debug_dir = Some(dir.into());
    }
    Ok(opts)
}

fn evaluate(
    opts: SessionOptions,
    document: &doc::Document,
    built: &Built,
) -> Result<Evaluated, CliError> {
    let mut session = Session::with_options(&built.graph, opts).map_err(tensor_error)?;
    let mut outputs = vec![built.root.clone()];
    outputs.extend(built.nodes.iter().map(|(_, t)| t.clone()));
    outputs.extend(built.params.iter().map(|(_, t)| t.clone()));
    let plan = if document.grad {
        Plan {
            outputs,
            backprop_from: Some(built.root.clone()),
            grads: built.params.iter().map(|(_, t)| t.clone()).collect(),
            ..Plan::default()
        }
    } else {
        Plan { outputs, ..Plan::default() }
    };
    let routine = session.compile("eval", &plan).map_err(tensor_error)?;
    session.run(&routine).map_err(tensor_error)?;
    Ok(Evaluated { session, grad: document.grad })
}

/// Runs one command, writing its answer to `out`.
fn run<W: Write>(cli: &Cli, out: &mut Answer<W>) -> Result<(), Failure> {
    match &cli.command {
        Command::Shapes(c) => {
            let (_, built) = load(c)?;
            write_answer(out, &built, None)
        }
        Command::Eval(c) => {
            // Options are checked before the document is read.
            let opts = options(c)?;
            let (document, built) = load(c)?;
            let evaluated = evaluate(opts, &document, &built)?;
            evaluated.check_readable(&built)?;
            write_answer(out, &built, Some(&evaluated))
        }
        Command::Explain(c) => {
            let (_, built) = load(c)?;
            out.raw(&explain::explain(&built).map_err(tensor_error)?)?;
            Ok(())
        }
        Command::Bench(b) => bench(b, out),
    }
}

/// `rocannl bench`: the session options from the flags, then the document run on each
/// backend, reported as a table or JSON (and a plot when asked).
fn bench<W: Write>(b: &BenchArgs, out: &mut Answer<W>) -> Result<(), Failure> {
    let common = Common {
        file: b.file.clone(),
        backend: None,
        precision: b.precision.clone(),
        strict: b.strict,
        limits: b.limits.clone(),
    };
    let base = bench_options(b, &common)?;
    let backends = bench::backends(&b.backend)?;
    let started = std::time::Instant::now();
    let (document, built) = load(&common)?;
    let setup =
        bench::Setup { base, reps: b.reps as usize, shape_s: started.elapsed().as_secs_f64() };
    let mut runs = Vec::new();
    for (backend, named) in backends {
        match bench::bench_backend(&document, &built, backend, &setup) {
            Ok(r) => runs.push(r),
            // A backend that cannot run here is left out unless it was asked for.
            Err(e) if e.kind == ErrorKind::Backend && !named => {}
            Err(e) => return Err(e.into()),
        }
    }
    let plotted = match &b.plot {
        Some(path) => {
            let bars = bench::bars(&document, &built, &runs, &setup)?;
            plot::write(path, &b.file, &bars)?;
            Some(path)
        }
        None => None,
    };
    if b.json {
        let v = json!({"runs": runs.iter().map(bench::Run::json).collect::<Vec<_>>()});
        out.raw(&format!("{v}\n"))?;
    } else {
        out.raw(&bench::table(&runs))?;
        if let Some(path) = plotted {
            out.raw(&format!("plot: {}\n", path.display()))?;
        }
    }
    Ok(())
}

/// The session options of `rocannl bench`: the common ones, with the optimization level, map
/// calls, epilogues and parallel groups the flags set.
fn bench_options(b: &BenchArgs, common: &Common) -> Result<SessionOptions, Failure> {
    let usage =
        |message: String| -> Failure { CliError { kind: ErrorKind::Usage, message }.into() };
    let mut base = options(common)?;
    if let Some(l) = b.opt_level {
        base.compile.opt_level = l;
    }
    if let Some(m) = &b.map_calls {
        use rocannl::arrayjit::low_level::schedule::MapCalls;
        base.compile.map_calls = match m.as_str() {
            "off" => MapCalls::Off,
            "reductions" => MapCalls::Reductions,
            "all" => MapCalls::All,
            other => {
                return Err(usage(format!(
                    "--map-calls takes off, reductions or all, not `{other}`"
                )));
            }
        };
    }
    match b.epilogues.as_deref() {
        None | Some("off") => {}
        Some("on") => base.compile.epilogues = true,
        Some(other) => return Err(usage(format!("--epilogues takes on or off, not `{other}`"))),
    }
    match b.groups.as_deref() {
        None | Some("on") => {}
        Some("off") => base.compile.parallel_groups = false,
        Some(other) => return Err(usage(format!("--groups takes on or off, not `{other}`"))),
    }
    Ok(base)
}

/// Room for the recursive passes over a document of [`doc::MAX_DEPTH`] nested expressions.
const STACK_BYTES: usize = 512 << 20;

/// Prints an error object on standard output and exits with `code`.
fn fail(e: &CliError, code: u8) -> ExitCode {
    let text = json!({"error": {"kind": e.kind.name(), "message": e.message}}).to_string();
    let mut stdout = io::stdout().lock();
    let _ = writeln!(stdout, "{text}").and_then(|_| stdout.flush());
    ExitCode::from(code)
}

fn main() -> ExitCode {
    let cli = match Cli::try_parse() {
        Ok(cli) => cli,
        Err(e) => {
            use clap::error::ErrorKind as K;
            if matches!(e.kind(), K::DisplayHelp | K::DisplayVersion) {
                let _ = e.print();
                return ExitCode::SUCCESS;
            }
            let message = e.render().to_string().trim().to_string();
            return fail(&CliError { kind: ErrorKind::Usage, message }, 2);
        }
    };
    std::panic::set_hook(Box::new(|_| {}));
    // The answer is buffered and written as it is produced; everything runs on a thread with a
    // stack deep enough for deeply nested documents.
    let worker = std::thread::Builder::new().stack_size(STACK_BYTES).spawn(move || {
        let mut out = Answer { w: io::BufWriter::new(io::stdout().lock()) };
        let result = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| run(&cli, &mut out)))
            .unwrap_or_else(|p| {
                let what = p
                    .downcast_ref::<&str>()
                    .map(|s| s.to_string())
                    .or_else(|| p.downcast_ref::<String>().cloned())
                    .unwrap_or_default();
                Err(Failure::Cli(CliError {
                    kind: ErrorKind::Input,
                    message: format!("internal error: {what}"),
                }))
            });
        let flushed = out.w.flush();
        (result, flushed)
    });
    let outcome = match worker {
        Ok(handle) => handle.join().unwrap_or_else(|_| {
            let e = CliError { kind: ErrorKind::Input, message: "internal error".into() };
            (Err(Failure::Cli(e)), Ok(()))
        }),
        Err(e) => {
            let message = format!("cannot start a thread: {e}");
            (Err(Failure::Cli(CliError { kind: ErrorKind::Limit, message })), Ok(()))
        }
    };
    match outcome {
        // Nobody reads standard output any more (e.g. `rocannl eval big.json | head`): stop
        // quietly, as a filter does when its reader has gone.
        (Err(Failure::Io(e)), _) | (Ok(()), Err(e)) if e.kind() == io::ErrorKind::BrokenPipe => {
            ExitCode::SUCCESS
        }
        (Ok(()), Ok(())) => ExitCode::SUCCESS,
        (Ok(()), Err(e)) | (Err(Failure::Io(e)), _) => fail(
            &CliError { kind: ErrorKind::Input, message: format!("cannot write the answer: {e}") },
            1,
        ),
        (Err(Failure::Cli(e)), _) => fail(&e, if e.kind == ErrorKind::Usage { 2 } else { 1 }),
    }
}

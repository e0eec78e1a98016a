//! `rocannl bench`: compile a document cold and warm and run it repeatedly on each backend.
//!
//! The instrument of the compile-latency and kernel work. For every backend: the compile of
//! the document's routine (forward, and backprop with `"grad": true`) in a fresh, empty compile
//! cache (*cold*), the same compile again served by that cache (*warm*, `null` where the backend
//! has none), then `reps` timed runs after two untimed ones. The cache folder is a temporary one
//! of this command, so a user's cache neither helps the cold figure nor is filled by it. The
//! table for people breaks the cold compile down by phase; `--json` prints the contract's
//! `{"runs": [..]}`.

use std::time::Instant;

use rocannl::arrayjit::{BackendKind, CacheMode, CacheOutcome, Prec};
use rocannl::tensor::{Plan, Session, SessionOptions};
use serde_json::{Value, json};

use rocannl::document::build::{Built, tensor_error};
use rocannl::document::doc::{CliError, Document, ErrorKind};

/// One backend's figures.
pub struct Run {
    backend: BackendKind,
    prec: Prec,
    cold_s: f64,
    warm_s: Option<f64>,
    runs_s: Vec<f64>,
    flops: u64,
    /// Seconds per phase of the cold compile, shape inference first.
    phases: Vec<(&'static str, f64)>,
    /// With tiered builds (gccjit): the cold compile of the quick first build and its first
    /// run, in a fresh cache (the table for people only).
    first_tier_s: Option<(f64, f64)>,
}

fn plan(document: &Document, built: &Built) -> Plan {
    if document.grad {
        Plan {
            outputs: vec![built.root.clone()],
            backprop_from: Some(built.root.clone()),
            grads: built.params.iter().map(|(_, t)| t.clone()).collect(),
            ..Plan::default()
        }
    } else {
        Plan { outputs: vec![built.root.clone()], ..Plan::default() }
    }
}

/// A temporary cache folder of a fresh random name (mode 0700), removed when dropped; `None`
/// where none can be made (the runs then have no cache).
struct TempCache(Option<tempfile::TempDir>);

impl TempCache {
    fn new(backend: BackendKind) -> TempCache {
        let prefix = format!("rocannl-bench-{}-", backend.name());
        let tmp = std::env::temp_dir();
        TempCache(tempfile::Builder::new().prefix(&prefix).tempdir_in(tmp).ok())
    }
}

/// What every backend is benchmarked with.
pub struct Setup {
    /// The session options (precision, limits, optimization level); the backend and the
    /// compile cache are set per run.
    pub base: SessionOptions,
    /// Timed runs, 1 to 1,000,000 (the command line refuses other counts: each run's time is
    /// kept).
    pub reps: usize,
    /// The document's shape inference time.
    pub shape_s: f64,
}

/// The options of a run on `backend` with its own compile cache.
fn opts_for(base: &SessionOptions, backend: BackendKind, cache: &TempCache) -> SessionOptions {
    let mut opts = SessionOptions { backend, ..base.clone() };
    opts.compile.cache = match &cache.0 {
        Some(dir) => CacheMode::Dir(dir.path().to_path_buf()),
        None => CacheMode::Off,
    };
    opts
}

/// Benchmarks one backend.
pub fn bench_backend(
    document: &Document,
    built: &Built,
    backend: BackendKind,
    setup: &Setup,
) -> Result<Run, CliError> {
    let (prec, reps, shape_s) = (setup.base.prec, setup.reps, setup.shape_s);
    let cache = TempCache::new(backend);
    let opts = opts_for(&setup.base, backend, &cache);
    let plan = plan(document, built);
    let mut session = Session::with_options(&built.graph, opts.clone()).map_err(tensor_error)?;
    let started = Instant::now();
    let routine = session.compile("bench", &plan).map_err(tensor_error)?;
    let cold_s = started.elapsed().as_secs_f64();
    let report = rocannl::tensor::advanced::compile_report(&routine).clone();
    let warm_s = if report.cache == CacheOutcome::Miss {
        let mut again = Session::with_options(&built.graph, opts).map_err(tensor_error)?;
        let started = Instant::now();
        let r = again.compile("bench", &plan).map_err(tensor_error)?;
        let warm = started.elapsed().as_secs_f64();
        (rocannl::tensor::advanced::compile_report(&r).cache == CacheOutcome::Hit).then_some(warm)
    } else {
        None
    };
    for _ in 0..2 {
        session.run(&routine).map_err(tensor_error)?;
    }
    let mut runs_s = Vec::with_capacity(reps);
    for _ in 0..reps {
        let started = Instant::now();
        session.run(&routine).map_err(tensor_error)?;
        runs_s.push(started.elapsed().as_secs_f64());
    }
    runs_s.sort_by(f64::total_cmp);
    let mut phases = vec![("shape inference", shape_s)];
    phases.extend(report.phases.iter().copied());
    // The time to a first run when the optimized build is made in the background.
    let first_tier_s = if backend == BackendKind::Gccjit {
        let cache = TempCache::new(backend);
        let mut tiered = opts_for(&setup.base, backend, &cache);
        tiered.compile.tiered = true;
        let mut s = Session::with_options(&built.graph, tiered).map_err(tensor_error)?;
        let started = Instant::now();
        let r = s.compile("bench", &plan).map_err(tensor_error)?;
        let compiled = started.elapsed().as_secs_f64();
        let started = Instant::now();
        s.run(&r).map_err(tensor_error)?;
        Some((compiled, started.elapsed().as_secs_f64()))
    } else {
        None
    };
    Ok(Run { backend, prec, cold_s, warm_s, runs_s, flops: report.flops, phases, first_tier_s })
}

impl Run {
    fn median(&self) -> f64 {
        let n = self.runs_s.len();
        if n == 0 {
            return f64::NAN;
        }
        if n % 2 == 1 {
            self.runs_s[n / 2]
        } else {
            (self.runs_s[n / 2 - 1] + self.runs_s[n / 2]) / 2.0
        }
    }

    /// The contract's `RUN` object.
    pub fn json(&self) -> Value {
        json!({
            "backend": self.backend.name(),
            "precision": self.prec.name(),
            "compile_s": {"cold": self.cold_s, "warm": self.warm_s},
            "run_s": {
                "median": self.median(),
                "min": self.runs_s.first(),
                "max": self.runs_s.last(),
                "reps": self.runs_s.len(),
            },
            "flops": self.flops,
        })
    }
}

/// The bars of `--plot`: every run, and gccjit at the optimization levels it did not run at
/// (each benchmarked as the runs were, in its own fresh cache).
pub fn bars(
    document: &Document,
    built: &Built,
    runs: &[Run],
    setup: &Setup,
) -> Result<Vec<crate::plot::Bar>, CliError> {
    let level = setup.base.compile.opt_level;
    let mut bars = Vec::new();
    for r in runs {
        if r.backend != BackendKind::Gccjit {
            bars.push(r.bar(r.backend.name().to_string()));
            continue;
        }
        for l in 0..=3u8 {
            if l == level {
                bars.push(r.bar(format!("gccjit -O{l}")));
            } else {
                let mut at = Setup { base: setup.base.clone(), ..*setup };
                at.base.compile.opt_level = l;
                let other = bench_backend(document, built, BackendKind::Gccjit, &at)?;
                bars.push(other.bar(format!("gccjit -O{l}")));
            }
        }
    }
    Ok(bars)
}

impl Run {
    fn bar(&self, label: String) -> crate::plot::Bar {
        crate::plot::Bar {
            label,
            cold_s: self.cold_s,
            warm_s: self.warm_s,
            run_median_s: self.median(),
            run_min_s: self.runs_s.first().copied().unwrap_or(f64::NAN),
            run_max_s: self.runs_s.last().copied().unwrap_or(f64::NAN),
        }
    }
}

/// The table for people: one block per backend.
pub fn table(runs: &[Run]) -> String {
    let mut out = String::new();
    for r in runs {
        let warm = r.warm_s.map_or_else(|| "no cache".to_string(), |w| format!("{w:.3} s"));
        out.push_str(&format!(
            "{} ({}): compile cold {:.3} s, warm {warm}\n",
            r.backend.name(),
            r.prec.name(),
            r.cold_s
        ));
        for (phase, s) in &r.phases {
            out.push_str(&format!("    {phase:<16} {s:>9.4} s\n"));
        }
        if let Some((compile, run)) = r.first_tier_s {
            out.push_str(&format!(
                "  tiered: first build {compile:.3} s cold, first run {run:.6} s (the optimized \
                 build then follows in the background)\n"
            ));
        }
        let median = r.median();
        let rate = if median > 0.0 && r.flops > 0 {
            format!(", {:.2} GFLOP/s", r.flops as f64 / median / 1e9)
        } else {
            String::new()
        };
        out.push_str(&format!(
            "  run: median {:.6} s (min {:.6}, max {:.6}, {} reps){rate}\n",
            median,
            r.runs_s.first().copied().unwrap_or(f64::NAN),
            r.runs_s.last().copied().unwrap_or(f64::NAN),
            r.runs_s.len()
        ));
    }
    out
}

/// The backends to benchmark: the named ones (each must run here), else every backend the
/// build has that can run here.
pub fn backends(named: &[String]) -> Result<Vec<(BackendKind, bool)>, CliError> {
    if named.is_empty() {
        return Ok(BackendKind::available().into_iter().map(|b| (b, false)).collect());
    }
    named
        .iter()
        .map(|b| {
            BackendKind::from_name(b)
                .map(|k| (k, true))
                .map_err(|e| CliError { kind: ErrorKind::Backend, message: e.to_string() })
        })
        .collect()
}

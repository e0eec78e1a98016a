//! A seed changes values, not code: two graphs that differ only in their seed compile to the
//! same native code, so the second is served from the compile cache, while each computes its
//! own initial weights and random numbers.
#![cfg(feature = "gccjit")]

use rocannl_tensor::optim::{Optimizer, Sgd};
use rocannl_tensor::{
    Axes, BackendKind, CompileOptions, Graph, ParamSpec, Prec, Session, SessionOptions, Tensor,
};

/// `loss = mean((w · (x + noise))²)` with `w` randomly initialized from the graph's seed and
/// fresh noise from the generator.
fn model(seed: u64) -> (Graph, Tensor, Tensor, Tensor) {
    let g = Graph::with_seed(seed);
    let x = g.data("x", Axes::new().batch(&[4]).output(&[3]));
    let w = g.param("w", ParamSpec::new(Axes::new().output(&[5])));
    let y = w.matmul(&(&x + &x.uniform_like(false)));
    let loss = y.pointmul(&y).mean_all();
    (g, x, w, loss)
}

/// The cache's files (entries, digests and step records).
fn files(dir: &std::path::Path) -> Vec<String> {
    let mut out = Vec::new();
    for sub in ["", "steps"] {
        let d = dir.join(rocannl_arrayjit::cache::ENTRIES).join(sub);
        for e in std::fs::read_dir(d).into_iter().flatten().flatten() {
            if e.path().is_file() {
                out.push(e.file_name().to_string_lossy().into_owned());
            }
        }
    }
    out.sort();
    out
}

#[test]
fn a_graph_with_another_seed_is_served_from_the_compile_cache_with_its_own_values() {
    let dir = std::env::temp_dir().join(format!("rocannl-seeds-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let compile = CompileOptions {
        cache: rocannl_tensor::CacheMode::Dir(dir.clone()),
        tiered: false,
        ..CompileOptions::default()
    };
    let opts = SessionOptions {
        backend: BackendKind::Gccjit,
        prec: Prec::F32,
        compile,
        ..SessionOptions::default()
    };
    let mut seen = Vec::new();
    let mut first_files = None;
    for seed in [1, 2, 3] {
        let (g, x, w, loss) = model(seed);
        let mut s = Session::with_options(&g, opts.clone()).unwrap();
        s.write(&x, &(0..12).map(|i| i as f64 / 12.0).collect::<Vec<_>>()).unwrap();
        let mut step = s
            .train_step(&loss, &Optimizer::Sgd(Sgd::default()), &[&loss], &Default::default())
            .unwrap();
        let w0 = s.read(&w).unwrap();
        s.step(&mut step, 0.1).unwrap();
        let l = s.read(&loss).unwrap()[0];
        // The interpreter, the oracle, computes the same initial weights and loss.
        let (gi, xi, wi, lossi) = model(seed);
        let iopts = SessionOptions { backend: BackendKind::Interp, ..opts.clone() };
        let mut si = Session::with_options(&gi, iopts).unwrap();
        si.write(&xi, &(0..12).map(|i| i as f64 / 12.0).collect::<Vec<_>>()).unwrap();
        let mut stepi = si
            .train_step(&lossi, &Optimizer::Sgd(Sgd::default()), &[&lossi], &Default::default())
            .unwrap();
        assert_eq!(si.read(&wi).unwrap(), w0, "seed {seed}: initial weights");
        si.step(&mut stepi, 0.1).unwrap();
        assert_eq!(si.read(&lossi).unwrap()[0], l, "seed {seed}: loss");
        seen.push((w0, l));
        // The first seed fills the cache; the others add nothing to it.
        let now = files(&dir);
        assert!(!now.is_empty());
        match &first_files {
            None => first_files = Some(now),
            Some(f) => assert_eq!(&now, f, "seed {seed} compiled code of its own"),
        }
    }
    assert!(seen[0] != seen[1] && seen[1] != seen[2], "each seed its own values");
    let _ = std::fs::remove_dir_all(&dir);
}

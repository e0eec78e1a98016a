//! Counter-based random numbers with a runtime salt: every backend computes exactly
//! `uniform(seed, offset + cells · salt)`, so a step counter as salt draws a fresh block each run.

use rocannl_arrayjit::assignments::{Asgn, FetchOp};
use rocannl_arrayjit::indexing::Symbol;
use rocannl_arrayjit::ops::{Prec, uniform};
use rocannl_arrayjit::tnode::{MemoryMode, NodeTable};
use rocannl_arrayjit::{BackendKind, CompileOptions, Context};

#[test]
fn salted_uniform_is_the_same_everywhere() {
    let salt = Symbol(7);
    for backend in BackendKind::available() {
        let Ok(mut ctx) = Context::new(backend, CompileOptions::default()) else {
            assert_eq!(backend, BackendKind::Cuda, "only CUDA may be missing a device");
            continue;
        };
        let mut nodes = NodeTable::default();
        let r = nodes.add("r", &[2, 3], Prec::F64, MemoryMode::HostVisible);
        let fill = Asgn::Fetch { lhs: r, fetch: FetchOp::Uniform { seed: 5, salt: Some(salt) } };
        let routine = ctx.compile("fill", &fill, &nodes).unwrap();
        assert_eq!(routine.runtime_symbols(), &[salt]);
        for step in [0i64, 1, 4] {
            ctx.run(&routine, &[(salt, step)]).unwrap();
            let got = ctx.read(r).unwrap().to_f64_vec();
            let want: Vec<f64> = (0..6).map(|o| uniform(5, o + 6 * step as u64)).collect();
            assert_eq!(got, want, "{backend:?}, salt {step}");
        }
    }
}

//! The backend conformance suite: every case on every backend, against an independent
//! reference and against the interpreter (the oracle).

mod common;

use common::*;
use rocannl_arrayjit::ops::Prec;
use rocannl_arrayjit::{BackendKind, CompileOptions};

fn conformance(kind: BackendKind, precs: &[Prec], opts: CompileOptions) {
    for case in all_cases(precs) {
        let tol = tolerance(case_prec(&case));
        let got = run_case(kind, opts.clone(), &case);
        if let Some(expected) = &case.expected {
            for (k, (g, w)) in got.iter().zip(expected).enumerate() {
                assert_close(&format!("{} output {k} vs reference", case.name), g, w, tol);
            }
        }
        if kind != BackendKind::Interp {
            let oracle = run_case(BackendKind::Interp, CompileOptions::default(), &case);
            for (k, (g, w)) in got.iter().zip(&oracle).enumerate() {
                assert_close(&format!("{} output {k} vs interp", case.name), g, w, tol);
            }
        }
    }
}

#[test]
fn interp_all_precisions() {
    conformance(BackendKind::Interp, &Prec::ALL, CompileOptions::default());
}

#[test]
fn interp_without_virtualization() {
    let opts = CompileOptions { virtualize: false, ..CompileOptions::default() };
    conformance(BackendKind::Interp, &[Prec::F32, Prec::F64], opts);
}

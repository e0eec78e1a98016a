//! The machine code gccjit builds for `f32` special functions calls no scalar function of the C
//! math library: every unary operation and `pow` in `f32` is inline arithmetic
//! (`rocannl_arrayjit::math`, or an instruction such as `sqrtss`), which the loop vectorizer
//! can turn into vector code. Checked on the shared libraries the compile cache stores, by the
//! undefined symbols of their dynamic symbol tables: what the loader would have to bind. The
//! same routine in `f64` is the control: there the library's functions are called, and seen.
#![cfg(all(unix, feature = "gccjit"))]

mod common;

use std::collections::BTreeSet;
use std::path::Path;

use common::*;
use object::{Object as _, ObjectSymbol as _};
use rocannl_arrayjit::assignments::ScalarExpr;
use rocannl_arrayjit::cache::{CacheMode, ENTRIES};
use rocannl_arrayjit::ops::{BinOp, Prec, UnOp};
use rocannl_arrayjit::{BackendKind, CompileOptions};

/// The C math library's functions of one argument or two, by their `f64` names.
const LIBM: [&str; 21] = [
    "exp", "expm1", "exp2", "log", "log1p", "log2", "log10", "sqrt", "sin", "cos", "sincos", "tan",
    "sinh", "cosh", "tanh", "erf", "erfc", "pow", "hypot", "atan", "cbrt",
];

/// The library's `sin` and `cos` in the `f64` control (`sincos` where GCC merges a `sin` and a
/// `cos` of one value).
const TRIG: [&str; 3] = ["sin", "cos", "sincos"];

/// `Σ op(x)` over every unary operation, plus `pow(x, x)` and `pow(x, 0.5)`, cell by cell.
fn every_function(x: ScalarExpr) -> ScalarExpr {
    let mut e = ScalarExpr::bin(BinOp::Pow, x.clone(), x.clone());
    e = ScalarExpr::bin(
        BinOp::Add,
        e,
        ScalarExpr::bin(BinOp::Pow, x.clone(), ScalarExpr::Const(0.5)),
    );
    for op in UnOp::ALL {
        e = ScalarExpr::bin(BinOp::Add, e, ScalarExpr::un(op, x.clone()));
    }
    e
}

/// The undefined dynamic symbols of every shared library in the cache folder `dir`.
fn imports(dir: &Path) -> BTreeSet<String> {
    let mut names = BTreeSet::new();
    let entries = std::fs::read_dir(dir.join(ENTRIES)).expect("the cache's entries");
    let mut libraries = 0;
    for entry in entries.flatten() {
        let path = entry.path();
        if path.extension().is_none_or(|e| e != "so") {
            continue;
        }
        libraries += 1;
        let bytes = std::fs::read(&path).expect("a library");
        let file = object::File::parse(&*bytes).expect("an object file");
        for sym in file.dynamic_symbols().filter(|s| s.is_undefined()) {
            names.insert(sym.name().expect("a symbol name").to_string());
        }
    }
    assert!(libraries > 0, "the compile stored no library");
    names
}

/// The C math library functions a routine computing [`every_function`] in `prec` imports.
fn libm_imports(prec: Prec) -> BTreeSet<String> {
    let dir = tempfile::Builder::new()
        .prefix("rocannl-no-libm-")
        .tempdir_in(rocannl_arrayjit::env::temp_dir())
        .expect("a temporary folder");
    let xs = data(1000, 5, 0.25, 4.0);
    let case = map_case(
        &format!("every_function_{}", prec.name()),
        prec,
        prec,
        every_function(ScalarExpr::Arg(0)),
        xs,
    );
    let opts = CompileOptions {
        cache: CacheMode::Dir(dir.path().to_path_buf()),
        tiered: false,
        ..CompileOptions::default()
    };
    let out = run_case(BackendKind::Gccjit, opts, &case);
    assert!(out[0].iter().all(|v| v.is_finite()), "the routine ran");
    let all = imports(dir.path());
    let suffix = if prec == Prec::F64 { "" } else { "f" };
    LIBM.iter().map(|n| format!("{n}{suffix}")).filter(|n| all.contains(n)).collect()
}

#[test]
fn f32_special_functions_call_no_math_library_function() {
    for prec in [Prec::F32, Prec::Bf16] {
        let imports = libm_imports(prec);
        assert!(imports.is_empty(), "{prec:?} calls {imports:?}");
    }
}

#[test]
fn the_f64_control_calls_the_library_and_is_seen() {
    let imports = libm_imports(Prec::F64);
    let others: BTreeSet<&str> =
        imports.iter().map(|n| n.as_str()).filter(|n| !TRIG.contains(n)).collect();
    // `sqrt` is the instruction in `f64` too.
    let want: BTreeSet<&str> = ["exp", "exp2", "log", "log2", "tanh", "erf", "pow"].into();
    assert_eq!(others, want);
    assert!(imports.len() > want.len(), "sin and cos are calls: {imports:?}");
}

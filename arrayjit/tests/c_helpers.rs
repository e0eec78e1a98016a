//! The special functions as the C-family renderer prints them (the helpers before every CUDA
//! kernel, `rocannl_arrayjit::backend::c_syntax::prelude`) compile as C and compute the bits
//! of `rocannl_arrayjit::math`, checked by compiling the C dialect's prelude with the system's
//! C compiler (skipped, saying so, where there is none). The CUDA dialect differs only in its
//! bit casts and qualifiers.
#![cfg(unix)]

use std::fmt::Write as _;
use std::process::Command;

use rocannl_arrayjit::backend::c_syntax::{Dialect, prelude};
use rocannl_arrayjit::math;

/// A function of one `f32`.
type Unary = fn(f32) -> f32;

/// Inputs over the whole range: special values, then varied bit patterns.
fn inputs() -> Vec<f32> {
    let mut v = vec![0.0, -0.0, 1.0, -1.0, 0.5, 3.0, 1e-45, f32::INFINITY, f32::NEG_INFINITY];
    v.push(f32::NAN);
    // Near multiples of π/2, the hardest argument reductions among them, and the largest.
    let pi_4 = std::f32::consts::FRAC_PI_4;
    v.extend([pi_4, 252.898_21, 2.199_938_5e10, 7.729_179e28, 1e30, f32::MAX, -f32::MAX]);
    v.extend((0..20_000u32).map(|i| f32::from_bits(i.wrapping_mul(214_739))));
    v.extend((0..4_000).map(|i| -10.0 + i as f32 / 200.0));
    v
}

/// A C program printing, for each function and input (each pair for `pow`), the bits of the
/// result in hexadecimal, one a line.
fn program(xs: &[f32]) -> String {
    let mut s = String::from("#include <math.h>\n#include <stdio.h>\n");
    // The C dialect declares the runtime's helpers `extern`; nothing here calls them.
    s.push_str(&prelude(Dialect::C));
    let _ = write!(s, "static const unsigned int xs[{}] = {{", xs.len());
    for x in xs {
        let _ = write!(s, "{:#x}u,", x.to_bits());
    }
    s.push_str("};\n");
    let n = xs.len();
    s.push_str("int main(void) {\n");
    for f in ["exp", "exp2", "log", "log2", "tanh", "erf", "sin", "cos"] {
        let _ = writeln!(
            s,
            "  for (int i = 0; i < {n}; ++i) printf(\"%x\\n\", rc_f32_bits(rc_{f}f(rc_bits_f32(xs[i]))));"
        );
    }
    let _ = writeln!(
        s,
        "  for (int i = 0; i < {n}; ++i) printf(\"%x\\n\", rc_f32_bits(rc_powf(rc_bits_f32(xs[i]), rc_bits_f32(xs[({n} - 1 - i + i / 7) % {n}]))));"
    );
    s.push_str("  return 0;\n}\n");
    s
}

#[test]
fn the_printed_functions_compute_the_same_bits() {
    let xs = inputs();
    let dir = tempfile::Builder::new()
        .prefix("rocannl-c-helpers-")
        .tempdir_in(rocannl_arrayjit::env::temp_dir())
        .expect("a temporary folder");
    let src = dir.path().join("helpers.c");
    let exe = dir.path().join("helpers");
    std::fs::write(&src, program(&xs)).expect("written");
    // As the renderer's code is compiled: no contraction, no errno.
    let built = Command::new("cc")
        .args(["-O2", "-ffp-contract=off", "-fno-math-errno", "-o"])
        .arg(&exe)
        .arg(&src)
        .arg("-lm")
        .output();
    let Ok(built) = built else {
        eprintln!("skipped: no C compiler");
        return;
    };
    assert!(built.status.success(), "{}", String::from_utf8_lossy(&built.stderr));
    let out = Command::new(&exe).output().expect("ran");
    let got: Vec<u32> = String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(|l| u32::from_str_radix(l, 16).expect("hex"))
        .collect();
    let unary: [(&str, Unary); 8] = [
        ("exp", math::exp_f32),
        ("exp2", math::exp2_f32),
        ("log", math::log_f32),
        ("log2", math::log2_f32),
        ("tanh", math::tanh_f32),
        ("erf", math::erf_f32),
        ("sin", math::sin_f32),
        ("cos", math::cos_f32),
    ];
    let n = xs.len();
    let mut want = vec![];
    for (_, f) in unary {
        want.extend(xs.iter().map(|&x| f(x)));
    }
    want.extend((0..n).map(|i| math::pow_f32(xs[i], xs[(n - 1 - i + i / 7) % n])));
    assert_eq!(got.len(), want.len());
    for (k, (g, w)) in got.iter().zip(&want).enumerate() {
        let (g, w) = (f32::from_bits(*g), *w);
        let name = unary.get(k / n).map_or("pow", |u| u.0);
        assert!(
            g.to_bits() == w.to_bits() || g.is_nan() && w.is_nan(),
            "{name} at input {}: C {g:e}, Rust {w:e}",
            k % n
        );
    }
}

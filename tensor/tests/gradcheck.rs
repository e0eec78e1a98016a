//! Gradient checks: every differentiable operation's backprop against central finite
//! differences, in f64 on the reference interpreter (see `common::check`).

mod common;

use common::{check, param};
use rocannl_tensor::{Axes, Init, ParamSpec, Tensor};

#[test]
fn unary_ops() {
    type F = fn(&Tensor) -> Tensor;
    let cases: [(&str, F, f64, f64); 17] = [
        ("relu", |x| x.relu(), 0.1, 2.0),
        ("relu_negative", |x| x.relu(), -2.0, -0.1),
        ("sat01", |x| x.sat01(), 0.1, 0.9),
        ("exp", |x| x.exp(), -1.0, 1.0),
        ("log", |x| x.log(), 0.5, 3.0),
        ("exp2", |x| x.exp2(), -1.0, 1.0),
        ("log2", |x| x.log2(), 0.5, 3.0),
        ("sqrt", |x| x.sqrt(), 0.5, 3.0),
        ("recip", |x| x.recip(), 0.5, 3.0),
        ("sin_cos", |x| x.sin().cos(), -2.0, 2.0),
        ("tanh", |x| x.tanh(), -2.0, 2.0),
        ("sigmoid", |x| x.sigmoid(), -2.0, 2.0),
        ("abs_neg", |x| (-x).abs(), -2.0, 2.0),
        ("erf", |x| x.erf(), -2.0, 2.0),
        ("gelu", |x| x.gelu(), -3.0, 3.0),
        ("gelu_tanh", |x| x.gelu_tanh(), -3.0, 3.0),
        ("silu", |x| x.silu(), -3.0, 3.0),
    ];
    for (name, f, lo, hi) in cases {
        check(name, |g| {
            let x = param(g, "x", &[], &[2, 3], lo, hi);
            (vec![x.clone()], f(&x))
        });
    }
}

#[test]
fn binary_ops_with_broadcasting() {
    type F = fn(&Tensor, &Tensor) -> Tensor;
    let cases: [(&str, F); 7] = [
        ("add", |a, b| a + b),
        ("sub", |a, b| a - b),
        ("pointmul", |a, b| a.pointmul(b)),
        ("div", |a, b| a / b),
        ("pow", |a, b| a.pow(b)),
        ("max", |a, b| a.max(b)),
        ("min", |a, b| a.min(b)),
    ];
    for (name, f) in cases {
        // b broadcasts along a's first axis.
        check(name, |g| {
            let a = param(g, "a", &[], &[2, 3], 0.5, 2.0);
            let b = param(g, "b", &[], &[3], 0.3, 2.5);
            (vec![a.clone(), b.clone()], f(&a, &b))
        });
    }
}

#[test]
fn where_and_scalars() {
    check("where", |g| {
        let c = g.vector("c", &[1.0, 0.0, 2.0]);
        let a = param(g, "a", &[], &[3], -1.0, 1.0);
        let b = param(g, "b", &[], &[3], -1.0, 1.0);
        (vec![a.clone(), b.clone()], Tensor::where_(&c, &a, &b))
    });
    check("scalar_ops", |g| {
        let a = param(g, "a", &[], &[3], 0.5, 1.5);
        (vec![a.clone()], (&(&a * 2.0) + 1.0).powf(3.0).scale(0.5))
    });
}

#[test]
fn compose_and_fma() {
    check("matmul", |g| {
        let w = param(g, "w", &[3], &[2], -1.0, 1.0);
        let x = param(g, "x", &[], &[3], -1.0, 1.0);
        (vec![w.clone(), x.clone()], w.matmul(&x))
    });
    check("matmul_batched", |g| {
        let w = param(g, "w", &[3], &[2], -1.0, 1.0);
        let x = g.param(
            "x",
            ParamSpec::new(Axes::new().batch(&[2]).input(&[]).output(&[3]))
                .init(Init::Values(vec![0.3, -0.2, 0.5, 0.1, 0.7, -0.4])),
        );
        (vec![w.clone(), x.clone()], w.matmul(&x))
    });
    check("fma", |g| {
        let a = param(g, "a", &[2], &[2], -1.0, 1.0);
        let x = param(g, "x", &[], &[2], -1.0, 1.0);
        let c = param(g, "c", &[], &[2], -1.0, 1.0);
        (vec![a.clone(), x.clone(), c.clone()], a.fma(&x, &c))
    });
    check("transpose", |g| {
        let a = param(g, "a", &[3], &[2], -1.0, 1.0);
        (vec![a.clone()], a.transpose())
    });
}

#[test]
fn einsum_family() {
    check("einsum_matmul", |g| {
        let a = param(g, "a", &[], &[2, 3], -1.0, 1.0);
        let b = param(g, "b", &[], &[3, 4], -1.0, 1.0);
        (vec![a.clone(), b.clone()], a.einsum("ij;jk=>ik", &b))
    });
    check("einsum_unary_reduce_permute", |g| {
        let a = param(g, "a", &[2], &[3], -1.0, 1.0);
        (vec![a.clone()], a.einsum("i->o => o", []))
    });
    check("einsum_unary_diagonal", |g| {
        let a = param(g, "a", &[], &[3, 3], -1.0, 1.0);
        (vec![a.clone()], a.einsum("ii => i", []))
    });
    check("einsum_unary_place", |g| {
        let a = param(g, "a", &[], &[3], -1.0, 1.0);
        (vec![a.clone()], a.einsum("i => 2i", []))
    });
    for unbiased in [false, true] {
        check(&format!("var_{unbiased}"), |g| {
            let a = param(g, "a", &[], &[2, 5], -1.0, 1.0);
            (vec![a.clone()], a.var("i, j => i, 0", unbiased))
        });
    }
    check("amax", |g| {
        let a = param(g, "a", &[], &[2, 3], -1.0, 1.0);
        (vec![a.clone()], a.amax("ij => i"))
    });
    check("tropical", |g| {
        let a = param(g, "a", &[], &[4], -1.0, 1.0);
        let k = param(g, "k", &[], &[2], -0.3, 0.3);
        (vec![a.clone(), k.clone()], a.tropical("o+w; w => o", &k))
    });
    check("einsum_ternary", |g| {
        let a = param(g, "a", &[], &[2, 3], -1.0, 1.0);
        let b = param(g, "b", &[], &[3], -1.0, 1.0);
        let c = param(g, "c", &[], &[3, 2], -1.0, 1.0);
        (vec![a.clone(), b.clone(), c.clone()], a.einsum("ij; j; jk => ik", [&b, &c]))
    });
}

#[test]
fn convolutions() {
    check("conv_valid", |g| {
        let x = param(g, "x", &[], &[5, 2], -1.0, 1.0);
        let k = param(g, "k", &[], &[3, 2], -1.0, 1.0);
        (vec![x.clone(), k.clone()], x.einsum("o+w, c; w, c => o", &k))
    });
    check("conv_strided", |g| {
        let x = param(g, "x", &[], &[7], -1.0, 1.0);
        let k = param(g, "k", &[], &[3], -1.0, 1.0);
        (vec![x.clone(), k.clone()], x.einsum("2*o+w; w => o", &k))
    });
    check("conv_padded", |g| {
        let x = param(g, "x", &[], &[5], -1.0, 1.0);
        let k = param(g, "k", &[], &[3], -1.0, 1.0);
        (vec![x.clone(), k.clone()], x.einsum_padded("o+w; w => o", &k))
    });
}

#[test]
fn layout_ops() {
    check("concat", |g| {
        let a = param(g, "a", &[], &[2, 2], -1.0, 1.0);
        let b = param(g, "b", &[], &[2, 3], -1.0, 1.0);
        (vec![a.clone(), b.clone()], a.concat("i, p; i, q => i, p^q", &[&b]))
    });
    check("batch_slice", |g| {
        let a = g.param(
            "a",
            ParamSpec::new(Axes::new().batch(&[3]).input(&[]).output(&[2]))
                .init(Init::Values(vec![0.1, 0.2, 0.3, 0.4, 0.5, 0.6])),
        );
        (vec![a.clone()], a.batch_slice(1))
    });
    check("shared_node", |g| {
        let a = param(g, "a", &[], &[3], -1.0, 1.0);
        let h = a.tanh();
        (vec![a.clone()], &h.pointmul(&h) + &h)
    });
}

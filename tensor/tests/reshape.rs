//! Reshape, flatten and unflatten: values and gradients against PyTorch's `view`
//! (`tests/reference/reshape_torch.py` prints the expected numbers), finite-difference gradient
//! checks, the einsum forms of the same splits and merges, dynamic batches, and the errors.

mod common;

use rocannl_tensor::{
    Axes, BackendKind, Graph, Init, ParamSpec, Prec, RowKind, Session, SessionOptions, Tensor,
};

fn backends() -> Vec<BackendKind> {
    let mut b = vec![BackendKind::Interp];
    if cfg!(feature = "gccjit") || BackendKind::default() == BackendKind::Gccjit {
        b.push(BackendKind::Gccjit);
    }
    b
}

fn session(g: &Graph, backend: BackendKind) -> Session {
    let opts = SessionOptions { backend, prec: Prec::F64, ..Default::default() };
    Session::with_options(g, opts).unwrap_or_else(|e| panic!("{backend:?}: {e}"))
}

/// `x[k] = ((7 k) mod 24) / 10 - 1.1` in memory order (as in the reference script).
fn x_values() -> Vec<f64> {
    (0..24).map(|k| ((7 * k) % 24) as f64 / 10.0 - 1.1).collect()
}

/// `w[o, i] = ((5 (6 o + i)) mod 11) / 10 - 0.5`: 5 outputs, 6 inputs.
fn w_values() -> Vec<f64> {
    (0..30).map(|k| ((5 * k) % 11) as f64 / 10.0 - 0.5).collect()
}

fn close(got: &[f64], want: &[f64], what: &str) {
    assert_eq!(got.len(), want.len(), "{what}: lengths");
    for (k, (g, w)) in got.iter().zip(want).enumerate() {
        assert!((g - w).abs() <= 1e-9 * (1.0 + w.abs()), "{what}[{k}]: {g} vs {w}");
    }
}

const H: [f64; 20] = [
    0.309506921213,
    -0.551128028538,
    0.300437097148,
    0.522665429686,
    -0.664036770268,
    0.019997333760,
    0.604367777117,
    -0.610676832817,
    -0.664036770268,
    0.641076961185,
    -0.477700012168,
    -0.696257672687,
    0.584979882881,
    0.216518061493,
    -0.507977432898,
    0.551128028538,
    -0.019997333760,
    -0.109558470214,
    -0.197375320225,
    0.039978680311,
];
const DX: [f64; 24] = [
    -0.221475032542,
    0.338474779850,
    0.386546077927,
    -0.000869345115,
    0.047201952963,
    -0.340213470079,
    -0.239052080674,
    0.141022673215,
    0.565510875279,
    -0.153754642071,
    0.270733559993,
    -0.448531957357,
    -0.179233726022,
    0.276965328752,
    0.253882754831,
    -0.043861473488,
    -0.066944047408,
    -0.364688275727,
    0.219323829613,
    0.279933019195,
    0.420343708532,
    -0.171529740038,
    -0.031119050700,
    -0.622992499270,
];
const DW: [f64; 30] = [
    -0.475827781706,
    -0.676941101190,
    -0.124460991990,
    0.649387797083,
    0.779856373901,
    0.578743054416,
    -0.747040274808,
    -0.243444834743,
    0.564944346493,
    -0.076494127689,
    0.257029506686,
    0.760624946750,
    -1.032465588474,
    -0.226179505378,
    0.496861733689,
    0.179139419483,
    0.132822292885,
    0.939108375981,
    -0.762684677220,
    0.240993854826,
    0.067222952901,
    -0.134191352201,
    0.414633766168,
    1.418312298213,
    -0.587812839322,
    0.069961870143,
    0.304856000877,
    -0.298646904221,
    0.435470905721,
    1.093245615186,
];

/// PyTorch's printed values are rounded to 12 decimals.
fn close12(got: &[f64], want: &[f64], what: &str) {
    assert_eq!(got.len(), want.len(), "{what}: lengths");
    for (k, (g, w)) in got.iter().zip(want).enumerate() {
        assert!((g - w).abs() <= 1e-11, "{what}[{k}]: {g} vs {w}");
    }
}

/// FlattenConsecutive(2) of `x` (batch 2, 4 positions | 3 channels), a linear layer without
/// bias, tanh: `h`, and the params `x` and `w`.
fn wavenet_stage(g: &Graph, flatten: impl Fn(&Tensor) -> Tensor) -> (Tensor, Tensor, Tensor) {
    let x_spec = ParamSpec::new(Axes::new().batch(&[2, 4]).input(&[]).output(&[3]))
        .init(Init::Values(x_values()));
    let x = g.param("x", x_spec);
    let w = g.param(
        "w",
        ParamSpec::new(Axes::new().input(&[6]).output(&[5])).init(Init::Values(w_values())),
    );
    let h = w.matmul(&flatten(&x)).tanh();
    (x, w, h)
}

#[test]
fn flatten_consecutive_matches_pytorch_view_values_and_gradients() {
    for backend in backends() {
        let g = Graph::new();
        let (x, w, h) = wavenet_stage(&g, |x| {
            x.reshape(&Axes::new().batch_partial(&[None, Some(2)]).output(&[6]))
        });
        let root = h.sin();
        let mut s = session(&g, backend);
        let bp = s.backprop(&root, &[&h]).unwrap();
        s.run(&bp).unwrap();
        assert_eq!(h.shape_string(), "2,2|->5");
        let what = format!("{backend:?}");
        close12(&s.read(&h).unwrap(), &H, &format!("{what} h"));
        close12(&s.read_grad(&x).unwrap(), &DX, &format!("{what} dx"));
        close12(&s.read_grad(&w).unwrap(), &DW, &format!("{what} dw"));
    }
}

#[test]
fn the_einsum_split_with_a_two_position_weight_is_the_same_layer() {
    // `2*t+k` splits the positions into pairs; the weight's input row `2, 3` makes `k = 2`
    // (so `t = 2`), and its product with the split is the product with the flattened pairs.
    for backend in backends() {
        let g = Graph::new();
        let x_spec = ParamSpec::new(Axes::new().batch(&[2, 4]).input(&[]).output(&[3]))
            .init(Init::Values(x_values()));
        let x = g.param("x", x_spec);
        let pairs = x.einsum("..b.., 2*t+k | c => ..b.., t | k, c", []);
        let w_spec =
            ParamSpec::new(Axes::new().input(&[2, 3]).output(&[5])).init(Init::Values(w_values()));
        let w = g.param("w", w_spec);
        let h = w.matmul(&pairs).tanh();
        let root = h.sin();
        g.set_strict(true);
        let mut s = session(&g, backend);
        assert_eq!(pairs.shape_string(), "2,2|->2,3");
        let bp = s.backprop(&root, &[&h]).unwrap();
        s.run(&bp).unwrap();
        let what = format!("{backend:?} einsum");
        close12(&s.read(&h).unwrap(), &H, &format!("{what} h"));
        close12(&s.read_grad(&x).unwrap(), &DX, &format!("{what} dx"));
        close12(&s.read_grad(&w).unwrap(), &DW, &format!("{what} dw"));
    }
}

#[test]
fn an_einsum_merge_is_the_flatten_of_its_stride_and_kernel() {
    // `3*k+c` with `c` of 3 writes position 3k + c: the pairs' `k, c` merged, as the reshape.
    for backend in backends() {
        let g = Graph::new();
        let (x, w, h) = wavenet_stage(&g, |x| {
            x.unflatten(RowKind::Batch, -1, &[None, Some(2)])
                .einsum("..b.., t, k | c => ..b.., t | 3*k+c", [])
        });
        let root = h.sin();
        g.set_strict(true);
        let mut s = session(&g, backend);
        let bp = s.backprop(&root, &[&h]).unwrap();
        s.run(&bp).unwrap();
        let what = format!("{backend:?} einsum merge");
        close12(&s.read(&h).unwrap(), &H, &format!("{what} h"));
        close12(&s.read_grad(&x).unwrap(), &DX, &format!("{what} dx"));
        close12(&s.read_grad(&w).unwrap(), &DW, &format!("{what} dw"));
    }
}

#[test]
fn the_natural_flatten_consecutive_einsum_infers_its_pairs_from_the_weight() {
    // The building-blocks report: x of batch 32, 8 positions, 24 channels.
    let g = Graph::new();
    let x = g.data("x", Axes::new().batch(&[32, 8]).output(&[24]));
    let y = x.einsum("..b.., 2*t+k | c => ..b.., t | k, c", []);
    let w = g.param("w", ParamSpec::new(Axes::new().input(&[2, 24]).output(&[128])));
    let z = w.matmul(&y);
    g.set_strict(true);
    g.finish().unwrap();
    assert_eq!(y.shape_string(), "32,4|->2,24");
    assert_eq!(z.shape_string(), "32,4|->128");
    assert!(g.warnings().is_empty());
}

#[test]
fn an_einsum_split_nothing_decides_warns_and_fails_under_strict() {
    let build = |strict: bool| {
        let g = Graph::new();
        let x = g.data("x", Axes::new().output(&[8]));
        let y = x.einsum("2*t+k => t, k", []);
        g.set_strict(strict);
        let r = g.finish();
        (g, y, r)
    };
    let (g, y, r) = build(false);
    r.unwrap();
    assert_eq!(y.shape_string(), "|->1,8");
    let w = g.warnings();
    assert_eq!(w.len(), 1, "{w:?}");
    assert!(w[0].starts_with("einsum \"2*t+k => t, k\""), "{}", w[0]);
    assert!(w[0].contains("convolution 2*t+k (stride 2)") && w[0].contains("t = 1, k = 8"));
    let (_, _, r) = build(true);
    let e = r.unwrap_err().to_string();
    assert!(e.contains("einsum \"2*t+k => t, k\"") && e.contains("kernel k"), "{e}");
}

#[test]
fn a_kernel_that_does_not_divide_the_positions_names_the_convolution() {
    let g = Graph::new();
    let x = g.data("x", Axes::new().batch(&[32, 8]).output(&[24]));
    let y = x.einsum("..b.., 2*t+k | c => ..b.., t | k, c", []);
    let w = g.param("w", ParamSpec::new(Axes::new().input(&[3, 24]).output(&[128])));
    let _z = w.matmul(&y);
    let e = g.finish().unwrap_err().to_string();
    assert!(e.contains("convolution 2*t+k (stride 2, kernel k = 3)"), "{e}");
    assert!(e.contains("8 = 2*(t-1) + 3 has no whole-number solution"), "{e}");
    assert!(e.contains("'w' |3,24->128") && !e.contains('$'), "{e}");
}

#[test]
fn unflatten_and_flatten_split_heads_and_merge_them_back() {
    // heads y = (x.unflatten(-1, (2, 3)) ** 2 * [[1], [2]]).flatten(-2) in PyTorch.
    const Y: [f64; 24] = [
        1.21, 0.16, 0.09, 2.0, 0.98, 0.0, 0.49, 1.0, 0.09, 0.32, 2.42, 0.72, 0.01, 0.64, 0.81,
        0.08, 0.5, 2.88, 0.25, 0.04, 0.81, 1.28, 0.02, 0.72,
    ];
    for backend in backends() {
        let g = Graph::new();
        let x = g.data("x", Axes::new().batch(&[4]).output(&[6]));
        let scale = g.data("scale", Axes::new().output(&[2, 1]));
        let heads = x.unflatten(RowKind::Output, -1, &[Some(2), None]);
        let y = heads.pointmul(&heads).pointmul(&scale).flatten(RowKind::Output, -2, 2);
        let mut s = session(&g, backend);
        let fwd = s.forward(&[&y]).unwrap();
        s.write(&x, &x_values()).unwrap();
        s.write(&scale, &[1.0, 2.0]).unwrap();
        s.run(&fwd).unwrap();
        assert_eq!((heads.shape_string(), y.shape_string()), ("4|->2,3".into(), "4|->6".into()));
        close(&s.read(&y).unwrap(), &Y, &format!("{backend:?}"));
    }
}

#[test]
fn reshape_flatten_and_unflatten_gradients_match_finite_differences() {
    use common::{check, param};
    check("reshape across rows", |g| {
        let a = param(g, "a", &[2], &[3, 2], -1.0, 1.0);
        let w = param(g, "w", &[3], &[2], -1.0, 1.0);
        // |2 -> 3,2 (memory order 3,2,2) seen as |4 -> 3.
        let r = a.reshape(&Axes::new().input(&[4]).output(&[3]));
        (vec![a, w.clone()], w.matmul(&r.tanh()))
    });
    check("flatten", |g| {
        let a = param(g, "a", &[], &[2, 3, 2], -1.0, 1.0);
        let f = a.flatten(RowKind::Output, 1, 2);
        (vec![a], f.pointmul(&f).einsum("i, j => j", []))
    });
    check("unflatten", |g| {
        let a = param(g, "a", &[3], &[6], -1.0, 1.0);
        let u = a.unflatten(RowKind::Output, 0, &[None, Some(3)]);
        let b = param(g, "b", &[], &[2, 3], -0.5, 0.5);
        (vec![a, b.clone()], u.pointmul(&b).exp())
    });
}

#[test]
fn a_dynamic_batch_axis_is_kept_by_a_reshape() {
    for backend in backends() {
        let g = Graph::new();
        let b = g.dynamic("batch", 4);
        let x = g.data("x", Axes::new().dynamic_batch(&b).batch(&[4]).output(&[3]));
        let y = x.reshape(&Axes::new().batch_partial(&[None, Some(2)]).output(&[6]));
        let m = y.mean("n, t | c => t | c");
        let mut s = session(&g, backend);
        let fwd = s.forward(&[&m]).unwrap();
        assert_eq!(y.shape_string(), "4,2|->6");
        for n in [4, 1, 3] {
            s.set_size(&b, n).unwrap();
            let xv: Vec<f64> = (0..n * 12).map(|k| k as f64).collect();
            s.write(&x, &xv).unwrap();
            s.run(&fwd).unwrap();
            // Row r of the batch holds 12 r .. 12 r + 11: the mean over n rows at cell k of
            // the remaining 12 is k + 12 (n - 1) / 2.
            let want: Vec<f64> = (0..12).map(|k| k as f64 + 6.0 * (n as f64 - 1.0)).collect();
            close(&s.read(&m).unwrap(), &want, &format!("{backend:?} n={n}"));
        }
    }
}

#[test]
fn merging_a_dynamic_batch_axis_is_an_error_naming_the_reshape() {
    let g = Graph::new();
    let b = g.dynamic("batch", 4);
    let x = g.data("x", Axes::new().dynamic_batch(&b).batch(&[4]).output(&[3]));
    let y = x.flatten(RowKind::Batch, 0, 2);
    let mut s = Session::new(&g).unwrap();
    let e = s.forward(&[&y]).expect_err("merging a dynamic axis").to_string();
    assert!(e.contains("reshape") && e.contains("batch"), "{e}");
}

#[test]
fn a_regrouping_across_axis_boundaries_is_an_error_and_a_flat_axis_does_it() {
    let g = Graph::new();
    let x = g.data("x", Axes::new().output(&[6, 4]));
    let y = x.reshape(&Axes::new().output(&[4, 6]));
    let mut s = Session::new(&g).unwrap();
    let e = s.forward(&[&y]).expect_err("6,4 as 4,6").to_string();
    assert!(e.contains("reshape 'reshape' of 'x' from |->6,4 to |->4,6"), "{e}");
    assert!(e.contains("reshape through one flat axis first"), "{e}");

    let g = Graph::new();
    let x = g.data("x", Axes::new().output(&[6, 4]));
    let y = x.reshape(&Axes::new().output(&[24])).reshape(&Axes::new().output(&[4, 6]));
    let mut s = session(&g, BackendKind::Interp);
    let fwd = s.forward(&[&y]).unwrap();
    let v: Vec<f64> = (0..24).map(f64::from).collect();
    s.write(&x, &v).unwrap();
    s.run(&fwd).unwrap();
    assert_eq!(s.read(&y).unwrap(), v);
}

#[test]
fn sizes_that_do_not_divide_are_shape_errors_naming_the_reshape() {
    let g = Graph::new();
    let x = g.data("x", Axes::new().output(&[10]));
    let _y = x.reshape(&Axes::new().output_partial(&[Some(3), None]));
    let e = g.finish().unwrap_err().to_string();
    assert!(e.contains("reshape"), "{e}");
    let g = Graph::new();
    let x = g.data("x", Axes::new().output(&[10]));
    let _y = x.flatten(RowKind::Output, -1, 2);
    let e = g.finish().unwrap_err().to_string();
    assert!(e.contains("reshape") && e.contains("output row"), "{e}");
    // Like PyTorch's -1: one size at most is solved from the element count.
    let g = Graph::new();
    let x = g.data("x", Axes::new().output(&[10]));
    let _y = x.unflatten(RowKind::Output, 0, &[None, None]);
    let e = g.finish().unwrap_err().to_string();
    assert!(e.contains("unflatten: 2 sizes are left to inference"), "{e}");
}

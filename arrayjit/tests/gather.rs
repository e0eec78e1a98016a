//! The table lookup on every path: the native backend's kernel call, and the ordinary nests
//! every other backend runs (the interpreter, the CUDA simulator, native code in bounds-check
//! mode, any precision but `f32`). Each against a lookup written here, bit for bit: the rows
//! copied (a `−0` and a NaN in the table included; an id out of range gives `−0`), and the
//! table's gradient summed in token order; ids as `u32` and as `f32`; a table stored with the
//! vocabulary last and first; a dynamic batch that stops short.

mod common;

use common::*;
use rocannl_arrayjit::assignments::{Asgn, FetchOp, GatherAsgn};
use rocannl_arrayjit::indexing::Symbol;
use rocannl_arrayjit::ops::Prec;
use rocannl_arrayjit::tnode::{NodeId, NodeTable};
use rocannl_arrayjit::{BackendKind, CompileOptions, Context};

/// A case: the ids' axes, the rows' axes, the vocabulary, the table's layout.
#[derive(Clone, Debug)]
struct Case {
    tokens: Vec<usize>,
    rows: Vec<usize>,
    vocab: usize,
    vocab_first: bool,
}

impl Case {
    fn n_tokens(&self) -> usize {
        self.tokens.iter().product()
    }
    fn n_rows(&self) -> usize {
        self.rows.iter().product()
    }
    fn table_dims(&self) -> Vec<usize> {
        match self.vocab_first {
            true => [self.vocab].iter().chain(&self.rows).copied().collect(),
            false => self.rows.iter().chain([&self.vocab]).copied().collect(),
        }
    }
    fn out_dims(&self) -> Vec<usize> {
        self.tokens.iter().chain(&self.rows).copied().collect()
    }
    /// The table's flat offset of cell `r` of id `v`.
    fn cell(&self, r: usize, v: usize) -> usize {
        if self.vocab_first { v * self.n_rows() + r } else { r * self.vocab + v }
    }
    /// `(out, d_table)` for `used` tokens: the rows copied (`−0` for an id out of range), and
    /// the gradient `w` added into a zeroed table in token order.
    fn reference(&self, table: &[f64], ids: &[f64], w: &[f64], used: usize) -> [Vec<f64>; 2] {
        let (nr, nt) = (self.n_rows(), self.n_tokens());
        let mut out = vec![0.0; nt * nr];
        let mut d_table = vec![0.0; table.len()];
        for t in 0..used {
            let id = ids[t];
            let valid = id >= 0.0 && id.fract() == 0.0 && (id as usize) < self.vocab;
            for r in 0..nr {
                out[t * nr + r] = if valid { table[self.cell(r, id as usize)] } else { -0.0 };
                if valid {
                    // In f32, as the tensors are (the sums' rounding is the test's subject).
                    let c = &mut d_table[self.cell(r, id as usize)];
                    *c = (*c as f32 + w[t * nr + r] as f32) as f64;
                }
            }
        }
        [out, d_table]
    }
}

struct Built {
    nodes: NodeTable,
    asgn: Asgn,
    /// table, ids, w (the output's gradient).
    inputs: [NodeId; 3],
    /// out, d_table.
    outputs: [NodeId; 2],
}

fn build(c: &Case, prec: Prec, ids_prec: Prec, batch_limit: Option<Symbol>) -> Built {
    let mut nodes = NodeTable::default();
    let table = host(&mut nodes, "table", &c.table_dims(), prec);
    let ids = host(&mut nodes, "ids", &c.tokens, ids_prec);
    let w = host(&mut nodes, "w", &c.out_dims(), prec);
    let out = host(&mut nodes, "out", &c.out_dims(), prec);
    let d_table = host(&mut nodes, "d_table", &c.table_dims(), prec);
    let fwd =
        GatherAsgn { table, ids, out, vocab_first: c.vocab_first, backward: false, batch_limit };
    let bwd = GatherAsgn { table: d_table, out: w, backward: true, ..fwd.clone() };
    let asgn = Asgn::Seq(vec![
        Asgn::Gather(Box::new(fwd)),
        Asgn::Fetch { lhs: d_table, fetch: FetchOp::Constant(0.0) },
        Asgn::Gather(Box::new(bwd)),
    ]);
    Built { nodes, asgn, inputs: [table, ids, w], outputs: [out, d_table] }
}

fn run(
    kind: BackendKind,
    opts: CompileOptions,
    b: &Built,
    values: &[Vec<f64>; 3],
    bindings: &[(Symbol, i64)],
) -> (String, Vec<Vec<f64>>) {
    let inputs: Vec<(NodeId, &[f64])> =
        b.inputs.iter().zip(values).map(|(&n, v)| (n, v.as_slice())).collect();
    compile_and_run(kind, opts, (&b.asgn, &b.nodes), &inputs, &b.outputs, bindings)
}

fn cases() -> Vec<Case> {
    let c = |tokens: &[usize], rows: &[usize], vocab, vocab_first| Case {
        tokens: tokens.to_vec(),
        rows: rows.to_vec(),
        vocab,
        vocab_first,
    };
    vec![
        c(&[6], &[3], 5, false),
        c(&[4, 3], &[2, 3], 7, false),
        c(&[5], &[4], 3, true),
        // More tokens and rows than the lowering's parts, so parts hold several.
        c(&[130], &[70], 9, false),
    ]
}

/// The table (with a `−0` and a NaN in id 0's cells), the ids (repeats, and one out of
/// range), and the output's gradient.
fn inputs(c: &Case, seed: u64, f32_ids: bool) -> [Vec<f64>; 3] {
    let mut table = data(c.n_rows() * c.vocab, seed, -2.0, 2.0);
    table[c.cell(0, 0)] = -0.0;
    table[c.cell(c.n_rows() - 1, 0)] = f64::NAN;
    let mut ids: Vec<f64> = (0..c.n_tokens()).map(|t| ((t * 7 + 3) % c.vocab) as f64).collect();
    ids[1] = ids[0];
    ids[c.n_tokens() - 1] = c.vocab as f64 + 2.0;
    if f32_ids && c.n_tokens() > 3 {
        ids[2] = 1.5;
        ids[3] = -1.0;
    }
    let w = data(c.n_tokens() * c.n_rows(), seed + 1, -1.0, 1.0);
    [table, ids, w]
}

/// The backends, and whether each calls the kernel.
fn paths() -> Vec<(&'static str, BackendKind, CompileOptions, bool)> {
    let checked = CompileOptions { bounds_check: true, ..CompileOptions::default() };
    vec![
        ("native", BackendKind::Gccjit, CompileOptions::default(), true),
        ("native, bounds-checked", BackendKind::Gccjit, checked, false),
        ("interpreter", BackendKind::Interp, CompileOptions::default(), false),
        ("cuda simulator", BackendKind::CudaSim, CompileOptions::default(), false),
    ]
}

/// Equal bits, NaN equal to NaN and `−0` told from `+0`.
fn assert_bits(label: &str, got: &[f64], want: &[f64]) {
    assert_eq!(got.len(), want.len(), "{label}");
    for (k, (g, w)) in got.iter().zip(want).enumerate() {
        let same = (g.is_nan() && w.is_nan()) || g.to_bits() == w.to_bits();
        assert!(same, "{label}: cell {k} is {g:?}, expected {w:?}");
    }
}

#[test]
fn every_path_looks_up_the_rows_and_adds_their_gradients_bit_for_bit() {
    for (n, c) in cases().iter().enumerate() {
        for ids_prec in [Prec::U32, Prec::F32] {
            let values = inputs(c, 10 * n as u64, ids_prec == Prec::F32);
            let want = c.reference(&values[0], &values[1], &values[2], c.n_tokens());
            let b = build(c, Prec::F32, ids_prec, None);
            for (name, kind, opts, calls) in paths() {
                let (text, got) = run(kind, opts, &b, &values, &[]);
                let label = format!("{name} ids {ids_prec:?} {c:?}");
                assert_eq!(text.contains(" part "), calls, "{label}:\n{text}");
                assert_bits(&format!("{label} out"), &got[0], &want[0]);
                assert_bits(&format!("{label} d_table"), &got[1], &want[1]);
            }
        }
    }
}

#[test]
fn other_precisions_run_the_nests() {
    let c = cases()[1].clone();
    let values = inputs(&c, 3, false);
    let [out, _] = c.reference(&values[0], &values[1], &values[2], c.n_tokens());
    for prec in [Prec::F64, Prec::Bf16] {
        let b = build(&c, prec, Prec::U32, None);
        let (text, got) = run(BackendKind::Gccjit, CompileOptions::default(), &b, &values, &[]);
        assert!(!text.contains(" part "), "{prec:?}:\n{text}");
        // The rows are copies: bf16 rounds the table once, when it is written.
        let rounded: Vec<f64> = out
            .iter()
            .map(|&x| if prec == Prec::Bf16 { half::bf16::from_f64(x).to_f64() } else { x })
            .collect();
        assert_bits(&format!("{prec:?} out"), &got[0], &rounded);
    }
}

#[test]
fn a_dynamic_batch_looks_up_only_its_tokens() {
    let c = Case { tokens: vec![4, 3], rows: vec![5], vocab: 6, vocab_first: false };
    let values = inputs(&c, 7, false);
    let size = Symbol(901);
    let b = build(&c, Prec::F32, Prec::U32, Some(size));
    // Two of the four rows of ids: six tokens.
    let want = c.reference(&values[0], &values[1], &values[2], 6);
    for (name, kind, opts, _) in paths() {
        let (_, got) = run(kind, opts, &b, &values, &[(size, 2)]);
        let mut out = want[0].clone();
        // The tokens past the batch are not written: their cells keep the buffer's zeros.
        out[6 * 5..].iter_mut().for_each(|x| *x = 0.0);
        assert_bits(&format!("{name} out"), &got[0], &out);
        assert_bits(&format!("{name} d_table"), &got[1], &want[1]);
    }
}

#[test]
fn mismatched_tensors_are_an_error_not_a_crash() {
    let c = cases()[0].clone();
    let mut b = build(&c, Prec::F32, Prec::U32, None);
    let short = b.nodes.add(
        "short",
        &[c.n_tokens(), 2],
        Prec::F32,
        rocannl_arrayjit::MemoryMode::HostVisible,
    );
    if let Asgn::Seq(items) = &mut b.asgn
        && let Asgn::Gather(g) = &mut items[0]
    {
        g.out = short;
    }
    for kind in [BackendKind::Interp, BackendKind::Gccjit] {
        let mut ctx = Context::new(kind, CompileOptions::default()).unwrap();
        let err = ctx.compile("lookup", &b.asgn, &b.nodes).unwrap_err().to_string();
        assert!(err.contains("lookup output of dims [6, 2], expected [6, 3]"), "{err}");
    }
}

#[test]
fn the_printed_forms_are_stable() {
    let c = Case { tokens: vec![2, 3], rows: vec![4], vocab: 5, vocab_first: false };
    let b = build(&c, Prec::F32, Prec::U32, None);
    expect_test::expect![[r#"
        n3 := gather(n0, n1)
        n4 := constant(0)
        n4 += gather_grad(n1, n2)
    "#]]
    .assert_eq(&b.asgn.to_string());
    let text = |kind| {
        let mut ctx = Context::new(kind, CompileOptions::default()).unwrap();
        ctx.compile("lookup", &b.asgn, &b.nodes).unwrap().low_level_text().to_string()
    };
    let native = text(BackendKind::Gccjit);
    let calls: Vec<&str> = native.lines().filter(|l| l.contains(" part ")).map(str::trim).collect();
    expect_test::expect![[r#"
        [
            "n3 := gather(n0, n1) part v0, 1 long",
            "n4 += gather_grad(n1, n2) part v3, 1 long",
        ]
    "#]]
    .assert_debug_eq(&calls);
    expect_test::expect![[r#"
        # n3 := gather(n0, n1)
        for v4 in 0..2 par {
          for v5 in 0..3 par {
            for v6 in 0..4 par {
              t0 := -0
              for v7 in 0..5 {
                t0 := add(t0, where(eq(n1[v4, v5], index(v7)), n0[v6, v7], -0))
              }
              n3[v4, v5, v6] := t0
            }
          }
        }
        for v1 in 0..4 par {
          for v2 in 0..5 par {
            n4[v1, v2] := 0
          }
        }
        # n4 += gather_grad(n1, n2)
        for v10 in 0..4 par {
          for v11 in 0..5 par {
            t1 := n4[v10, v11]
            for v8 in 0..2 {
              for v9 in 0..3 {
                t1 := add(t1, where(eq(n1[v8, v9], index(v11)), n2[v8, v9, v10], -0))
              }
            }
            n4[v10, v11] := t1
          }
        }
    "#]]
    .assert_eq(&text(BackendKind::Interp));
}

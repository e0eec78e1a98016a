//! The shape-generic kernels alone (one thread), per instruction set the host has, in FLOP/s.
//!
//! `gemm_f32/<isa>/<layout>/<n>`: `C = A·B` of n×n f32 matrices; layouts `nn` (both
//! row-major), `tn` (`Aᵀ·B`, a weight gradient's layout) and `nt` (`A·Bᵀ`, an input
//! gradient's). Criterion's "elem/s" read as FLOP/s (2n³ per call).
//!
//! `gemm_suite/<isa>/<name>`: the model suite's product shapes (`SUITE_PRODUCTS`: a GPT's
//! projections, MLP layers and their gradients at widths 64–384), one thread, the host's best
//! instruction set, to compare with the FMA probe (`../shared/anchors/perf/fma_peak.c`).
//!
//! `gemm_bf16/<path>/<n>`: the same with bf16 factors into f32 (`kernels::bf16`), on the host's
//! bf16 dot products (`native`, where it has them) and on the portable pairwise reference, a
//! projection (`native/projection_512x64x256`) and a weight's gradient
//! (`native/weight_gradient_64x256x512`) in char_gpt's shapes.
//!
//! `map/<case>`: the map kernel (`kernels::map`) on the shapes a training step gives it —
//! row sums of 512 × 64 (points contiguous), column sums of 512 × 64 (a bias gradient), the
//! row maxima of 2048 rows of 16 read through a scaled, masked score (`fma(s, 0.25, mask)`),
//! a 65 536-cell add, and `0.5·x·(1 + tanh(y))` over 65 536 cells. "elem/s": cells × points.
//!
//! `attention/<pass>/<model>`: the fused causal attention (`kernels::attention`), forward and
//! backward, one thread, at the suite's attention shapes (batch, positions, heads, head width
//! of gpt-w128-l2-c256, gpt-w96-l2-c128, gpt-w128-l4-c64, gpt-w64-l3-c32 and gpt-w64-l2-c16).
//! "elem/s": the (query, key)
//! pairs the causal mask leaves.

use criterion::{BenchmarkId, Criterion, Throughput, criterion_group, criterion_main};
use rocannl::arrayjit::kernels::attention::{self, Attention};
use rocannl::arrayjit::kernels::bf16::{GemmBf16, gemm_bf16, has_native, reference};
use rocannl::arrayjit::kernels::map::{MAX_INPUTS, MapAxisDesc, MapCode, MapDesc};
use rocannl::arrayjit::kernels::{Gemm, Isa, gemm, rc_map_f32};
use rocannl::arrayjit::ops::{BinOp, TernOp, UnOp};

/// A map kernel axis: `n` steps, the result's step, each input's.
fn axis(n: usize, out: isize, steps: &[isize]) -> MapAxisDesc {
    let mut s = [0isize; MAX_INPUTS];
    s[..steps.len()].copy_from_slice(steps);
    MapAxisDesc { n, out, steps: s }
}

fn map_group(c: &mut Criterion) {
    let mut group = c.benchmark_group("map");
    group.sample_size(20);
    let big: Vec<f32> = (0..65536).map(|x| ((x % 97) as f32 - 48.0) / 32.0).collect();
    let other: Vec<f32> = (0..65536).map(|x| ((x % 89) as f32 - 44.0) / 32.0).collect();
    let mut out = vec![0f32; 65536];
    let cases: Vec<(&str, MapDesc, usize)> = vec![
        (
            "row_sums_512x64",
            MapDesc {
                cells: vec![axis(512, 1, &[64])],
                points: vec![axis(64, 0, &[1])],
                inputs: 1,
                reduce: Some(BinOp::Add),
                accumulate: false,
                code: vec![MapCode::Input(0)],
            },
            512 * 64,
        ),
        (
            "column_sums_512x64",
            MapDesc {
                cells: vec![axis(64, 1, &[1])],
                points: vec![axis(512, 0, &[64])],
                inputs: 1,
                reduce: Some(BinOp::Add),
                accumulate: true,
                code: vec![MapCode::Input(0)],
            },
            512 * 64,
        ),
        (
            "masked_row_max_2048x16",
            MapDesc {
                cells: vec![axis(2048, 1, &[16, 0])],
                points: vec![axis(16, 0, &[1, 1])],
                inputs: 2,
                reduce: Some(BinOp::Max),
                accumulate: false,
                code: vec![
                    MapCode::Input(0),
                    MapCode::Const(0.25),
                    MapCode::Input(1),
                    MapCode::Tern(TernOp::Fma),
                ],
            },
            2048 * 16,
        ),
        (
            "add_65536",
            MapDesc {
                cells: vec![axis(65536, 1, &[1, 1])],
                points: vec![],
                inputs: 2,
                reduce: None,
                accumulate: false,
                code: vec![MapCode::Input(0), MapCode::Input(1), MapCode::Bin(BinOp::Add)],
            },
            65536,
        ),
        (
            "half_x_one_plus_tanh_65536",
            MapDesc {
                cells: vec![axis(65536, 1, &[1, 1])],
                points: vec![],
                inputs: 2,
                reduce: None,
                accumulate: false,
                code: vec![
                    MapCode::Input(0),
                    MapCode::Const(0.5),
                    MapCode::Bin(BinOp::Mul),
                    MapCode::Const(1.0),
                    MapCode::Input(1),
                    MapCode::Un(UnOp::Tanh),
                    MapCode::Bin(BinOp::Add),
                    MapCode::Bin(BinOp::Mul),
                ],
            },
            65536,
        ),
    ];
    for (name, desc, elems) in cases {
        let words = desc.encode();
        group.throughput(Throughput::Elements(elems as u64));
        group.bench_function(name, |bench| {
            bench.iter(|| {
                let ptrs = [out.as_mut_ptr(), big.as_ptr() as *mut f32, other.as_ptr() as *mut f32];
                // SAFETY: every case addresses at most 65 536 cells of each buffer.
                unsafe { rc_map_f32(ptrs.as_ptr(), words.as_ptr()) }
            })
        });
    }
    group.finish();
}

/// The f32 products, then the bf16 ones, then attention.
fn bench(c: &mut Criterion) {
    gemm_f32_group(c);
    gemm_suite_group(c);
    gemm_bf16_group(c);
    attention_group(c);
}

/// The fused causal attention at the suite's shapes, forward and backward.
fn attention_group(c: &mut Criterion) {
    let mut group = c.benchmark_group("attention");
    group.sample_size(10);
    let isa = Isa::host();
    for (name, batch, positions, heads, width) in [
        ("gpt-w128-l2-c256", 8, 256, 8, 16),
        ("gpt-w96-l2-c128", 16, 128, 3, 32),
        ("gpt-w128-l4-c64", 12, 64, 4, 32),
        ("gpt-w64-l3-c32", 64, 32, 2, 32),
        ("gpt-w64-l2-c16", 32, 16, 4, 16),
    ] {
        let a = Attention {
            batch,
            queries: positions,
            keys: positions,
            heads,
            depth: width,
            width,
            causal: true,
            scale: 1.0 / (width as f32).sqrt(),
        };
        let cells = batch * positions * heads * width;
        let x: Vec<f32> = (0..cells).map(|i| ((i % 23) as f32 - 11.0) / 11.0).collect();
        let mut out = vec![0f32; cells];
        let mut lse = vec![0f32; batch * positions * heads];
        let (mut dq, mut dk, mut dv) = (vec![0f32; cells], vec![0f32; cells], vec![0f32; cells]);
        let seen = batch * heads * positions * (positions + 1) / 2;
        group.throughput(Throughput::Elements(seen as u64));
        let f = attention::Forward {
            q: x.as_ptr(),
            k: x.as_ptr(),
            v: x.as_ptr(),
            out: out.as_mut_ptr(),
            lse: lse.as_mut_ptr(),
        };
        group.bench_function(BenchmarkId::new("forward", name), |bench| {
            // SAFETY: dense tensors of the sizes' layouts.
            bench.iter(|| unsafe { attention::forward(&a, f, 0..a.pairs(), isa) })
        });
        let b = attention::Backward {
            q: x.as_ptr(),
            k: x.as_ptr(),
            v: x.as_ptr(),
            out: out.as_ptr(),
            lse: lse.as_ptr(),
            d_out: x.as_ptr(),
            d_q: dq.as_mut_ptr(),
            d_k: dk.as_mut_ptr(),
            d_v: dv.as_mut_ptr(),
        };
        group.bench_function(BenchmarkId::new("backward", name), |bench| {
            // SAFETY: as above; the gradients are distinct buffers.
            bench.iter(|| unsafe { attention::backward(&a, b, 0..a.pairs(), isa) })
        });
    }
    group.finish();
}

/// The fused product `C = A·B` of `(m, k, n)` over the slices, in a layout: `nn` (both
/// row-major), `tn` (`A` stored transposed, a weight gradient's) or `nt` (`B` stored
/// transposed, an input gradient's).
fn product(
    (m, k, n): (usize, usize, usize),
    layout: &str,
    a: &[f32],
    b: &[f32],
    c: &mut [f32],
) -> Gemm<f32> {
    let ((rsa, csa), (rsb, csb)) = match layout {
        "nn" => ((k as isize, 1), (n as isize, 1)),
        "tn" => ((1, m as isize), (n as isize, 1)),
        _ => ((k as isize, 1), (1, k as isize)),
    };
    let row_major = Gemm::row_major(m, k, n, a.as_ptr(), b.as_ptr(), c.as_mut_ptr());
    Gemm { rsa, csa, rsb, csb, fused: true, ..row_major }
}

/// `gemm_f32/<isa>/<layout>/<n>`: square f32 products per instruction set and layout.
fn gemm_f32_group(c: &mut Criterion) {
    let mut group = c.benchmark_group("gemm_f32");
    group.sample_size(10);
    for isa in Isa::available() {
        for n in [256usize, 512, 1024] {
            if isa == Isa::Generic && n > 256 {
                continue;
            }
            let a: Vec<f32> = (0..n * n).map(|x| ((x % 17) as f32 - 8.0) / 8.0).collect();
            let b: Vec<f32> = (0..n * n).map(|x| ((x % 13) as f32 - 6.0) / 8.0).collect();
            let mut out = vec![0f32; n * n];
            for layout in ["nn", "tn", "nt"] {
                group.throughput(Throughput::Elements(2 * (n as u64).pow(3)));
                let id = BenchmarkId::new(format!("{}/{layout}", isa.name()), n);
                group.bench_function(id, |bench| {
                    bench.iter(|| {
                        let g = product((n, n, n), layout, &a, &b, &mut out);
                        // SAFETY: every operand is n×n, with the layout's strides.
                        unsafe { gemm(&g, isa) }
                    })
                });
            }
        }
    }
    group.finish();
}

/// The model suite's products (`benches/suite/models.json`), one thread, the host's best
/// instruction set: `(name, m, k, n, layout)`. A GPT of width `d`, `r = batch × context` rows
/// and MLP width `4d` has the forward products `r × d × {d, 4d}` and `r × 4d × d` (`nn`), their
/// input gradients (`nt`: `r × n × k`) and weight gradients (`tn`: `k × r × n`).
const SUITE_PRODUCTS: &[(&str, usize, usize, usize, &str)] = &[
    ("w128_c64_proj", 768, 128, 128, "nn"),
    ("w128_c64_ff1", 768, 128, 512, "nn"),
    ("w128_c64_ff2", 768, 512, 128, "nn"),
    ("w128_c64_ff1_dx", 768, 512, 128, "nt"),
    ("w128_c64_ff1_dw", 128, 768, 512, "tn"),
    ("w128_c64_ff2_dw", 512, 768, 128, "tn"),
    ("w64_c16_ff1", 512, 64, 256, "nn"),
    ("w192_c32_ff1", 1024, 192, 768, "nn"),
    ("w192_c32_ff2_dx", 1024, 192, 768, "nt"),
    ("w384_c128_ff1", 1024, 384, 1536, "nn"),
    ("w384_c128_ff2_dw", 1536, 1024, 384, "tn"),
    ("w128_c256_proj", 2048, 128, 128, "nn"),
];

/// `gemm_suite/<name>`: the suite's product shapes ([`SUITE_PRODUCTS`]), fused, one thread.
fn gemm_suite_group(c: &mut Criterion) {
    let mut group = c.benchmark_group("gemm_suite");
    group.sample_size(20);
    let isa = Isa::host();
    for &(name, m, k, n, layout) in SUITE_PRODUCTS {
        let a: Vec<f32> = (0..m * k).map(|x| ((x % 17) as f32 - 8.0) / 8.0).collect();
        let b: Vec<f32> = (0..k * n).map(|x| ((x % 13) as f32 - 6.0) / 8.0).collect();
        let mut out = vec![0f32; m * n];
        group.throughput(Throughput::Elements(2 * (m * k * n) as u64));
        group.bench_function(BenchmarkId::new(isa.name(), name), |bench| {
            bench.iter(|| {
                let g = product((m, k, n), layout, &a, &b, &mut out);
                // SAFETY: `A` is m×k, `B` k×n and `C` m×n, with the layout's strides.
                unsafe { gemm(&g, isa) }
            })
        });
    }
    group.finish();
}

/// The bf16 bits of `x` (truncated).
fn bits(x: f32) -> u16 {
    (x.to_bits() >> 16) as u16
}

/// `gemm_bf16/<path>/<n>`: square bf16 products on the native and reference paths, then
/// char_gpt's shapes.
fn gemm_bf16_group(c: &mut Criterion) {
    let mut group = c.benchmark_group("gemm_bf16");
    group.sample_size(10);
    for (path, sizes) in [("native", &[256usize, 512, 1024][..]), ("reference", &[128][..])] {
        if path == "native" && !has_native() {
            continue;
        }
        for &n in sizes {
            let a: Vec<u16> = (0..n * n).map(|x| bits(((x % 17) as f32 - 8.0) / 8.0)).collect();
            let b: Vec<u16> = (0..n * n).map(|x| bits(((x % 13) as f32 - 6.0) / 8.0)).collect();
            let mut out = vec![0f32; n * n];
            group.throughput(Throughput::Elements(2 * (n as u64).pow(3)));
            group.bench_function(BenchmarkId::new(path, n), |bench| {
                bench.iter(|| {
                    let s = n as isize;
                    let g = GemmBf16 {
                        m: n,
                        n,
                        k: n,
                        a: a.as_ptr(),
                        rsa: s,
                        csa: 1,
                        b: b.as_ptr(),
                        rsb: s,
                        csb: 1,
                        c: out.as_mut_ptr(),
                        rsc: s,
                        csc: 1,
                        accumulate: false,
                        fused: false,
                        epilogue: None,
                    };
                    // SAFETY: every operand is n×n with the strides above.
                    unsafe { if path == "native" { gemm_bf16(&g) } else { reference(&g) } }
                })
            });
        }
    }
    char_gpt_shapes(&mut group);
    group.finish();
}

/// Two products in char_gpt's shapes on the native path.
fn char_gpt_shapes(group: &mut criterion::BenchmarkGroup<'_, criterion::measurement::WallTime>) {
    // Two products in char_gpt's shapes (m, k, n, A transposed, accumulating):
    // - a projection `Y = X·W`, X (batch·time, in) row-major, so A is read in place, with a
    //   reduction of 64 (`MIN_PAIR_DEPTH`);
    // - a weight's gradient `dW = Xᵀ·G`: A transposed (packed), the reduction the batch·time rows.
    let shapes = [
        ("native/projection_512x64x256", (512usize, 64usize, 256usize), false, false),
        ("native/weight_gradient_64x256x512", (64, 512, 256), true, true),
    ];
    for (name, (m, k, n), transposed, accumulate) in shapes.into_iter().filter(|_| has_native()) {
        let a: Vec<u16> = (0..m * k).map(|x| bits(((x % 17) as f32 - 8.0) / 8.0)).collect();
        let b: Vec<u16> = (0..k * n).map(|x| bits(((x % 13) as f32 - 6.0) / 8.0)).collect();
        let mut out = vec![0f32; m * n];
        let (rsa, csa) = if transposed { (1, m as isize) } else { (k as isize, 1) };
        group.throughput(Throughput::Elements(2 * (m * n * k) as u64));
        group.bench_function(name, |bench| {
            bench.iter(|| {
                let g = GemmBf16 {
                    m,
                    n,
                    k,
                    a: a.as_ptr(),
                    rsa,
                    csa,
                    b: b.as_ptr(),
                    rsb: n as isize,
                    csb: 1,
                    c: out.as_mut_ptr(),
                    rsc: n as isize,
                    csc: 1,
                    accumulate,
                    fused: false,
                    epilogue: None,
                };
                // SAFETY: A holds m×k cells (k×m when transposed), B k×n, C m×n, with the
                // strides above.
                unsafe { gemm_bf16(&g) }
            })
        });
    }
}

criterion_group!(benches, bench, map_group);
criterion_main!(benches);

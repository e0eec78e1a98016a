//! The shape-generic kernels alone (one thread), per instruction set the host has, in FLOP/s.
//!
//! `gemm_f32/<isa>/<layout>/<n>`: `C = A·B` of n×n f32 matrices; layouts `nn` (both
//! row-major), `tn` (`Aᵀ·B`, a weight gradient's layout) and `nt` (`A·Bᵀ`, an input
//! gradient's). Criterion's "elem/s" read as FLOP/s (2n³ per call).
//!
//! `gemm_bf16/<path>/<n>`: the same with bf16 factors into f32 (`kernels::bf16`), on the host's
//! bf16 dot products (`native`, where it has them) and on the portable pairwise reference.

use criterion::{BenchmarkId, Criterion, Throughput, criterion_group, criterion_main};
use rocannl::arrayjit::kernels::bf16::{GemmBf16, gemm_bf16, has_native, reference};
use rocannl::arrayjit::kernels::{Gemm, Isa, gemm};

fn bench(c: &mut Criterion) {
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
                let s = n as isize;
                let ((rsa, csa), (rsb, csb)) = match layout {
                    "nn" => ((s, 1), (s, 1)),
                    "tn" => ((1, s), (s, 1)),
                    _ => ((s, 1), (1, s)),
                };
                group.throughput(Throughput::Elements(2 * (n as u64).pow(3)));
                let id = BenchmarkId::new(format!("{}/{layout}", isa.name()), n);
                group.bench_function(id, |bench| {
                    bench.iter(|| {
                        let g = Gemm {
                            m: n,
                            n,
                            k: n,
                            a: a.as_ptr(),
                            rsa,
                            csa,
                            b: b.as_ptr(),
                            rsb,
                            csb,
                            c: out.as_mut_ptr(),
                            rsc: s,
                            csc: 1,
                            accumulate: false,
                            fused: true,
                        };
                        // SAFETY: every operand is n×n with the strides above.
                        unsafe { gemm(&g, isa) }
                    })
                });
            }
        }
    }
    group.finish();

    let mut group = c.benchmark_group("gemm_bf16");
    group.sample_size(10);
    let bits = |x: f32| (x.to_bits() >> 16) as u16;
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
                    };
                    // SAFETY: every operand is n×n with the strides above.
                    unsafe { if path == "native" { gemm_bf16(&g) } else { reference(&g) } }
                })
            });
        }
    }
    group.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);

//! The shape-generic kernels alone (one thread), per instruction set the host has, in FLOP/s.
//!
//! `gemm_f32/<isa>/<layout>/<n>`: `C = A·B` of n×n f32 matrices; layouts `nn` (both
//! row-major), `tn` (`Aᵀ·B`, a weight gradient's layout) and `nt` (`A·Bᵀ`, an input
//! gradient's). Criterion's "elem/s" read as FLOP/s (2n³ per call).

use criterion::{BenchmarkId, Criterion, Throughput, criterion_group, criterion_main};
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
}

criterion_group!(benches, bench);
criterion_main!(benches);

use rocannl::arrayjit::kernels::{Gemm, Isa, gemm};
use std::time::Instant;
fn main() {
    let isa = Isa::host();
    // scores: C[s,t] (rsc 2048), A = q[s,d] (rsa 128), B[d,t] = k[t,d] (rsb 1, csb 128); 64 calls over (b, h).
    let (m, n, k) = (256usize, 256usize, 16usize);
    let q: Vec<f32> = (0..8 * 256 * 128).map(|x| ((x % 17) as f32 - 8.0) / 8.0).collect();
    let kk: Vec<f32> = (0..8 * 256 * 128).map(|x| ((x % 13) as f32 - 6.0) / 8.0).collect();
    let mut c = vec![0f32; 8 * 256 * 8 * 256];
    for (name, rsb, csb, reuse) in [
        ("kT pack_columns", 1isize, 128isize, false),
        ("k row-major", 256, 1, false),
        ("kT, C reused", 1, 128, true),
        ("k row-major, C reused", 256, 1, true),
    ] {
        let mut best = f64::MAX;
        for _ in 0..10 {
            let t = Instant::now();
            for b in 0..8 {
                for h in 0..8 {
                    let g = Gemm {
                        m,
                        n,
                        k,
                        a: unsafe { q.as_ptr().add(b * 32768 + h * 16) },
                        rsa: 128,
                        csa: 1,
                        b: unsafe { kk.as_ptr().add(b * 32768 + h * 16) },
                        rsb,
                        csb,
                        c: unsafe {
                            c.as_mut_ptr().add(if reuse { h * 256 } else { b * 524288 + h * 256 })
                        },
                        rsc: 2048,
                        csc: 1,
                        accumulate: false,
                        fused: true,
                        epilogue: None,
                    };
                    unsafe { gemm(&g, isa) }
                }
            }
            best = best.min(t.elapsed().as_secs_f64());
        }
        println!(
            "{name}: {:.2} ms for 64 calls, {:.0} GF/s",
            best * 1e3,
            2.0 * (64 * m * n * k) as f64 / best / 1e9
        );
    }
}

//! The CUDA backend: generated CUDA C snapshots, NVRTC compilation to PTX and SASS for every
//! conformance case (no GPU needed), and `NoDevice` — or the full conformance suite when a
//! device is present.
#![cfg(feature = "cuda")]

mod common;

use common::*;
use expect_test::expect;
use rocannl_arrayjit::backend::c_syntax::{Dialect, prelude};
use rocannl_arrayjit::backend::cuda::nvrtc::Nvrtc;
use rocannl_arrayjit::backend::cuda::{PTX_ARCH, SASS_ARCH, render};
use rocannl_arrayjit::ops::Prec;
use rocannl_arrayjit::{BackendKind, CompileOptions, Context, Error, compile_program};

fn kernels_of(case: &Case) -> String {
    let prog =
        compile_program(&case.name, &case.asgn, &case.nodes, &CompileOptions::default()).unwrap();
    let src = render::render(&prog).source;
    src[prelude(Dialect::Cuda).len()..].to_string()
}

/// NVRTC, or `None` (the compile tests then pass without compiling) where it is not installed:
/// `scripts/setup.sh` fetches it only with `--cuda` or when an NVIDIA driver is present. CI sets
/// `ROCANNL_REQUIRE_NVRTC=1`, which makes its absence a failure.
fn nvrtc() -> Option<Nvrtc> {
    match Nvrtc::load() {
        Ok(n) => Some(n),
        Err(e) if rocannl_arrayjit::env::var_os("ROCANNL_REQUIRE_NVRTC").is_some() => {
            panic!(
                "NVRTC is required for the CUDA compile tests (run scripts/setup.sh --cuda): {e}"
            )
        }
        Err(e) => {
            eprintln!(
                "NVRTC not installed, CUDA compile test skipped (scripts/setup.sh --cuda): {e}"
            );
            None
        }
    }
}

#[test]
fn matmul_cuda_c() {
    expect![[r#"

        extern "C" __global__ void k0(float *__restrict__ p_n0, float *__restrict__ p_n1, float *__restrict__ p_n2) {
          long long gid = (long long)blockIdx.x * blockDim.x + threadIdx.x;
          if (gid >= 20LL) return;
          long long v0 = (gid / 5LL) % 4LL;
          long long v1 = (gid / 1LL) % 5LL;
          float t0;
          t0 = (float)(0.0f);
          for (long long v2 = 0; v2 < 3; ++v2) {
            t0 = (float)(fmaf((float)p_n0[3LL * v0 + v2], (float)p_n1[5LL * v2 + v1], (float)t0));
          }
          p_n2[5LL * v0 + v1] = (float)((float)t0);
        }
    "#]]
    .assert_eq(&kernels_of(&matmul_case(4, 3, 5, Prec::F32)));
}

#[test]
fn convolution_cuda_c() {
    expect![[r#"

        extern "C" __global__ void k0(float *__restrict__ p_n0, float *__restrict__ p_n1, float *__restrict__ p_n2) {
          long long gid = (long long)blockIdx.x * blockDim.x + threadIdx.x;
          if (gid >= 5LL) return;
          long long v0 = (gid / 1LL) % 5LL;
          float t0;
          t0 = (float)(0.0f);
          for (long long v1 = 0; v1 < 3; ++v1) {
            if ((2LL * v0 + v1 - 1LL) >= 0 && (2LL * v0 + v1 - 1LL) < 10) {
              t0 = (float)(fmaf((float)p_n0[2LL * v0 + v1 - 1LL], (float)p_n1[v1], (float)t0));
            }
          }
          p_n2[v0] = (float)((float)t0);
        }
    "#]].assert_eq(&kernels_of(&conv_case(Prec::F32, 2, 1)));
}

#[test]
fn softmax_cuda_c() {
    expect![[r#"

        extern "C" __global__ void k0(unsigned short *__restrict__ p_n0, unsigned short *__restrict__ p_n1) {
          long long gid = (long long)blockIdx.x * blockDim.x + threadIdx.x;
          if (gid >= 2LL) return;
          long long v0 = (gid / 1LL) % 2LL;
          float t0;
          t0 = (float)((-(float)(1.0 / 0.0)));
          for (long long v1 = 0; v1 < 8; ++v1) {
            t0 = (float)(rc_maxf((float)t0, (float)rc_f16_to_f32(p_n0[8LL * v0 + v1])));
          }
          p_n1[v0] = rc_f32_to_f16((float)((float)t0));
        }

        extern "C" __global__ void k1(unsigned short *__restrict__ p_n0, unsigned short *__restrict__ p_n1, unsigned short *__restrict__ p_n2) {
          long long gid = (long long)blockIdx.x * blockDim.x + threadIdx.x;
          if (gid >= 16LL) return;
          long long v2 = (gid / 8LL) % 2LL;
          long long v3 = (gid / 1LL) % 8LL;
          p_n2[8LL * v2 + v3] = rc_f32_to_f16((float)(rc_expf(((float)rc_f16_to_f32(p_n0[8LL * v2 + v3]) - (float)rc_f16_to_f32(p_n1[v2])))));
        }

        extern "C" __global__ void k2(unsigned short *__restrict__ p_n2, unsigned short *__restrict__ p_n3) {
          long long gid = (long long)blockIdx.x * blockDim.x + threadIdx.x;
          if (gid >= 2LL) return;
          long long v4 = (gid / 1LL) % 2LL;
          float t1;
          t1 = (float)(0.0f);
          for (long long v5 = 0; v5 < 8; ++v5) {
            t1 = (float)(((float)t1 + (float)rc_f16_to_f32(p_n2[8LL * v4 + v5])));
          }
          p_n3[v4] = rc_f32_to_f16((float)((float)t1));
        }

        extern "C" __global__ void k3(unsigned short *__restrict__ p_n2, unsigned short *__restrict__ p_n3, unsigned short *__restrict__ p_n4) {
          long long gid = (long long)blockIdx.x * blockDim.x + threadIdx.x;
          if (gid >= 16LL) return;
          long long v6 = (gid / 8LL) % 2LL;
          long long v7 = (gid / 1LL) % 8LL;
          p_n4[8LL * v6 + v7] = rc_f32_to_f16((float)(((float)rc_f16_to_f32(p_n2[8LL * v6 + v7]) / (float)rc_f16_to_f32(p_n3[v6]))));
        }
    "#]].assert_eq(&kernels_of(&softmax_case(Prec::F16, 2, 8)));
}

#[test]
fn every_case_compiles_to_ptx_and_sass() {
    let Some(nvrtc) = nvrtc() else { return };
    let mut cases = all_cases(&Prec::ALL);
    cases.push(matmul_case(64, 64, 64, Prec::F32));
    for case in cases {
        let prog = compile_program(&case.name, &case.asgn, &case.nodes, &CompileOptions::default())
            .unwrap();
        let src = render::render(&prog);
        let ptx = nvrtc
            .compile(&case.name, &src.source, PTX_ARCH, false)
            .unwrap_or_else(|e| panic!("{}: {e}\n{}", case.name, src.source));
        let ptx = String::from_utf8_lossy(&ptx);
        for k in &src.kernels {
            assert!(
                ptx.contains(&format!(".entry {}(", k.name)),
                "{}: no kernel {}",
                case.name,
                k.name
            );
        }
        let sass = nvrtc.compile(&case.name, &src.source, SASS_ARCH, true).unwrap();
        assert_eq!(&sass[..4], b"\x7fELF", "{}: not a cubin", case.name);
    }
}

#[test]
fn compile_errors_are_typed() {
    let Some(nvrtc) = nvrtc() else { return };
    let err = nvrtc.compile("broken", "__global__ void k( {", PTX_ARCH, false).unwrap_err();
    assert!(matches!(&err, Error::Compile { backend: "cuda", .. }), "{err}");
}

#[test]
fn context_without_device_is_no_device_else_conformance() {
    match Context::new(BackendKind::Cuda, CompileOptions::default()) {
        Err(Error::NoDevice { reason }) => {
            assert!(!reason.is_empty());
            // The device check (`scripts/gpu_check.sh`) sets this: there, no device is a failure.
            let required = rocannl_arrayjit::env::var_os("ROCANNL_REQUIRE_DEVICE").is_some();
            assert!(!required, "ROCANNL_REQUIRE_DEVICE is set but: {reason}");
        }
        Err(e) => panic!("expected NoDevice, got {e}"),
        Ok(_) => {
            for case in all_cases(&Prec::ALL) {
                let tol = tolerance(case_prec(&case));
                let got = run_case(BackendKind::Cuda, CompileOptions::default(), &case);
                let want = run_case(BackendKind::Interp, CompileOptions::default(), &case);
                for (k, (g, w)) in got.iter().zip(&want).enumerate() {
                    assert_close(&format!("{} output {k} vs interp", case.name), g, w, tol);
                }
            }
        }
    }
}

/// A fresh cache folder under the system's temporary folder.
fn cache_dir(name: &str) -> std::path::PathBuf {
    let d = rocannl_arrayjit::env::temp_dir()
        .join(format!("rocannl-cuda-cache-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    d
}

#[test]
fn compiled_modules_are_cached_on_disk() {
    use rocannl_arrayjit::CacheOutcome;
    use rocannl_arrayjit::backend::cuda::module_cache;
    use rocannl_arrayjit::cache::{Cache, CacheMode};
    let Some(nvrtc) = nvrtc() else { return };
    let dir = cache_dir("modules");
    let cache = Cache::open(&CacheMode::Dir(dir.clone())).expect("a cache");
    let case = softmax_case(Prec::F32, 3, 7);
    let prog =
        compile_program(&case.name, &case.asgn, &case.nodes, &CompileOptions::default()).unwrap();
    let src = render::render(&prog).source;
    for (arch, cubin) in [(PTX_ARCH, false), (SASS_ARCH, true)] {
        let fresh = nvrtc.compile("softmax", &src, arch, cubin).unwrap();
        let (first, outcome) =
            module_cache::compile(&nvrtc, Some(&cache), "softmax", &src, arch, cubin).unwrap();
        assert_eq!(outcome, CacheOutcome::Miss);
        assert_eq!(first, fresh, "{arch}: the stored module is what NVRTC compiles");
        let (second, outcome) =
            module_cache::compile(&nvrtc, Some(&cache), "softmax", &src, arch, cubin).unwrap();
        assert_eq!(outcome, CacheOutcome::Hit, "{arch}");
        assert_eq!(second, fresh, "{arch}");
    }
    let ext = |e: &str| {
        std::fs::read_dir(cache.entries_dir())
            .unwrap()
            .filter(|f| f.as_ref().unwrap().path().extension().is_some_and(|x| x == e))
            .count()
    };
    assert_eq!((ext("ptx"), ext("cubin")), (1, 1));

    // A different program, or the same one for another architecture, is another entry.
    let other = render::render(
        &compile_program("other", &case.asgn, &case.nodes, &CompileOptions::default()).unwrap(),
    )
    .source;
    let k = |s: &str, a: &str| module_cache::key(&nvrtc, s, a, false);
    assert_eq!(k(&src, PTX_ARCH), k(&src, PTX_ARCH));
    assert_ne!(k(&src, PTX_ARCH), k(&src, "compute_80"));
    if other != src {
        assert_ne!(k(&src, PTX_ARCH), k(&other, PTX_ARCH));
    }

    // A damaged entry is compiled again (and rewritten), never used.
    let key = k(&src, PTX_ARCH);
    let entry = cache.entries_dir().join(format!("{key}.ptx"));
    let mut bytes = std::fs::read(&entry).unwrap();
    bytes.truncate(bytes.len() / 2);
    std::fs::write(&entry, &bytes).unwrap();
    let (again, outcome) =
        module_cache::compile(&nvrtc, Some(&cache), "softmax", &src, PTX_ARCH, false).unwrap();
    assert_eq!(outcome, CacheOutcome::Miss);
    assert_eq!(again, nvrtc.compile("softmax", &src, PTX_ARCH, false).unwrap());
    let (_, outcome) =
        module_cache::compile(&nvrtc, Some(&cache), "softmax", &src, PTX_ARCH, false).unwrap();
    assert_eq!(outcome, CacheOutcome::Hit);
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn an_unusable_cache_folder_only_means_compiling() {
    use rocannl_arrayjit::CacheOutcome;
    use rocannl_arrayjit::backend::cuda::module_cache;
    use rocannl_arrayjit::cache::{Cache, CacheMode};
    let Some(nvrtc) = nvrtc() else { return };
    // A file where the folder should be: nothing can be created inside it.
    let blocker = cache_dir("blocked");
    std::fs::write(&blocker, b"not a folder").unwrap();
    let cache = Cache::open(&CacheMode::Dir(blocker.join("inner"))).expect("a cache");
    let case = matmul_case(4, 3, 5, Prec::F32);
    let prog =
        compile_program(&case.name, &case.asgn, &case.nodes, &CompileOptions::default()).unwrap();
    let src = render::render(&prog).source;
    for _ in 0..2 {
        let (ptx, outcome) =
            module_cache::compile(&nvrtc, Some(&cache), "matmul", &src, PTX_ARCH, false).unwrap();
        assert_eq!(outcome, CacheOutcome::Miss);
        assert!(String::from_utf8_lossy(&ptx).contains(".entry k0("));
    }
    let (_, outcome) =
        module_cache::compile(&nvrtc, None, "matmul", &src, PTX_ARCH, false).unwrap();
    assert_eq!(outcome, CacheOutcome::Off);
    let _ = std::fs::remove_file(&blocker);
}

/// A routine's kernels split into translation units: in launch order, every kernel in exactly
/// one unit, each unit the shared prelude and its kernels' text, each compiling on its own;
/// one unit holding everything is the whole source.
#[test]
fn kernels_split_into_units_that_compile_alone() {
    use rocannl_arrayjit::backend::cuda::compile::compile_units;
    let case = softmax_case(Prec::F32, 3, 7);
    let prog =
        compile_program(&case.name, &case.asgn, &case.nodes, &CompileOptions::default()).unwrap();
    let src = render::render(&prog);
    assert!(src.kernels.len() > 1, "the case has several kernels");
    assert_eq!(src.units(usize::MAX), vec![(src.source.clone(), 0..src.kernels.len())]);
    let units = src.units(1);
    assert_eq!(units.len(), src.kernels.len(), "a unit per kernel when each is over the size");
    let prelude = prelude(Dialect::Cuda);
    for (i, (text, range)) in units.iter().enumerate() {
        assert_eq!(range, &(i..i + 1));
        assert!(text.starts_with(&prelude));
        assert_eq!(&text[prelude.len()..], &src.source[src.spans[i].clone()]);
    }
    let Some(nvrtc) = nvrtc() else { return };
    let sources: Vec<&str> = units.iter().map(|(t, _)| t.as_str()).collect();
    let (modules, _) = compile_units(&nvrtc, None, "softmax", &sources, PTX_ARCH, false).unwrap();
    for (ptx, k) in modules.iter().zip(&src.kernels) {
        let ptx = String::from_utf8_lossy(ptx);
        assert!(ptx.contains(&format!(".entry {}(", k.name)), "{}", k.name);
        let others = src.kernels.iter().filter(|o| o.name != k.name);
        assert!(others.clone().all(|o| !ptx.contains(&format!(".entry {}(", o.name))));
    }
}

/// NVRTC names the architectures it compiles SASS for, and the CUDA test target is one.
#[test]
fn nvrtc_lists_its_architectures() {
    let Some(nvrtc) = nvrtc() else { return };
    let archs = nvrtc.supported_archs();
    assert!(archs.contains(&90), "{archs:?}");
    assert!(archs.windows(2).all(|w| w[0] < w[1]), "{archs:?}");
}

/// The kernels compile to SASS for the GPUs before Hopper too: the backend compiles for the
/// device's own architecture (`compile::target`), here an A100's `sm_80` (the oldest the bf16
/// conversions of the prelude allow).
#[test]
fn every_case_compiles_for_ampere() {
    use rocannl_arrayjit::backend::cuda::compile::target;
    let Some(nvrtc) = nvrtc() else { return };
    let archs = nvrtc.supported_archs();
    let (arch, cubin) = target(&archs, (8, 0));
    assert!(cubin, "NVRTC {:?} lists {archs:?}", nvrtc.version());
    for case in all_cases(&Prec::ALL) {
        let prog = compile_program(&case.name, &case.asgn, &case.nodes, &CompileOptions::default())
            .unwrap();
        let src = render::render(&prog);
        let sass = nvrtc
            .compile(&case.name, &src.source, &arch, true)
            .unwrap_or_else(|e| panic!("{} for {arch}: {e}", case.name));
        assert_eq!(&sass[..4], b"\x7fELF", "{}: not a cubin", case.name);
    }
}

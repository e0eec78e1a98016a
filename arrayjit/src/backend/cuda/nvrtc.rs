//! Finding, loading and calling NVRTC.
//!
//! cudarc loads CUDA libraries by name and panics when none is found, so nothing here calls
//! cudarc before checking that the library is present. NVRTC is searched, in order, in
//! `$ROCANNL_NVRTC_DIR`, in `.nv/nvidia/cuda_nvrtc/lib` of the workspace (where
//! `scripts/setup.sh` unpacks it) and of the current directory, then in the system's library
//! folders. The file found is opened by absolute path with `RTLD_NOW | RTLD_GLOBAL` (and its
//! `libnvrtc-builtins` companion first): the dynamic loader then matches cudarc's later
//! by-name `dlopen("libnvrtc.so.12")` to the already loaded object through its SONAME.

use std::ffi::{CStr, CString, c_char};
use std::path::{Path, PathBuf};

use crate::error::Error;

/// A loaded NVRTC. Keeping the handles keeps the libraries loaded.
#[derive(Debug)]
pub struct Nvrtc {
    /// The folder NVRTC was loaded from.
    pub dir: PathBuf,
    _libs: Vec<libloading::os::unix::Library>,
}

fn candidate_dirs() -> Vec<PathBuf> {
    let mut dirs = Vec::new();
    if let Some(d) = crate::env::var_os("ROCANNL_NVRTC_DIR") {
        dirs.push(PathBuf::from(d));
    }
    let manifest = Path::new(env!("CARGO_MANIFEST_DIR"));
    if let Some(ws) = manifest.parent() {
        dirs.push(ws.join(".nv/nvidia/cuda_nvrtc/lib"));
    }
    if let Ok(cwd) = std::env::current_dir() {
        dirs.push(cwd.join(".nv/nvidia/cuda_nvrtc/lib"));
    }
    if let Some(paths) = crate::env::var_os("LD_LIBRARY_PATH") {
        dirs.extend(std::env::split_paths(&paths));
    }
    for d in [
        "/usr/local/cuda/lib64",
        "/usr/local/cuda/targets/x86_64-linux/lib",
        "/usr/lib/x86_64-linux-gnu",
        "/usr/lib64",
        "/usr/lib",
    ] {
        dirs.push(PathBuf::from(d));
    }
    dirs
}

fn find_in(dir: &Path, prefix: &str) -> Option<PathBuf> {
    let mut found: Vec<PathBuf> = std::fs::read_dir(dir)
        .ok()?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| {
            p.file_name()
                .and_then(|n| n.to_str())
                .is_some_and(|n| n.starts_with(prefix) && !n.contains(".alt."))
        })
        .collect();
    found.sort();
    found.pop()
}

/// Where NVRTC would be loaded from, if it can be found.
pub fn locate() -> Option<PathBuf> {
    candidate_dirs().into_iter().find_map(|d| find_in(&d, "libnvrtc.so.").map(|_| d))
}

impl Nvrtc {
    /// Finds and loads NVRTC, or says where it was looked for.
    pub fn load() -> Result<Nvrtc, Error> {
        let Some(dir) = locate() else {
            let searched: Vec<String> =
                candidate_dirs().iter().map(|d| d.display().to_string()).collect();
            return Err(Error::LibraryMissing {
                library: "libnvrtc.so.12".into(),
                reason: format!(
                    "not found in {} (run scripts/setup.sh or set ROCANNL_NVRTC_DIR)",
                    searched.join(", ")
                ),
            });
        };
        let flags = libc_flags();
        let mut libs = Vec::new();
        for prefix in ["libnvrtc-builtins.so.", "libnvrtc.so."] {
            let Some(path) = find_in(&dir, prefix) else { continue };
            // SAFETY: loading NVRTC runs its initializers, which have no preconditions.
            let lib = unsafe { libloading::os::unix::Library::open(Some(&path), flags) };
            let lib = lib.map_err(|e| Error::LibraryMissing {
                library: path.display().to_string(),
                reason: e.to_string(),
            })?;
            libs.push(lib);
        }
        // SAFETY: only probes whether cudarc can open the library by name.
        if !unsafe { cudarc::nvrtc::sys::is_culib_present() } {
            return Err(Error::LibraryMissing {
                library: "libnvrtc.so.12".into(),
                reason: format!("loaded from {} but cudarc cannot open it", dir.display()),
            });
        }
        Ok(Nvrtc { dir, _libs: libs })
    }

    /// NVRTC's version, `(major, minor)`; `(0, 0)` if it does not say.
    pub fn version(&self) -> (i32, i32) {
        let (mut major, mut minor) = (0, 0);
        // SAFETY: NVRTC is loaded (`self` exists); the pointers are valid for writes.
        let r = unsafe { cudarc::nvrtc::sys::nvrtcVersion(&mut major, &mut minor) };
        if r == cudarc::nvrtc::sys::nvrtcResult::NVRTC_SUCCESS { (major, minor) } else { (0, 0) }
    }

    /// The real architectures NVRTC compiles SASS for (`90` for `sm_90`), ascending; empty if
    /// it does not say.
    pub fn supported_archs(&self) -> Vec<i32> {
        use cudarc::nvrtc::sys;
        let mut n = 0;
        // SAFETY: NVRTC is loaded (`self` exists); the pointer is valid for a write.
        if unsafe { sys::nvrtcGetNumSupportedArchs(&mut n) } != sys::nvrtcResult::NVRTC_SUCCESS {
            return Vec::new();
        }
        let mut archs = vec![0; n.max(0) as usize];
        // SAFETY: the buffer holds the `n` entries NVRTC reported.
        let r = unsafe { sys::nvrtcGetSupportedArchs(archs.as_mut_ptr()) };
        if r != sys::nvrtcResult::NVRTC_SUCCESS {
            return Vec::new();
        }
        archs.sort_unstable();
        archs
    }

    /// The options every compile passes for `arch`. `--fmad=false`: every operation rounds as
    /// the interpreter does (the IR says `fma` where it wants one).
    pub fn options(arch: &str) -> Vec<String> {
        vec![
            format!("--gpu-architecture={arch}"),
            "--std=c++17".to_string(),
            "--fmad=false".to_string(),
        ]
    }

    /// Compiles CUDA C to PTX (`arch` like `compute_90`) or to a cubin of SASS (`arch` like
    /// `sm_90`, with `cubin = true`).
    pub fn compile(
        &self,
        name: &str,
        src: &str,
        arch: &str,
        cubin: bool,
    ) -> Result<Vec<u8>, Error> {
        use cudarc::nvrtc::{result, sys};
        let fail = |log: String| Error::Compile { backend: "cuda", routine: name.to_string(), log };
        let c_src = CString::new(src).map_err(|e| fail(e.to_string()))?;
        let c_name = CString::new(format!("{name}.cu")).map_err(|e| fail(e.to_string()))?;
        let prog =
            result::create_program(&c_src, Some(&c_name)).map_err(|e| fail(format!("{e:?}")))?;
        let options = Nvrtc::options(arch);
        // SAFETY: `prog` is a live program; the options are valid C strings.
        let compiled = unsafe { result::compile_program(prog, &options) };
        let out = match compiled {
            Err(e) => {
                // SAFETY: as above.
                let log = unsafe { result::get_program_log(prog) }
                    .map(|l| {
                        // SAFETY: NVRTC returns a NUL-terminated log.
                        unsafe { CStr::from_ptr(l.as_ptr()) }.to_string_lossy().into_owned()
                    })
                    .unwrap_or_default();
                Err(fail(format!("{e:?}: {log}")))
            }
            Ok(()) if cubin => {
                let mut size = 0usize;
                // SAFETY: `prog` compiled successfully; the buffer has the reported size.
                unsafe {
                    let r = sys::nvrtcGetCUBINSize(prog, &mut size);
                    if r != sys::nvrtcResult::NVRTC_SUCCESS {
                        Err(fail(format!("nvrtcGetCUBINSize: {r:?}")))
                    } else {
                        let mut buf = vec![0u8; size];
                        let r = sys::nvrtcGetCUBIN(prog, buf.as_mut_ptr() as *mut c_char);
                        if r != sys::nvrtcResult::NVRTC_SUCCESS {
                            Err(fail(format!("nvrtcGetCUBIN: {r:?}")))
                        } else {
                            Ok(buf)
                        }
                    }
                }
            }
            // SAFETY: `prog` compiled successfully.
            Ok(()) => unsafe { result::get_ptx(prog) }
                .map(|p| p.iter().map(|c| *c as u8).collect())
                .map_err(|e| fail(format!("{e:?}"))),
        };
        // SAFETY: `prog` is not used after this.
        let _ = unsafe { result::destroy_program(prog) };
        out
    }
}

fn libc_flags() -> std::os::raw::c_int {
    libloading::os::unix::RTLD_NOW | libloading::os::unix::RTLD_GLOBAL
}

//! CUDA modules in the persistent compile cache.
//!
//! NVRTC takes tens to hundreds of milliseconds per routine, and the same routine is compiled
//! again by every process that builds the same model. A compiled module — PTX text, or a cubin
//! of SASS for one architecture — is stored in the compile cache ([`crate::cache`]) like
//! gccjit's libraries, as an entry of kind [`EntryKind::Ptx`] or [`EntryKind::Cubin`].
//!
//! The key covers everything the module's bytes depend on: the rendered CUDA C (which already
//! holds the optimized, scheduled program), the target architecture and output kind, NVRTC's
//! options and its version, and this crate's version. Nothing about the device is in the key:
//! PTX is device-independent (the driver compiles it for the device at load time), and a cubin
//! names its architecture. A damaged entry is recompiled, an unusable folder means compiling
//! without the cache — both handled by [`Cache`], neither an error.

use super::nvrtc::Nvrtc;
use crate::cache::{Cache, CacheOutcome, EntryKind};
use crate::error::Error;

/// The key of a module: see the module documentation for what it covers.
pub fn key(nvrtc: &Nvrtc, source: &str, arch: &str, cubin: bool) -> String {
    let version = nvrtc.version();
    let options = Nvrtc::options(arch).join(" ");
    Cache::key(&[
        b"rocannl-cuda-module",
        env!("CARGO_PKG_VERSION").as_bytes(),
        format!("nvrtc {}.{}", version.0, version.1).as_bytes(),
        options.as_bytes(),
        if cubin { b"cubin" } else { b"ptx" },
        source.as_bytes(),
    ])
}

/// Compiles CUDA C to PTX or a cubin ([`Nvrtc::compile`]) unless the cache holds the result:
/// returns the module's bytes and what the cache did.
pub fn compile(
    nvrtc: &Nvrtc,
    cache: Option<&Cache>,
    name: &str,
    source: &str,
    arch: &str,
    cubin: bool,
) -> Result<(Vec<u8>, CacheOutcome), Error> {
    let Some(cache) = cache else {
        return Ok((nvrtc.compile(name, source, arch, cubin)?, CacheOutcome::Off));
    };
    let kind = if cubin { EntryKind::Cubin } else { EntryKind::Ptx };
    let key = key(nvrtc, source, arch, cubin);
    if let Some((_, bytes)) = cache.lookup_bytes(&key, kind) {
        return Ok((bytes, CacheOutcome::Hit));
    }
    let bytes = nvrtc.compile(name, source, arch, cubin)?;
    cache.store_bytes(&key, &bytes, kind);
    Ok((bytes, CacheOutcome::Miss))
}

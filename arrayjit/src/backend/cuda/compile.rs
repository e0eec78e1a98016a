//! Compiling a routine's kernels for the device at hand, in units compiled side by side.
//!
//! A training step is hundreds of kernels (one per loop nest), and NVRTC compiles one
//! translation unit on one thread: a GPT's step as one unit took 15.7 s on an H200's host
//! (NVRTC, then the driver compiling the PTX to SASS while loading it). Two things cut that:
//!
//! - **Units.** The kernels are split, in launch order, into units of about [`UNIT_BYTES`] of
//!   CUDA C ([`super::render::CudaSource::units`]); the units are compiled on up to one thread
//!   per core and loaded as separate modules. The split depends on the source alone, so every
//!   machine has the same units and the same compile-cache keys; a routine smaller than one
//!   unit is one unit, as before.
//! - **SASS for the device.** Where NVRTC knows the device's architecture, each unit is
//!   compiled to a cubin for it (`sm_XY`), and loading it compiles nothing more; the cubin is
//!   what the compile cache keeps, so a warm start does no compiling at all. A device newer
//!   than NVRTC gets PTX for the newest architecture NVRTC knows below it (the driver compiles
//!   that at load), and one older than any gets PTX for [`super::PTX_ARCH`], which fails to
//!   load with the driver's error.

use std::sync::atomic::{AtomicUsize, Ordering};

use super::module_cache;
use super::nvrtc::Nvrtc;
use crate::cache::{Cache, CacheOutcome};
use crate::error::Error;

/// About this much CUDA C per translation unit (besides the shared prelude). NVRTC's fixed
/// cost per unit (reading the prelude, starting up) is tens of milliseconds: units much
/// smaller than this spend more on that than they save by running side by side.
pub const UNIT_BYTES: usize = 32 * 1024;

/// What NVRTC produces for a device of compute capability `cc`: the architecture option and
/// whether it is a cubin of SASS (else PTX).
pub fn target(supported: &[i32], cc: (i32, i32)) -> (String, bool) {
    let sm = cc.0 * 10 + cc.1;
    if supported.contains(&sm) {
        return (format!("sm_{sm}"), true);
    }
    match supported.iter().copied().filter(|a| *a < sm).max() {
        Some(a) => (format!("compute_{a}"), false),
        None => (super::PTX_ARCH.to_string(), false),
    }
}

/// Compiles each unit (its source) for `arch`, through the cache, on up to one thread per core:
/// the modules' bytes in the units' order and what the cache did (a miss if any unit missed).
pub fn compile_units(
    nvrtc: &Nvrtc,
    cache: Option<&Cache>,
    name: &str,
    units: &[&str],
    arch: &str,
    cubin: bool,
) -> Result<(Vec<Vec<u8>>, CacheOutcome), Error> {
    let threads = std::thread::available_parallelism().map_or(1, |n| n.get()).min(units.len());
    let next = AtomicUsize::new(0);
    let work = || {
        let mut done = Vec::new();
        loop {
            let i = next.fetch_add(1, Ordering::Relaxed);
            let Some(src) = units.get(i) else { return done };
            let unit = if units.len() == 1 { name.to_string() } else { format!("{name}.{i}") };
            done.push((i, module_cache::compile(nvrtc, cache, &unit, src, arch, cubin)));
        }
    };
    let mut results: Vec<_> = if threads <= 1 {
        work()
    } else {
        std::thread::scope(|s| {
            let handles: Vec<_> = (0..threads).map(|_| s.spawn(work)).collect();
            handles.into_iter().flat_map(|h| h.join().expect("an NVRTC thread panicked")).collect()
        })
    };
    results.sort_by_key(|(i, _)| *i);
    let mut modules = Vec::with_capacity(units.len());
    let mut outcome = CacheOutcome::Hit;
    for (_, r) in results {
        let (bytes, o) = r?;
        outcome = match (outcome, o) {
            (CacheOutcome::Off, _) | (_, CacheOutcome::Off) => CacheOutcome::Off,
            (CacheOutcome::Miss, _) | (_, CacheOutcome::Miss) => CacheOutcome::Miss,
            _ => CacheOutcome::Hit,
        };
        modules.push(bytes);
    }
    Ok((modules, outcome))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_target_is_the_devices_sass_where_nvrtc_knows_it() {
        let known = [75, 80, 86, 89, 90, 100, 120];
        assert_eq!(target(&known, (9, 0)), ("sm_90".to_string(), true));
        assert_eq!(target(&known, (8, 6)), ("sm_86".to_string(), true));
        // Newer than NVRTC: PTX of the newest architecture below it, compiled by the driver.
        assert_eq!(target(&known, (13, 0)), ("compute_120".to_string(), false));
        // Older than any NVRTC knows, or NVRTC did not say.
        assert_eq!(target(&known, (7, 0)), (crate::backend::cuda::PTX_ARCH.to_string(), false));
        assert_eq!(target(&[], (9, 0)), (crate::backend::cuda::PTX_ARCH.to_string(), false));
    }
}

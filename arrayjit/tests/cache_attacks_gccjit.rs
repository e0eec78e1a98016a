//! The gccjit backend compiling from an attacked compile cache: whatever was planted in the
//! cache folder or the temporary folder, a routine compiles and computes the same bits as
//! without a cache, nothing planted is loaded or written through, and nothing hangs. The
//! attacks on the cache itself are in `cache_attacks.rs`.
#![cfg(all(unix, feature = "gccjit"))]

mod common;

use std::ffi::{CString, OsStr};
use std::fs;
use std::os::unix::ffi::OsStrExt as _;
use std::os::unix::fs::{PermissionsExt as _, symlink};
use std::path::{Path, PathBuf};
use std::sync::mpsc;
use std::time::Duration;

use common::*;
use rocannl_arrayjit::cache::{Cache, CacheMode, CacheOutcome, ENTRIES};
use rocannl_arrayjit::ops::Prec;
use rocannl_arrayjit::{BackendKind, CompileOptions, Context, NdArray};

fn temp() -> tempfile::TempDir {
    tempfile::Builder::new()
        .prefix("rocannl-cache-attacks-")
        .tempdir_in(rocannl_arrayjit::env::temp_dir())
        .expect("a temporary folder")
}

fn opts(cache: CacheMode) -> CompileOptions {
    // Not tiered: each compile stores its builds before it returns.
    CompileOptions { cache, tiered: false, ..CompileOptions::default() }
}

/// Compiles and runs a case with the cache `mode`, on another thread that must finish within
/// two minutes; returns the bits of its outputs and what the cache did.
fn compile_and_run(case: &Case, mode: CacheMode) -> (Vec<Vec<u64>>, CacheOutcome) {
    let (tx, rx) = mpsc::channel();
    let (name, asgn, nodes) = (case.name.clone(), case.asgn.clone(), case.nodes.clone());
    let (inputs, outputs) = (case.inputs.clone(), case.outputs.clone());
    std::thread::spawn(move || {
        let mut ctx = Context::new(BackendKind::Gccjit, opts(mode)).expect("a context");
        let r = ctx.compile(&name, &asgn, &nodes).expect("compiled");
        for (id, vals) in &inputs {
            let node = nodes.get(*id).expect("a node");
            ctx.ensure_buffer(node).expect("a buffer");
            ctx.write(*id, &NdArray::from_f64(node.prec, &node.dims, vals).expect("values"))
                .expect("written");
        }
        ctx.run(&r, &[]).expect("run");
        let bits = outputs
            .iter()
            .map(|o| ctx.read(*o).expect("read").to_f64_vec().iter().map(|x| x.to_bits()).collect())
            .collect();
        let _ = tx.send((bits, r.report().cache));
    });
    rx.recv_timeout(Duration::from_secs(120)).expect("the compile neither failed nor hung")
}

fn case() -> Case {
    softmax_case(Prec::F32, 5, 17)
}

fn reference(case: &Case) -> Vec<Vec<u64>> {
    compile_and_run(case, CacheMode::Off).0
}

/// The entries (shared libraries) of the cache in `dir`.
fn libraries(dir: &Path) -> Vec<PathBuf> {
    let mut v: Vec<PathBuf> = fs::read_dir(dir.join(ENTRIES))
        .map(|r| {
            r.flatten()
                .map(|e| e.path())
                .filter(|p| p.extension().is_some_and(|e| e == "so"))
                .collect()
        })
        .unwrap_or_default();
    v.sort();
    v
}

fn chmod(path: &Path, mode: u32) {
    fs::set_permissions(path, fs::Permissions::from_mode(mode)).expect("chmod");
}

#[test]
fn a_planted_symlink_at_a_temporary_name_is_not_followed() {
    let tmp = temp();
    let victim = tmp.path().join("victim");
    fs::write(&victim, b"precious").expect("victim");
    // Every name of the old, predictable pattern of libraries built outside the cache.
    let pid = std::process::id();
    let planted: Vec<PathBuf> = (0..256)
        .map(|n| rocannl_arrayjit::env::temp_dir().join(format!("rocannl-{pid}-{n}.so")))
        .filter(|p| symlink(&victim, p).is_ok())
        .collect();
    let case = case();
    let want = reference(&case);
    // Without a cache (the libraries' old place), and with one.
    let got = [CacheMode::Off, CacheMode::Dir(tmp.path().join("cache"))]
        .map(|mode| compile_and_run(&case, mode).0);
    for p in &planted {
        let _ = fs::remove_file(p);
    }
    assert_eq!(got, [want.clone(), want]);
    assert_eq!(fs::read(&victim).expect("victim"), b"precious");
}

#[test]
fn a_folder_writable_by_others_is_refused_and_compiles_without_cache() {
    let tmp = temp();
    let dir = tmp.path().to_path_buf();
    let case = case();
    let want = reference(&case);
    assert_eq!(
        compile_and_run(&case, CacheMode::Dir(dir.clone())),
        (want.clone(), CacheOutcome::Miss)
    );
    let stored = libraries(&dir);
    assert!(!stored.is_empty());
    // The libraries there are valid, with their digests: exactly what someone who may write in
    // the folder could plant. None is loaded, whichever folder others may write.
    for (folder, mode) in [(dir.clone(), 0o777), (dir.join(ENTRIES), 0o757)] {
        chmod(&folder, mode);
        let (got, outcome) = compile_and_run(&case, CacheMode::Dir(dir.clone()));
        assert_eq!(got, want);
        assert_eq!(outcome, CacheOutcome::Off, "{mode:o}: compiled without the cache");
        assert_eq!(libraries(&dir), stored, "nothing written there");
        chmod(&folder, 0o700);
    }
    // Trusted again, they are served.
    assert_eq!(compile_and_run(&case, CacheMode::Dir(dir)), (want, CacheOutcome::Hit));
}

#[test]
fn a_non_utf8_cache_folder_is_no_error() {
    let tmp = temp();
    let dir = tmp.path().join(OsStr::from_bytes(b"cache-\xff"));
    let case = case();
    let want = reference(&case);
    assert_eq!(
        compile_and_run(&case, CacheMode::Dir(dir.clone())),
        (want.clone(), CacheOutcome::Miss)
    );
    assert_eq!(compile_and_run(&case, CacheMode::Dir(dir)), (want, CacheOutcome::Hit));
}

#[test]
fn a_step_record_pointing_at_another_entry_compiles_the_step() {
    let tmp = temp();
    let dir = tmp.path().to_path_buf();
    let (case, other) = (case(), matmul_case(7, 5, 3, Prec::F32));
    let want = reference(&case);
    compile_and_run(&case, CacheMode::Dir(dir.clone()));
    let before = libraries(&dir);
    compile_and_run(&other, CacheMode::Dir(dir.clone()));
    let foreign = libraries(&dir).into_iter().find(|p| !before.contains(p)).expect("an entry");
    let foreign_key = foreign.file_stem().and_then(OsStr::to_str).expect("a key").to_string();
    // Every step of the first routine now "found" in the other routine's library.
    for record in fs::read_dir(dir.join(ENTRIES).join("steps")).expect("steps").flatten() {
        fs::write(record.path(), &foreign_key).expect("record");
    }
    let (got, _) = compile_and_run(&case, CacheMode::Dir(dir));
    assert_eq!(got, want);
}

fn mkfifo(path: &Path) {
    let c = CString::new(path.as_os_str().as_bytes()).expect("a path without NUL");
    // SAFETY: a valid C string.
    assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);
}

/// Replaces the file at `path` by an attack.
fn attack(path: &Path, how: &str) {
    let _ = fs::remove_file(path);
    match how {
        "fifo" => mkfifo(path),
        "folder" => fs::create_dir(path).expect("folder"),
        "link to /dev/zero" => symlink("/dev/zero", path).expect("link"),
        "link to /dev/null" => symlink("/dev/null", path).expect("link"),
        "enormous" => fs::File::create(path).and_then(|f| f.set_len(64 << 30)).expect("sparse"),
        "empty" => fs::write(path, b"").expect("empty"),
        _ => unreachable!("{how}"),
    }
}

#[test]
fn an_attacked_cache_still_compiles_every_routine() {
    let case = case();
    let want = reference(&case);
    for how in ["fifo", "folder", "link to /dev/zero", "link to /dev/null", "enormous", "empty"] {
        for digests in [false, true] {
            let tmp = temp();
            let dir = tmp.path().to_path_buf();
            assert_eq!(compile_and_run(&case, CacheMode::Dir(dir.clone())).0, want);
            for lib in libraries(&dir) {
                let target = if digests { lib.with_extension("sha256") } else { lib };
                attack(&target, how);
            }
            let (got, outcome) = compile_and_run(&case, CacheMode::Dir(dir.clone()));
            assert_eq!(got, want, "{how}");
            assert_ne!(outcome, CacheOutcome::Hit, "{how}: nothing attacked is loaded");
        }
    }
}

#[test]
fn a_valid_digest_of_a_library_that_does_not_load_only_means_compiling() {
    let tmp = temp();
    let dir = tmp.path().to_path_buf();
    let case = case();
    let want = reference(&case);
    compile_and_run(&case, CacheMode::Dir(dir.clone()));
    let cache = Cache::open(&CacheMode::Dir(dir.clone())).expect("a cache");
    // Not a library, stored through the cache itself: its digest matches.
    for lib in libraries(&dir) {
        let key = lib.file_stem().and_then(OsStr::to_str).expect("a key").to_string();
        fs::remove_file(&lib).expect("entry");
        cache.store_bytes(
            &key,
            b"not a library",
            rocannl_arrayjit::cache::EntryKind::SharedLibrary,
        );
    }
    let (got, _) = compile_and_run(&case, CacheMode::Dir(dir));
    assert_eq!(got, want);
}

//! The persistent compile cache through the command line: a second process is served from the
//! cache with the same answer; a damaged entry, an unwritable, read-only or non-UTF-8 folder, a
//! folder others may write (refused) and two processes racing to fill the same entry all give
//! the right answer, never an error or a crash; a folder of the user's own files pointed at as
//! the cache keeps them all.
#![cfg(all(unix, feature = "gccjit"))]

mod common;

use std::path::{Path, PathBuf};

use serde_json::{Value, json};

fn doc() -> String {
    json!({"grad": true, "expr": {"op": "tanh", "args": [{"op": "matmul", "args": [
        {"leaf": "param", "name": "w", "input": [3], "output": [2], "init": {"values": [1, 2, 3, 4, 5, 6]}},
        {"leaf": "ndarray", "output": [3], "values": [0.1, 0.2, 0.3]}]}]}})
    .to_string()
}

/// Runs `rocannl eval` with the given environment; returns the answer and standard error.
fn eval(env: &[(&str, &Path)], off: bool) -> (Value, String) {
    let (rc, v, err) = common::rocannl_with(&["eval", "--backend", "gccjit", "-"], &doc(), |cmd| {
        cmd.env_remove("ROCANNL_CACHE");
        for (k, v) in env {
            cmd.env(k, v);
        }
        if off {
            cmd.env("ROCANNL_CACHE", "off");
        }
    });
    assert_eq!(rc, 0, "{v}");
    assert!(!v.is_null(), "one JSON answer: {err}");
    (v, err)
}

fn fresh_dir(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("rocannl-test-cache-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    let _ = std::fs::remove_file(&d);
    d
}

/// The entries (shared libraries) in the cache's own folder in `dir` (its one subfolder, named
/// by the cache's format version).
fn entries(dir: &Path) -> Vec<PathBuf> {
    let folders: Vec<PathBuf> = std::fs::read_dir(dir)
        .map(|r| r.flatten().map(|e| e.path()).filter(|p| p.is_dir()).collect())
        .unwrap_or_default();
    let mut v: Vec<PathBuf> = folders
        .iter()
        .flat_map(|f| std::fs::read_dir(f).into_iter().flatten().flatten())
        .map(|e| e.path())
        .filter(|p| p.extension().is_some_and(|e| e == "so"))
        .collect();
    v.sort();
    v
}

#[test]
fn a_second_process_is_served_from_the_cache_with_the_same_answer() {
    let dir = fresh_dir("warm");
    let (reference, _) = eval(&[], true);
    let (cold, err) = eval(&[("ROCANNL_CACHE_DIR", &dir)], false);
    assert_eq!(cold, reference);
    assert!(err.is_empty(), "{err}");
    let stored = entries(&dir);
    assert!(!stored.is_empty(), "the routine was stored");
    let (warm, err) = eval(&[("ROCANNL_CACHE_DIR", &dir)], false);
    assert_eq!(warm, reference);
    assert!(err.is_empty(), "{err}");
    assert_eq!(entries(&dir), stored, "nothing new was compiled");
    // Disabled: nothing is written.
    let off = fresh_dir("off");
    let (v, _) = eval(&[("ROCANNL_CACHE_DIR", &off)], true);
    assert_eq!(v, reference);
    assert!(!off.exists());
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn damaged_entries_are_compiled_again() {
    let dir = fresh_dir("damaged");
    let (reference, _) = eval(&[("ROCANNL_CACHE_DIR", &dir)], false);
    for damage in [b"garbage, not a shared library".to_vec(), Vec::new()] {
        for e in entries(&dir) {
            let mut bytes = std::fs::read(&e).expect("entry");
            if damage.is_empty() {
                bytes.truncate(bytes.len() / 2);
            } else {
                bytes[..damage.len()].copy_from_slice(&damage);
            }
            std::fs::write(&e, bytes).expect("damage the entry");
        }
        let (v, err) = eval(&[("ROCANNL_CACHE_DIR", &dir)], false);
        assert_eq!(v, reference);
        assert_eq!(err.matches("warning").count(), 1, "one warning: {err}");
        // Rewritten: the next process finds it valid.
        let (v, err) = eval(&[("ROCANNL_CACHE_DIR", &dir)], false);
        assert_eq!(v, reference);
        assert!(err.is_empty(), "{err}");
    }
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn an_unusable_cache_folder_is_no_error() {
    // A regular file where the folder should be: nothing can be created in it (this holds for
    // every user, root included, unlike file permissions).
    let file = fresh_dir("file");
    std::fs::write(&file, b"a file").expect("file");
    let (reference, _) = eval(&[], true);
    let (v, err) = eval(&[("ROCANNL_CACHE_DIR", &file.join("cache"))], false);
    assert_eq!(v, reference);
    assert_eq!(err.matches("warning").count(), 1, "{err}");
    let _ = std::fs::remove_file(&file);
}

#[test]
fn processes_racing_to_fill_one_entry_all_succeed() {
    let dir = fresh_dir("race");
    let (reference, _) = eval(&[], true);
    let handles: Vec<_> = (0..4)
        .map(|_| {
            let dir = dir.clone();
            std::thread::spawn(move || eval(&[("ROCANNL_CACHE_DIR", &dir)], false))
        })
        .collect();
    for h in handles {
        let (v, err) = h.join().expect("a racing process");
        assert_eq!(v, reference);
        assert!(err.is_empty(), "{err}");
    }
    let (v, err) = eval(&[("ROCANNL_CACHE_DIR", &dir)], false);
    assert_eq!(v, reference);
    assert!(err.is_empty(), "{err}");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_non_utf8_cache_folder_is_no_error() {
    use std::os::unix::ffi::OsStrExt as _;
    let base = fresh_dir("non-utf8");
    let dir = base.join(std::ffi::OsStr::from_bytes(b"cache-\xff"));
    let (reference, _) = eval(&[], true);
    let (cold, err) = eval(&[("ROCANNL_CACHE_DIR", &dir)], false);
    assert_eq!(cold, reference);
    assert!(err.is_empty(), "{err}");
    assert!(!entries(&dir).is_empty(), "the routine was stored");
    let (warm, err) = eval(&[("ROCANNL_CACHE_DIR", &dir)], false);
    assert_eq!(warm, reference);
    assert!(err.is_empty(), "{err}");
    let _ = std::fs::remove_dir_all(&base);
}

#[test]
fn a_folder_writable_by_others_is_refused_with_one_warning() {
    use std::os::unix::fs::PermissionsExt as _;
    let dir = fresh_dir("shared");
    let (reference, _) = eval(&[("ROCANNL_CACHE_DIR", &dir)], false);
    let stored = entries(&dir);
    std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o777)).expect("chmod");
    let (v, err) = eval(&[("ROCANNL_CACHE_DIR", &dir)], false);
    assert_eq!(v, reference);
    assert_eq!(err.matches("warning").count(), 1, "{err}");
    assert!(err.contains("group or others may write"), "{err}");
    assert_eq!(entries(&dir), stored, "nothing written there");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn pointing_the_cache_at_a_folder_of_the_users_files_leaves_them_alone() {
    let dir = fresh_dir("users-files");
    std::fs::create_dir_all(&dir).expect("folder");
    let names = ["thesis.tmp", "libmine.so", "model.ptx", "kernel.cubin", "notes.sha256"];
    let old = std::time::SystemTime::now() - std::time::Duration::from_secs(7200);
    for n in names {
        std::fs::write(dir.join(n), b"the user's").expect("a file of the user's");
        let f = std::fs::File::options().append(true).open(dir.join(n)).expect("open");
        f.set_modified(old).expect("age");
    }
    let (reference, _) = eval(&[], true);
    for _ in 0..2 {
        let env: [(&str, &Path); 2] =
            [("ROCANNL_CACHE_DIR", &dir), ("ROCANNL_CACHE_MAX_BYTES", Path::new("1"))];
        let (v, _) = eval(&env, false);
        assert_eq!(v, reference);
    }
    for n in names {
        assert_eq!(std::fs::read(dir.join(n)).expect(n), b"the user's");
    }
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_read_only_cache_folder_is_no_error() {
    use std::os::unix::fs::PermissionsExt as _;
    let dir = fresh_dir("read-only");
    std::fs::create_dir_all(&dir).expect("folder");
    std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o500)).expect("chmod");
    let (reference, _) = eval(&[], true);
    let (v, _) = eval(&[("ROCANNL_CACHE_DIR", &dir)], false);
    assert_eq!(v, reference);
    let _ = std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o700));
    let _ = std::fs::remove_dir_all(&dir);
}

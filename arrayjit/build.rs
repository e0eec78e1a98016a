//! The code generator's digest: a SHA-256 over every source file of this crate, compiled in as
//! `ROCANNL_CODEGEN_DIGEST` and made part of every gccjit compile-cache key.
//!
//! A cached library is machine code the generator made from a program; when the generator
//! changes, the same program may compile to other code, and an entry made by the old
//! generator must not be used. Keying on the sources themselves makes that automatic: no
//! version string to remember to bump. A change that leaves the generated code as it was
//! (a comment, a test) only costs a rebuild of the entries.

use sha2::{Digest, Sha256};
use std::path::{Path, PathBuf};

/// The `.rs` files under `dir`, sorted, so that the digest does not depend on the order in
/// which the file system lists them.
fn sources(dir: &Path, out: &mut Vec<PathBuf>) {
    let Ok(entries) = std::fs::read_dir(dir) else { return };
    for e in entries.flatten() {
        let p = e.path();
        if p.is_dir() {
            sources(&p, out);
        } else if p.extension().is_some_and(|x| x == "rs") {
            out.push(p);
        }
    }
}

fn main() {
    println!("cargo:rerun-if-changed=src");
    let mut files = Vec::new();
    sources(Path::new("src"), &mut files);
    files.sort();
    let mut h = Sha256::new();
    for f in &files {
        let bytes = std::fs::read(f).unwrap_or_default();
        let name = f.to_string_lossy();
        h.update((name.len() as u64).to_le_bytes());
        h.update(name.as_bytes());
        h.update((bytes.len() as u64).to_le_bytes());
        h.update(&bytes);
    }
    let digest: String = h.finalize().iter().map(|b| format!("{b:02x}")).collect();
    println!("cargo:rustc-env=ROCANNL_CODEGEN_DIGEST={digest}");
}

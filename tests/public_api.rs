//! The user's API names no compiler type, and what users read never reaches for the compiler.
//!
//! A model is written with `rocannl::tensor` alone: routines, run-time sizes, the step counter
//! and every error come as tensor-level types, and the compiler's vocabulary (node ids, runtime
//! symbols, projections, the assignments IR) stays behind `rocannl::tensor::advanced`, for tools
//! and new operations. Two checks keep it so:
//!
//! - the examples, the user guides and the root crate's tests do not import the compiler
//!   ([`USER_FILES`]);
//! - no public item of `rocannl_tensor` (outside `advanced`) or of the root crate's library
//!   modules has a signature naming an arrayjit type, other than the few that are user concepts
//!   and are re-exported by `rocannl::tensor` ([`USER_CONCEPTS`]). Without rustdoc's JSON on
//!   stable Rust this is a scan of the source: every `pub` function signature, `pub` field,
//!   variant of a `pub` enum, method of a `pub` trait, `pub type`, `pub const` and `pub use` is
//!   searched for paths through `arrayjit` and for the names the file imports from it.

use std::path::{Path, PathBuf};

/// What users read, relative to the workspace root (`examples/` is added whole): the README,
/// the guides that teach the API, and the root crate's tests. The compiler's own documents
/// (docs/backends.md, docs/lowering.md, docs/architecture.md, docs/benchmarks.md,
/// docs/testing.md, docs/shape_inference.md) describe arrayjit itself and are not listed.
const USER_FILES: [&str; 6] = [
    "README.md",
    "docs/getting_started.md",
    "docs/tensors.md",
    "docs/porting.md",
    "docs/models.md",
    "docs/einsum.md",
];

/// Arrayjit types that are user concepts, re-exported by `rocannl::tensor`: precisions, the
/// choice of backend, compile settings (with the types of their fields), host arrays, the
/// compiler's error as a cause (`CompileError`), and the counter-based generator of the
/// datasets.
const USER_CONCEPTS: [&str; 10] = [
    "Prec",
    "BackendKind",
    "CacheMode",
    "CompileOptions",
    "Limits",
    "WorkLimit",
    "MapCalls",
    "NdArray",
    "Error",
    "uniform",
];

/// The library sources whose public items users see; `tensor/src/advanced*.rs` is the one
/// module allowed to name compiler types.
fn public_sources(root: &Path) -> Vec<PathBuf> {
    let mut files = rust_files(&root.join("tensor/src"));
    files.retain(|f| !f.file_name().is_some_and(|n| n.to_string_lossy().starts_with("advanced")));
    files.push(root.join("src/lib.rs"));
    files.push(root.join("src/datasets.rs"));
    files.extend(rust_files(&root.join("src/document")));
    files
}

fn rust_files(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    for e in std::fs::read_dir(dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display())) {
        let p = e.unwrap().path();
        if p.is_dir() {
            out.extend(rust_files(&p));
        } else if p.extension().is_some_and(|x| x == "rs") {
            out.push(p);
        }
    }
    out.sort();
    out
}

/// Whether `text` reaches for the compiler crate by a path or by its package name.
fn imports_compiler(text: &str) -> Option<&'static str> {
    ["rocannl::arrayjit", "rocannl_arrayjit", "crate::arrayjit", "rocannl-arrayjit"]
        .into_iter()
        .find(|p| text.contains(p))
}

#[test]
fn examples_guides_and_tests_do_not_import_the_compiler() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut files: Vec<PathBuf> = USER_FILES.iter().map(|f| root.join(f)).collect();
    files.extend(rust_files(&root.join("examples")));
    files.extend(
        rust_files(&root.join("tests")).into_iter().filter(|f| !f.ends_with("public_api.rs")),
    );
    let mut bad = Vec::new();
    for f in &files {
        let text = std::fs::read_to_string(f).unwrap_or_else(|e| panic!("{}: {e}", f.display()));
        let examples = f.starts_with(root.join("examples"));
        for (n, line) in text.lines().enumerate() {
            // An example does not even mention the compiler; a guide may name a benchmark.
            let hit = if examples && line.contains("arrayjit") {
                Some("arrayjit")
            } else {
                imports_compiler(line)
            };
            if let Some(what) = hit {
                bad.push(format!("{}:{}: {what}: {}", f.display(), n + 1, line.trim()));
            }
        }
    }
    assert!(bad.is_empty(), "user-facing files use the compiler:\n{}", bad.join("\n"));
}

#[test]
fn no_public_item_names_a_compiler_type() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut bad = Vec::new();
    for f in public_sources(root) {
        let text = std::fs::read_to_string(&f).unwrap();
        for (line, what) in compiler_types_in_public_items(&text) {
            bad.push(format!("{}:{line}: {what}", f.display()));
        }
    }
    assert!(
        bad.is_empty(),
        "public items naming compiler types (move them to rocannl_tensor::advanced, make \
         them pub(crate), or wrap the type):\n{}",
        bad.join("\n")
    );
}

#[test]
fn the_scan_finds_a_compiler_type_in_a_public_signature() {
    let src = "use rocannl_arrayjit::indexing::Symbol;\n\
               pub fn f() -> rocannl_arrayjit::Routine { todo!() }\n\
               pub fn g(s: Symbol) {}\n\
               pub(crate) fn h(s: Symbol) {}\n\
               pub fn k(p: rocannl_arrayjit::Prec) {}\n\
               pub struct S {\n    pub node: rocannl_arrayjit::NodeId,\n    hidden: Symbol,\n}\n\
               pub enum E {\n    A(Symbol),\n}\n";
    let found: Vec<usize> =
        compiler_types_in_public_items(src).into_iter().map(|(l, _)| l).collect();
    assert_eq!(found, vec![2, 3, 7, 11]);
}

/// What the body of a public item that is open holds.
#[derive(Clone, Copy, PartialEq)]
enum Body {
    /// Fields: the `pub` ones are public.
    Struct,
    /// Variants: all public.
    Enum,
    /// Methods: all public.
    Trait,
}

/// The (1-based) lines of public items in `src` that name a compiler type, with the item.
fn compiler_types_in_public_items(src: &str) -> Vec<(usize, String)> {
    let imported = imported_compiler_names(src);
    let lines: Vec<&str> = src.lines().map(strip_comment).collect();
    let mut out = Vec::new();
    // The struct, enum or trait whose body is open, the depth of that body, and whether the
    // item is public (a private struct's `pub` fields are not).
    let mut body: Option<(Body, usize, bool)> = None;
    let mut depth = 0usize;
    for (i, raw) in lines.iter().enumerate() {
        let line = raw.trim();
        if line.starts_with("#[cfg(test)]") {
            break; // unit tests close every file that has them
        }
        let in_body = body.filter(|(_, d, _)| depth == *d);
        let member = match in_body {
            Some((kind, _, true)) if !line.is_empty() && !line.starts_with('#') => match kind {
                Body::Struct => is_public(line),
                Body::Enum => true,
                Body::Trait => line.starts_with("fn "),
            },
            _ => false,
        };
        let in_private_item = matches!(in_body, Some((_, _, false)));
        let opens = line.ends_with('{');
        let kind = ["struct ", "enum ", "trait "].iter().position(|k| line.contains(k));
        if member || (is_public(line) && !in_private_item) {
            let sig = signature(&lines[i..]);
            // A struct's, enum's or trait's name alone: its body is scanned line by line.
            let sig = if opens && kind.is_some() && !member { String::new() } else { sig };
            if let Some(name) = names_compiler_type(&sig, &imported) {
                out.push((i + 1, format!("{name} in `{}`", sig.trim())));
            }
        }
        if opens
            && body.is_none()
            && let Some(k) = kind
        {
            let public = is_public(line);
            body = Some(([Body::Struct, Body::Enum, Body::Trait][k], depth + 1, public));
        }
        depth += line.matches('{').count();
        depth = depth.saturating_sub(line.matches('}').count());
        if body.is_some_and(|(_, d, _)| depth < d) {
            body = None;
        }
    }
    out
}

/// An item's text from its first line to its body or its end (`{` or `;`), or its one line
/// (a field, a variant).
fn signature(lines: &[&str]) -> String {
    let first = lines[0].trim();
    if !(first.contains("fn ") || first.starts_with("pub use ")) {
        return first.to_string();
    }
    let mut sig = String::new();
    for l in lines {
        sig.push(' ');
        sig.push_str(l.trim());
        if let Some(k) = sig.find(['{', ';']).filter(|_| !first.starts_with("pub use ")) {
            sig.truncate(k);
            break;
        }
        if first.starts_with("pub use ") && sig.contains(';') {
            break;
        }
    }
    sig
}

fn strip_comment(line: &str) -> &str {
    match line.find("//") {
        Some(k) => &line[..k],
        None => line,
    }
}

/// `pub`, not `pub(crate)`, `pub(super)` or `pub(in ..)`.
fn is_public(line: &str) -> bool {
    line.starts_with("pub ")
}

/// The names a file imports from the compiler (`use rocannl_arrayjit::a::{B, C as D}` gives
/// `B` and `D`), other than user concepts.
fn imported_compiler_names(src: &str) -> Vec<String> {
    let mut names = Vec::new();
    let mut rest = src;
    while let Some(k) = rest.find("use ") {
        let stmt = &rest[k + 4..];
        let end = stmt.find(';').unwrap_or(stmt.len());
        names.extend(names_used_from_compiler(&stmt[..end]));
        rest = &stmt[end..];
    }
    names
}

/// What a `use` statement's path (after `use `) brings in from the compiler, other than user
/// concepts: each name as the file calls it.
fn names_used_from_compiler(path: &str) -> Vec<String> {
    let Some(tail) = ["rocannl_arrayjit", "crate::arrayjit", "rocannl::arrayjit"]
        .iter()
        .find_map(|p| path.trim().strip_prefix(p))
    else {
        return vec![];
    };
    let tail = tail.replace(['{', '}', '\n'], ",");
    let mut names = Vec::new();
    for part in tail.split(',') {
        let mut halves = part.split(" as ");
        let original = halves.next().unwrap_or("").rsplit("::").next().unwrap_or("").trim();
        let name = halves.next().map_or(original, str::trim);
        if !original.is_empty() && original != "self" && !USER_CONCEPTS.contains(&original) {
            names.push(name.to_string());
        }
    }
    names
}

/// The first compiler type `sig` names: something other than a user concept re-exported from
/// the compiler, a path through `arrayjit` to something other than a user concept, or a name
/// imported from the compiler.
fn names_compiler_type(sig: &str, imported: &[String]) -> Option<String> {
    if let Some(path) = sig.trim().strip_prefix("pub use ") {
        let path = path.trim_end_matches(';');
        return names_used_from_compiler(path).first().map(|n| format!("re-export {n}"));
    }
    let words = sig.split(|c: char| !(c.is_alphanumeric() || c == '_' || c == ':'));
    for w in words {
        if let Some(k) = w.find("arrayjit::") {
            let last = w[k..].rsplit("::").next().unwrap_or("");
            if !USER_CONCEPTS.contains(&last) {
                return Some(w.to_string());
            }
            continue;
        }
        let first = w.split("::").next().unwrap_or("");
        if imported.iter().any(|n| n == first) {
            return Some(w.to_string());
        }
    }
    None
}

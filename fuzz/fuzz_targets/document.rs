//! Arbitrary bytes as a tensor-expression document: reading it, building its graph and inferring
//! its shapes (what `rocannl shapes` does) must answer `Ok` or a typed error without panicking or
//! looping, and a document that passes must have every node's shape closed.

#![no_main]

use libfuzzer_sys::fuzz_target;
use rocannl::document::{build, doc};

fuzz_target!(|data: &[u8]| {
    let text = String::from_utf8_lossy(data);
    let Ok(document) = doc::parse_document(&text) else { return };
    let Ok(built) = build::build(&document, false) else { return };
    if built.graph.finish().is_err() {
        return;
    }
    if built.check_init_counts().is_err() {
        return;
    }
    for (_, t) in built.nodes.iter().chain(&built.params) {
        t.rows().expect("a finished graph has closed shapes");
    }
    built.root.rows().expect("a finished graph has a closed root shape");
});

//! Arbitrary bytes as a document, evaluated on the interpreter with its gradients (what
//! `rocannl eval --backend interp` does) under small work and memory limits: every path —
//! reading, inference, lowering, the limit check, running, reading values back — must answer
//! `Ok` or a typed error, never panic, abort or run for long. A document whose root's values are
//! read must give as many values as its shape has cells.

#![no_main]

use libfuzzer_sys::fuzz_target;
use rocannl::arrayjit::BackendKind;
use rocannl::arrayjit::low_level::estimate::{Limits, WorkLimit};
use rocannl::document::{build, doc};
use rocannl::tensor::{Plan, Session, SessionOptions};

fuzz_target!(|data: &[u8]| {
    let text = String::from_utf8_lossy(data);
    let Ok(document) = doc::parse_document(&text) else { return };
    let Ok(built) = build::build(&document, false) else { return };
    if built.graph.finish().is_err() || built.check_init_counts().is_err() {
        return;
    }
    let mut opts = SessionOptions { backend: BackendKind::Interp, ..SessionOptions::default() };
    opts.compile.limits = Limits { max_memory: Some(1 << 20), max_work: WorkLimit::At(1 << 16) };
    let Ok(mut session) = Session::with_options(&built.graph, opts) else { return };
    let plan = Plan {
        outputs: vec![built.root.clone()],
        backprop_from: document.grad.then(|| built.root.clone()),
        grads: if document.grad {
            built.params.iter().map(|(_, t)| t.clone()).collect()
        } else {
            vec![]
        },
        ..Plan::default()
    };
    let Ok(routine) = session.compile("eval", &plan) else { return };
    if session.run(&routine).is_err() {
        return;
    }
    let rows = built.root.rows().expect("a closed root shape");
    let cells: usize = rows.iter().flatten().product();
    let values = session.read(&built.root).expect("the root was computed");
    assert_eq!(values.len(), cells);
});

//! Arbitrary bytes as an einsum spec: parsing must return `Ok` or `Err` without panicking, and
//! the canonical rendering (`Display`) of a parsed spec must parse back to the same patterns and
//! render the same again.

#![no_main]

use libfuzzer_sys::fuzz_target;
use rocannl_shape::spec::EinsumSpec;

fuzz_target!(|data: &[u8]| {
    let text = String::from_utf8_lossy(data);
    let Ok(spec) = EinsumSpec::parse(&text) else {
        return;
    };
    let shown = spec.to_string();
    let again = EinsumSpec::parse(&shown)
        .unwrap_or_else(|e| panic!("{text:?} renders as {shown:?}, which does not parse: {e}"));
    assert_eq!(again.operands, spec.operands, "{text:?} renders as {shown:?}");
    assert_eq!(again.result, spec.result, "{text:?} renders as {shown:?}");
    assert_eq!(again.to_string(), shown, "rendering {text:?} is not a fixed point");
    let padded = EinsumSpec::parse_padded(&text).expect("parses as unpadded");
    assert!(padded.padded);
});

//! Tensor-expression documents (the JSON format of the `rocannl` command line): reading a
//! document into an expression tree ([`doc`]) and building the tensor graph it describes
//! ([`build`]).
//!
//! They live in the library, not only in the binary, so that everything reading documents can be
//! tested and fuzzed directly: `fuzz/` feeds arbitrary bytes through [`doc::parse_document`] and
//! [`build::build`].

pub mod build;
pub mod doc;

//! Structured inputs and oracles for fuzzing `rocannl-shape`.
//!
//! Raw bytes make poor solver inputs: almost all of them would fail at the first step. So the
//! `solver` target decodes its bytes (with `arbitrary`) into a [`plan::Plan`] — shapes with
//! given, labeled or inferred rows, and steps of every kind of shape logic, with einsum specs
//! drawn from a small grammar (labels, row variables, fixed indices, convolution and
//! concatenation axes) — and replays it through `Inference` ([`replay::check`]). A plan prints
//! (`Debug`) as a readable description, so a crashing input can be turned by hand into a plain
//! regression test in `shape/tests/` that needs neither this crate nor a fuzzer.
//!
//! Besides "no panic, no hang", the replay checks what must hold whenever inference succeeds:
//! every shape is closed, and every index of every derived projection stays inside its tensor
//! over the whole product space (checked exactly by interval arithmetic, since an index is
//! affine in the iterators).
//!
//! Running (the machine has only a stable toolchain; `RUSTC_BOOTSTRAP=1` lets it take the
//! `-Z` sanitizer flags cargo-fuzz passes; `-a` keeps debug assertions, so overflows panic):
//!
//! ```text
//! RUSTC_BOOTSTRAP=1 cargo fuzz run -a einsum_parser -- -max_total_time=600 -dict=einsum.dict
//! RUSTC_BOOTSTRAP=1 cargo fuzz run -a solver -- -max_total_time=600 -timeout=10
//! RUSTC_BOOTSTRAP=1 cargo fuzz fmt -a solver artifacts/solver/crash-…   # the plan, readable
//! ```

pub mod plan;
pub mod replay;

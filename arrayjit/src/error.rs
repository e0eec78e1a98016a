//! The crate's one error type.
//!
//! Bad input — an unknown node, a missing runtime binding, an assignment whose projections do
//! not match its arguments, a backend that is not installed, a generated index that leaves its
//! tensor in bounds-check mode — is reported as a typed [`Error`], never as a panic, so the
//! tensor layer and the command line can explain what went wrong.

use crate::indexing::Symbol;

/// Everything that can go wrong while lowering, compiling or running a routine.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A backend name that is not one of `interp`, `gccjit`, `cuda`.
    #[error("unknown backend `{0}` (known: interp, gccjit, cuda)")]
    UnknownBackend(String),
    /// The backend was left out of this build (a disabled cargo feature).
    #[error("backend `{0}` is not built in (enable the cargo feature of the same name)")]
    NotBuiltIn(&'static str),
    /// No GPU (or no CUDA driver library) to run on.
    #[error("no CUDA device: {reason}")]
    NoDevice {
        /// Why: the driver library is missing, or it reports no device.
        reason: String,
    },
    /// A library a backend needs could not be found or loaded.
    #[error("library `{library}` not available: {reason}")]
    LibraryMissing {
        /// The library's file name.
        library: String,
        /// Where it was looked for, or the loader's message.
        reason: String,
    },
    /// A compiler (libgccjit or NVRTC) rejected the generated program.
    #[error("{backend} compilation of routine `{routine}` failed: {log}")]
    Compile {
        /// The backend name.
        backend: &'static str,
        /// The routine's name.
        routine: String,
        /// The compiler's message.
        log: String,
    },
    /// A CUDA driver call failed.
    #[error("CUDA driver error: {0}")]
    Cuda(String),
    /// A node id that the node table or the context does not know.
    #[error("unknown tensor node n{0}")]
    UnknownNode(u32),
    /// A node that has no buffer in this context (it was virtualized, or never compiled).
    #[error("tensor node n{id} `{label}` has no buffer in this context (virtual or never used)")]
    NotMaterialized {
        /// The node.
        id: u32,
        /// Its label.
        label: String,
    },
    /// Host data whose shape does not match the node.
    #[error("shape mismatch for n{id}: node has dims {expected:?}, data has dims {got:?}")]
    ShapeMismatch {
        /// The node.
        id: u32,
        /// The node's dims.
        expected: Vec<usize>,
        /// The data's dims.
        got: Vec<usize>,
    },
    /// An array built from a slice of the wrong length.
    #[error("array of dims {dims:?} needs {expected} elements, got {got}")]
    DataLength {
        /// The requested dims.
        dims: Vec<usize>,
        /// Their product.
        expected: usize,
        /// The slice's length.
        got: usize,
    },
    /// An assignment that is inconsistent with its projections or nodes.
    #[error(
        "cell {index} holds {value}, which is not an unsigned 32-bit integer (a u32 array holds ids)"
    )]
    NotAnInteger {
        /// The cell, in memory order.
        index: usize,
        /// Its value.
        value: f64,
    },
    #[error("invalid assignment to n{lhs}: {reason}")]
    InvalidAssignment {
        /// The assigned node.
        lhs: u32,
        /// What is wrong.
        reason: String,
    },
    /// `initialize_neutral` with an accumulation that has no neutral element.
    #[error("accumulation `{0}` has no neutral element to initialize with")]
    NoNeutral(&'static str),
    /// A runtime symbol used by a routine but not bound when running it.
    #[error("runtime symbol {0} is not bound")]
    MissingBinding(Symbol),
    /// A runtime symbol bound to a value that makes an index leave its tensor.
    #[error(
        "runtime symbol {symbol} = {value} puts index {axis} of n{node} `{label}` out of 0..{bound}"
    )]
    SymbolOutOfRange {
        /// The symbol.
        symbol: Symbol,
        /// Its bound value.
        value: i64,
        /// The tensor.
        node: u32,
        /// The tensor's label.
        label: String,
        /// The axis.
        axis: usize,
        /// The axis' size.
        bound: usize,
    },
    /// Bounds-check mode caught an index out of range.
    #[error("index out of bounds: n{node} `{label}` axis {axis}: index {index} not in 0..{bound}")]
    OutOfBounds {
        /// The tensor.
        node: u32,
        /// The tensor's label.
        label: String,
        /// The axis.
        axis: usize,
        /// The offending index.
        index: i64,
        /// The axis' size.
        bound: usize,
    },
    /// The kernel simulator (`cuda-sim`) found what a GPU would not report: a data race, a
    /// barrier some thread cannot reach, shared memory past the limit.
    #[error("kernel {kernel}: {problem}")]
    KernelCheck {
        /// The kernel.
        kernel: String,
        /// What is wrong, with the threads and cells involved.
        problem: String,
    },
    /// A buffer that cannot be allocated.
    #[error("cannot allocate {bytes} bytes for {what}")]
    Alloc {
        /// What the memory was for: a tensor node (`tensor node n3 'h'`), a routine's
        /// intermediates, a host array.
        what: String,
        /// The requested size.
        bytes: usize,
    },
    /// A routine needs more memory or work than the limits allow
    /// (`low_level::estimate::Limits`, raised through [`crate::CompileOptions::limits`]).
    #[error(
        "{}; raise it with CompileOptions::limits",
        limit_message(routine, resource, *estimate, *limit, *default_for)
    )]
    LimitExceeded {
        /// The routine.
        routine: String,
        /// `"memory"` or `"work"`.
        resource: &'static str,
        /// What it needs: bytes, or statement executions.
        estimate: u64,
        /// The limit.
        limit: u64,
        /// The backend whose default the limit is, when it is one
        /// (`low_level::estimate::WorkLimit::Default`).
        default_for: Option<crate::BackendKind>,
    },
    /// A routine run on a context other than the one that compiled it.
    #[error("routine `{0}` was compiled by another context")]
    ForeignRoutine(String),
    /// A routine run after [`crate::Context::release`] released it.
    #[error("routine `{0}` was released")]
    ReleasedRoutine(String),
    /// The low-level IR verifier found a broken invariant (a compiler bug, reported not hidden).
    #[error("low-level IR verification failed after `{pass}`: {reason}")]
    Verify {
        /// The pass after which the problem appeared.
        pass: &'static str,
        /// The broken invariant.
        reason: String,
    },
    /// Writing the debug folder failed.
    #[error("cannot write debug output to {path}: {source}")]
    Io {
        /// The file.
        path: String,
        /// The cause.
        source: std::io::Error,
    },
}

/// A figure of a limit error for people.
/// What [`Error::LimitExceeded`] says, without how to raise the limit (which callers with
/// their own knobs, such as a command line's flags, add):
/// `routine `r` needs 1.5 GiB of memory, above the limit of 1.0 GiB`.
///
/// ```
/// use rocannl_arrayjit::{BackendKind, error::limit_message};
/// let m = limit_message("step", "work", 10_000, 100, Some(BackendKind::Interp));
/// assert_eq!(
///     m,
///     "routine `step` needs 10000 operations of work, above the limit of 100 operations \
///      (the interp backend's default)"
/// );
/// ```
pub fn limit_message(
    routine: &str,
    resource: &str,
    estimate: u64,
    limit: u64,
    default_for: Option<crate::BackendKind>,
) -> String {
    let default =
        default_for.map_or(String::new(), |k| format!(" (the {} backend's default)", k.name()));
    format!(
        "routine `{routine}` needs {} of {resource}, above the limit of {}{default}",
        show(resource, estimate),
        show(resource, limit)
    )
}

fn show(resource: &str, x: u64) -> String {
    if resource == "memory" { human_bytes(x) } else { format!("{x} operations") }
}

/// Bytes for people: `1.5 GiB`.
pub fn human_bytes(b: u64) -> String {
    const UNITS: [&str; 5] = ["bytes", "KiB", "MiB", "GiB", "TiB"];
    let mut x = b as f64;
    let mut u = 0;
    while x >= 1024.0 && u + 1 < UNITS.len() {
        x /= 1024.0;
        u += 1;
    }
    if u == 0 { format!("{b} bytes") } else { format!("{x:.1} {}", UNITS[u]) }
}

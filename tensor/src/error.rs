//! The crate's one error type.
//!
//! Building expressions never fails: a shape error found while a tensor is built is kept in the
//! graph and returned, with the shape crate's message naming the operations involved, when the
//! graph is finalized (a [`crate::Session`] is created or a routine compiled). Everything after
//! that — compiling, running, reading, persistence — returns [`Error`] directly.

use rocannl_arrayjit as arrayjit;
use rocannl_shape::ShapeError;

/// Everything that can go wrong in the tensor layer.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// Shapes that cannot be reconciled, a bad einsum spec, or a guess in strict mode.
    #[error(transparent)]
    Shape(#[from] ShapeError),
    /// Lowering, compiling or running a routine failed, or a backend is missing.
    #[error(transparent)]
    Compile(#[from] arrayjit::Error),
    /// A dynamic size ([`crate::DynDim`]) flows where a fixed size is needed.
    #[error("dynamic size `{dim}` in {op}: {message}")]
    Dynamic {
        /// The dynamic size, `name<=max`.
        dim: String,
        /// The operation, as its result is named.
        op: String,
        /// What it meets.
        message: String,
    },
    /// The API was used in a way that cannot work (the message says how to fix it).
    #[error("{0}")]
    Usage(String),
    /// The graph has warnings and [`crate::Warnings::Deny`] makes them errors.
    #[error("the graph has {} warning(s), denied:\n{}", .0.len(), .0.join("\n"))]
    Warnings(Vec<String>),
    /// Saving or loading parameters failed.
    #[error("{0}")]
    Persist(String),
    /// A collective operation of data parallelism failed: a rank died, hung or runs another
    /// program ([`crate::parallel`]).
    #[error("rank {rank} of {size}: {message}")]
    Distributed {
        /// The rank that reports it.
        rank: usize,
        /// The number of ranks.
        size: usize,
        /// What happened, naming the ranks involved where they are known.
        message: String,
    },
    /// Reading or writing a file failed.
    #[error("{path}: {source}")]
    Io {
        /// The file.
        path: String,
        /// The cause.
        source: std::io::Error,
    },
}

impl Error {
    /// A usage error.
    pub(crate) fn usage(msg: impl Into<String>) -> Error {
        Error::Usage(msg.into())
    }
}

/// The crate's result type.
pub type Result<T, E = Error> = std::result::Result<T, E>;

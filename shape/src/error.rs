//! Shape errors: typed, never a panic, and always naming the operations involved.
//!
//! The solver works with variables and knows operations only by their
//! [`StepId`](crate::var::StepId); when it finds a contradiction it returns a [`Conflict`] (what
//! failed and which steps produced the constraints). The inference driver turns it into a
//! [`ShapeError`] that names each operation by its debug name and prints the shapes involved as
//! `batch|input->output`.

use std::fmt;
use std::sync::Arc;

use crate::constraint::Origin;
use crate::dim::ConvDim;
use crate::spec::SpecError;

/// What the solver found contradictory, before the operations are named.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Conflict {
    /// A sentence saying which rows or dimensions disagree and which relation failed.
    pub message: String,
    /// The operations whose constraints conflict.
    pub origin: Origin,
    /// The convolution axis whose size failed, if that is what failed: the message then names
    /// it as the user wrote it in the spec, with its stride and kernel.
    pub conv: Option<Arc<ConvDim>>,
}

/// Builds a [`Conflict`].
pub(crate) fn conflict(message: impl Into<String>, origin: &Origin) -> Conflict {
    Conflict { message: message.into(), origin: origin.clone(), conv: None }
}

/// One operation named in an error: its kind, its debug name and its shapes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct OpContext {
    /// E.g. `einsum "ij;jk=>ik"` or `add`.
    pub op: String,
    /// The debug name of the result tensor.
    pub name: String,
    /// The result's shape and the arguments' names and shapes, as `batch|input->output`.
    pub shapes: Vec<String>,
    /// The user's call the operation belongs to, when a library function built it.
    pub within: Option<String>,
}

impl fmt::Display for OpContext {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} '{}'", self.op, self.name)?;
        if let Some(w) = &self.within {
            write!(f, " (inside {w})")?;
        }
        write!(f, ": ")?;
        match self.shapes.split_first() {
            Some((result, args)) if !args.is_empty() => {
                write!(f, "result {result} from {}", args.join(", "))
            }
            Some((result, _)) => write!(f, "{result}"),
            None => Ok(()),
        }
    }
}

/// A shape error with its context.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ShapeMismatch {
    /// What failed.
    pub message: String,
    /// The operations involved, most specific first.
    pub ops: Vec<OpContext>,
    /// The steps of those operations (to name them again after they were renamed).
    pub steps: Vec<crate::var::StepId>,
}

impl fmt::Display for ShapeMismatch {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.message)?;
        for op in &self.ops {
            write!(f, "; in {op}")?;
        }
        Ok(())
    }
}

/// Errors of shape and projection inference.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum ShapeError {
    /// An einsum spec that does not parse.
    #[error(transparent)]
    Spec(#[from] SpecError),
    /// Shapes that cannot be reconciled.
    #[error("shape error: {0}")]
    Mismatch(Box<ShapeMismatch>),
    /// In strict mode: closing had to guess a parameter's size.
    #[error("shape error (strict): {0}")]
    Guess(String),
    /// An operation was given the wrong number of arguments for its spec or kind.
    #[error("{0}")]
    Arity(String),
}

impl ShapeError {
    /// The context-free message, for tests.
    pub fn message(&self) -> String {
        match self {
            ShapeError::Mismatch(m) => m.message.clone(),
            other => other.to_string(),
        }
    }
}

//! The unit of a routine's machine code: a *step*, one function the routine's run calls, and
//! how it is run ([`StepKind`]).
//!
//! Planning ([`super::plan`]) cuts a program into steps, deduplication and grouping
//! ([`super::dedup`], [`super::group`]) compare and join them, the build ([`super::codegen`])
//! gives each its function, and the run hands the parallel ones to the pool ([`super::pool`]).

/// How a step is run.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum StepKind {
    /// On the calling thread, once.
    Serial,
    /// Split over `0..extent` of its outermost loop across the pool.
    Parallel {
        /// The outermost loop's trip count.
        extent: i64,
        /// A dynamic batch's limit on that loop ([`crate::low_level::Limit`]): the slot of its
        /// size among the runtime symbols and the rows per iteration. Only the iterations below
        /// it are split.
        limit: Option<(usize, i64)>,
    },
}

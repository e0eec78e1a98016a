//! The stages of shape inference, in order, and what each closes.
//!
//! Stage 1 runs online while tensors are built. The later stages run in `finish_inference`,
//! in order, each solving all remaining constraints to a fixed point before the next starts:
//!
//! | stage | closes |
//! |---|---|
//! | 1 `Online` | nothing: unification and propagation only |
//! | 2 `TerminalDimsToOne` | dimension variables of leaf (terminal) shapes with no upper bound and no other constraint (not related to any other variable either), to 1 |
//! | 3 `TerminalsToLub` | dimension and row variables of leaf shapes to their least upper bounds (rows only without a `TotalElems 1` constraint); a leaf row without an upper bound whose constraint needs one axis gets it |
//! | 4 `TerminalRowsClosed` | leaf row variables without an upper bound (and not related to other row variables, by a bound or by a constraint waiting for an alignment) to no further axes; dimensions with a lower bound > 1 (from fixed indexing) to their upper bounds |
//! | 5 `RowConstraints` | `TotalElems` and `Exact` constraints with unknown row variables: one row variable gets the remaining axes (one axis, or none when one element is left); with several, the output row's variable does |
//! | 6 `RowsToNoMoreAxes` | every remaining row variable to no further axes |
//! | 7 `DimsToLowerBound` | every remaining dimension variable to its lower bound, or 1: composite shapes' rows one whole row at a time, arguments before results; a leaf dimension below another variable waits for that one (and takes the upper bound it then has) |
//!
//! The solver's driver runs one stage at a time; how each stage closes variables is in
//! `close.rs`.

/// The stages of shape inference, in order.
#[derive(Copy, Clone, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Stage {
    /// 1: online unification and propagation while tensors are built.
    #[default]
    Online = 1,
    /// 2: unbounded leaf dimensions to 1.
    TerminalDimsToOne = 2,
    /// 3: leaf dimensions and rows to their least upper bounds.
    TerminalsToLub = 3,
    /// 4: unbounded leaf rows to no further axes; lower-bounded dimensions to upper bounds.
    TerminalRowsClosed = 4,
    /// 5: row constraints with unknown row variables.
    RowConstraints = 5,
    /// 6: all row variables to no further axes.
    RowsToNoMoreAxes = 6,
    /// 7: all dimension variables to their lower bound or 1.
    DimsToLowerBound = 7,
}

impl Stage {
    /// The closing stages, in order.
    pub const CLOSING: [Stage; 6] = [
        Stage::TerminalDimsToOne,
        Stage::TerminalsToLub,
        Stage::TerminalRowsClosed,
        Stage::RowConstraints,
        Stage::RowsToNoMoreAxes,
        Stage::DimsToLowerBound,
    ];
}

//! The optimization pipeline, readable top to bottom.
//!
//! Each pass is one module of [`crate::low_level`]; in debug builds the verifier runs after
//! every pass, so a pass that breaks an invariant is named in the error instead of producing
//! wrong code somewhere downstream.

use super::Program;
use crate::error::Error;

/// Settings of the pipeline.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct OptimizeOptions {
    /// Inline intermediates into their consumers (see [`super::virtualize`]).
    pub virtualize: bool,
    /// Run the verifier between passes (always on in debug builds).
    pub verify: bool,
}

impl Default for OptimizeOptions {
    fn default() -> Self {
        OptimizeOptions { virtualize: true, verify: cfg!(debug_assertions) }
    }
}

/// Optimizes a lowered program in place.
pub fn optimize(prog: &mut Program, opts: &OptimizeOptions) -> Result<(), Error> {
    let check =
        |prog: &Program, pass| if opts.verify { super::verify::verify(prog, pass) } else { Ok(()) };
    check(prog, "lower")?;
    // An accumulation onto a tensor zeroed earlier reads +0 instead, so a gradient with one
    // contribution is one pointwise definition, which the next pass may inline.
    super::schedule::fold_zero_fills(prog);
    check(prog, "zero fills")?;
    // Visit counting (`trace`) feeds the next two passes; they recount after each change.
    if opts.virtualize {
        // Inline intermediates computed once and read once, or cheap, into their consumers.
        super::virtualize::inline_virtual_nodes(prog);
        check(prog, "virtualize")?;
    }
    // Fold constants, apply algebraic identities, fuse multiply-adds.
    super::simplify::simplify_exprs(prog);
    check(prog, "simplify")?;
    // Compute repeated subexpressions once into locals.
    super::cse::eliminate_common_subexprs(prog);
    check(prog, "cse")?;
    // Drop writes nobody reads: unread intermediates and locals.
    super::dse::remove_dead_stores(prog);
    check(prog, "dse")?;
    prog.virtual_nodes.sort();
    prog.virtual_nodes.dedup();
    Ok(())
}

//! Reshapes: the shape logic and the projections of a view of the same cells in other axes.
//!
//! A reshape keeps the cells in their memory order (batch, output, input, each row-major) and
//! regroups the axes, as PyTorch's `view` does for contiguous tensors. Its shape logic is the
//! seed's `Total_elems` row constraint: the rows a reshape changes hold as many elements on
//! both sides, `t` for one fresh variable `t` (`TotalElems` with a `StridedVar` numerator), so
//! one size left to inference on either side is solved by division. Rows it keeps are equal.
//! A merge or a split of axes inside one row relates only those axes (the rest of the row,
//! known or not, is shared), so it works on rows whose other axes are still unknown.
//!
//! Projections cannot express a flat index (`i*4 + j` read as `p*6 + q` needs division), but a
//! reshape that only merges and splits consecutive axes is affine in the *common refinement*
//! of both shapes: the element counts after each axis boundary of either side, sorted, divide
//! each other, and each factor between two of them is one product iterator. Every axis of
//! either side is then a sum of iterators times their place in that axis. A reshape that
//! regroups across boundaries (`6, 4` as `4, 6`) has no such refinement and is an error naming
//! it; going through one flat axis (two reshapes) always has one.

use std::sync::Arc;

use rocannl_arrayjit::indexing::{AxisIndex, Projections, SymbolGen};

use crate::constraint::{Constraint, RowConstraint, TotalElems};
use crate::dim::Dim;
use crate::row::{Bcast, Kind, Row, RowId, Shape};
use crate::var::VarGen;

/// How a reshape's result row of one kind relates to the argument's row of that kind.
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash)]
pub enum RowReshape {
    /// The result's row is as declared; together with the other `Free` rows it holds as many
    /// elements as the argument's `Free` rows.
    #[default]
    Free,
    /// The result's row is the argument's row.
    Keep,
    /// `count` consecutive axes of the argument's row, starting at axis `at`, are one axis of
    /// the result. A negative `at` counts from the end of the row (`-1` is the last axis).
    Merge {
        /// The first merged axis.
        at: isize,
        /// How many axes are merged (at least 1).
        count: usize,
    },
    /// Axis `at` of the argument's row is several axes of the result, of these sizes (`None`:
    /// inferred). A negative `at` counts from the end of the row.
    Split {
        /// The split axis.
        at: isize,
        /// The sizes of the new axes.
        sizes: Vec<Option<usize>>,
    },
}

/// The rows of a reshape, in `batch, input, output` order.
pub type ReshapeRows = [RowReshape; 3];

/// The axes of a merge or split within one row: the argument's row, the result's row, and the
/// two runs of axes that must hold the same number of elements.
struct Regroup {
    arg: Row,
    cur: Row,
    from: Row,
    to: Row,
}

/// `beg ++ ..v.. ++ []` for a non-negative position, `..v.. ++ end` for a negative one: the
/// axes `pre` then `mid` (at the start), or `mid` then `post` (at the end).
fn pattern(v: crate::var::RowVar, at: isize, edge: Vec<Dim>, mid: Vec<Dim>, id: RowId) -> Row {
    if at >= 0 {
        let beg_dims = [edge, mid].concat();
        Row { dims: vec![], bcast: Bcast::Var { v, beg_dims }, id }
    } else {
        Row { dims: [mid, edge].concat(), bcast: Bcast::Var { v, beg_dims: vec![] }, id }
    }
}

/// The axes around the regrouped ones: `at` leading axes, or `-at - width` trailing axes.
fn edge_len(at: isize, width: usize) -> Option<usize> {
    if at >= 0 { Some(at.unsigned_abs()) } else { at.unsigned_abs().checked_sub(width) }
}

fn regroup(rr: &RowReshape, cur: RowId, arg: RowId, vars: &mut VarGen) -> Option<Regroup> {
    let (at, width, to): (isize, usize, Vec<Dim>) = match rr {
        RowReshape::Merge { at, count } => (*at, *count, vec![Dim::Var(vars.dim())]),
        RowReshape::Split { at, sizes } => {
            let to = sizes.iter().map(|s| s.map_or_else(|| Dim::Var(vars.dim()), Dim::of));
            (*at, 1, to.collect())
        }
        RowReshape::Free | RowReshape::Keep => return None,
    };
    let edge: Vec<Dim> = (0..edge_len(at, width)?).map(|_| Dim::Var(vars.dim())).collect();
    let from: Vec<Dim> = (0..width).map(|_| Dim::Var(vars.dim())).collect();
    let v = vars.row();
    Some(Regroup {
        arg: pattern(v, at, edge.clone(), from.clone(), arg),
        cur: pattern(v, at, edge, to.clone(), cur),
        from: Row::fixed(from, arg),
        to: Row::fixed(to, cur),
    })
}

/// Checks that the row changes name axes that can exist: a merge of at least one axis, a split
/// into at least one, and a negative position that leaves room for the regrouped axes.
pub fn check_rows(rows: &ReshapeRows) -> Result<(), String> {
    for (kind, rr) in Kind::ALL.into_iter().zip(rows) {
        let (at, width) = match rr {
            RowReshape::Merge { count: 0, .. } => {
                return Err(format!("a merge of no axes of the {} row", kind.name()));
            }
            RowReshape::Split { sizes, .. } if sizes.is_empty() => {
                return Err(format!("a split of the {} row into no axes", kind.name()));
            }
            RowReshape::Merge { at, count } => (*at, *count),
            RowReshape::Split { at, .. } => (*at, 1),
            RowReshape::Free | RowReshape::Keep => continue,
        };
        if edge_len(at, width).is_none() {
            return Err(format!(
                "axis {at} of the {} row cannot start {width} consecutive axes",
                kind.name()
            ));
        }
    }
    Ok(())
}

/// The constraints of a reshape of `a` into `cur`.
pub fn reshape_constraints(
    cur: &Shape,
    a: &Shape,
    rows: &ReshapeRows,
    vars: &mut VarGen,
) -> Vec<Constraint> {
    let total = |vars: &mut VarGen| RowConstraint::TotalElems {
        numerator: TotalElems::StridedVar { coeff: 1, var: vars.dim(), denom: 1 },
        divided_by: vec![],
    };
    let mut cs = Vec::new();
    let (mut free_cur, mut free_arg) = (Vec::new(), Vec::new());
    // Memory order, so that the element count is over the rows as they are laid out.
    for kind in [Kind::Batch, Kind::Output, Kind::Input] {
        let rr = &rows[Kind::ALL.iter().position(|k| *k == kind).unwrap_or(0)];
        let (c, r) = (cur.row(kind), a.row(kind));
        match rr {
            RowReshape::Free => {
                free_cur.push(c.as_ref().clone());
                free_arg.push(r.as_ref().clone());
            }
            RowReshape::Keep => cs.push(Constraint::RowEq { r1: c.clone(), r2: r.clone() }),
            _ => {
                let Some(g) = regroup(rr, c.id, r.id, vars) else { continue };
                cs.push(Constraint::RowEq { r1: r.clone(), r2: Arc::new(g.arg) });
                cs.push(Constraint::RowEq { r1: c.clone(), r2: Arc::new(g.cur) });
                let t = total(vars);
                cs.push(Constraint::RowsConstr { rows: vec![g.from], constr: t.clone() });
                cs.push(Constraint::RowsConstr { rows: vec![g.to], constr: t });
            }
        }
    }
    if !free_cur.is_empty() {
        let t = total(vars);
        cs.push(Constraint::RowsConstr { rows: free_arg, constr: t.clone() });
        cs.push(Constraint::RowsConstr { rows: free_cur, constr: t });
    }
    cs
}

/// The element counts after each axis boundary of `dims` (`N, …, 1`), without repeats.
fn cuts(dims: &[usize]) -> Vec<usize> {
    let mut out = vec![1usize];
    for d in dims.iter().rev() {
        let last = *out.last().unwrap_or(&1);
        out.push(last.saturating_mul(*d));
    }
    out
}

/// The indices of a tensor of `dims` over the refinement's iterators (`(place, symbol)`, the
/// flat stride of each).
fn axis_indices(
    dims: &[usize],
    iters: &[(usize, rocannl_arrayjit::indexing::Symbol)],
) -> Vec<AxisIndex> {
    let mut stride = 1usize;
    let mut out = Vec::with_capacity(dims.len());
    for d in dims.iter().rev() {
        let end = stride.saturating_mul(*d);
        let terms = iters
            .iter()
            .filter(|(place, _)| *place >= stride && *place < end)
            .map(|(place, s)| ((place / stride) as i64, *s))
            .collect();
        out.push(AxisIndex::affine(terms, 0));
        stride = end;
    }
    out.reverse();
    out
}

/// The projections of a reshape from `rhs_dims` to `lhs_dims` (memory order, equal element
/// counts), or `Err` with the reason when the axes do not refine each other.
pub fn reshape_projections(
    lhs_dims: &[usize],
    rhs_dims: &[usize],
    symbols: &mut SymbolGen,
    debug_info: String,
) -> Result<Projections, String> {
    let n: usize = lhs_dims.iter().product();
    if n == 0 {
        // No cells: one empty loop (every axis reads its iterator, which never runs).
        let s = symbols.fresh();
        return Ok(Projections {
            product_space: vec![0],
            product_iterators: vec![s],
            lhs_dims: lhs_dims.to_vec(),
            rhs_dims: vec![rhs_dims.to_vec()],
            project_lhs: lhs_dims.iter().map(|_| AxisIndex::Iterator(s)).collect(),
            project_rhs: vec![rhs_dims.iter().map(|_| AxisIndex::Iterator(s)).collect()],
            debug_info,
            dynamic: vec![],
        });
    }
    let mut all = [cuts(lhs_dims), cuts(rhs_dims)].concat();
    all.sort_unstable();
    all.dedup();
    if let Some(w) = all.windows(2).find(|w| !w[1].is_multiple_of(w[0])) {
        return Err(format!(
            "it regroups cells across axis boundaries ({} cells per step on one side, {} on the \
             other): only merges and splits of consecutive axes can be indexed; reshape through \
             one flat axis first",
            w[0], w[1]
        ));
    }
    // Outermost first: the loops follow memory order.
    let mut iters = Vec::with_capacity(all.len());
    let mut product_space = Vec::with_capacity(all.len());
    for w in all.windows(2).rev() {
        iters.push((w[0], symbols.fresh()));
        product_space.push(w[1] / w[0]);
    }
    Ok(Projections {
        product_space,
        product_iterators: iters.iter().map(|(_, s)| *s).collect(),
        lhs_dims: lhs_dims.to_vec(),
        rhs_dims: vec![rhs_dims.to_vec()],
        project_lhs: axis_indices(lhs_dims, &iters),
        project_rhs: vec![axis_indices(rhs_dims, &iters)],
        debug_info,
        dynamic: vec![],
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn proj(lhs: &[usize], rhs: &[usize]) -> String {
        match reshape_projections(lhs, rhs, &mut SymbolGen::default(), String::new()) {
            Ok(p) => p.to_string(),
            Err(e) => e,
        }
    }

    #[test]
    fn merges_and_splits_are_affine_in_the_common_refinement() {
        // [2, 3, 4] merged to [2, 12]: the result's axis is 4*i1 + i2.
        assert_eq!(
            proj(&[2, 12], &[2, 3, 4]),
            "[i0:2, i1:3, i2:4] lhs[i0, 4*i1 + i2] <- rhs0[i0, i1, i2]"
        );
        // FlattenConsecutive(2): [32, 8, 24] as [32, 4, 48].
        assert_eq!(
            proj(&[32, 4, 48], &[32, 8, 24]),
            "[i0:32, i1:4, i2:2, i3:24] lhs[i0, i1, 24*i2 + i3] <- rhs0[i0, 2*i1 + i2, i3]"
        );
        // Axes of 1 are position 0.
        assert_eq!(proj(&[6, 1], &[1, 2, 3]), "[i0:2, i1:3] lhs[3*i0 + i1, 0] <- rhs0[0, i0, i1]");
    }

    #[test]
    fn regrouping_across_boundaries_is_refused_and_empty_tensors_loop_zero_times() {
        assert!(proj(&[4, 6], &[6, 4]).starts_with("it regroups cells across axis boundaries"));
        assert_eq!(proj(&[0, 3], &[3, 0]), "[i0:0] lhs[i0, i0] <- rhs0[i0, i0]");
    }
}

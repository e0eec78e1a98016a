//! The operations of the tensor graph, grouped by kind. Each one defines its shape logic,
//! forward assignment and gradient side by side (see [`crate::op::Op`]).

pub mod attention;
pub mod contract;
pub mod gather;
pub mod layout;
pub mod pointwise;
pub mod reshape;

use rocannl_arrayjit::indexing::{AxisIndex, Symbol};

use crate::op::OpCtx;

/// The runtime size of the result's first axis when it is a dynamic batch (for the operations
/// whose assignments take it as a limit rather than through projections).
pub(crate) fn batch_limit(cx: &OpCtx) -> Option<Symbol> {
    let p = cx.proj.first()?;
    let AxisIndex::Iterator(first) = p.project_lhs.first()? else { return None };
    p.dynamic.iter().find(|(it, _)| it == first).map(|(_, size)| *size)
}

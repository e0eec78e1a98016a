//! The operations of the tensor graph, grouped by kind. Each one defines its shape logic,
//! forward assignment and gradient side by side (see [`crate::op::Op`]).

pub mod attention;
pub mod contract;
pub mod layout;
pub mod pointwise;
pub mod reshape;

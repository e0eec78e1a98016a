//! `rocannl-tensor`: differentiable tensors built on inferred shapes and compiled assignments.

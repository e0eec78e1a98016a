//! Graphs that are valid but probably not what their author meant, found after inference and
//! reported as warnings ([`crate::Graph::warnings`]) that name the user's tensors.
//!
//! Broadcasting makes a pointwise operation accept arguments of different shapes: the result
//! takes every axis either argument has. That is what a bias wants (`x + b`, `b` with fewer
//! axes), but when the *param* is the one with an axis the other argument lacks, every cell of
//! the activations is combined with every slice of the param along that axis, and the result
//! carries the axis on. A position table declared like a token table — `|T->C` instead of a
//! batch row of `T` positions — added to token embeddings `B,T|->C` gives every activation
//! after it an extra input axis of `T`; the model still trains, as a different model, with no
//! error anywhere. The warning shows both shapes and says how to declare a table of positions.
//!
//! A warning only returned by a getter is one nobody reads, so [`Graph::finish`] prints each
//! new one to standard error by default, as Python's `warnings` module does; a program can
//! collect them silently instead, or deny them, making them errors (for tests and CI).

use crate::error::{Error, Result};
use crate::graph::{Graph, Leaf, Rows, Source, Tensor, Warnings};

impl Graph {
    /// Sets what [`Graph::finish`] does with warnings ([`Warnings`]).
    pub fn set_warnings(&self, policy: Warnings) {
        self.borrow_mut().warnings.policy = policy;
    }

    /// Applies the warning policy to the current warnings (called by `finish`).
    pub(crate) fn report_warnings(&self) -> Result<()> {
        let policy = self.borrow().warnings.policy;
        if policy == Warnings::Collect {
            return Ok(());
        }
        let all = self.warnings();
        if policy == Warnings::Deny && !all.is_empty() {
            return Err(Error::Warnings(all));
        }
        let mut g = self.borrow_mut();
        for w in all {
            if !g.warnings.printed.contains(&w) {
                eprintln!("rocannl warning: {w}");
                g.warnings.printed.insert(w);
            }
        }
        Ok(())
    }
}

impl Graph {
    /// A warning for each pointwise operation whose result gets a row's axes from a param
    /// that the other argument, an activation or data, does not have in that row.
    pub(crate) fn pointwise_param_axes(&self) -> Vec<String> {
        let mut out = Vec::new();
        for i in 0..self.len() {
            let t = self.tensor(crate::TensorId(i as u32));
            let info = t.info();
            let Source::Op { op, args } = &info.source else { continue };
            if !op.pointwise() || args.len() != 2 {
                continue;
            }
            let (a, b) = (self.tensor(args[0]), self.tensor(args[1]));
            for (param, other) in [(&a, &b), (&b, &a)] {
                if let Some(w) = param_axes_warning(&t, &op.name(), param, other) {
                    out.push(w);
                }
            }
        }
        out
    }
}

/// Whether `t` carries values of the model's inputs: data or an operation's result (a number,
/// a constant or a param broadcast by a param is nothing to warn about).
fn is_activation(t: &Tensor) -> bool {
    matches!(t.info().source, Source::Op { .. } | Source::Leaf(Leaf::Data(_)))
}

/// The warning for `param` giving `result` axes `other` does not have, if it does.
fn param_axes_warning(result: &Tensor, op: &str, param: &Tensor, other: &Tensor) -> Option<String> {
    if !param.is_param() || !is_activation(other) {
        return None;
    }
    let (p, o) = (param.rows().ok()?, other.rows().ok()?);
    let extra = |name: &'static str, p: &[usize], o: &[usize]| {
        (p.len() > o.len()).then(|| (name, p[..p.len() - o.len()].to_vec()))
    };
    let (row, axes) = extra("input", &p.input, &o.input)
        .or_else(|| extra("output", &p.output, &o.output))
        .or_else(|| extra("batch", &p.batch, &o.batch))?;
    Some(format!(
        "{op} '{}' combines param '{}' {} with '{}' {}: the result {} gets {row} axes {axes:?} \
         that only '{}' has, so each cell of '{}' meets every slice of '{}' along them. {}",
        result.label(),
        param.label(),
        param.shape_string(),
        other.label(),
        other.shape_string(),
        result.shape_string(),
        param.label(),
        other.label(),
        param.label(),
        hint(row, &p)
    ))
}

/// How to say what was probably meant.
fn hint(row: &str, p: &Rows) -> String {
    if row == "input" {
        format!(
            "If it holds one row per position, declare the positions as its batch row: \
             ParamSpec::new(Axes::new().batch(&{:?}).input(&[]).output(&{:?})).",
            p.input, p.output
        )
    } else {
        "If the param should follow the other argument's shape, leave that row inferred."
            .to_string()
    }
}

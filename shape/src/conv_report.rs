//! Convolution axes in messages, named as the user wrote them.
//!
//! The solver sees a convolution axis as `stride*output + dilation*kernel` over variables, and by
//! the time a size fails, a part may already be replaced by its value (`2*t+3`). A user wrote
//! `2*t+k` in an einsum spec and knows neither the solver's variables nor which of the spec's
//! axes the solver means. So messages about a convolution axis are rewritten here: the axis as
//! written in the spec, its stride, and its kernel (label and size). Two cases reach this
//! module: a convolution axis whose size has no solution (an error), and one whose output and
//! kernel were both still open when closing began (a warning, an error in strict mode:
//! closing chose the split, and a different split was as consistent with everything the graph
//! said).

use crate::dim::{ConvDim, Dim};
use crate::inference::{Inference, Warning};
use crate::logic::Logic;
use crate::row::Kind;
use crate::solve::OpenConv;
use crate::spec::{AxisSpec, EinsumSpec};
use crate::var::StepId;

/// A convolution axis of an einsum spec, as written.
struct Written<'s> {
    /// The spec.
    spec: &'s EinsumSpec,
    /// The row kind the axis is in.
    kind: Kind,
    /// The output label.
    output: &'s str,
    /// The kernel label, if the axis has a kernel.
    kernel: Option<&'s str>,
    /// The axis' text (`2*t+k`).
    text: String,
}

impl Inference {
    /// The label an (unsolved) dimension stands for, if it is an einsum label's variable.
    fn label_of(&self, d: &Dim) -> Option<&str> {
        match d {
            Dim::Var(v) => self.label_names.get(v.0 as usize)?.as_deref(),
            _ => None,
        }
    }

    /// The spec axis among `steps`' einsum specs that is `c`: same stride, dilation and kernel
    /// presence, and the same output (or kernel) label when those are still variables.
    fn written_conv(&self, c: &ConvDim, steps: &[StepId]) -> Option<Written<'_>> {
        let (out_label, kernel_label) = (self.label_of(&c.output), self.label_of(&c.kernel));
        let mut fallback = None;
        for s in steps {
            let Some(Logic::Einsum(spec, _)) = self.steps.get(s.0 as usize).map(|st| &st.logic)
            else {
                continue;
            };
            for pattern in spec.operands.iter().chain(std::iter::once(&spec.result)) {
                for (kind, row) in Kind::ALL.into_iter().zip(pattern.rows()) {
                    for axis in row.axes() {
                        let AxisSpec::Conv { stride, output, dilation, kernel } = axis else {
                            continue;
                        };
                        let dilation = if kernel.is_some() { *dilation } else { 0 };
                        if *stride != c.stride || dilation != c.dilation {
                            continue;
                        }
                        let w = Written {
                            spec,
                            kind,
                            output,
                            kernel: kernel.as_deref(),
                            text: axis.to_string(),
                        };
                        let named = out_label == Some(output.as_str())
                            || (kernel_label.is_some() && kernel_label == kernel.as_deref());
                        if named {
                            return Some(w);
                        }
                        fallback.get_or_insert(w);
                    }
                }
            }
        }
        fallback
    }

    /// `message` about the convolution axis `c` (shown as the solver prints it), rewritten to
    /// name it as written: `convolution 2*t+k (stride 2, kernel k = 3) of einsum "…"`, with the
    /// output label in the arithmetic (`8 = 2*(t-1) + 3`). Unchanged when the axis is not
    /// found in the steps' specs.
    pub(crate) fn name_conv(&self, message: &str, c: &ConvDim, steps: &[StepId]) -> String {
        let shown = format!("convolution axis {}", Dim::Conv(std::sync::Arc::new(c.clone())));
        match (self.written_conv(c, steps), self.describe_conv(c, steps)) {
            (Some(w), Some(written)) => message
                .replacen(&shown, &written, 1)
                .replace("*(output-1)", &format!("*({}-1)", w.output)),
            _ => message.to_string(),
        }
    }

    /// `convolution 2*t+k (stride 2, kernel k = 3) of einsum "…"`, or `None` when the axis is
    /// not found in the steps' specs.
    fn describe_conv(&self, c: &ConvDim, steps: &[StepId]) -> Option<String> {
        let w = self.written_conv(c, steps)?;
        let kernel = match (w.kernel, self.solver.env.subst_dim(&c.kernel).size()) {
            (None, _) => "no kernel".to_string(),
            (Some(k), Some(size)) => format!("kernel {k} = {size}"),
            (Some(k), None) => format!("kernel {k} not known"),
        };
        Some(format!(
            "convolution {} (stride {}, {kernel}) of einsum \"{}\"",
            w.text, c.stride, w.spec.text
        ))
    }

    /// The warnings for convolution axes whose split into output and kernel only closing chose.
    pub(crate) fn conv_warnings(&self) -> Vec<Warning> {
        // Each derivation of a step (the online one and the second pass) has its own axis.
        let mut out: Vec<Warning> = Vec::new();
        for w in self.solver.open_convs.iter().filter_map(|o| self.conv_warning(o)) {
            if !out.iter().any(|o| o.message == w.message) {
                out.push(w);
            }
        }
        out
    }

    fn conv_warning(&self, o: &OpenConv) -> Option<Warning> {
        let env = &self.solver.env;
        let (out, kernel) = (env.subst_dim(&o.conv.output), env.subst_dim(&o.conv.kernel));
        let (out, kernel) = (out.size()?, kernel.size()?);
        let steps = o.origin.steps();
        let w = self.written_conv(&o.conv, steps)?;
        let k = w.kernel.unwrap_or("kernel");
        let name = steps
            .iter()
            .find_map(|s| self.steps.get(s.0 as usize))
            .map(|st| self.shape(st.shape).debug_name.clone())
            .unwrap_or_default();
        let message = format!(
            "einsum \"{}\" ('{name}'): its convolution {} (stride {}) over {} positions does not \
             determine its output {} and its kernel {k}; closing chose {} = {out}, {k} = {kernel}. \
             Give the kernel's size (e.g. a weight with that many positions) or the output's",
            w.spec.text, w.text, o.conv.stride, o.size, w.output, w.output
        );
        Some(Warning { param: name, kind: w.kind, message })
    }
}

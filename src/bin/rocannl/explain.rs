//! `rocannl explain`: shapes and loop nests for people.

use std::fmt::Write;

use rocannl::arrayjit::indexing::{AxisIndex, Projections};
use rocannl::tensor::{Result, Tensor};

use rocannl::document::build::Built;

fn idx(ix: &[AxisIndex]) -> String {
    ix.iter().map(|i| i.to_string()).collect::<Vec<_>>().join(", ")
}

fn loop_nest(out: &mut String, t: &Tensor, args: &[Tensor], p: &Projections) {
    let mut depth = 1;
    for (s, d) in p.product_iterators.iter().zip(&p.product_space) {
        let _ = writeln!(out, "{}for {s} in 0..{d}:", "  ".repeat(depth));
        depth += 1;
    }
    let reads: Vec<String> = args
        .iter()
        .zip(&p.project_rhs)
        .map(|(a, ix)| format!("{}[{}]", a.label(), idx(ix)))
        .collect();
    let accum = if p.is_injective() { "=" } else { "+=" };
    let _ = writeln!(
        out,
        "{}{}[{}] {accum} {}({})",
        "  ".repeat(depth),
        t.label(),
        idx(&p.project_lhs),
        t.op_name().unwrap_or_default(),
        reads.join(", ")
    );
}

/// The text of `rocannl explain`.
pub fn explain(built: &Built) -> Result<String> {
    let mut out = String::new();
    let g = &built.graph;
    for i in 0..g.len() {
        let t = g.tensor(rocannl::tensor::TensorId(i as u32));
        let op = t
            .op_name()
            .unwrap_or_else(|| if t.is_param() { "param".into() } else { "leaf".into() });
        let _ = writeln!(out, "{}: {op}  shape {}", t.label(), t.shape_string());
        let args = t.args();
        let projections = rocannl::tensor::advanced::projections(&t)?;
        for (n, p) in projections.iter().enumerate() {
            let part: Vec<Tensor> =
                if projections.len() > 1 { vec![args[n].clone()] } else { args.clone() };
            loop_nest(&mut out, &t, &part, p);
        }
    }
    for w in g.warnings() {
        let _ = writeln!(out, "warning: {w}");
    }
    Ok(out)
}

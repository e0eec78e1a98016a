//! The model suite's ratios as a picture (docs/benchmarks.md, "The model suite"): for each
//! model, PyTorch eager's and `torch.compile`'s step time over rocannl's, as horizontal bars
//! with the line of parity at 1 — past it rocannl is faster.
//!
//! ```text
//! python3 scripts/suite_compare.py --out eager.json ...      # one or more result files
//! cargo run --release --example suite_plot -- docs/suite_ratios.svg eager.json [compile.json]
//! ```
//!
//! Each side's ratio of a model comes from the first file that has it, in the order given (so
//! the file with the most rounds goes first). Drawn with `plotters`' SVG backend.

use plotters::prelude::*;
use serde_json::Value;

/// One model's ratios: (side, PyTorch's time over rocannl's).
struct Row {
    model: String,
    ratios: Vec<(String, f64)>,
}

/// The sides as the result files name them, their legend and colour.
const SIDES: [(&str, &str, RGBColor); 3] = [
    ("torch", "PyTorch eager", RGBColor(31, 119, 180)),
    ("torch.compile", "torch.compile", RGBColor(255, 127, 14)),
    ("jax", "JAX (jit)", RGBColor(44, 160, 44)),
];

fn main() {
    if let Err(e) = run() {
        eprintln!("error: {e}");
        std::process::exit(1);
    }
}

fn run() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let (out, files) = args
        .split_first()
        .filter(|(_, f)| !f.is_empty())
        .ok_or("usage: suite_plot OUT.svg RESULTS.json [MORE.json ...]")?;
    let mut rows: Vec<Row> = Vec::new();
    let mut cpu = String::new();
    for f in files {
        let v: Value =
            serde_json::from_str(&std::fs::read_to_string(f).map_err(|e| format!("{f}: {e}"))?)?;
        if cpu.is_empty() {
            cpu = v["cpu"].as_str().unwrap_or("unknown CPU").to_string();
        }
        merge(&mut rows, &v);
    }
    if rows.is_empty() {
        return Err("the result files hold no model".into());
    }
    draw(out, &format!("model suite: each framework's step time / rocannl's ({cpu})"), &rows)?;
    println!("{out}: {} models", rows.len());
    Ok(())
}

/// Adds the ratios of a result file's table that `rows` does not have yet.
fn merge(rows: &mut Vec<Row>, v: &Value) {
    for r in v["table"].as_array().into_iter().flatten() {
        let Some(model) = r["model"].as_str() else { continue };
        let at = match rows.iter().position(|x| x.model == model) {
            Some(i) => i,
            None => {
                rows.push(Row { model: model.to_string(), ratios: vec![] });
                rows.len() - 1
            }
        };
        for (side, _, _) in SIDES {
            let have = rows[at].ratios.iter().any(|(s, _)| s == side);
            if let (false, Some(x)) = (have, r["ratio"][side].as_f64()) {
                rows[at].ratios.push((side.to_string(), x));
            }
        }
    }
}

fn draw(out: &str, title: &str, rows: &[Row]) -> Result<(), Box<dyn std::error::Error>> {
    let height = 90 + 34 * rows.len() as u32;
    let root = SVGBackend::new(out, (900, height)).into_drawing_area();
    root.fill(&WHITE)?;
    let n = rows.len() as f64;
    // A linear axis from 0 to the largest ratio, rounded up to a half.
    let most = rows.iter().flat_map(|r| r.ratios.iter().map(|(_, x)| *x)).fold(1.0, f64::max);
    let top = (most * 2.0).ceil() / 2.0 + 0.25;
    let mut chart = ChartBuilder::on(&root)
        .caption(title, ("sans-serif", 16))
        .margin(14)
        .x_label_area_size(30)
        .y_label_area_size(190)
        .build_cartesian_2d(0f64..top, -0.5f64..n - 0.5)?;
    let labels: Vec<String> = rows.iter().map(|r| r.model.clone()).collect();
    chart
        .configure_mesh()
        .disable_y_mesh()
        .y_labels(rows.len())
        .y_label_formatter(&|y| {
            let i = y.round();
            if (y - i).abs() > 1e-6 || i < 0.0 {
                String::new()
            } else {
                labels.get(labels.len() - 1 - i as usize).cloned().unwrap_or_default()
            }
        })
        .x_labels((top * 2.0) as usize + 1)
        .x_label_formatter(&|x| format!("{x:.2}×"))
        .draw()?;
    for (k, (side, legend, color)) in SIDES.iter().enumerate() {
        let bars = rows.iter().enumerate().filter_map(|(i, r)| {
            let x = r.ratios.iter().find(|(s, _)| s == side)?.1;
            // The first model at the top; each side's bar in its own slot of the row.
            let slot = 0.8 / SIDES.len() as f64;
            let y = n - 1.0 - i as f64 + 0.4 - slot * (k as f64 + 0.5);
            Some(Rectangle::new([(0.0, y - 0.42 * slot), (x, y + 0.42 * slot)], color.filled()))
        });
        chart
            .draw_series(bars)?
            .label(format!("{legend}'s time / rocannl's"))
            .legend(move |(x, y)| Rectangle::new([(x, y - 5), (x + 12, y + 5)], color.filled()));
    }
    chart.draw_series([PathElement::new(
        vec![(1.0, -0.5), (1.0, n - 0.5)],
        BLACK.stroke_width(2),
    )])?;
    chart.configure_series_labels().background_style(WHITE.mix(0.8)).border_style(BLACK).draw()?;
    root.present()?;
    Ok(())
}

//! `rocannl bench --plot FILE.svg`: compile and run times per backend and optimization level,
//! drawn side by side.
//!
//! People choosing or tuning a backend compare two costs that differ by orders of magnitude —
//! seconds of compiling against microseconds per run — so each gets its own panel on a
//! logarithmic axis: on the left the cold compile (empty cache) and the warm one (served by
//! the cache) per configuration, on the right the median run with its fastest and slowest
//! repetition. Drawn with `plotters`' SVG backend (no font files: text is left to the viewer).

use std::path::Path;

use plotters::prelude::*;

use rocannl::document::doc::{CliError, ErrorKind};

/// One configuration's figures, in seconds.
pub struct Bar {
    /// `interp`, `gccjit -O3`, …
    pub label: String,
    pub cold_s: f64,
    pub warm_s: Option<f64>,
    pub run_median_s: f64,
    pub run_min_s: f64,
    pub run_max_s: f64,
}

const COLD: RGBColor = RGBColor(31, 119, 180);
const WARM: RGBColor = RGBColor(255, 127, 14);
const RUN: RGBColor = RGBColor(44, 160, 44);

fn failed(path: &Path, e: impl std::fmt::Display) -> CliError {
    CliError { kind: ErrorKind::Input, message: format!("cannot draw {}: {e}", path.display()) }
}

/// The range of a logarithmic axis holding every value, widened to whole decades.
fn decades(values: impl Iterator<Item = f64>) -> std::ops::Range<f64> {
    let (lo, hi) = values
        .filter(|v| *v > 0.0 && v.is_finite())
        .fold((f64::INFINITY, 0.0f64), |(lo, hi), v| (lo.min(v), hi.max(v)));
    if lo > hi {
        return 1e-6..1.0;
    }
    10f64.powf(lo.log10().floor())..10f64.powf(hi.log10().ceil().max(lo.log10().floor() + 1.0))
}

/// Writes the two panels to `path` (an SVG file), with `title` above them.
pub fn write(path: &Path, title: &str, bars: &[Bar]) -> Result<(), CliError> {
    let width = 260 + 120 * bars.len() as u32;
    let root = SVGBackend::new(path, (2 * width, 440)).into_drawing_area();
    root.fill(&WHITE).map_err(|e| failed(path, e))?;
    let root = root.titled(title, ("sans-serif", 18)).map_err(|e| failed(path, e))?;
    let (left, right) = root.split_horizontally(width);
    let labels: Vec<String> = bars.iter().map(|b| b.label.clone()).collect();

    // Compile: cold and warm bars per configuration.
    let range = decades(bars.iter().flat_map(|b| [Some(b.cold_s), b.warm_s]).flatten());
    let floor = range.start;
    let mut chart = panel(&left, "compile (s): cold | warm", range, &labels, path)?;
    for (i, b) in bars.iter().enumerate() {
        let x = i as f64;
        let mut rects =
            vec![Rectangle::new([(x - 0.4, floor), (x - 0.02, b.cold_s)], COLD.filled())];
        if let Some(w) = b.warm_s {
            rects.push(Rectangle::new([(x + 0.02, floor), (x + 0.4, w)], WARM.filled()));
        }
        chart.draw_series(rects).map_err(|e| failed(path, e))?;
    }

    // Run: the median, with a line from the fastest to the slowest repetition.
    let range = decades(bars.iter().flat_map(|b| [b.run_min_s, b.run_max_s]));
    let floor = range.start;
    let mut chart = panel(&right, "run (s): median, min to max", range, &labels, path)?;
    for (i, b) in bars.iter().enumerate() {
        let x = i as f64;
        let bar = Rectangle::new([(x - 0.25, floor), (x + 0.25, b.run_median_s)], RUN.filled());
        chart.draw_series([bar]).map_err(|e| failed(path, e))?;
        let spread =
            PathElement::new(vec![(x, b.run_min_s), (x, b.run_max_s)], BLACK.stroke_width(2));
        chart.draw_series([spread]).map_err(|e| failed(path, e))?;
    }
    root.present().map_err(|e| failed(path, e))
}

type Panel<'a> = ChartContext<
    'a,
    SVGBackend<'a>,
    Cartesian2d<
        plotters::coord::types::RangedCoordf64,
        plotters::coord::combinators::LogCoord<f64>,
    >,
>;

/// One panel: configurations along x (each at a whole number), `range` on a log scale.
fn panel<'a>(
    area: &DrawingArea<SVGBackend<'a>, plotters::coord::Shift>,
    caption: &str,
    range: std::ops::Range<f64>,
    labels: &[String],
    path: &Path,
) -> Result<Panel<'a>, CliError> {
    let n = labels.len();
    let mut chart = ChartBuilder::on(area)
        .caption(caption, ("sans-serif", 15))
        .margin(12)
        .x_label_area_size(36)
        .y_label_area_size(64)
        .build_cartesian_2d(-0.5f64..n as f64 - 0.5, range.log_scale())
        .map_err(|e| failed(path, e))?;
    chart
        .configure_mesh()
        .disable_x_mesh()
        .x_labels(n.max(1))
        .x_label_formatter(&|x| label_at(labels, *x))
        .y_label_formatter(&|y| format!("{y:.0e}"))
        .draw()
        .map_err(|e| failed(path, e))?;
    Ok(chart)
}

/// The label of configuration `x` (each sits at a whole number; other ticks stay unlabelled).
fn label_at(labels: &[String], x: f64) -> String {
    let i = x.round();
    if (x - i).abs() > 1e-6 || i < 0.0 {
        return String::new();
    }
    labels.get(i as usize).cloned().unwrap_or_default()
}

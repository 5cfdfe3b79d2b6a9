//! The picture of a run: for each side, its latency and goodput second by second, the
//! fault's window shaded. Drawn from the per-second series in `timeseries.json` (all a
//! published run keeps, so `cargo xtask chart DIR` draws it again), as an SVG by plotters,
//! whose SVG backend needs no fonts and no C.

use std::path::Path;

use anyhow::Context as _;
use plotters::coord::Shift;
use plotters::coord::types::RangedCoordf64;
use plotters::prelude::*;
use serde::{Deserialize, Serialize};

use crate::run::ModeRun;
use crate::scenario::Load;
use crate::stats::Second;
use crate::summary::Summary;

/// One run's series, as `timeseries.json` keeps it: its side (`mode`), its repeat
/// (0-based), and arrivals, goodput and latency per second of arrivals.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Series {
    pub mode: String,
    pub repeat: usize,
    /// When the fault was on, in seconds since the load started (the link cut, for
    /// `partition`); `None` for a run without one.
    pub fault: Option<[f64; 2]>,
    pub seconds: Vec<Second>,
}

impl Series {
    /// The series of `run` under `load`.
    pub fn of(run: &ModeRun, load: &Load) -> Self {
        Self {
            mode: run.mode.clone(),
            repeat: run.repeat,
            fault: fault_window(load, run),
            seconds: run.seconds.clone(),
        }
    }
}

/// When the fault of `run` was on: the link's cut, else the catalog's (or pricing's)
/// fault from its start (or the load's) to its removal (or the load's end).
fn fault_window(load: &Load, run: &ModeRun) -> Option<[f64; 2]> {
    if run.partition_at.is_some() {
        return run.partition_at;
    }
    if load.fault.is_none() && load.pricing_fault.is_none() {
        return None;
    }
    let from = load.fault_from.map_or(0.0, |d| d.as_secs_f64());
    let until = run
        .fault_removed_at
        .or(load.fault_removed_after.map(|d| d.as_secs_f64()))
        .unwrap_or(load.duration.as_secs_f64());
    Some([from, until])
}

/// The colours of the two sides, in table order (the one without the technique warm),
/// of the fault's window and of the budget's line.
const COLOURS: [RGBColor; 2] = [RGBColor(214, 69, 65), RGBColor(38, 110, 196)];
const FAULT: RGBColor = RGBColor(253, 238, 204);
const BUDGET: RGBColor = RGBColor(110, 110, 110);

/// Draws the first repeat of each side as an SVG: latency above, goodput below.
pub fn svg(summary: &Summary, series: &[Series]) -> anyhow::Result<String> {
    let budget_ms = summary.load["budget_ms"].as_f64().unwrap_or(0.0);
    let first: Vec<&Series> = summary
        .sides
        .iter()
        .filter_map(|side| series.iter().find(|s| &s.mode == side && s.repeat == 0))
        .collect();
    anyhow::ensure!(!first.is_empty(), "no run of {:?} to draw", summary.sides);
    let seconds = |s: &&Series| s.seconds.len() as f64;
    let x_max = first.iter().map(seconds).fold(1.0, f64::max);
    let top = |f: fn(&Second) -> f64| {
        first
            .iter()
            .flat_map(|s| s.seconds.iter().map(f))
            .fold(1.0, f64::max)
            * 1.1
    };
    let latency_max = top(|s| s.p99_ms).max(budget_ms * 1.2);
    let goodput_max = top(|s| s.good as f64);
    let fault = first.iter().find_map(|s| s.fault);

    let mut out = String::new();
    {
        let root = SVGBackend::with_string(&mut out, (900, 640)).into_drawing_area();
        root.fill(&WHITE).map_err(draw)?;
        let title = format!(
            "{}: {} against {} (first run of each; the fault's window shaded)",
            summary.scenario, summary.sides[0], summary.sides[1]
        );
        let root = root.titled(&title, ("sans-serif", 18)).map_err(draw)?;
        let (upper, lower) = root.split_vertically(330);
        let mut chart = panel(
            &upper,
            "latency per second of arrivals, ms",
            x_max,
            latency_max,
        )?;
        shade(&mut chart, fault, latency_max)?;
        let budget = [(0.0, budget_ms), (x_max, budget_ms)];
        chart
            .draw_series(DashedLineSeries::new(budget, 6, 4, BUDGET.stroke_width(1)))
            .map_err(draw)?
            .label(format!("budget, {budget_ms} ms"))
            .legend(|(x, y)| PathElement::new([(x, y), (x + 16, y)], BUDGET));
        for (s, colour) in first.iter().zip(COLOURS) {
            line(&mut chart, s, colour.stroke_width(2), "p99", |s| s.p99_ms)?;
            if s.seconds.iter().any(|s| s.p50_ms > 0.0) {
                line(&mut chart, s, colour.mix(0.5).stroke_width(2), "p50", |s| {
                    s.p50_ms
                })?;
            }
        }
        legend(&mut chart)?;
        let mut chart = panel(
            &lower,
            "goodput: orders created within the budget, per second of arrivals",
            x_max,
            goodput_max,
        )?;
        shade(&mut chart, fault, goodput_max)?;
        for (s, colour) in first.iter().zip(COLOURS) {
            line(&mut chart, s, colour.stroke_width(2), "goodput", |s| {
                s.good as f64
            })?;
        }
        legend(&mut chart)?;
        root.present().map_err(draw)?;
    }
    Ok(out)
}

/// Writes `chart.svg` beside the `timeseries.json` and `summary.json` of `dir`.
pub fn write(dir: &Path) -> anyhow::Result<()> {
    let read = |name: &str| {
        let path = dir.join(name);
        std::fs::read_to_string(&path).with_context(|| format!("cannot read {}", path.display()))
    };
    let summary: Summary = serde_json::from_str(&read("summary.json")?)?;
    let series: Vec<Series> =
        serde_json::from_str(&read("timeseries.json")?).context("timeseries.json")?;
    std::fs::write(dir.join("chart.svg"), svg(&summary, &series)?)?;
    Ok(())
}

type Chart<'a, DB> = ChartContext<'a, DB, Cartesian2d<RangedCoordf64, RangedCoordf64>>;

fn panel<'a, DB: DrawingBackend>(
    area: &'a DrawingArea<DB, Shift>,
    caption: &str,
    x_max: f64,
    y_max: f64,
) -> anyhow::Result<Chart<'a, DB>> {
    let mut chart = ChartBuilder::on(area)
        .caption(caption, ("sans-serif", 15))
        .margin(12)
        .x_label_area_size(32)
        .y_label_area_size(48)
        .build_cartesian_2d(0.0..x_max, 0.0..y_max)
        .map_err(draw)?;
    chart
        .configure_mesh()
        .light_line_style(WHITE)
        .x_desc("seconds since the load started")
        .x_label_formatter(&|x| format!("{x:.0}"))
        .y_label_formatter(&|y| format!("{y:.0}"))
        .draw()
        .map_err(draw)?;
    Ok(chart)
}

fn shade<DB: DrawingBackend>(
    chart: &mut Chart<'_, DB>,
    fault: Option<[f64; 2]>,
    y_max: f64,
) -> anyhow::Result<()> {
    if let Some([from, until]) = fault {
        let window = Rectangle::new([(from, 0.0), (until, y_max)], FAULT.filled());
        chart
            .draw_series([window])
            .map_err(draw)?
            .label("fault")
            .legend(|(x, y)| Rectangle::new([(x, y - 5), (x + 16, y + 5)], FAULT.filled()));
    }
    Ok(())
}

/// One side's figure, plotted at the middle of each second; a last second the load
/// ended early in (under half the arrivals of the one before) is left out.
fn line<DB: DrawingBackend>(
    chart: &mut Chart<'_, DB>,
    series: &Series,
    style: ShapeStyle,
    what: &str,
    figure: fn(&Second) -> f64,
) -> anyhow::Result<()> {
    let mut seconds = series.seconds.as_slice();
    if let [.., before, last] = seconds
        && last.arrivals * 2 < before.arrivals
    {
        seconds = &seconds[..seconds.len() - 1];
    }
    let points = seconds
        .iter()
        .filter(|s| s.arrivals > 0)
        .map(|s| (s.t as f64 + 0.5, figure(s)));
    chart
        .draw_series(LineSeries::new(points, style))
        .map_err(draw)?
        .label(format!("{} {what}", series.mode))
        .legend(move |(x, y)| PathElement::new([(x, y), (x + 16, y)], style));
    Ok(())
}

fn legend<'a, DB: DrawingBackend + 'a>(chart: &mut Chart<'a, DB>) -> anyhow::Result<()> {
    chart
        .configure_series_labels()
        .position(SeriesLabelPosition::UpperRight)
        .background_style(WHITE.mix(0.85))
        .border_style(BLACK)
        .draw()
        .map_err(draw)
}

fn draw(err: impl std::fmt::Display) -> anyhow::Error {
    anyhow::anyhow!("drawing the chart: {err}")
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::scenario::Scenario;

    fn second(t: u64, good: u64, p99_ms: f64) -> Second {
        Second {
            t,
            arrivals: 150,
            good,
            p50_ms: p99_ms / 2.0,
            p99_ms,
        }
    }

    #[test]
    fn the_fault_window_is_the_cut_or_the_fault_on_the_load() {
        let load = Scenario::Goodput.load(Some(std::time::Duration::from_secs(20)), 700);
        let run = ModeRun::default();
        assert_eq!(fault_window(&load, &run), Some([0.0, 20.0]));
        let cut = ModeRun {
            partition_at: Some([5.0, 25.0]),
            ..ModeRun::default()
        };
        assert_eq!(fault_window(&load, &cut), Some([5.0, 25.0]));
        let happy = Scenario::Happy.load(None, 700);
        assert_eq!(fault_window(&happy, &run), None);
        let outage = Scenario::Outage.load(Some(std::time::Duration::from_secs(30)), 700);
        assert_eq!(fault_window(&outage, &run), Some([10.0, 20.0]));
    }

    #[test]
    fn draws_each_side_and_the_fault() {
        let published = crate::stack::workspace().join("docs/results/goodput/summary.json");
        let summary: Summary =
            serde_json::from_str(&std::fs::read_to_string(published).unwrap()).unwrap();
        let series = |mode: &str, good, p99| Series {
            mode: mode.into(),
            repeat: 0,
            fault: Some([0.0, 3.0]),
            seconds: (0..3).map(|t| second(t, good, p99)).collect(),
        };
        let svg = svg(
            &summary,
            &[series("legacy", 5, 1700.0), series("propagate", 80, 690.0)],
        )
        .unwrap();
        assert!(svg.starts_with("<svg"), "{svg}");
        for label in [
            "legacy p99",
            "propagate p50",
            "propagate goodput",
            "fault",
            "budget",
        ] {
            assert!(svg.contains(label), "no {label:?} in the chart");
        }
        assert!(svg.matches("<polyline").count() >= 7, "{svg}");
        let none: &[Series] = &[];
        assert!(super::svg(&summary, none).is_err());
    }

    #[test]
    fn timeseries_round_trips() {
        let series = Series {
            mode: "legacy".into(),
            repeat: 1,
            fault: None,
            seconds: vec![second(0, 1, 2.0)],
        };
        let json = serde_json::to_string(&[&series]).unwrap();
        let back: Vec<Series> = serde_json::from_str(&json).unwrap();
        assert_eq!(back, [series]);
    }
}

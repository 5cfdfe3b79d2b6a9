//! The chart of one scenario: legacy and propagate over time, one panel per question.
//!
//! plotters' SVG backend writes `<text>` elements and, with no font feature enabled,
//! measures text with its built-in estimate: no system fonts are needed to draw, and
//! the viewer's browser renders the labels.

use std::path::Path;

use anyhow::Context as _;
use plotters::prelude::*;

use crate::diagnosis::SATURATED_BUSY_RATIO;
use crate::run::ModeRun;
use crate::sampler::{Runtime, Sample};
use crate::summary::Summary;

const LEGACY: RGBColor = RGBColor(0xd6, 0x27, 0x28);
const PROPAGATE: RGBColor = RGBColor(0x1f, 0x77, 0xb4);
const LIMIT: RGBColor = RGBColor(0x55, 0x55, 0x55);

/// One mode's line in a panel: its points, colour and name.
type Line<'a> = (Vec<(f64, f64)>, RGBColor, &'a str);

/// One panel: a title, a value per point in time, and an optional limit line.
struct Panel {
    title: &'static str,
    series: fn(&ModeRun) -> Vec<(f64, f64)>,
    limit: Option<(f64, &'static str)>,
}

fn panels(summary: &Summary) -> Vec<Panel> {
    let budget = summary.load["budget_ms"].as_f64().unwrap_or(700.0);
    vec![
        Panel {
            title: "goodput: orders created within the budget, per second of arrivals",
            series: |r| {
                r.seconds
                    .iter()
                    .map(|s| (s.t as f64 + 0.5, s.good as f64))
                    .collect()
            },
            limit: None,
        },
        Panel {
            title: "client p99 latency per second of arrivals, ms",
            series: |r| {
                r.seconds
                    .iter()
                    .map(|s| (s.t as f64 + 0.5, s.p99_ms))
                    .collect()
            },
            limit: Some((budget, "budget")),
        },
        Panel {
            title: "catalog calls waiting for a pool slot (pending)",
            series: |r| r.samples.iter().map(|s| (s.t, s.pending)).collect(),
            limit: Some((50.0, "propagate's pending limit")),
        },
        Panel {
            title: "POST /api/orders in flight",
            series: |r| r.samples.iter().map(|s| (s.t, s.in_flight)).collect(),
            limit: None,
        },
        Panel {
            title: "orders-service resident memory, MiB",
            series: |r| r.samples.iter().map(|s| (s.t, s.rss_mib)).collect(),
            limit: None,
        },
        Panel {
            title: "write transactions of orders-service open on the server (partition)",
            series: |r| r.held.iter().map(|h| (h.t, h.writes)).collect(),
            limit: None,
        },
        Panel {
            title: "oldest of them: row locks held for, ms (partition)",
            series: |r| r.held.iter().map(|h| (h.t, h.oldest_ms)).collect(),
            limit: Some((budget, "budget")),
        },
        Panel {
            title: "orders-service tokio workers busy, share of their time (1 s windows)",
            series: |r| busy_series(r, |s| s.orders_runtime),
            limit: Some((SATURATED_BUSY_RATIO, "saturated")),
        },
        Panel {
            title: "catalog-service tokio workers busy, share of their time (1 s windows)",
            series: |r| busy_series(r, |s| s.catalog_runtime),
            limit: Some((SATURATED_BUSY_RATIO, "saturated")),
        },
    ]
}

/// The busy ratio over the last second at each runtime reading: readings 250 ms apart
/// would show the steps in which workers add their busy time.
fn busy_series(run: &ModeRun, runtime: fn(&Sample) -> Option<Runtime>) -> Vec<(f64, f64)> {
    let readings: Vec<(f64, Runtime)> = run
        .samples
        .iter()
        .filter_map(|s| runtime(s).map(|r| (s.t, r)))
        .collect();
    readings
        .iter()
        .enumerate()
        .filter_map(|(i, &(t, now))| {
            let &(t0, then) = readings[..i].iter().rev().find(|(t0, _)| t - t0 >= 1.0)?;
            let worker_seconds = (t - t0) * now.workers;
            (worker_seconds > 0.0).then(|| (t, (now.busy_s - then.busy_s) / worker_seconds))
        })
        .collect()
}

/// Draws `path` from the first run of each mode.
pub fn draw(path: &Path, summary: &Summary, runs: &[ModeRun]) -> anyhow::Result<()> {
    let first = |mode: &str| runs.iter().find(|r| r.mode == mode);
    let shown: Vec<(&ModeRun, RGBColor)> = summary
        .sides
        .iter()
        .zip([LEGACY, PROPAGATE])
        .filter_map(|(m, c)| first(m).map(|r| (r, c)))
        .collect();
    // Runs without runtime readings (older results, or the metrics off) draw no
    // runtime panels.
    let mut panels = panels(summary);
    panels.retain(|p| shown.iter().any(|(r, _)| !(p.series)(r).is_empty()));
    let root = SVGBackend::new(path, (960, 260 * panels.len() as u32 + 60)).into_drawing_area();
    root.fill(&WHITE)?;
    let title = format!(
        "{}: {} vs {} (commit {}, {} build, first run of each)",
        summary.scenario, summary.sides[0], summary.sides[1], summary.commit, summary.profile
    );
    let (header, body) = root.split_vertically(60);
    header.draw_text(
        &title,
        &("sans-serif", 18).into_text_style(&header),
        (20, 20),
    )?;
    let duration = summary.load["duration"].as_f64().unwrap_or(30.0);
    for (area, panel) in body.split_evenly((panels.len(), 1)).iter().zip(&panels) {
        draw_panel(area, panel, &shown, duration, summary)?;
    }
    root.present().context("cannot write the chart")?;
    Ok(())
}

fn draw_panel(
    area: &DrawingArea<SVGBackend<'_>, plotters::coord::Shift>,
    panel: &Panel,
    shown: &[(&ModeRun, RGBColor)],
    duration: f64,
    summary: &Summary,
) -> anyhow::Result<()> {
    let data: Vec<Line<'_>> = shown
        .iter()
        .map(|(r, c)| ((panel.series)(r), *c, r.mode.as_str()))
        .collect();
    let top = data
        .iter()
        .flat_map(|(points, _, _)| points.iter().map(|p| p.1))
        .chain(panel.limit.map(|l| l.0))
        .fold(1.0, f64::max)
        * 1.15;
    let x_end = data
        .iter()
        .flat_map(|(p, _, _)| p.iter().map(|p| p.0))
        .fold(duration, f64::max);
    let mut chart = ChartBuilder::on(area)
        .caption(panel.title, ("sans-serif", 15))
        .margin(8)
        .x_label_area_size(28)
        .y_label_area_size(56)
        .build_cartesian_2d(0.0..x_end, 0.0..top)?;
    chart
        .configure_mesh()
        .x_desc("seconds since the load started")
        .light_line_style(WHITE)
        .draw()?;
    // The fault window: the whole load, or until `recovery` removed it.
    let fault_end = shown
        .iter()
        .find_map(|(r, _)| r.fault_removed_at)
        .unwrap_or(duration);
    if summary.load["fault"].is_object() {
        chart
            .draw_series([Rectangle::new(
                [(0.0, 0.0), (fault_end, top)],
                RGBColor(0xf3, 0xe9, 0xd2).filled(),
            )])?
            .label("catalog fault on")
            .legend(|(x, y)| {
                Rectangle::new(
                    [(x, y - 5), (x + 14, y + 5)],
                    RGBColor(0xf3, 0xe9, 0xd2).filled(),
                )
            });
    }
    // The cut of the link to PostgreSQL (`partition`).
    if let Some([cut, healed]) = shown.iter().find_map(|(r, _)| r.partition_at) {
        let grey = RGBColor(0xdd, 0xdd, 0xe8);
        chart
            .draw_series([Rectangle::new([(cut, 0.0), (healed, top)], grey.filled())])?
            .label("link to PostgreSQL cut")
            .legend(move |(x, y)| Rectangle::new([(x, y - 5), (x + 14, y + 5)], grey.filled()));
    }
    if let Some((limit, label)) = panel.limit {
        chart
            .draw_series(LineSeries::new(
                [(0.0, limit), (x_end, limit)],
                LIMIT.stroke_width(1),
            ))?
            .label(label)
            .legend(|(x, y)| PathElement::new([(x, y), (x + 14, y)], LIMIT));
    }
    for (points, color, mode) in data {
        chart
            .draw_series(LineSeries::new(points, color.stroke_width(2)))?
            .label(mode)
            .legend(move |(x, y)| PathElement::new([(x, y), (x + 14, y)], color.stroke_width(2)));
    }
    chart
        .configure_series_labels()
        .background_style(WHITE.mix(0.85))
        .border_style(LIMIT)
        .position(SeriesLabelPosition::UpperRight)
        .draw()?;
    Ok(())
}

/// `--replot DIR`: redraws `DIR/chart.svg` from `DIR/summary.json` and
/// `DIR/timeseries.json`, as committed under `docs/results/`.
pub fn replot(dir: &Path) -> anyhow::Result<()> {
    let read = |name: &str| {
        std::fs::read_to_string(dir.join(name)).with_context(|| format!("{}/{name}", dir.display()))
    };
    let summary: Summary = serde_json::from_str(&read("summary.json")?)?;
    let runs: Vec<ModeRun> = serde_json::from_str(&read("timeseries.json")?)?;
    draw(&dir.join("chart.svg"), &summary, &runs)?;
    println!("redrew {}", dir.join("chart.svg").display());
    Ok(())
}

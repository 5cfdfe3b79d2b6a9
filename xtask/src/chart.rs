//! The chart of one scenario: the first run of each side over time, one panel per
//! question, drawn as plain SVG (a polyline per side on a shared time axis, the
//! fault's window shaded, a panel's limit dashed).

use std::fmt::Write as _;
use std::path::Path;

use anyhow::Context as _;

use crate::diagnosis::SATURATED_BUSY_RATIO;
use crate::run::ModeRun;
use crate::sampler::{Runtime, Sample};
use crate::summary::Summary;

/// The sides' colours, in table order; the fault's window and the cut's.
const COLOURS: [&str; 2] = ["#d62728", "#1f77b4"];
const FAULT: &str = "#f3e9d2";
const CUT: &str = "#ddddee";
/// The chart's width, a panel's height, and the plot's margins in a panel.
const WIDTH: f64 = 960.0;
const PANEL: f64 = 200.0;
const LEFT: f64 = 60.0;
const RIGHT: f64 = 20.0;

/// One panel: a title, a value per point in time, and an optional limit line.
type Panel = (
    &'static str,
    fn(&ModeRun) -> Vec<(f64, f64)>,
    Option<(f64, &'static str)>,
);

/// Every panel: values per second of arrivals (at its middle), per sample (four a
/// second) and per reading of the database (ten a second, `partition` only).
#[rustfmt::skip]
fn panels(summary: &Summary) -> Vec<Panel> {
    let budget = Some((summary.load["budget_ms"].as_f64().unwrap_or(700.0), "budget"));
    let saturated = Some((SATURATED_BUSY_RATIO, "saturated"));
    vec![
        ("goodput: orders created within the budget, per second of arrivals", |r| r.seconds.iter().map(|s| (s.t as f64 + 0.5, s.good as f64)).collect(), None),
        ("client p99 latency per second of arrivals, ms", |r| r.seconds.iter().map(|s| (s.t as f64 + 0.5, s.p99_ms)).collect(), budget),
        ("catalog calls waiting for a pool slot (pending)", |r| r.samples.iter().map(|s| (s.t, s.pending)).collect(), Some((50.0, "propagate's pending limit"))),
        ("POST /api/orders in flight", |r| r.samples.iter().map(|s| (s.t, s.in_flight)).collect(), None),
        ("orders-service resident memory, MiB", |r| r.samples.iter().map(|s| (s.t, s.rss_mib)).collect(), None),
        ("write transactions of orders-service open on the server (partition)", |r| r.held.iter().map(|h| (h.t, h.writes)).collect(), None),
        ("oldest of them: row locks held for, ms (partition)", |r| r.held.iter().map(|h| (h.t, h.oldest_ms)).collect(), budget),
        ("orders-service tokio workers busy, share of their time (1 s windows)", |r| busy_series(r, |s| s.orders_runtime), saturated),
        ("catalog-service tokio workers busy, share of their time (1 s windows)", |r| busy_series(r, |s| s.catalog_runtime), saturated),
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

/// Draws `path` from the first run of each side.
pub fn draw(path: &Path, summary: &Summary, runs: &[ModeRun]) -> anyhow::Result<()> {
    let shown: Vec<(&ModeRun, &str)> = summary
        .sides
        .iter()
        .zip(COLOURS)
        .filter_map(|(side, colour)| Some((runs.iter().find(|r| &r.mode == side)?, colour)))
        .collect();
    // Runs without runtime readings (the metrics off) draw no runtime panels.
    let mut panels = panels(summary);
    panels.retain(|p| shown.iter().any(|(r, _)| !(p.1)(r).is_empty()));
    let duration = summary.load["duration"].as_f64().unwrap_or(30.0);
    let x_end = shown
        .iter()
        .flat_map(|(r, _)| panels.iter().flat_map(|p| (p.1)(r)))
        .fold(duration, |end, (t, _)| end.max(t));
    let x = |t: f64| LEFT + t / x_end * (WIDTH - LEFT - RIGHT);
    // The fault's window (the whole load, or until it was removed) and the cut's.
    let fault_end = shown.iter().find_map(|(r, _)| r.fault_removed_at);
    let mut bands = Vec::new();
    if summary.load["fault"].is_object() {
        bands.push((
            0.0,
            fault_end.unwrap_or(duration),
            FAULT,
            "catalog fault on",
        ));
    }
    if let Some([cut, healed]) = shown.iter().find_map(|(r, _)| r.partition_at) {
        bands.push((cut, healed, CUT, "link to PostgreSQL cut"));
    }
    let height = 60.0 + PANEL * panels.len() as f64;
    let mut svg = format!(
        "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{WIDTH}\" height=\"{height}\" \
         font-family=\"sans-serif\" font-size=\"12\">\n<rect width=\"100%\" height=\"100%\" \
         fill=\"white\"/>\n<text x=\"20\" y=\"24\" font-size=\"16\">{}: {} vs {} (commit {}, \
         {} build, first run of each)</text>\n",
        summary.scenario, summary.sides[0], summary.sides[1], summary.commit, summary.profile
    );
    let legend = shown.iter().map(|(r, c)| (r.mode.as_str(), *c));
    let legend = legend.chain(bands.iter().map(|&(.., colour, label)| (label, colour)));
    for (i, (label, colour)) in legend.enumerate() {
        let left = 20.0 + 180.0 * i as f64;
        writeln!(
            svg,
            "<rect x=\"{left}\" y=\"36\" width=\"14\" height=\"10\" fill=\"{colour}\"/><text x=\"{}\" y=\"46\">{label}</text>",
            left + 18.0
        )?;
    }
    for (i, panel) in panels.iter().enumerate() {
        let (top, bottom) = (
            60.0 + PANEL * i as f64 + 24.0,
            60.0 + PANEL * (i + 1) as f64 - 24.0,
        );
        let lines: Vec<(Vec<(f64, f64)>, &str)> =
            shown.iter().map(|(r, c)| ((panel.1)(r), *c)).collect();
        let y_max = lines
            .iter()
            .flat_map(|(points, _)| points.iter().map(|p| p.1))
            .chain(panel.2.map(|l| l.0))
            .fold(1.0, f64::max)
            * 1.15;
        let y = |v: f64| bottom - v / y_max * (bottom - top);
        writeln!(
            svg,
            "<text x=\"{LEFT}\" y=\"{}\" font-size=\"14\">{}</text>",
            top - 8.0,
            panel.0
        )?;
        for &(from, to, colour, _) in &bands {
            writeln!(
                svg,
                "<rect x=\"{:.1}\" y=\"{top}\" width=\"{:.1}\" height=\"{}\" fill=\"{colour}\"/>",
                x(from),
                x(to) - x(from),
                bottom - top
            )?;
        }
        writeln!(
            svg,
            "<rect x=\"{LEFT}\" y=\"{top}\" width=\"{}\" height=\"{}\" fill=\"none\" stroke=\"#999\"/>",
            WIDTH - LEFT - RIGHT,
            bottom - top
        )?;
        writeln!(
            svg,
            "<text x=\"{}\" y=\"{}\" text-anchor=\"end\">{}</text><text x=\"{}\" y=\"{bottom}\" text-anchor=\"end\">0</text><text x=\"{}\" y=\"{}\" text-anchor=\"end\">{x_end:.0} s</text>",
            LEFT - 4.0,
            top + 10.0,
            round(y_max),
            LEFT - 4.0,
            WIDTH - RIGHT,
            bottom + 14.0
        )?;
        if let Some((limit, label)) = panel.2 {
            let (right, at) = (WIDTH - RIGHT, y(limit));
            writeln!(
                svg,
                "<line x1=\"{LEFT}\" x2=\"{right}\" y1=\"{at:.1}\" y2=\"{at:.1}\" \
                 stroke=\"#555\" stroke-dasharray=\"6 4\"/><text x=\"{}\" y=\"{:.1}\" \
                 fill=\"#555\">{label}</text>",
                LEFT + 6.0,
                at - 4.0
            )?;
        }
        for (points, colour) in lines {
            let points: Vec<String> = points
                .iter()
                .map(|&(t, v)| format!("{:.1},{:.1}", x(t), y(v)))
                .collect();
            writeln!(
                svg,
                "<polyline fill=\"none\" stroke=\"{colour}\" stroke-width=\"1.5\" points=\"{}\"/>",
                points.join(" ")
            )?;
        }
    }
    svg.push_str("</svg>\n");
    std::fs::write(path, svg).with_context(|| format!("cannot write {}", path.display()))
}

/// A value as an axis label: whole numbers from 10 up, two decimals below.
fn round(value: f64) -> String {
    if value >= 10.0 {
        format!("{value:.0}")
    } else {
        format!("{value:.2}")
    }
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

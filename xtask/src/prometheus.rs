//! A real Prometheus beside the experiment, scraping both services with the project's
//! own configuration (`prometheus/prometheus.local.yml`, only the ports and the
//! interval changed), so every dashboard query is checked against real series.

use std::path::Path;
use std::time::{Duration, Instant};

use anyhow::{Context as _, bail};
use serde_json::Value;
use test_support::ServiceProcess;
use test_support::process::free_port;

use crate::dashboards::{self, SEED_QUERY, list};
use crate::stack::{Ports, workspace};

/// A running Prometheus at its base `url`; stopped when dropped.
pub struct Prometheus {
    pub url: String,
    _process: ServiceProcess,
}

/// `prometheus.local.yml` with the services' real ports, 1 s scrape and evaluation
/// intervals, and the rule files by absolute path.
pub fn config(ports: &Ports) -> anyhow::Result<String> {
    let mut text = std::fs::read_to_string(workspace().join("prometheus/prometheus.local.yml"))?;
    let orders = format!("\"127.0.0.1:{}\"", ports.orders);
    let catalog = format!("\"127.0.0.1:{}\"", ports.catalog);
    let pricing = format!("\"127.0.0.1:{}\"", ports.pricing_admin);
    let shipping = format!("\"127.0.0.1:{}\"", ports.shipping);
    // The configuration is written to a temporary folder; the rules stay here.
    let rules = format!(
        "\"{}/rules/*.rules.yml\"",
        workspace().join("prometheus").display()
    );
    let replacements = [
        ("\"127.0.0.1:8080\"", orders.as_str()),
        ("\"127.0.0.1:8081\"", &catalog),
        ("\"127.0.0.1:9082\"", &pricing),
        ("\"127.0.0.1:8083\"", &shipping),
        ("scrape_interval: 5s", "scrape_interval: 1s"),
        ("scrape_timeout: 4s", "scrape_timeout: 1s"),
        ("evaluation_interval: 5s", "evaluation_interval: 1s"),
        ("\"rules/*.rules.yml\"", &rules),
    ];
    for (old, new) in replacements {
        anyhow::ensure!(
            text.matches(old).count() == 1,
            "prometheus.local.yml no longer has {old} once"
        );
        text = text.replace(old, new);
    }
    Ok(text)
}

impl Prometheus {
    /// Starts Prometheus (Debian's `prometheus` binary) with its data under `dir`.
    pub async fn start(ports: &Ports, dir: &Path) -> anyhow::Result<Self> {
        let (config_file, tsdb) = (dir.join("prometheus.yml"), dir.join("tsdb"));
        std::fs::create_dir_all(&tsdb)?;
        std::fs::write(&config_file, config(ports)?)?;
        let port = free_port();
        let mut command = std::process::Command::new("prometheus");
        command.arg(format!("--config.file={}", config_file.display()));
        command.arg(format!("--storage.tsdb.path={}", tsdb.display()));
        command.arg(format!("--web.listen-address=127.0.0.1:{port}"));
        let process = ServiceProcess::spawn(command, dir.join("prometheus.log"))
            .context("cannot start prometheus (Debian: apt-get install prometheus)")?;
        let url = format!("http://127.0.0.1:{port}");
        let started = Instant::now();
        while started.elapsed() < Duration::from_secs(60) {
            let ready = reqwest::get(format!("{url}/-/ready")).await;
            if ready.is_ok_and(|r| r.status().is_success()) {
                return Ok(Self {
                    url,
                    _process: process,
                });
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        bail!(
            "Prometheus was not ready within 60 s; see {}",
            dir.join("prometheus.log").display()
        )
    }

    /// Every dashboard query and the seed's return data at `at` (services up: after,
    /// their series go stale; a metric that does not exist returns none). The
    /// annotation's only with a catalog delay (`fault`); k6's only under compose.
    pub async fn check_dashboards(&self, at: f64, fault: bool) -> anyhow::Result<Vec<String>> {
        let report = dashboards::check_dir(&workspace().join("grafana/dashboards"))?;
        let mut problems = report.problems;
        let seed = dashboards::Query {
            label: "the seed's p99 query".into(),
            expr: SEED_QUERY.into(),
            during_fault: false,
        };
        let queries = report.queries.iter().chain([&seed]);
        for query in queries.filter(|q| !q.expr.contains("k6_") && (fault || !q.during_fault)) {
            // A NaN from a histogram without observations in the window is data too.
            match instant_query(&self.url, &query.expr, Some(at)).await {
                Ok(result) if !result.is_empty() => {}
                Ok(_) => problems.push(format!("{}: no data for {}", query.label, query.expr)),
                Err(err) => problems.push(format!("{}: {err:#}", query.label)),
            }
        }
        problems.extend(self.check_rules(at).await?);
        eprintln!(
            "  Prometheus: {} dashboard queries and the seed's query checked, {} problems",
            report.queries.len(),
            problems.len()
        );
        Ok(problems)
    }

    /// The rules loaded from `prometheus/rules/` (parsing is promtool's): every rule
    /// evaluates without error on real series, and every recording rule's series exists
    /// at `at`. An alert whose expression returns nothing is not firing: no problem.
    pub async fn check_rules(&self, at: f64) -> anyhow::Result<Vec<String>> {
        let body: Value = reqwest::get(format!("{}/api/v1/rules", self.url))
            .await?
            .json()
            .await?;
        let groups: Vec<&Value> = list(&body["data"]["groups"]).collect();
        let rules: Vec<&Value> = groups.iter().flat_map(|g| list(&g["rules"])).collect();
        let mut problems = Vec::new();
        if rules.is_empty() {
            problems.push("Prometheus loaded no rule from prometheus/rules/".to_owned());
        }
        for rule in &rules {
            let name = rule["name"].as_str().unwrap_or("?");
            if rule["health"] != "ok" {
                let (health, error) = (&rule["health"], &rule["lastError"]);
                problems.push(format!("rule {name}: health {health}: {error}"));
            } else if rule["type"] == "recording"
                && instant_query(&self.url, name, Some(at)).await?.is_empty()
            {
                problems.push(format!("recording rule {name}: no data"));
            }
        }
        eprintln!(
            "  Prometheus: {} rules from {} group(s) checked, {} problems",
            rules.len(),
            groups.len(),
            problems.len()
        );
        Ok(problems)
    }
}

/// An instant query to the Prometheus at `url`, at `at` (Unix seconds) or now: the
/// result vector's elements, each `{"metric": {labels}, "value": [time, "value"]}`.
pub async fn instant_query(url: &str, expr: &str, at: Option<f64>) -> anyhow::Result<Vec<Value>> {
    let mut params = vec![("query", expr.to_owned())];
    params.extend(at.map(|at| ("time", format!("{at:.3}"))));
    let query = reqwest::Url::parse_with_params(&format!("{url}/api/v1/query"), &params)?;
    let body: Value = reqwest::get(query).await?.json().await?;
    if body["status"] != "success" {
        bail!("{}: {}", body["errorType"], body["error"]);
    }
    Ok(list(&body["data"]["result"]).cloned().collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn config_points_at_the_real_ports() {
        let ports = Ports {
            orders: 1111,
            catalog: 2222,
            admin: 3333,
            orders_admin: 4444,
            pricing: 5555,
            pricing_admin: 6666,
            shipping: 7777,
        };
        let text = config(&ports).unwrap();
        assert!(text.contains("\"127.0.0.1:1111\"") && text.contains("\"127.0.0.1:2222\""));
        assert!(text.contains("scrape_interval: 1s"));
    }
}

//! The Grafana dashboards, checked without Grafana: their structure here, their
//! queries against a real Prometheus in [`crate::prometheus`].
//!
//! Every panel needs a description, the provisioned Prometheus datasource and at least
//! one query; every query's variables must resolve, and every metric it selects must be
//! a contract family ([`shared::metrics::names`]), so a typo fails before any
//! Prometheus is involved. The seed's p99 query must appear unchanged (DESIGN §7).

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

use anyhow::Context as _;
use serde_json::Value;
use shared::metrics::names;

/// The seed's own p99 query, which must work unchanged (DESIGN §7).
pub const SEED_QUERY: &str = r#"histogram_quantile(0.99, sum by (le) (rate(http_server_requests_seconds_bucket{uri="/api/orders"}[1m])))"#;
/// The datasource uid grafana/provisioning/datasources provides.
const DATASOURCE_UID: &str = "prometheus";

/// One query of one panel, its variables replaced by their defaults.
#[derive(Debug, Clone)]
pub struct Query {
    /// `dashboard file / panel title / refId`.
    pub label: String,
    /// The query as Prometheus gets it.
    pub expr: String,
}

/// What the static check found in every dashboard.
#[derive(Debug, Default)]
pub struct Report {
    /// Every query, resolved.
    pub queries: Vec<Query>,
    /// Every problem, one line each.
    pub problems: Vec<String>,
}

/// Checks every `*.json` in `dir`.
pub fn check_dir(dir: &Path) -> anyhow::Result<Report> {
    let mut report = Report::default();
    let mut uids = BTreeSet::new();
    let mut seed_found = false;
    let mut files: Vec<_> = std::fs::read_dir(dir)?
        .filter_map(Result::ok)
        .map(|e| e.path())
        .collect();
    files.sort();
    for path in files
        .iter()
        .filter(|p| p.extension().is_some_and(|e| e == "json"))
    {
        let name = path
            .file_name()
            .unwrap_or_default()
            .to_string_lossy()
            .into_owned();
        let text = std::fs::read_to_string(path)?;
        let dashboard: Value =
            serde_json::from_str(&text).with_context(|| format!("{name} does not parse"))?;
        let uid = dashboard["uid"].as_str().unwrap_or_default().to_owned();
        if uid.is_empty() || !uids.insert(uid.clone()) {
            report
                .problems
                .push(format!("{name}: missing or repeated uid {uid:?}"));
        }
        let defaults = variable_defaults(&dashboard);
        for panel in panels(&dashboard) {
            seed_found |= check_panel(&name, panel, &defaults, &mut report);
        }
    }
    if !seed_found {
        report
            .problems
            .push(format!("the seed's query is in no dashboard: {SEED_QUERY}"));
    }
    Ok(report)
}

/// Every panel, rows flattened (a collapsed row nests its panels).
fn panels(dashboard: &Value) -> Vec<&Value> {
    let mut out = Vec::new();
    for panel in dashboard["panels"].as_array().into_iter().flatten() {
        if panel["type"] == "row" {
            out.extend(panel["panels"].as_array().into_iter().flatten());
        } else {
            out.push(panel);
        }
    }
    out
}

/// Checks one panel; returns whether it holds the seed's query.
fn check_panel(
    file: &str,
    panel: &Value,
    defaults: &BTreeMap<String, String>,
    report: &mut Report,
) -> bool {
    let title = format!(
        "{file} / {}",
        panel["title"].as_str().unwrap_or("<untitled>")
    );
    let mut problem = |what: String| report.problems.push(format!("{title}: {what}"));
    if panel["description"]
        .as_str()
        .is_none_or(|d| d.trim().is_empty())
    {
        problem("no description".into());
    }
    if panel["datasource"]["uid"] != DATASOURCE_UID {
        problem(format!("datasource is not uid {DATASOURCE_UID}"));
    }
    let targets = panel["targets"].as_array().cloned().unwrap_or_default();
    if targets.is_empty() {
        problem("no targets".into());
    }
    let mut seed = false;
    let mut refs = BTreeSet::new();
    let mut queries = Vec::new();
    for target in &targets {
        let ref_id = target["refId"].as_str().unwrap_or("?").to_owned();
        if !refs.insert(ref_id.clone()) {
            problem(format!("refId {ref_id} used twice"));
        }
        let expr = target["expr"].as_str().unwrap_or_default().trim();
        if expr.is_empty() {
            problem(format!("target {ref_id}: no expr"));
            continue;
        }
        seed |= expr == SEED_QUERY;
        match substitute(expr, defaults) {
            Ok(resolved) => {
                for metric in metric_names(&resolved) {
                    if !names::is_contract_series(&metric) && metric != "up" {
                        problem(format!(
                            "target {ref_id}: {metric} is not a contract metric"
                        ));
                    }
                }
                queries.push(Query {
                    label: format!("{title} / {ref_id}"),
                    expr: resolved,
                });
            }
            Err(unknown) => problem(format!("target {ref_id}: unknown variable ${unknown}")),
        }
    }
    report.queries.extend(queries);
    seed
}

/// Each dashboard variable's default, as Grafana would interpolate it.
fn variable_defaults(dashboard: &Value) -> BTreeMap<String, String> {
    let mut defaults: BTreeMap<String, String> = [
        ("__rate_interval", "1m"),
        ("__interval", "1m"),
        ("__interval_ms", "60000"),
        ("__range", "15m"),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_owned(), v.to_owned()))
    .collect();
    for var in dashboard["templating"]["list"]
        .as_array()
        .into_iter()
        .flatten()
    {
        let value = var["current"]["value"]
            .as_str()
            .or(var["query"].as_str())
            .unwrap_or_default();
        if let Some(name) = var["name"].as_str() {
            defaults.insert(name.to_owned(), value.to_owned());
        }
    }
    defaults
}

/// `$name`, `${name}` and `${name:format}` replaced; `Err(name)` for an unknown one.
fn substitute(expr: &str, defaults: &BTreeMap<String, String>) -> Result<String, String> {
    let mut out = String::new();
    let mut rest = expr;
    while let Some(at) = rest.find('$') {
        out.push_str(&rest[..at]);
        let after = &rest[at + 1..];
        let (name, len) = if let Some(braced) = after.strip_prefix('{') {
            let end = braced.find('}').ok_or_else(|| after.to_owned())?;
            (braced[..end].split(':').next().unwrap_or_default(), end + 2)
        } else {
            let end = after
                .find(|c: char| !(c.is_alphanumeric() || c == '_'))
                .unwrap_or(after.len());
            (&after[..end], end)
        };
        out.push_str(defaults.get(name).ok_or_else(|| name.to_owned())?);
        rest = &after[len..];
    }
    out.push_str(rest);
    Ok(out)
}

/// The metric names a PromQL expression selects: identifiers that are not function
/// calls, keywords, label names or inside quotes, braces or brackets.
fn metric_names(expr: &str) -> BTreeSet<String> {
    const KEYWORDS: &[&str] = &[
        "by",
        "without",
        "on",
        "ignoring",
        "group_left",
        "group_right",
        "bool",
        "and",
        "or",
        "unless",
        "offset",
        "inf",
        "nan",
    ];
    // Aggregations may be followed by `by (...)` instead of their argument.
    const AGGREGATIONS: &[&str] = &[
        "sum",
        "min",
        "max",
        "avg",
        "count",
        "stddev",
        "stdvar",
        "topk",
        "bottomk",
        "quantile",
        "count_values",
        "group",
        "limitk",
        "limit_ratio",
    ];
    let mut names = BTreeSet::new();
    let chars: Vec<char> = expr.chars().collect();
    let (mut i, mut depth, mut quote, mut label_list) = (0, 0i32, None, false);
    while i < chars.len() {
        let c = chars[i];
        match (quote, c) {
            (Some(q), _) if c == q => quote = None,
            (Some(_), _) => {}
            (None, '"' | '\'' | '`') => quote = Some(c),
            (None, '{' | '[') => depth += 1,
            (None, '}' | ']') => depth -= 1,
            (None, ')') => label_list = false,
            (None, c) if depth == 0 && !label_list && (c.is_alphabetic() || c == '_') => {
                let start = i;
                while i < chars.len()
                    && (chars[i].is_alphanumeric() || chars[i] == '_' || chars[i] == ':')
                {
                    i += 1;
                }
                let word: String = chars[start..i].iter().collect();
                let next = chars[i..].iter().find(|c| !c.is_whitespace());
                if KEYWORDS.contains(&word.to_lowercase().as_str()) {
                    // `by (...)` and friends list labels, not metrics.
                    label_list = next == Some(&'(') && word != "bool";
                } else if next != Some(&'(') && !AGGREGATIONS.contains(&word.as_str()) {
                    names.insert(word);
                }
                continue;
            }
            _ => {}
        }
        i += 1;
    }
    names
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn finds_metric_names_not_functions_labels_or_windows() {
        let names = metric_names(SEED_QUERY);
        assert_eq!(
            names.into_iter().collect::<Vec<_>>(),
            ["http_server_requests_seconds_bucket"]
        );
        let names = metric_names(
            r#"sum by (service, stage) (rate(deadline_exceeded_total{a="b c"}[1m])) / up"#,
        );
        assert_eq!(
            names.into_iter().collect::<Vec<_>>(),
            ["deadline_exceeded_total", "up"]
        );
        assert!(metric_names("vector(2000 / 1000)").is_empty());
    }

    #[test]
    fn substitutes_variables_and_names_unknown_ones() {
        let defaults = BTreeMap::from([
            ("limit".to_owned(), "50".to_owned()),
            ("__rate_interval".to_owned(), "1m".to_owned()),
        ]);
        assert_eq!(
            substitute("vector($limit) [$__rate_interval] ${limit:raw}", &defaults).unwrap(),
            "vector(50) [1m] 50"
        );
        assert_eq!(substitute("$nope", &defaults), Err("nope".to_owned()));
    }

    #[test]
    fn the_project_dashboards_pass() {
        let dir = crate::stack::workspace().join("grafana/dashboards");
        let report = check_dir(&dir).unwrap();
        assert!(report.problems.is_empty(), "{:#?}", report.problems);
        assert!(report.queries.len() > 10);
    }
}

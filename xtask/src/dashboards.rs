//! The Grafana dashboards, checked without Grafana: their structure here, their queries
//! against a real Prometheus in `experiment --prometheus` (which also says whether each
//! selected metric exists: no list of names is kept here).
//!
//! Every panel, target and annotation uses the `datasource` variable; every panel has a
//! description and a query; every query's variables resolve, it does not depend on the
//! scrape job's name, and its windows are `$__rate_interval`. The seed's p99 query stays
//! unchanged (docs/design.md §7).

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

use anyhow::Context as _;
use serde_json::Value;

/// The seed's own p99 query, which must work unchanged (docs/design.md §7).
pub const SEED_QUERY: &str = r#"histogram_quantile(0.99, sum by (le) (rate(http_server_requests_seconds_bucket{uri="/api/orders"}[1m])))"#;
/// The datasource uid grafana/provisioning/datasources provides.
const DATASOURCE_UID: &str = "prometheus";
/// How panels name their datasource: the `datasource` variable, so any Prometheus will
/// do (its default is [`DATASOURCE_UID`]).
const DATASOURCE_REF: &str = "${datasource}";

/// One query of one panel (`dashboard file / panel title / refId`), as Prometheus gets
/// it: its variables replaced by their defaults.
#[derive(Debug, Clone)]
pub struct Query {
    pub label: String,
    pub expr: String,
    /// Whether it has data only while a catalog delay is injected (the annotation).
    pub during_fault: bool,
}

/// What the static check found in every dashboard: every query, resolved, and every
/// problem, one line each.
#[derive(Debug, Default)]
pub struct Report {
    pub queries: Vec<Query>,
    pub problems: Vec<String>,
}

/// Checks every `*.json` in `dir`.
pub fn check_dir(dir: &Path) -> anyhow::Result<Report> {
    let mut report = Report::default();
    let (mut uids, mut seed_found) = (BTreeSet::new(), false);
    let mut files: Vec<_> = std::fs::read_dir(dir)?
        .map(|e| e.map(|e| e.path()))
        .collect::<Result<_, _>>()?;
    files.retain(|p| p.extension().is_some_and(|e| e == "json"));
    files.sort();
    for path in &files {
        let name = path.strip_prefix(dir)?.display().to_string();
        let text = std::fs::read_to_string(path)?;
        let dashboard: Value =
            serde_json::from_str(&text).with_context(|| format!("{name} does not parse"))?;
        let mut problem = |what: String| report.problems.push(format!("{name}: {what}"));
        let uid = dashboard["uid"].as_str().unwrap_or_default().to_owned();
        if uid.is_empty() || !uids.insert(uid.clone()) {
            problem(format!("missing or repeated uid {uid:?}"));
        }
        if let Err(what) = check_datasource_variable(&dashboard) {
            problem(what);
        }
        let defaults = variable_defaults(&dashboard);
        let annotations = list(&dashboard["annotations"]["list"]);
        for annotation in annotations.filter(|a| a["builtIn"].as_u64().unwrap_or(0) == 0) {
            let label = format!("annotation {}", annotation["name"]);
            if annotation["datasource"]["uid"] != DATASOURCE_REF {
                problem(format!("{label}: datasource is not {DATASOURCE_REF}"));
            }
            let expr = annotation["expr"].as_str().unwrap_or_default().trim();
            match check_expr(expr, &defaults) {
                Ok(expr) => report.queries.push(Query {
                    label: format!("{name}: {label}"),
                    expr,
                    during_fault: true,
                }),
                Err(problems) => problems
                    .into_iter()
                    .for_each(|p| problem(format!("{label}: {p}"))),
            }
        }
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

/// The elements of a JSON array; none when `value` is not one.
pub(crate) fn list(value: &Value) -> impl Iterator<Item = &Value> {
    value.as_array().into_iter().flatten()
}

/// Every panel, rows flattened (a collapsed row nests its panels).
fn panels(dashboard: &Value) -> Vec<&Value> {
    let mut out = Vec::new();
    for panel in list(&dashboard["panels"]) {
        if panel["type"] == "row" {
            out.extend(list(&panel["panels"]));
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
    let title = panel["title"].as_str().unwrap_or("<untitled>");
    let title = format!("{file} / {title}");
    let mut problem = |what: String| report.problems.push(format!("{title}: {what}"));
    if panel["description"]
        .as_str()
        .is_none_or(|d| d.trim().is_empty())
    {
        problem("no description".into());
    }
    if panel["datasource"]["uid"] != DATASOURCE_REF {
        problem(format!("datasource is not {DATASOURCE_REF}"));
    }
    if list(&panel["targets"]).next().is_none() {
        problem("no targets".into());
    }
    let (mut seed, mut refs) = (false, BTreeSet::new());
    for target in list(&panel["targets"]) {
        let ref_id = target["refId"].as_str().unwrap_or("?").to_owned();
        if !refs.insert(ref_id.clone()) {
            problem(format!("refId {ref_id} used twice"));
        }
        let expr = target["expr"].as_str().unwrap_or_default().trim();
        seed |= expr == SEED_QUERY;
        if !target["datasource"].is_null() && target["datasource"]["uid"] != DATASOURCE_REF {
            problem(format!(
                "target {ref_id}: datasource is not {DATASOURCE_REF}"
            ));
        }
        match check_expr(expr, defaults) {
            Ok(expr) => report.queries.push(Query {
                label: format!("{title} / {ref_id}"),
                expr,
                during_fault: false,
            }),
            Err(problems) => problems
                .into_iter()
                .for_each(|p| problem(format!("target {ref_id}: {p}"))),
        }
    }
    seed
}

/// One query with its variables resolved, or its problems (an unknown variable, a `job`
/// selector, a window other than `$__rate_interval`).
fn check_expr(expr: &str, defaults: &BTreeMap<String, String>) -> Result<String, Vec<String>> {
    let mut problems = Vec::new();
    if expr.is_empty() {
        return Err(vec!["no expr".into()]);
    }
    let mut words = expr.split(|c: char| !(c.is_alphanumeric() || c == '_'));
    if words.any(|word| word == "job") {
        problems.push(
            "depends on the scrape job's name (`job`): select by the metrics' own labels".into(),
        );
    }
    if expr != SEED_QUERY {
        for window in expr.split('[').skip(1).filter_map(|w| w.split(']').next()) {
            if window != "$__rate_interval" {
                problems.push(format!("range window [{window}]: use [$__rate_interval]"));
            }
        }
    }
    match substitute(expr, defaults) {
        Ok(resolved) if problems.is_empty() => Ok(resolved),
        Ok(_) => Err(problems),
        Err(unknown) => {
            problems.push(format!("unknown variable ${unknown}"));
            Err(problems)
        }
    }
}

/// The `datasource` variable: a Prometheus datasource picker defaulting to ours.
fn check_datasource_variable(dashboard: &Value) -> Result<(), String> {
    let mut variables = list(&dashboard["templating"]["list"]);
    let Some(var) = variables.find(|v| v["name"] == "datasource") else {
        return Err(format!(
            "no `datasource` variable (panels use {DATASOURCE_REF})"
        ));
    };
    if var["type"] != "datasource" || var["query"] != "prometheus" {
        return Err("variable datasource is not a Prometheus datasource variable".into());
    }
    if var["current"]["value"] != DATASOURCE_UID {
        return Err(format!(
            "variable datasource does not default to {DATASOURCE_UID}"
        ));
    }
    Ok(())
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
    for var in list(&dashboard["templating"]["list"]) {
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
pub fn substitute(expr: &str, defaults: &BTreeMap<String, String>) -> Result<String, String> {
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_job_selector_a_fixed_window_and_an_unknown_variable_are_problems() {
        let defaults = BTreeMap::from([("__rate_interval".to_owned(), "1m".to_owned())]);
        let problems = check_expr(
            r#"rate(tool_calls_total{job="orders"}[5m]) + $nope"#,
            &defaults,
        );
        assert_eq!(problems.unwrap_err().len(), 3);
        let resolved = check_expr("rate(tool_calls_total[$__rate_interval])", &defaults);
        assert_eq!(resolved.unwrap(), "rate(tool_calls_total[1m])");
        assert!(
            check_expr(SEED_QUERY, &defaults).is_ok(),
            "the seed keeps its [1m]"
        );
        let defaults = BTreeMap::from([("limit".to_owned(), "50".to_owned())]);
        assert_eq!(
            substitute("vector($limit) ${limit:raw}", &defaults).unwrap(),
            "vector(50) 50"
        );
    }

    #[test]
    fn the_project_dashboards_pass() {
        let dir = crate::stack::workspace().join("grafana/dashboards");
        let report = check_dir(&dir).unwrap();
        assert!(report.problems.is_empty(), "{:#?}", report.problems);
        assert!(report.queries.len() > 10);
    }
}

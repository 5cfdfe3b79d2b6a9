//! Just enough PromQL for the dashboard check: Grafana's variables substituted, and the
//! metric names an expression selects.

use std::collections::{BTreeMap, BTreeSet};

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

/// The metric names a PromQL expression selects: identifiers that are not function
/// calls, keywords, label names or inside quotes, braces or brackets.
pub fn metric_names(expr: &str) -> BTreeSet<String> {
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
    use crate::dashboards::SEED_QUERY;

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
}

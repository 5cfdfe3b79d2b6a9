//! The Prometheus text format (and OpenMetrics, which the services serve), parsed once
//! for the tests, the experiment and the checks.
//!
//! Only what a reader of `/metrics` needs: one [`Sample`] per line that is not a
//! comment, with its labels unescaped. Timestamps and exemplars after the value are
//! ignored.

/// One line of an exposition: `name{label="value",...} value`.
#[derive(Debug, Clone, PartialEq)]
pub struct Sample {
    /// The series name as written, with any `_total`, `_bucket`, `_sum`, `_count`.
    pub name: String,
    /// The labels in the order written, values unescaped.
    pub labels: Vec<(String, String)>,
    /// The value; `+Inf`, `-Inf` and `NaN` are parsed too.
    pub value: f64,
}

impl Sample {
    /// The value of label `key`, if present.
    pub fn label(&self, key: &str) -> Option<&str> {
        self.labels
            .iter()
            .find(|(k, _)| k == key)
            .map(|(_, v)| v.as_str())
    }

    /// Whether every `(key, value)` of `wanted` is among this sample's labels.
    pub fn has_labels(&self, wanted: &[(&str, &str)]) -> bool {
        wanted.iter().all(|(k, v)| self.label(k) == Some(v))
    }
}

/// Every sample of `text`; lines that do not parse are skipped.
pub fn parse(text: &str) -> Vec<Sample> {
    text.lines()
        .map(str::trim)
        .filter(|line| !line.is_empty() && !line.starts_with('#'))
        .filter_map(parse_line)
        .collect()
}

/// The sum of the samples named `name` that carry every label of `wanted`
/// (`None` when there is none): e.g. all statuses of one route.
pub fn sum(samples: &[Sample], name: &str, wanted: &[(&str, &str)]) -> Option<f64> {
    samples
        .iter()
        .filter(|s| s.name == name && s.has_labels(wanted))
        .map(|s| s.value)
        .reduce(|a, b| a + b)
}

/// The value of the sample `name{labels}` in an exposition; `labels` is the label text
/// between the braces, e.g. `uri="/catalog/{sku}"`, and must match the sample's labels
/// exactly (in any order).
pub fn metric_value(exposition: &str, name: &str, labels: &str) -> Option<f64> {
    let mut wanted = parse_labels(labels)?;
    wanted.sort();
    parse(exposition).into_iter().find_map(|s| {
        let mut have = s.labels.clone();
        have.sort();
        (s.name == name && have == wanted).then_some(s.value)
    })
}

fn parse_line(line: &str) -> Option<Sample> {
    let name_end = line.find(['{', ' ']).unwrap_or(line.len());
    let name = &line[..name_end];
    let (labels, rest) = if line[name_end..].starts_with('{') {
        let close = closing_brace(&line[name_end..])? + name_end;
        (
            parse_labels(&line[name_end + 1..close])?,
            &line[close + 1..],
        )
    } else {
        (Vec::new(), &line[name_end..])
    };
    let value = rest.split_whitespace().next()?;
    let value = match value {
        "+Inf" | "Inf" => f64::INFINITY,
        "-Inf" => f64::NEG_INFINITY,
        v => v.parse().ok()?,
    };
    (!name.is_empty()).then(|| Sample {
        name: name.to_owned(),
        labels,
        value,
    })
}

/// The index of the `}` that closes the label set at the start of `text`, skipping
/// braces inside quoted values (route templates such as `/catalog/{sku}` have them).
fn closing_brace(text: &str) -> Option<usize> {
    let (mut quoted, mut escaped) = (false, false);
    for (i, c) in text.char_indices() {
        match c {
            _ if escaped => escaped = false,
            '\\' if quoted => escaped = true,
            '"' => quoted = !quoted,
            '}' if !quoted => return Some(i),
            _ => {}
        }
    }
    None
}

/// `a="x",b="y\"z"` into pairs; `None` when malformed.
fn parse_labels(text: &str) -> Option<Vec<(String, String)>> {
    let mut labels = Vec::new();
    let mut rest = text.trim();
    while !rest.is_empty() {
        let eq = rest.find('=')?;
        let key = rest[..eq].trim().to_owned();
        let mut chars = rest[eq + 1..].trim_start().char_indices();
        let start = rest.len() - rest[eq + 1..].trim_start().len();
        if chars.next()?.1 != '"' {
            return None;
        }
        let mut value = String::new();
        let mut end = None;
        let mut escaped = false;
        for (i, c) in chars {
            match (escaped, c) {
                (true, 'n') => (value.push('\n'), escaped = false).1,
                (true, c) => (value.push(c), escaped = false).1,
                (false, '\\') => escaped = true,
                (false, '"') => {
                    end = Some(start + i);
                    break;
                }
                (false, c) => value.push(c),
            }
        }
        labels.push((key, value));
        rest = rest[end? + 1..].trim_start();
        rest = rest.strip_prefix(',').unwrap_or(rest).trim_start();
    }
    Some(labels)
}

/// `GET {base}/metrics` over HTTP, as a Prometheus scrape reads it: the promises
/// about metrics are checked against what a scraper sees, not the in-process registry.
/// Panics unless the answer is a 200.
pub async fn scrape(client: &reqwest::Client, base: &str) -> String {
    let response = client
        .get(format!("{base}/metrics"))
        .send()
        .await
        .expect("scrape sent");
    assert_eq!(
        response.status(),
        reqwest::StatusCode::OK,
        "GET {base}/metrics"
    );
    response.text().await.expect("a text exposition")
}

#[cfg(test)]
mod tests {
    use super::*;

    const TEXT: &str = r#"# HELP http_server_requests_seconds time
# TYPE http_server_requests_seconds histogram
http_server_requests_seconds_bucket{method="GET",uri="/catalog/{sku}",status="200",le="0.5"} 3
http_server_requests_seconds_bucket{method="GET",uri="/catalog/{sku}",status="504",le="0.5"} 2
http_server_requests_seconds_bucket{method="GET",uri="/catalog/{sku}",status="200",le="+Inf"} 4 # {trace_id="x"} 1.0
db_pool_pending_acquires 0
odd{v="a\"b\\c,d}"} NaN
# EOF
"#;

    #[test]
    fn parses_names_labels_and_values() {
        let samples = parse(TEXT);
        assert_eq!(samples.len(), 5);
        assert_eq!(samples[0].label("uri"), Some("/catalog/{sku}"));
        assert_eq!(samples[2].label("le"), Some("+Inf"));
        assert_eq!(samples[2].value, 4.0);
        assert_eq!(samples[3].name, "db_pool_pending_acquires");
        assert!(samples[3].labels.is_empty());
        assert_eq!(samples[4].label("v"), Some(r#"a"b\c,d}"#));
        assert!(samples[4].value.is_nan());
    }

    #[test]
    fn sums_over_the_labels_not_named() {
        let samples = parse(TEXT);
        let name = "http_server_requests_seconds_bucket";
        assert_eq!(sum(&samples, name, &[("le", "0.5")]), Some(5.0));
        assert_eq!(
            sum(&samples, name, &[("status", "200"), ("le", "0.5")]),
            Some(3.0)
        );
        assert_eq!(sum(&samples, name, &[("status", "404")]), None);
    }

    #[test]
    fn finds_one_sample_by_its_exact_labels_in_any_order() {
        let labels = r#"le="0.5",status="504",uri="/catalog/{sku}",method="GET""#;
        let name = "http_server_requests_seconds_bucket";
        assert_eq!(metric_value(TEXT, name, labels), Some(2.0));
        assert_eq!(
            metric_value(TEXT, "db_pool_pending_acquires", ""),
            Some(0.0)
        );
        assert_eq!(metric_value(TEXT, name, r#"status="504""#), None);
    }

    #[test]
    fn skips_malformed_lines() {
        assert!(parse("broken{a=\"x\" 1\nok 2\nnovalue\n").len() == 1);
    }
}

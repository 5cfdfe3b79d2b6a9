//! The `downstream_answer` target: what a downstream sends back, read as the budgeted
//! client reads it. The first line is `Server-Timing` (split at `,` into header values
//! too), the rest a 500's problem body; each is checked against an oracle of its own.

use std::time::Duration;

use deadline_propagation::testing::{is_outcome_unknown, server_total};
use http::{HeaderMap, HeaderValue};

/// The `total` a `Server-Timing` header must give: of the values that are visible ASCII
/// (others are skipped), the first `total` metric whose first `dur` is a number of
/// milliseconds a `Duration` holds; read here metric by metric, comma-separated, each
/// `name;param=value;...`.
pub fn expected_total(values: &[&str]) -> Option<Duration> {
    let visible = |v: &&&str| v.bytes().all(|b| (32..127).contains(&b) || b == b'\t');
    for value in values.iter().filter(visible) {
        for metric in value.split(',') {
            let mut parts = metric.split(';').map(str::trim);
            if parts.next() != Some("total") {
                continue;
            }
            let Some(dur) = parts.find_map(|p| p.strip_prefix("dur=")) else {
                continue;
            };
            let Ok(ms) = dur.parse::<f64>() else {
                continue;
            };
            if let Ok(total) = Duration::try_from_secs_f64(ms / 1000.0) {
                return Some(total);
            }
        }
    }
    None
}

/// The fuzz target's body.
pub fn downstream_answer(data: &[u8]) {
    let (first, body) = match data.iter().position(|&b| b == b'\n') {
        Some(at) => (&data[..at], &data[at + 1..]),
        None => (data, &[][..]),
    };
    // Server-Timing: as one header value, then as one per comma-separated piece.
    if let Ok(text) = std::str::from_utf8(first)
        && let Ok(value) = HeaderValue::from_str(text)
    {
        let mut headers = HeaderMap::new();
        headers.insert("server-timing", value);
        assert_eq!(server_total(&headers), expected_total(&[text]), "{text:?}");
        let mut split = HeaderMap::new();
        let pieces: Vec<&str> = text.split(',').collect();
        for piece in &pieces {
            split.append("server-timing", HeaderValue::from_str(piece).unwrap());
        }
        assert_eq!(server_total(&split), expected_total(&pieces), "{text:?}");
    }
    // The problem body: `outcome-unknown` only as a JSON object's `type`.
    let expected = serde_json::from_slice::<serde_json::Value>(body).is_ok_and(|v| {
        v.as_object()
            .and_then(|o| o.get("type"))
            .and_then(|t| t.as_str())
            == Some("urn:problem:outcome-unknown")
    });
    assert_eq!(is_outcome_unknown(body), expected, "{body:?}");
}

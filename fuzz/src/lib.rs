//! The fuzz targets' bodies, as plain functions.
//!
//! Each function takes arbitrary bytes, feeds them to the project's code, and panics when
//! a property does not hold (or when the project's code panics by itself). The libFuzzer
//! binaries in `fuzz_targets/` call them, and so does `tests/replay_corpus.rs`, which runs
//! every file of `corpus/<target>/` (and `artifacts/<target>/`) on the stable toolchain
//! without cargo-fuzz.
//!
//! The expected answers are computed here independently of the code under test (a
//! different algorithm, or a re-parse through `serde_json::Value`), so a change to the
//! parser that breaks DESIGN §3 or the order validation shows up as a failed assertion,
//! not only as a panic.

use http::{HeaderMap, HeaderName, HeaderValue, StatusCode};
use orders_service::orders::{
    MAX_KEY_LEN, MAX_QUANTITY, NewOrder, NewOrderRequest, validate_key, validate_sku,
};
use shared::header::{
    InvalidTimeout, REQUEST_TIMEOUT_HEADER, REQUEST_TIMEOUT_HEADER_DISPLAY, parse_millis,
    parse_request_timeout,
};

/// A fuzz target: its name (the folder under `corpus/` and `fuzz_targets/<name>.rs`) and
/// its body.
pub type Target = (&'static str, fn(&[u8]));

/// Every target, for the corpus replay.
pub const TARGETS: &[Target] = &[
    ("timeout_header", timeout_header),
    ("order_body", order_body),
];

// ---------------------------------------------------------------- X-Request-Timeout-Ms

/// The class of answer `parse_millis` must give, without the error's payload.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Millis {
    /// A valid value.
    Ok(u64),
    /// Nothing but whitespace.
    Empty,
    /// Something other than ASCII digits between the whitespace.
    NotAnInteger,
    /// More than 20 digits, or a value past `u64::MAX`.
    TooLarge,
    /// Repeated header values that disagree (`parse_request_timeout` only).
    Conflicting,
}

impl Millis {
    fn of(result: &Result<u64, InvalidTimeout>) -> Self {
        match result {
            Ok(n) => Self::Ok(*n),
            Err(InvalidTimeout::Empty) => Self::Empty,
            Err(InvalidTimeout::NotAnInteger(_)) => Self::NotAnInteger,
            Err(InvalidTimeout::TooLarge) => Self::TooLarge,
            Err(InvalidTimeout::Conflicting) => Self::Conflicting,
        }
    }
}

/// The bytes between leading and trailing ASCII whitespace (space, tab, CR, LF, FF).
fn trim_whitespace(raw: &[u8]) -> &[u8] {
    let start = raw
        .iter()
        .position(|b| !b.is_ascii_whitespace())
        .unwrap_or(raw.len());
    let end = raw
        .iter()
        .rposition(|b| !b.is_ascii_whitespace())
        .map_or(start, |i| i + 1);
    &raw[start..end]
}

/// What `parse_millis(raw)` must answer (DESIGN §3), computed without its digit cap or
/// checked arithmetic: the value is accumulated in a `u128` that saturates.
pub fn expected_millis(raw: &[u8]) -> Millis {
    let digits = trim_whitespace(raw);
    if digits.is_empty() {
        return Millis::Empty;
    }
    if !digits.iter().all(u8::is_ascii_digit) {
        return Millis::NotAnInteger;
    }
    // The parser refuses more than 20 digits before looking at them, even leading zeros:
    // "000000000000000000001" is TooLarge. Both answers are a 400 naming the header.
    if digits.len() > 20 {
        return Millis::TooLarge;
    }
    let value = digits.iter().fold(0u128, |acc, d| {
        acc.saturating_mul(10).saturating_add(u128::from(d - b'0'))
    });
    u64::try_from(value).map_or(Millis::TooLarge, Millis::Ok)
}

/// `parse_millis` on `raw`: the answer is the expected one, a valid value round-trips to
/// the digits, and every error message names the header.
fn check_millis(raw: &[u8]) -> Millis {
    let result = parse_millis(raw);
    let got = Millis::of(&result);
    let expected = expected_millis(raw);
    assert_eq!(
        got,
        expected,
        "parse_millis({:?}) = {result:?}",
        String::from_utf8_lossy(raw)
    );
    match &result {
        Ok(n) => {
            // Ok(n) only for 1..=20 ASCII digits (after trimming) whose value is n.
            let digits = trim_whitespace(raw);
            assert!((1..=20).contains(&digits.len()), "{n} from {digits:?}");
            let without_zeros = match digits.iter().position(|&d| d != b'0') {
                Some(i) => &digits[i..],
                None => b"0",
            };
            assert_eq!(n.to_string().as_bytes(), without_zeros);
        }
        Err(err) => {
            assert!(
                err.to_string().contains(REQUEST_TIMEOUT_HEADER_DISPLAY),
                "the message must name the header: {err}"
            );
            if let InvalidTimeout::NotAnInteger(echo) = err {
                // The echo is bounded and comes from the value itself.
                assert!(!echo.is_empty());
                assert!(echo.chars().count() <= 32, "echo too long: {echo:?}");
                let shown = String::from_utf8_lossy(trim_whitespace(raw));
                assert!(
                    shown.starts_with(echo.as_str()),
                    "{echo:?} not in {shown:?}"
                );
            }
        }
    }
    got
}

/// The `timeout_header` target.
///
/// 1. The bytes as one header value, into `parse_millis`.
/// 2. The bytes split at `\n` (which no header value can hold) into several values of the
///    header, each one that `HeaderValue::from_bytes` accepts, into
///    `parse_request_timeout`: absent when none is accepted, the value when all agree,
///    the first invalid value's error, or `Conflicting`. A look-alike header next to it
///    must be ignored.
pub fn timeout_header(data: &[u8]) {
    check_millis(data);

    let values: Vec<HeaderValue> = data
        .split(|&b| b == b'\n')
        .filter_map(|piece| HeaderValue::from_bytes(piece).ok())
        .collect();
    let mut headers = HeaderMap::new();
    let decoy = HeaderName::from_static("x-request-timeout");
    for value in &values {
        headers.append(decoy.clone(), value.clone());
        headers.append(REQUEST_TIMEOUT_HEADER, value.clone());
    }
    headers.append(decoy, HeaderValue::from_static("not a number"));

    // What parse_request_timeout must answer: values in order, the first error wins.
    let mut expected: Result<Option<u64>, Millis> = Ok(None);
    for value in &values {
        let Ok(previous) = expected else { break };
        expected = match check_millis(value.as_bytes()) {
            Millis::Ok(ms) if previous.is_some_and(|p| p != ms) => Err(Millis::Conflicting),
            Millis::Ok(ms) => Ok(Some(ms)),
            other => Err(other),
        };
    }

    let result = parse_request_timeout(&headers);
    let got = match &result {
        Ok(budget) => Ok(budget
            .map(|d| u64::try_from(d.as_millis()).expect("a budget built from u64 milliseconds"))),
        Err(err) => {
            assert!(err.to_string().contains(REQUEST_TIMEOUT_HEADER_DISPLAY));
            Err(Millis::of(&Err(err.clone())))
        }
    };
    assert_eq!(
        got, expected,
        "parse_request_timeout({:?}) = {result:?}",
        values
    );
}

// ---------------------------------------------------------------- POST /api/orders

/// Whether `sku` may go into a URL path as it is (`/catalog/{sku}` in the catalog
/// client): only letters, digits, `-` and `_` (a subset of RFC 3986 unreserved
/// characters without `.` and `~`), so no escaping, no dot segments, no slash, no query.
pub fn url_path_safe(sku: &str) -> bool {
    if sku.is_empty()
        || !sku
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
    {
        return false;
    }
    let path = format!("/catalog/{sku}");
    match http::uri::PathAndQuery::try_from(path.as_str()) {
        Ok(parsed) => parsed.path() == path && parsed.query().is_none(),
        Err(_) => false,
    }
}

/// The SKU rule of the API, written out: 1 to 32 ASCII letters, digits, `-` or `_`.
pub fn expected_sku_ok(sku: &str) -> bool {
    (1..=32).contains(&sku.len())
        && sku
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
}

/// What `validate()` must answer for a body that parsed, read back from the same bytes
/// as a `serde_json::Value`: the order, or the field its 422 must name. `None` when the
/// value cannot tell (a shape the struct accepts that is not an object or a pair).
fn expected_order(body: &serde_json::Value) -> Option<Result<NewOrder, &'static str>> {
    use serde_json::Value;
    // A derived Deserialize also takes a sequence: ["SKU-00001", 3].
    let (sku, quantity) = match body {
        Value::Object(fields) => (fields.get("sku"), fields.get("quantity")),
        Value::Array(items) if items.len() == 2 => (items.first(), items.get(1)),
        _ => return None,
    };
    let sku = match sku {
        None | Some(Value::Null) => return Some(Err("sku")),
        Some(Value::String(sku)) => sku,
        Some(_) => return None,
    };
    if !expected_sku_ok(sku) {
        return Some(Err("sku"));
    }
    let quantity = match quantity {
        None | Some(Value::Null) => return Some(Err("quantity")),
        Some(Value::Number(n)) => n,
        Some(_) => return None,
    };
    Some(
        match quantity.as_i64().filter(|q| (1..=MAX_QUANTITY).contains(q)) {
            Some(q) => Ok(NewOrder {
                sku: sku.clone(),
                quantity: i32::try_from(q).expect("at most MAX_QUANTITY"),
            }),
            None => Err("quantity"),
        },
    )
}

/// `validate_key` on arbitrary bytes: accepted exactly when they are 1 to 255 visible
/// ASCII characters, returned unchanged, and then valid as a header value to echo.
fn check_key(data: &[u8]) {
    let expected_ok =
        (1..=MAX_KEY_LEN).contains(&data.len()) && data.iter().all(u8::is_ascii_graphic);
    match validate_key(data) {
        Ok(key) => {
            assert!(expected_ok, "validate_key accepted {data:?}");
            assert_eq!(key.as_bytes(), data);
            assert!(HeaderValue::from_bytes(data).is_ok());
        }
        Err(problem) => {
            assert!(!expected_ok, "validate_key refused {data:?}");
            assert_eq!(problem.status(), StatusCode::BAD_REQUEST);
            assert!(problem.detail().contains("Idempotency-Key"));
        }
    }
}

/// `validate_sku` on arbitrary text: the written-out rule, and URL-path-safe when Ok.
fn check_sku(sku: &str) {
    let ok = validate_sku(sku).is_ok();
    assert_eq!(ok, expected_sku_ok(sku), "validate_sku({sku:?})");
    if ok {
        assert!(url_path_safe(sku), "{sku:?} is not URL-path-safe");
    }
}

/// The `order_body` target.
///
/// The bytes as a JSON body: `serde_json::from_slice::<NewOrderRequest>` then
/// `validate()`. When it succeeds, the quantity is in 1..=1000 and the SKU passes
/// `validate_sku` and is URL-path-safe; when it fails, the 422 names the field; either
/// way the answer matches a re-reading of the body as a `serde_json::Value`. The same
/// bytes also go through `validate_key`, and (as text) through `validate_sku`.
pub fn order_body(data: &[u8]) {
    check_key(data);
    if let Ok(text) = std::str::from_utf8(data) {
        check_sku(text);
    }

    let Ok(request) = serde_json::from_slice::<NewOrderRequest>(data) else {
        return;
    };
    let expected = serde_json::from_slice::<serde_json::Value>(data)
        .ok()
        .and_then(|value| expected_order(&value));
    let outcome = request.validate();
    match &outcome {
        Ok(order) => {
            assert!(
                (1..=MAX_QUANTITY).contains(&i64::from(order.quantity)),
                "{order:?}"
            );
            assert!(validate_sku(&order.sku).is_ok(), "{order:?}");
            assert!(url_path_safe(&order.sku), "{order:?}");
        }
        Err(problem) => {
            assert_eq!(problem.status(), StatusCode::UNPROCESSABLE_ENTITY);
            let detail = problem.detail();
            assert!(
                detail.starts_with("sku") || detail.starts_with("quantity"),
                "the 422 must name the field: {detail}"
            );
        }
    }
    if let Some(expected) = expected {
        let got = outcome.map_err(|problem| {
            if problem.detail().starts_with("sku") {
                "sku"
            } else {
                "quantity"
            }
        });
        assert_eq!(got, expected, "body {:?}", String::from_utf8_lossy(data));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_millis_oracle_agrees_with_the_header_tests_table() {
        for (raw, expected) in [
            (&b"250"[..], Millis::Ok(250)),
            (b" 250 ", Millis::Ok(250)),
            (b"\t250", Millis::Ok(250)),
            (b"0", Millis::Ok(0)),
            (b"0250", Millis::Ok(250)),
            (b"18446744073709551615", Millis::Ok(u64::MAX)),
            (b"", Millis::Empty),
            (b"   ", Millis::Empty),
            (b"-5", Millis::NotAnInteger),
            (b"1e3", Millis::NotAnInteger),
            (b"2 50", Millis::NotAnInteger),
            (b"18446744073709551616", Millis::TooLarge),
            (b"000000000000000000001", Millis::TooLarge),
        ] {
            assert_eq!(expected_millis(raw), expected, "{raw:?}");
        }
    }

    #[test]
    fn the_order_oracle_reads_objects_and_pairs() {
        let read = |json: &str| expected_order(&serde_json::from_str(json).unwrap());
        let order = |q| {
            Some(Ok(NewOrder {
                sku: "A".into(),
                quantity: q,
            }))
        };
        assert_eq!(read(r#"{"sku":"A","quantity":1000}"#), order(1000));
        assert_eq!(read(r#"["A",1]"#), order(1));
        assert_eq!(
            read(r#"{"sku":"A","quantity":1001}"#),
            Some(Err("quantity"))
        );
        assert_eq!(read(r#"{"sku":"A/B","quantity":1}"#), Some(Err("sku")));
        assert_eq!(read(r#"{"quantity":1}"#), Some(Err("sku")));
    }

    #[test]
    fn url_path_safety() {
        assert!(url_path_safe("SKU-00001"));
        for bad in ["", "..", "a/b", "a?b", "a#b", "a%2F", "a b", "é"] {
            assert!(!url_path_safe(bad), "{bad:?}");
        }
    }
}

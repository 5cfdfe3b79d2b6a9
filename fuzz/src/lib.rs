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
//! parser that breaks docs/design.md §3 or the order validation shows up as a failed assertion,
//! not only as a panic.

use http::{HeaderValue, StatusCode};
use orders_service::orders::{
    MAX_KEY_LEN, MAX_QUANTITY, NewOrder, NewOrderRequest, validate_key, validate_sku,
};

mod downstream_answer;
mod grpc_timeout;
mod timeout_header;

pub use downstream_answer::{downstream_answer, expected_total};
pub use grpc_timeout::{expected_grpc, grpc_timeout};
pub use timeout_header::{Millis, expected_millis, timeout_header};

/// A fuzz target: its name (the folder under `corpus/` and `fuzz_targets/<name>.rs`) and
/// its body.
pub type Target = (&'static str, fn(&[u8]));

/// Every target, for the corpus replay.
pub const TARGETS: &[Target] = &[
    ("timeout_header", timeout_header),
    ("order_body", order_body),
    ("grpc_timeout", grpc_timeout),
    ("downstream_answer", downstream_answer),
];

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
    // A whole number in range, however it is written: JSON has one number type, so
    // `2`, `2.0` and `2e0` are the same quantity (JSON Schema's `integer`, which the
    // OpenAPI document promises). Every integer in range is exact as an f64.
    let whole = quantity
        .as_f64()
        .filter(|q| q.fract() == 0.0 && (1.0..=MAX_QUANTITY as f64).contains(q));
    Some(match whole {
        Some(q) => Ok(NewOrder {
            sku: sku.clone(),
            quantity: q as i32,
        }),
        None => Err("quantity"),
    })
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
        assert_eq!(read(r#"{"sku":"A","quantity":1.0}"#), order(1));
        assert_eq!(read(r#"{"sku":"A","quantity":1e3}"#), order(1000));
        assert_eq!(read(r#"{"sku":"A","quantity":1.5}"#), Some(Err("quantity")));
        assert_eq!(read(r#"{"sku":"A","quantity":1e4}"#), Some(Err("quantity")));
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

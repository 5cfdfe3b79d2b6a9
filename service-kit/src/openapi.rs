//! The services' OpenAPI 3.1 documents, generated from the code.
//!
//! Each handler documents its own answers with `#[utoipa::path]`, and `utoipa-axum`'s
//! `routes!` puts the handler into the router and its path into the document in one
//! call, so a route cannot be served undocumented or documented under another path.
//! What the *layers* add to every route is added here, once, the way the layers wrap
//! every route: the budget headers and their 400, the ingress's 504, `Server-Timing` on
//! every answer, `Retry-After` on every 503, the JSON body limits' 400, 413 and 415, and
//! for each problem status the `type` values docs/design.md §3.6 allows.
//!
//! utoipa rather than a hand-written document or a router walker: the handler's
//! attribute sits on the code that answers, a router alone does not know the statuses,
//! and the crate stays free of it (this is demo plumbing, not the technique).

use axum::body::Bytes;
use axum::routing::{MethodRouter, get};
use http::header;
use serde_json::{Map, Value, json};
use utoipa::ToSchema;

/// What the ingress of a service reads besides the budget headers.
#[derive(Debug, Clone, Copy, Default)]
pub struct Ingress {
    /// The service honours `X-Deadline-Mode: observe` from its callers (catalog-service,
    /// docs/design.md §4.3).
    pub mode_header: bool,
}

/// An error answer, `application/problem+json` (RFC 9457), as
/// `deadline_propagation::Problem` writes it.
#[derive(ToSchema)]
#[schema(title = "A problem (RFC 9457)")]
#[allow(
    dead_code,
    reason = "never built: it describes the JSON that deadline_propagation::Problem writes"
)]
pub struct ProblemDetails {
    /// What kind of problem: one URN per status (docs/design.md §3.6).
    #[serde(rename = "type")]
    kind: ProblemType,
    /// The status's reason phrase.
    title: String,
    /// The HTTP status, repeated.
    #[schema(minimum = 400, maximum = 599)]
    status: u16,
    /// What went wrong, for a person.
    detail: String,
    /// Where the budget ran out, or which step refused (`ingress`, `catalog_pool`,
    /// `catalog`, `db_pool`, `db`, ...).
    #[schema(nullable = false)]
    stage: Option<String>,
    /// The budget the service accepted, after the clamp.
    #[schema(nullable = false)]
    budget_ms: Option<u64>,
    /// How long the request had run when it was answered.
    #[schema(nullable = false)]
    elapsed_ms: Option<u64>,
    /// The malformed header, for `urn:problem:invalid-header`.
    #[schema(nullable = false)]
    header: Option<String>,
}

/// The problem types of docs/design.md §3.6.
#[derive(ToSchema)]
#[allow(dead_code, reason = "never built: it describes the JSON")]
enum ProblemType {
    #[serde(rename = "urn:problem:bad-request")]
    BadRequest,
    #[serde(rename = "urn:problem:invalid-header")]
    InvalidHeader,
    #[serde(rename = "urn:problem:forbidden")]
    Forbidden,
    #[serde(rename = "urn:problem:not-found")]
    NotFound,
    #[serde(rename = "urn:problem:conflict")]
    Conflict,
    #[serde(rename = "urn:problem:payload-too-large")]
    PayloadTooLarge,
    #[serde(rename = "urn:problem:unsupported-media-type")]
    UnsupportedMediaType,
    #[serde(rename = "urn:problem:validation")]
    Validation,
    #[serde(rename = "urn:problem:bad-gateway")]
    BadGateway,
    #[serde(rename = "urn:problem:overloaded")]
    Overloaded,
    #[serde(rename = "urn:problem:deadline-exceeded")]
    DeadlineExceeded,
    #[serde(rename = "urn:problem:outcome-unknown")]
    OutcomeUnknown,
    #[serde(rename = "urn:problem:internal")]
    Internal,
}

/// The `type` values each status may carry (docs/design.md §3.6).
const TYPES_BY_STATUS: [(&str, &[&str]); 11] = [
    (
        "400",
        &["urn:problem:invalid-header", "urn:problem:bad-request"],
    ),
    ("403", &["urn:problem:forbidden"]),
    ("404", &["urn:problem:not-found"]),
    ("409", &["urn:problem:conflict"]),
    ("413", &["urn:problem:payload-too-large"]),
    ("415", &["urn:problem:unsupported-media-type"]),
    ("422", &["urn:problem:validation"]),
    (
        "500",
        &["urn:problem:outcome-unknown", "urn:problem:internal"],
    ),
    ("502", &["urn:problem:bad-gateway"]),
    ("503", &["urn:problem:overloaded"]),
    ("504", &["urn:problem:deadline-exceeded"]),
];

const METHODS: [&str; 7] = ["get", "put", "post", "delete", "patch", "head", "options"];

const PROBLEM_JSON: &str = "application/problem+json";

/// `GET /openapi.json`: the document, rendered once, byte for byte the committed file.
pub fn serve<S: Clone + Send + Sync + 'static>(document: Value) -> MethodRouter<S> {
    let mut body = serde_json::to_string_pretty(&document).expect("a JSON value renders");
    body.push('\n');
    let body = Bytes::from(body);
    get(move || {
        let body = body.clone();
        async move { ([(header::CONTENT_TYPE, "application/json")], body) }
    })
}

/// The document as served and committed: the handlers' paths, with what the layers add
/// to every operation.
pub fn finish(api: utoipa::openapi::OpenApi, ingress: Ingress) -> Value {
    let mut doc = serde_json::to_value(api).expect("an OpenAPI document serializes");
    let paths = doc["paths"].as_object_mut().into_iter().flatten();
    for (_, item) in paths {
        let operations = item.as_object_mut().into_iter().flatten();
        for (method, operation) in operations {
            if METHODS.contains(&method.as_str()) {
                finish_operation(operation, ingress);
            }
        }
    }
    doc
}

fn finish_operation(operation: &mut Value, ingress: Ingress) {
    let parameters = operation
        .as_object_mut()
        .expect("an operation is an object")
        .entry("parameters")
        .or_insert_with(|| json!([]));
    let parameters = parameters.as_array_mut().expect("parameters are a list");
    parameters.extend(budget_headers());
    if ingress.mode_header {
        parameters.push(mode_header());
    }

    let has_body = operation.get("requestBody").is_some();
    let responses = operation["responses"]
        .as_object_mut()
        .expect("an operation has responses");
    // The ingress refuses a malformed budget header before the handler runs, and
    // answers 504 when the budget runs out, whatever the route.
    add_problem(
        responses,
        "400",
        "A malformed budget header (`urn:problem:invalid-header`, its `header` member names it)",
    );
    add_problem(
        responses,
        "504",
        "The budget ran out; `stage` says where. Nothing was written",
    );
    if has_body {
        add_problem(
            responses,
            "400",
            "A body that is not well-formed JSON (`urn:problem:bad-request`)",
        );
        add_problem(
            responses,
            "413",
            "A body over the limit, also when only announced by `Content-Length`",
        );
        add_problem(responses, "415", "A body that is not `application/json`");
    }
    for (status, response) in responses.iter_mut() {
        finish_response(status, response);
    }
}

/// Every answer says where its time went; a 503 says when to come back; a problem is
/// `application/problem+json`, with the `type` and `status` its status allows.
fn finish_response(status: &str, response: &mut Value) {
    // A handler writes `body = ProblemDetails`; every error is sent as problem+json.
    if status >= "400"
        && let Some(content) = response.get_mut("content").and_then(Value::as_object_mut)
        && let Some(json) = content.remove("application/json")
    {
        content.insert(PROBLEM_JSON.into(), json);
    }
    let headers = response
        .as_object_mut()
        .expect("a response is an object")
        .entry("headers")
        .or_insert_with(|| json!({}))
        .as_object_mut()
        .expect("headers are an object");
    headers.insert(
        "Server-Timing".into(),
        json!({
            "required": true,
            "description": "Where the time went, per stage, then `total` (docs/design.md §3.7), \
                            e.g. `catalog_pool;dur=0.1, catalog;dur=12.4, db;dur=3.2, total;dur=16.9`",
            "schema": {"type": "string", "pattern": "total;dur=[0-9]+\\.[0-9]$"},
        }),
    );
    if status == "503" {
        headers.insert(
            "Retry-After".into(),
            json!({
                "required": true,
                "description": "Seconds to wait before trying again (the downstream's own, when passing its 503 on)",
                "schema": {"type": "string", "pattern": "^[0-9]+$"},
            }),
        );
    }
    let Some(types) = TYPES_BY_STATUS.iter().find(|(s, _)| *s == status) else {
        return;
    };
    if let Some(content) =
        response.pointer_mut(&format!("/content/{}", PROBLEM_JSON.replace('/', "~1")))
    {
        let code: u16 = status.parse().expect("a status is a number");
        content["schema"] = json!({
            "allOf": [
                {"$ref": "#/components/schemas/ProblemDetails"},
                {"properties": {"type": {"enum": types.1}, "status": {"const": code}}},
            ],
        });
    }
}

/// Adds a problem answer for `status`, or appends `why` to the one the handler wrote.
fn add_problem(responses: &mut Map<String, Value>, status: &str, why: &str) {
    match responses.get_mut(status) {
        Some(response) => {
            let description = response["description"].as_str().unwrap_or_default();
            if !description.contains(why) {
                response["description"] = Value::String(format!("{description}; or {why}"));
            }
        }
        None => {
            responses.insert(
                status.into(),
                json!({
                    "description": why,
                    "content": {PROBLEM_JSON: {"schema": {"$ref": "#/components/schemas/ProblemDetails"}}},
                }),
            );
        }
    }
}

/// The three budget headers of docs/design.md §3.1. The patterns are the grammar of a
/// field value (HTTP strips the surrounding whitespace the grammar allows).
fn budget_headers() -> [Value; 3] {
    let millis = |name: &str, description: &str| {
        json!({
            "name": name,
            "in": "header",
            "required": false,
            "description": description,
            "schema": {"type": "string", "pattern": decimal_at_most(u64::MAX), "maxLength": 256},
        })
    };
    [
        millis(
            "X-Request-Timeout-Ms",
            "The caller's remaining budget in whole milliseconds, from when the request is \
             received; clamped to the service's maximum, the default without it. Leading zeros \
             are allowed; anything but ASCII digits, a value above 18446744073709551615, or a \
             repeat that disagrees is 400 `urn:problem:invalid-header`. When several budget \
             headers are present, the smallest wins.",
        ),
        json!({
            "name": "grpc-timeout",
            "in": "header",
            "required": false,
            "description": "A gRPC client's budget: at most 8 digits and a unit (H, M, S, m, u, n), \
                            rounded up to whole milliseconds.",
            "schema": {"type": "string", "pattern": "^[0-9]{1,8}[HMSmun]$"},
        }),
        millis(
            "x-envoy-expected-rq-timeout-ms",
            "Envoy's budget for this request, with the grammar and limits of X-Request-Timeout-Ms.",
        ),
    ]
}

/// A pattern for the decimal numbers from 0 to `bound`, leading zeros allowed. A header
/// is a string, and JSON Schema cannot compare a string as a number, so the range is
/// spelled out digit by digit: shorter numbers, then for each position of `bound` a
/// smaller digit there after the same prefix, then `bound` itself. Without it a client
/// generated from the document would send `99999999999999999999`, which the service
/// refuses (400: above `u64::MAX`).
fn decimal_at_most(bound: u64) -> String {
    let digits = bound.to_string();
    let len = digits.len();
    let any = |n: usize| {
        if n == 0 {
            String::new()
        } else {
            format!("[0-9]{{{n}}}")
        }
    };
    let mut alternatives = Vec::new();
    if len > 1 {
        alternatives.push(format!("[0-9]{{1,{}}}", len - 1));
    }
    for (at, digit) in digits.bytes().enumerate() {
        let smaller = match digit {
            b'0' => continue,
            b'1' => "0".to_owned(),
            _ => format!("[0-{}]", char::from(digit - 1)),
        };
        alternatives.push(format!("{}{smaller}{}", &digits[..at], any(len - at - 1)));
    }
    alternatives.push(digits);
    format!("^0*(?:{})$", alternatives.join("|"))
}

fn mode_header() -> Value {
    json!({
        "name": "X-Deadline-Mode",
        "in": "header",
        "required": false,
        "description": "`observe`: run this request in observe mode (nothing is refused, what \
                        would be is counted), as an observing caller asks (docs/design.md §4.3). \
                        Any other value is 400 `urn:problem:invalid-header`.",
        "schema": {"type": "string", "enum": ["observe"]},
    })
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::{TYPES_BY_STATUS, decimal_at_most};

    /// The document lists the problem types by hand (utoipa cannot read them out of
    /// `Problem`), so every kind the crate can build must be one the document allows
    /// for its status, and a table entry for it; a new kind fails here first.
    #[tokio::test]
    async fn every_problem_the_crate_builds_is_in_the_document() {
        use crate::answers::Answers as _;
        use axum::response::IntoResponse;
        use deadline_propagation::{Problem, Stage};

        let stage = Stage::named("catalog");
        let problems = [
            Problem::bad_request("x"),
            Problem::invalid_header("X-Request-Timeout-Ms", "x"),
            Problem::forbidden("x"),
            Problem::not_found("x"),
            Problem::conflict("x"),
            Problem::payload_too_large("x"),
            Problem::unsupported_media_type("x"),
            Problem::unprocessable("x"),
            Problem::overloaded(stage, std::time::Duration::from_secs(1), "x"),
            Problem::unavailable(stage, "x"),
            Problem::bad_gateway(stage, "x"),
            Problem::internal("x"),
            Problem::outcome_unknown(stage),
            Problem::deadline(
                deadline_propagation::Deadline::after(std::time::Duration::ZERO).exceeded(stage),
            ),
        ];
        let schema =
            serde_json::to_value(<super::ProblemType as utoipa::PartialSchema>::schema()).unwrap();
        for problem in problems {
            let response = problem.into_response();
            let status = response.status().as_str().to_owned();
            let body = axum::body::to_bytes(response.into_body(), 4096)
                .await
                .unwrap();
            let body: serde_json::Value = serde_json::from_slice(&body).unwrap();
            let kind = body["type"].as_str().unwrap();
            let allowed = TYPES_BY_STATUS
                .iter()
                .find(|(s, _)| *s == status)
                .map(|(_, types)| *types)
                .unwrap_or_default();
            assert!(
                allowed.contains(&kind),
                "{status} {kind} is not in TYPES_BY_STATUS"
            );
            assert!(
                schema["enum"].as_array().unwrap().contains(&kind.into()),
                "{kind} is not a ProblemType"
            );
        }
    }

    fn matches(bound: u64, text: &str) -> bool {
        regex_automata::meta::Regex::new(&decimal_at_most(bound))
            .unwrap()
            .is_match(text)
    }

    #[test]
    fn the_budget_pattern_stops_exactly_at_u64_max() {
        for text in [
            "0",
            "000",
            "18446744073709551615",
            "018446744073709551615",
            "9999999999999999999",
        ] {
            assert!(matches(u64::MAX, text), "{text} is at most u64::MAX");
        }
        for text in [
            "18446744073709551616",
            "18446744073709551620",
            "19000000000000000000",
            "99999999999999999999",
            "",
            "-1",
            "1.0",
            " 1",
        ] {
            assert!(
                !matches(u64::MAX, text),
                "{text:?} is not a number at most u64::MAX"
            );
        }
    }

    proptest! {
        #[test]
        fn the_pattern_matches_a_number_exactly_when_it_is_at_most_the_bound(
            bound in any::<u64>(),
            number in any::<u128>(),
            zeros in 0usize..3,
        ) {
            let text = format!("{}{number}", "0".repeat(zeros));
            prop_assert_eq!(matches(bound, &text), number <= u128::from(bound), "{} against {}", text, bound);
        }

        #[test]
        fn near_the_bound_too(bound in any::<u64>(), offset in -1000i128..1000) {
            let number = i128::from(bound) + offset;
            prop_assume!(number >= 0);
            prop_assert_eq!(matches(bound, &number.to_string()), offset <= 0);
        }
    }
}

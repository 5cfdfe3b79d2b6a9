//! The services' OpenAPI 3.1 documents, generated from the code.
//!
//! Each handler documents its own answers with `#[utoipa::path]`, and `utoipa-axum`'s
//! `routes!` puts the handler into the router and its path into the document in one
//! call, so a route cannot be served undocumented or documented under another path.
//! What the *layers* add to every route is added here, once, the way the layers wrap
//! every route: the budget headers and their 400, the ingress's 504, `Server-Timing` on
//! every answer, `Retry-After` on every 503, the JSON body limits' 400, 413 and 415,
//! `x-request-id` in and out ([`layers`](crate::layers)), and for each problem status
//! the `type` values docs/design.md §3.6 allows.
//!
//! utoipa rather than a hand-written document or a router walker: the handler's
//! attribute sits on the code that answers, a router alone does not know the statuses,
//! and the crate stays free of it (this is demo plumbing, not the technique). The
//! layers' part is a typed [`Modify`] ([`Ingress`]), run on the document once the
//! routes have put their paths into it.

use axum::body::Bytes;
use axum::routing::{MethodRouter, get};
use http::header;
use utoipa::openapi::extensions::Extensions;
use utoipa::openapi::path::{Operation, Parameter, ParameterBuilder, ParameterIn};
use utoipa::openapi::schema::SchemaType;
use utoipa::openapi::{
    AllOfBuilder, Content, Header, HeaderBuilder, ObjectBuilder, OpenApi, PathItem, Ref, RefOr,
    Required, Response, ResponseBuilder, Schema, Type,
};
use utoipa::{Modify, ToSchema};

use crate::layers::REQUEST_ID_HEADER;

/// What the ingress of a service reads besides the budget headers; as a [`Modify`], what
/// the layers add to every operation of a document.
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

const PROBLEM_JSON: &str = "application/problem+json";

/// `GET /openapi.json`: the document, rendered once, byte for byte the committed file.
/// It is rendered through a `serde_json::Value`, whose members are sorted by name, so
/// the file's order does not follow the order of utoipa's struct fields.
pub fn serve<S: Clone + Send + Sync + 'static>(document: OpenApi) -> MethodRouter<S> {
    let document = serde_json::to_value(document).expect("an OpenAPI document serializes");
    let mut body = serde_json::to_string_pretty(&document).expect("a JSON value renders");
    body.push('\n');
    let body = Bytes::from(body);
    get(move || {
        let body = body.clone();
        async move { ([(header::CONTENT_TYPE, "application/json")], body) }
    })
}

/// The document as served and committed: the handlers' paths, with what the layers add
/// to every operation ([`Ingress`] as a [`Modify`]).
pub fn finish(mut api: OpenApi, ingress: Ingress) -> OpenApi {
    ingress.modify(&mut api);
    api
}

impl Modify for Ingress {
    fn modify(&self, openapi: &mut OpenApi) {
        for item in openapi.paths.paths.values_mut() {
            for operation in operations(item) {
                self.finish_operation(operation);
            }
        }
    }
}

/// Every operation of a path, whatever its method.
fn operations(item: &mut PathItem) -> impl Iterator<Item = &mut Operation> {
    let fixed = [
        &mut item.get,
        &mut item.put,
        &mut item.post,
        &mut item.delete,
        &mut item.options,
        &mut item.head,
        &mut item.patch,
        &mut item.trace,
        &mut item.query,
    ];
    let fixed = fixed.into_iter().filter_map(Option::as_mut);
    fixed.chain(item.additional_operations.values_mut())
}

impl Ingress {
    fn finish_operation(self, operation: &mut Operation) {
        let parameters = operation.parameters.get_or_insert_with(Vec::new);
        parameters.extend(budget_headers().map(RefOr::T));
        if self.mode_header {
            parameters.push(RefOr::T(mode_header()));
        }
        parameters.push(RefOr::T(optional_header(
            REQUEST_ID_HEADER,
            "A name for this request, answered back in `x-request-id`; without it the \
             service makes one (a UUID).",
            ObjectBuilder::new().schema_type(Type::String),
        )));

        let has_body = operation.request_body.is_some();
        let responses = &mut operation.responses.responses;
        // The ingress refuses a malformed budget header before the handler runs, and
        // answers 504 when the budget runs out, whatever the route.
        let mut problems = vec![
            (
                "400",
                "A malformed budget header (`urn:problem:invalid-header`, its `header` member names it)",
            ),
            (
                "504",
                "The budget ran out; `stage` says where. Nothing was written",
            ),
        ];
        if has_body {
            problems.extend([
                (
                    "400",
                    "A body that is not well-formed JSON (`urn:problem:bad-request`)",
                ),
                (
                    "413",
                    "A body over the limit, also when only announced by `Content-Length`",
                ),
                ("415", "A body that is not `application/json`"),
            ]);
        }
        for (status, why) in problems {
            let response = responses.entry(status.to_owned());
            add_problem(response.or_insert_with(problem_response), why);
        }
        for (status, response) in responses.iter_mut() {
            if let RefOr::T(response) = response {
                finish_response(status, response);
            }
        }
    }
}

/// Puts `why` into the answer's description: alone in a new one, appended to the one the
/// handler wrote.
fn add_problem(response: &mut RefOr<Response>, why: &str) {
    let RefOr::T(response) = response else {
        return;
    };
    let description = &mut response.description;
    if description.is_empty() {
        why.clone_into(description);
    } else if !description.contains(why) {
        *description = format!("{description}; or {why}");
    }
}

/// An answer with a [`ProblemDetails`] body, not yet described.
fn problem_response() -> RefOr<Response> {
    let body = Content::new(Some(Ref::from_schema_name("ProblemDetails")));
    RefOr::T(ResponseBuilder::new().content(PROBLEM_JSON, body).build())
}

/// Every answer says where its time went; a 503 says when to come back; a problem is
/// `application/problem+json`, with the `type` and `status` its status allows.
fn finish_response(status: &str, response: &mut Response) {
    // A handler writes `body = ProblemDetails`; every error is sent as problem+json.
    if status >= "400"
        && let Some(json) = response.content.shift_remove("application/json")
    {
        response.content.insert(PROBLEM_JSON.into(), json);
    }
    response.headers.insert(
        "Server-Timing".into(),
        RefOr::T(required_header(
            "Where the time went, per stage, then `total` (docs/design.md §3.7), \
             e.g. `catalog_pool;dur=0.1, catalog;dur=12.4, db;dur=3.2, total;dur=16.9`",
            Some("total;dur=[0-9]+\\.[0-9]$"),
        )),
    );
    response.headers.insert(
        REQUEST_ID_HEADER.into(),
        RefOr::T(required_header(
            "The request's `x-request-id`: the caller's own, else one the service made (a UUID)",
            None,
        )),
    );
    if status == "503" {
        response.headers.insert(
            "Retry-After".into(),
            RefOr::T(required_header(
                "Seconds to wait before trying again (the downstream's own, when passing its 503 on)",
                Some("^[0-9]+$"),
            )),
        );
    }
    let Some((_, types)) = TYPES_BY_STATUS.iter().find(|(s, _)| *s == status) else {
        return;
    };
    if let Some(RefOr::T(content)) = response.content.get_mut(PROBLEM_JSON) {
        let code: u16 = status.parse().expect("a status is a number");
        // JSON Schema's `const` is a one-value `enum`; utoipa's schema has no `const`,
        // so `status` is written as that enum.
        let narrowed = ObjectBuilder::new()
            .schema_type(SchemaType::AnyValue)
            .property("type", any_of_values(types.iter().copied()))
            .property("status", any_of_values([code]));
        let schema = AllOfBuilder::new()
            .item(Ref::from_schema_name("ProblemDetails"))
            .item(narrowed);
        content.schema = Some(RefOr::T(Schema::AllOf(schema.build())));
    }
}

/// A schema of any type that allows exactly `values`.
fn any_of_values<V: Into<serde_json::Value>>(values: impl IntoIterator<Item = V>) -> ObjectBuilder {
    ObjectBuilder::new()
        .schema_type(SchemaType::AnyValue)
        .enum_values(Some(values))
}

/// A response header every answer carries, its value a string (matching `pattern`).
fn required_header(description: &str, pattern: Option<&str>) -> Header {
    // OpenAPI's Header Object has the Parameter Object's `required`; utoipa's has no
    // field for it, and writes its extensions flat into the object, so it goes there.
    let required = Extensions::from_iter([("required", true)]);
    HeaderBuilder::new()
        .description(Some(description))
        .schema(Some(
            ObjectBuilder::new()
                .schema_type(Type::String)
                .pattern(pattern),
        ))
        .extensions(Some(required))
        .build()
}

/// A string matching `pattern`.
fn string(pattern: impl Into<String>) -> ObjectBuilder {
    ObjectBuilder::new()
        .schema_type(Type::String)
        .pattern(Some(pattern))
}

/// The three budget headers of docs/design.md §3.1. The patterns are the grammar of a
/// field value (HTTP strips the surrounding whitespace the grammar allows).
fn budget_headers() -> [Parameter; 3] {
    let millis = |name: &str, description: &str| {
        optional_header(
            name,
            description,
            string(decimal_at_most(u64::MAX)).max_length(Some(256)),
        )
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
        optional_header(
            "grpc-timeout",
            "A gRPC client's budget: at most 8 digits and a unit (H, M, S, m, u, n), \
             rounded up to whole milliseconds.",
            string("^[0-9]{1,8}[HMSmun]$"),
        ),
        millis(
            "x-envoy-expected-rq-timeout-ms",
            "Envoy's budget for this request, with the grammar and limits of X-Request-Timeout-Ms.",
        ),
    ]
}

/// A request header the caller may leave out.
fn optional_header(name: &str, description: &str, schema: ObjectBuilder) -> Parameter {
    ParameterBuilder::new()
        .name(name)
        .parameter_in(ParameterIn::Header)
        .required(Required::False)
        .description(Some(description))
        .schema(Some(schema))
        .build()
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

fn mode_header() -> Parameter {
    optional_header(
        "X-Deadline-Mode",
        "`observe`: run this request in observe mode (nothing is refused, what would be is \
         counted), as an observing caller asks (docs/design.md §4.3). Any other value is 400 \
         `urn:problem:invalid-header`.",
        ObjectBuilder::new()
            .schema_type(Type::String)
            .enum_values(Some(["observe"])),
    )
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

//! Envoy's `x-envoy-expected-rq-timeout-ms`: the budget Envoy gives the request it
//! forwards, so a service behind it can stop when Envoy stops waiting.
//!
//! Whole milliseconds, like ours, and parsed by the same digit parser
//! ([`parse_digits`](super::request_timeout)): one grammar, one implementation, so the
//! two headers can never disagree about what a valid value is.

use http::HeaderName;

/// The header, lower-case as Envoy sends it.
pub(super) const ENVOY_TIMEOUT_HEADER: HeaderName =
    HeaderName::from_static("x-envoy-expected-rq-timeout-ms");

/// How the header is named in messages: Envoy documents it in lower case.
pub(crate) const ENVOY_TIMEOUT_HEADER_DISPLAY: &str = "x-envoy-expected-rq-timeout-ms";

/// Reads Envoy's budget from `headers`: `Ok(None)` when absent, the value when every
/// value of the header agrees, `Err` otherwise (the same rules as `X-Request-Timeout-Ms`).
/// [`read_budget`](super::read_budget) reads it in its one walk over the headers; this
/// lookup of the name alone is what the tests hold that walk to.
#[cfg(test)]
pub(crate) fn parse_envoy_timeout(
    headers: &http::HeaderMap,
) -> Result<Option<std::time::Duration>, super::InvalidValue> {
    let ms = super::read_values(
        headers,
        &ENVOY_TIMEOUT_HEADER,
        super::request_timeout::parse_digits,
    )?;
    Ok(ms.map(std::time::Duration::from_millis))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::header::{InvalidBudget, InvalidValue};
    use http::{HeaderMap, HeaderValue};
    use std::time::Duration;

    fn parse(values: &[&str]) -> Result<Option<Duration>, InvalidValue> {
        let mut headers = HeaderMap::new();
        for value in values {
            headers.append(ENVOY_TIMEOUT_HEADER, HeaderValue::from_str(value).unwrap());
        }
        parse_envoy_timeout(&headers)
    }

    #[test]
    fn absent_valid_and_invalid_like_ours() {
        let ms = |n| Ok(Some(Duration::from_millis(n)));
        assert_eq!(parse(&[]), Ok(None));
        assert_eq!(parse(&["250"]), ms(250));
        assert_eq!(parse(&[" 0250 "]), ms(250));
        assert_eq!(parse(&["0"]), ms(0));
        assert_eq!(parse(&["250", "250"]), ms(250));
        assert_eq!(parse(&[""]), Err(InvalidValue::Empty));
        assert_eq!(parse(&["-1"]), Err(InvalidValue::NotAnInteger("-1".into())));
        assert_eq!(
            parse(&["250m"]),
            Err(InvalidValue::NotAnInteger("250m".into()))
        );
        assert_eq!(
            parse(&["18446744073709551616"]),
            Err(InvalidValue::TooLarge)
        );
        assert_eq!(parse(&["250", "300"]), Err(InvalidValue::Conflicting));
    }

    #[test]
    fn every_error_message_names_the_header() {
        for reason in [
            InvalidValue::Empty,
            InvalidValue::NotAnInteger("x".into()),
            InvalidValue::TooLarge,
            InvalidValue::TooLong,
            InvalidValue::Conflicting,
        ] {
            let err = InvalidBudget::new(ENVOY_TIMEOUT_HEADER_DISPLAY, reason).to_string();
            assert!(err.starts_with("x-envoy-expected-rq-timeout-ms "), "{err}");
        }
    }
}

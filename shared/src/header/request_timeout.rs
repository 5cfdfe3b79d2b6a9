//! Parsing the `X-Request-Timeout-Ms` header (docs/design.md §3.1), and the digit parser
//! `x-envoy-expected-rq-timeout-ms` shares with it.
//!
//! The value is the caller's *remaining* budget in milliseconds, relative, so the clocks
//! of two hosts never need to agree. Parsing tells three cases apart, like tonic's
//! `grpc-timeout`: absent (use the default), valid, and invalid (answer 400). Anything
//! that is not a plain run of ASCII digits is invalid: a sign, a fraction, an exponent,
//! a hex prefix, non-ASCII digits, or a value larger than a `u64` holds. Leading zeros
//! add nothing and are skipped, however many there are. The work is bounded twice over:
//! a value longer than [`MAX_VALUE_BYTES`] is refused before it is looked at, and at most
//! 20 significant digits are ever multiplied out, so a hostile header costs nothing.
//! Nothing here can panic.

use std::time::Duration;

use http::{HeaderMap, HeaderName};

use super::{InvalidValue, read_values};

/// The budget header, lower-case as HTTP/2 and `http` spell it.
///
/// ```
/// // What a caller sends: 700 ms remaining.
/// let mut headers = http::HeaderMap::new();
/// headers.insert(shared::header::REQUEST_TIMEOUT_HEADER, http::HeaderValue::from(700u64));
/// ```
pub const REQUEST_TIMEOUT_HEADER: HeaderName = HeaderName::from_static("x-request-timeout-ms");

/// How the header is spelled in messages, for humans.
///
/// ```
/// use shared::header::{REQUEST_TIMEOUT_HEADER, REQUEST_TIMEOUT_HEADER_DISPLAY};
///
/// assert!(REQUEST_TIMEOUT_HEADER_DISPLAY.eq_ignore_ascii_case(REQUEST_TIMEOUT_HEADER.as_str()));
/// ```
pub const REQUEST_TIMEOUT_HEADER_DISPLAY: &str = "X-Request-Timeout-Ms";

/// The longest header value looked at. A real client sends at most 20 digits; this
/// leaves room for padding and zeros while keeping one pass over the value cheap.
///
/// ```
/// use shared::header::{InvalidTimeout, MAX_VALUE_BYTES, parse_millis};
///
/// let padded = format!("{:>width$}", 7, width = MAX_VALUE_BYTES + 1);
/// assert_eq!(parse_millis(padded.as_bytes()), Err(InvalidTimeout::TooLong));
/// ```
pub const MAX_VALUE_BYTES: usize = 256;

/// `u64::MAX` has 20 decimal digits: more significant digits cannot fit, so they are
/// refused without being multiplied out.
const MAX_SIGNIFICANT_DIGITS: usize = 20;

/// Why a budget header was refused. The message names the header so the client knows
/// which of its inputs was wrong.
///
/// ```
/// use shared::header::{InvalidTimeout, parse_millis};
///
/// assert_eq!(parse_millis(b"1e3"), Err(InvalidTimeout::NotAnInteger("1e3".into())));
/// assert_eq!(parse_millis(b"99999999999999999999"), Err(InvalidTimeout::TooLarge));
/// ```
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum InvalidTimeout {
    /// The header is present but holds nothing but whitespace.
    #[error("{REQUEST_TIMEOUT_HEADER_DISPLAY} is empty; send a whole number of milliseconds")]
    Empty,
    /// Something other than ASCII digits (a sign, a dot, an exponent, letters).
    #[error("{REQUEST_TIMEOUT_HEADER_DISPLAY} must be a whole number of milliseconds, got {0:?}")]
    NotAnInteger(String),
    /// A value larger than a `u64` can hold.
    #[error("{REQUEST_TIMEOUT_HEADER_DISPLAY} is too large to be a number of milliseconds")]
    TooLarge,
    /// Longer than [`MAX_VALUE_BYTES`], whatever it holds.
    #[error("{REQUEST_TIMEOUT_HEADER_DISPLAY} is longer than {MAX_VALUE_BYTES} bytes")]
    TooLong,
    /// The header appears more than once with values that disagree.
    #[error("{REQUEST_TIMEOUT_HEADER_DISPLAY} is repeated with different values")]
    Conflicting,
}

impl From<InvalidValue> for InvalidTimeout {
    /// The digit parser's reasons, told in this header's own words. `NotAGrpcTimeout`
    /// cannot come from the digit parser; it is mapped for completeness.
    fn from(reason: InvalidValue) -> Self {
        match reason {
            InvalidValue::Empty => InvalidTimeout::Empty,
            InvalidValue::NotAnInteger(got) | InvalidValue::NotAGrpcTimeout(got) => {
                InvalidTimeout::NotAnInteger(got)
            }
            InvalidValue::TooLarge => InvalidTimeout::TooLarge,
            InvalidValue::TooLong => InvalidTimeout::TooLong,
            InvalidValue::Conflicting => InvalidTimeout::Conflicting,
        }
    }
}

/// Reads the caller's budget from `headers`.
///
/// `Ok(None)` when the header is absent, `Ok(Some(budget))` for one valid value (or the
/// same value repeated), `Err` otherwise. Zero is valid here; the clamp raises it to 1 ms.
///
/// ```
/// use std::time::Duration;
/// use http::{HeaderMap, HeaderValue};
/// use shared::header::{REQUEST_TIMEOUT_HEADER, parse_request_timeout};
///
/// let mut headers = HeaderMap::new();
/// headers.insert(REQUEST_TIMEOUT_HEADER, HeaderValue::from_static(" 300 "));
/// assert_eq!(parse_request_timeout(&headers), Ok(Some(Duration::from_millis(300))));
/// ```
pub fn parse_request_timeout(headers: &HeaderMap) -> Result<Option<Duration>, InvalidTimeout> {
    let ms = read_values(headers, &REQUEST_TIMEOUT_HEADER, parse_digits)?;
    Ok(ms.map(Duration::from_millis))
}

/// Parses one header value: optional surrounding spaces or tabs around ASCII digits.
///
/// ```
/// use shared::header::parse_millis;
///
/// assert_eq!(parse_millis(b"\t042 "), Ok(42));
/// assert!(parse_millis(b"+42").is_err());
/// ```
pub fn parse_millis(raw: &[u8]) -> Result<u64, InvalidTimeout> {
    Ok(parse_digits(raw)?)
}

/// The one digit parser, shared by `X-Request-Timeout-Ms` and
/// `x-envoy-expected-rq-timeout-ms` (the same grammar): the header's name is added by
/// the caller, so both headers refuse exactly the same values.
pub(super) fn parse_digits(raw: &[u8]) -> Result<u64, InvalidValue> {
    if raw.len() > MAX_VALUE_BYTES {
        return Err(InvalidValue::TooLong);
    }
    let digits = raw.trim_ascii();
    if digits.is_empty() {
        return Err(InvalidValue::Empty);
    }
    if !digits.iter().all(u8::is_ascii_digit) {
        return Err(InvalidValue::NotAnInteger(echo(digits)));
    }
    // "0000250" is 250: only the significant digits count towards the cap.
    let first_significant = digits.iter().position(|&d| d != b'0');
    let significant = first_significant.map_or(&[][..], |i| &digits[i..]);
    if significant.len() > MAX_SIGNIFICANT_DIGITS {
        return Err(InvalidValue::TooLarge);
    }
    fold_digits(significant).ok_or(InvalidValue::TooLarge)
}

/// The value of a run of ASCII digits, `None` on overflow. The caller has checked that
/// only digits are there (and how many), so the only possible failure is overflow.
pub(super) fn fold_digits(digits: &[u8]) -> Option<u64> {
    digits.iter().try_fold(0u64, |acc, d| {
        acc.checked_mul(10)?.checked_add(u64::from(d - b'0'))
    })
}

/// At most 32 characters of a refused value, to quote it back without echoing a
/// hostile header whole.
pub(super) fn echo(value: &[u8]) -> String {
    String::from_utf8_lossy(value).chars().take(32).collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use http::HeaderValue;
    use proptest::prelude::*;

    fn parse_one(raw: &[u8]) -> Result<Option<Duration>, InvalidTimeout> {
        let mut headers = HeaderMap::new();
        headers.insert(
            REQUEST_TIMEOUT_HEADER,
            HeaderValue::from_bytes(raw).expect("test values are valid header bytes"),
        );
        parse_request_timeout(&headers)
    }

    #[test]
    fn absent_header_is_none() {
        assert_eq!(parse_request_timeout(&HeaderMap::new()), Ok(None));
    }

    #[test]
    fn parse_table() {
        let ms = |n| Ok(Some(Duration::from_millis(n)));
        let not_int = |s: &str| Err(InvalidTimeout::NotAnInteger(s.to_owned()));
        type Case = (&'static [u8], Result<Option<Duration>, InvalidTimeout>);
        let cases: &[Case] = &[
            (b"250", ms(250)),
            (b" 250 ", ms(250)),
            (b"\t250", ms(250)),
            (b"0", ms(0)),
            (b"0250", ms(250)),
            (b"18446744073709551615", ms(u64::MAX)),
            // Leading zeros add no value: any number of them is fine.
            (b"000000000000000000001", ms(1)),
            (
                b"0000000000000000000000000000018446744073709551615",
                ms(u64::MAX),
            ),
            (b"00000000000000000000000000000000000000000", ms(0)),
            (b"", Err(InvalidTimeout::Empty)),
            (b"   ", Err(InvalidTimeout::Empty)),
            (b"abc", not_int("abc")),
            (b"-5", not_int("-5")),
            (b"+5", not_int("+5")),
            (b"1.5", not_int("1.5")),
            (b"1e3", not_int("1e3")),
            (b"0x10", not_int("0x10")),
            (b"2 50", not_int("2 50")),
            (b"18446744073709551616", Err(InvalidTimeout::TooLarge)),
            (b"99999999999999999999999", Err(InvalidTimeout::TooLarge)),
            (b"000018446744073709551616", Err(InvalidTimeout::TooLarge)),
            // Arabic-Indic and full-width digits are digits to Unicode, not to us.
            ("٢٥٠".as_bytes(), not_int("٢٥٠")),
            ("２５０".as_bytes(), not_int("２５０")),
        ];
        for (raw, expected) in cases {
            assert_eq!(
                &parse_one(raw),
                expected,
                "input {:?}",
                String::from_utf8_lossy(raw)
            );
        }
    }

    #[test]
    fn only_a_value_longer_than_the_bound_is_refused_for_its_length() {
        let padded = format!("{}1", "0".repeat(MAX_VALUE_BYTES));
        assert_eq!(
            parse_millis(padded.as_bytes()),
            Err(InvalidTimeout::TooLong)
        );
        assert_eq!(parse_millis(&padded.as_bytes()[1..]), Ok(1));
    }

    #[test]
    fn repeated_header_with_equal_values_is_accepted() {
        let mut headers = HeaderMap::new();
        headers.append(REQUEST_TIMEOUT_HEADER, HeaderValue::from_static("300"));
        headers.append(REQUEST_TIMEOUT_HEADER, HeaderValue::from_static(" 300"));
        assert_eq!(
            parse_request_timeout(&headers),
            Ok(Some(Duration::from_millis(300)))
        );
    }

    #[test]
    fn repeated_header_with_different_values_is_rejected() {
        let mut headers = HeaderMap::new();
        headers.append(REQUEST_TIMEOUT_HEADER, HeaderValue::from_static("300"));
        headers.append(REQUEST_TIMEOUT_HEADER, HeaderValue::from_static("400"));
        assert_eq!(
            parse_request_timeout(&headers),
            Err(InvalidTimeout::Conflicting)
        );
    }

    #[test]
    fn every_error_message_names_the_header() {
        for err in [
            InvalidTimeout::Empty,
            InvalidTimeout::NotAnInteger("x".into()),
            InvalidTimeout::TooLarge,
            InvalidTimeout::TooLong,
            InvalidTimeout::Conflicting,
        ] {
            assert!(err.to_string().contains("X-Request-Timeout-Ms"), "{err}");
        }
    }

    proptest! {
        #[test]
        fn arbitrary_bytes_never_panic(raw in proptest::collection::vec(any::<u8>(), 0..64)) {
            let _ = parse_millis(&raw);
        }

        #[test]
        fn any_u64_round_trips(n in any::<u64>(), pad in 0usize..3, zeros in 0usize..100) {
            let text = format!("{}{}{n}{}", " ".repeat(pad), "0".repeat(zeros), "\t".repeat(pad));
            prop_assert_eq!(parse_millis(text.as_bytes()), Ok(n));
        }
    }
}

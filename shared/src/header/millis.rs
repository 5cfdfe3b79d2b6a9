//! Whole milliseconds, the grammar of `X-Request-Timeout-Ms` and Envoy's
//! `x-envoy-expected-rq-timeout-ms`: one parser, so the two can never disagree about
//! what a valid value is. Anything but ASCII digits (and whitespace around them) is
//! invalid: a sign, a fraction, an exponent, a hex prefix, non-ASCII digits, a value
//! larger than a `u64`. Leading zeros add nothing and are skipped.

use super::{InvalidValue, MAX_VALUE_BYTES};

/// `u64::MAX` has 20 decimal digits: more significant digits cannot fit, so they are
/// refused without being multiplied out.
const MAX_SIGNIFICANT_DIGITS: usize = 20;

/// Parses one value: ASCII digits, with optional spaces or tabs around them.
pub(crate) fn parse_millis(raw: &[u8]) -> Result<u64, InvalidValue> {
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
    use crate::header::{REQUEST_TIMEOUT_HEADER, read_values};
    use http::{HeaderMap, HeaderValue};
    use proptest::prelude::*;
    use std::time::Duration;

    fn parse_request_timeout(headers: &HeaderMap) -> Result<Option<Duration>, InvalidValue> {
        read_values(headers, &REQUEST_TIMEOUT_HEADER, parse_millis)
            .map(|ms| ms.map(Duration::from_millis))
    }

    fn parse_one(raw: &[u8]) -> Result<Option<Duration>, InvalidValue> {
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
        let not_int = |s: &str| Err(InvalidValue::NotAnInteger(s.to_owned()));
        type Case = (&'static [u8], Result<Option<Duration>, InvalidValue>);
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
            (b"", Err(InvalidValue::Empty)),
            (b"   ", Err(InvalidValue::Empty)),
            (b"abc", not_int("abc")),
            (b"-5", not_int("-5")),
            (b"+5", not_int("+5")),
            (b"1.5", not_int("1.5")),
            (b"1e3", not_int("1e3")),
            (b"0x10", not_int("0x10")),
            (b"2 50", not_int("2 50")),
            (b"18446744073709551616", Err(InvalidValue::TooLarge)),
            (b"99999999999999999999999", Err(InvalidValue::TooLarge)),
            (b"000018446744073709551616", Err(InvalidValue::TooLarge)),
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
        assert_eq!(parse_millis(padded.as_bytes()), Err(InvalidValue::TooLong));
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
            Err(InvalidValue::Conflicting)
        );
    }

    #[test]
    fn every_error_message_names_the_header() {
        for raw in ["", "x", "99999999999999999999999", &"1".repeat(300)] {
            let mut headers = HeaderMap::new();
            headers.insert(REQUEST_TIMEOUT_HEADER, HeaderValue::from_str(raw).unwrap());
            let err = crate::read_budget(&headers).unwrap_err();
            assert!(
                err.to_string().starts_with("X-Request-Timeout-Ms "),
                "{err}"
            );
            assert_eq!(err.header(), "X-Request-Timeout-Ms");
        }
        let mut repeated = HeaderMap::new();
        repeated.append(REQUEST_TIMEOUT_HEADER, HeaderValue::from_static("1"));
        repeated.append(REQUEST_TIMEOUT_HEADER, HeaderValue::from_static("2"));
        let err = crate::read_budget(&repeated).unwrap_err();
        assert!(
            err.to_string().starts_with("X-Request-Timeout-Ms "),
            "{err}"
        );
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

    const ENVOY_TIMEOUT_HEADER: http::HeaderName =
        http::HeaderName::from_static("x-envoy-expected-rq-timeout-ms");

    fn parse_envoy(values: &[&str]) -> Result<Option<Duration>, InvalidValue> {
        let mut headers = HeaderMap::new();
        for value in values {
            headers.append(ENVOY_TIMEOUT_HEADER, HeaderValue::from_str(value).unwrap());
        }
        read_values(&headers, &ENVOY_TIMEOUT_HEADER, parse_millis)
            .map(|ms| ms.map(Duration::from_millis))
    }

    #[test]
    fn envoys_header_is_absent_valid_and_invalid_like_ours() {
        let ms = |n| Ok(Some(Duration::from_millis(n)));
        assert_eq!(parse_envoy(&[]), Ok(None));
        assert_eq!(parse_envoy(&["250"]), ms(250));
        assert_eq!(parse_envoy(&[" 0250 "]), ms(250));
        assert_eq!(parse_envoy(&["0"]), ms(0));
        assert_eq!(parse_envoy(&["250", "250"]), ms(250));
        assert_eq!(parse_envoy(&[""]), Err(InvalidValue::Empty));
        assert_eq!(
            parse_envoy(&["-1"]),
            Err(InvalidValue::NotAnInteger("-1".into()))
        );
        assert_eq!(
            parse_envoy(&["250m"]),
            Err(InvalidValue::NotAnInteger("250m".into()))
        );
        assert_eq!(
            parse_envoy(&["18446744073709551616"]),
            Err(InvalidValue::TooLarge)
        );
        assert_eq!(parse_envoy(&["250", "300"]), Err(InvalidValue::Conflicting));
    }

    #[test]
    fn every_error_message_names_envoys_header() {
        for reason in [
            InvalidValue::Empty,
            InvalidValue::NotAnInteger("x".into()),
            InvalidValue::TooLarge,
            InvalidValue::TooLong,
            InvalidValue::Conflicting,
        ] {
            let err = crate::header::InvalidBudget::new("x-envoy-expected-rq-timeout-ms", reason)
                .to_string();
            assert!(err.starts_with("x-envoy-expected-rq-timeout-ms "), "{err}");
        }
    }
}

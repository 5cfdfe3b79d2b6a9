//! The `timeout_header` target: `X-Request-Timeout-Ms` against an oracle of its own.

use deadline_propagation::testing::{
    InvalidValue, MAX_VALUE_BYTES, REQUEST_TIMEOUT_HEADER_DISPLAY, parse_millis,
    parse_request_timeout,
};
use deadline_propagation::{REQUEST_TIMEOUT_HEADER, read_budget};
use http::{HeaderMap, HeaderName, HeaderValue};

/// The class of answer `parse_millis` must give, without the error's payload.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Millis {
    /// A valid value.
    Ok(u64),
    /// Nothing but whitespace.
    Empty,
    /// Something other than ASCII digits between the whitespace.
    NotAnInteger,
    /// A value past `u64::MAX`, however it is written.
    TooLarge,
    /// Longer than `MAX_VALUE_BYTES`, whatever it holds.
    TooLong,
    /// Repeated header values that disagree (`parse_request_timeout` only).
    Conflicting,
}

impl Millis {
    fn of(result: &Result<u64, InvalidValue>) -> Self {
        match result {
            Ok(n) => Self::Ok(*n),
            Err(InvalidValue::Empty) => Self::Empty,
            Err(InvalidValue::NotAnInteger(_)) => Self::NotAnInteger,
            Err(InvalidValue::TooLarge) => Self::TooLarge,
            Err(InvalidValue::TooLong) => Self::TooLong,
            Err(InvalidValue::Conflicting) => Self::Conflicting,
            Err(InvalidValue::NotAGrpcTimeout(_)) => unreachable!("not a gRPC value"),
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

/// What `parse_millis(raw)` must answer (docs/design.md §3), computed another way than the
/// parser does: no arithmetic on the digits at all. Without its leading zeros, the value
/// fits a `u64` when its decimal text is shorter than that of `u64::MAX`, or as long and
/// not greater in byte order (equal-length digit strings order like their values); std's
/// `str::parse` then reads it.
pub fn expected_millis(raw: &[u8]) -> Millis {
    if raw.len() > MAX_VALUE_BYTES {
        return Millis::TooLong;
    }
    let digits = trim_whitespace(raw);
    if digits.is_empty() {
        return Millis::Empty;
    }
    if !digits.iter().all(u8::is_ascii_digit) {
        return Millis::NotAnInteger;
    }
    let text = std::str::from_utf8(digits)
        .expect("ASCII digits are UTF-8")
        .trim_start_matches('0');
    let max = u64::MAX.to_string();
    if text.len() > max.len() || (text.len() == max.len() && text > max.as_str()) {
        return Millis::TooLarge;
    }
    Millis::Ok(if text.is_empty() {
        0
    } else {
        text.parse().expect("no longer than u64::MAX")
    })
}

/// `parse_millis` on `raw`: the answer is the expected one, a valid value round-trips to
/// the digits, and a refused value is echoed back bounded.
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
            // Ok(n) only for ASCII digits (after trimming) whose value is n, written
            // with any number of leading zeros.
            let digits = trim_whitespace(raw);
            assert!(digits.iter().all(u8::is_ascii_digit), "{n} from {digits:?}");
            let without_zeros = match digits.iter().position(|&d| d != b'0') {
                Some(i) => &digits[i..],
                None => b"0",
            };
            assert_eq!(n.to_string().as_bytes(), without_zeros);
        }
        Err(err) => {
            if let InvalidValue::NotAnInteger(echo) = err {
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
        Err(err) => Err(Millis::of(&Err(err.clone()))),
    };
    // The error a request gets names the header.
    if let Err(invalid) = read_budget(&headers) {
        assert_eq!(invalid.header(), REQUEST_TIMEOUT_HEADER_DISPLAY);
        assert!(
            invalid
                .to_string()
                .starts_with(REQUEST_TIMEOUT_HEADER_DISPLAY)
        );
    }
    assert_eq!(
        got, expected,
        "parse_request_timeout({:?}) = {result:?}",
        values
    );
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
            // Leading zeros add nothing: a value that fits is valid however many.
            (b"000000000000000000001", Millis::Ok(1)),
            (
                b"0000000000000000000000018446744073709551615",
                Millis::Ok(u64::MAX),
            ),
            (
                b"0000000000000000000000018446744073709551616",
                Millis::TooLarge,
            ),
            (&[b'0'; MAX_VALUE_BYTES], Millis::Ok(0)),
            (&[b'0'; MAX_VALUE_BYTES + 1], Millis::TooLong),
        ] {
            assert_eq!(expected_millis(raw), expected, "{raw:?}");
        }
    }
}

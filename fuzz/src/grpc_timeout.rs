//! The `grpc_timeout` target: `grpc-timeout` values, and the budget chosen from all the
//! budget headers, against an oracle of its own.

use std::time::Duration;

use deadline_propagation::read_budget;
use deadline_propagation::testing::{
    GRPC_TIMEOUT_HEADER, GRPC_TIMEOUT_HEADER_DISPLAY, InvalidValue, MAX_GRPC_DIGITS,
    MAX_VALUE_BYTES, parse_grpc_timeout, parse_grpc_value,
};
use http::{HeaderMap, HeaderValue};

/// Nanoseconds per unit, from the gRPC spec's table (PROTOCOL-HTTP2.md).
fn unit_nanos(unit: u8) -> Option<u128> {
    Some(match unit {
        b'H' => 3_600_000_000_000,
        b'M' => 60_000_000_000,
        b'S' => 1_000_000_000,
        b'm' => 1_000_000,
        b'u' => 1_000,
        b'n' => 1,
        _ => return None,
    })
}

/// What `parse_grpc_value(raw)` must answer, in nanoseconds, or the error class: the
/// value read by std's `str::parse` into a `u128` and multiplied there, where 8 digits
/// times an hour cannot overflow (the parser folds digits itself, in a `u64`).
pub fn expected_grpc(raw: &[u8]) -> Result<u128, &'static str> {
    if raw.len() > MAX_VALUE_BYTES {
        return Err("too long");
    }
    let value = raw.trim_ascii();
    let Some((&unit, digits)) = value.split_last() else {
        return Err("empty");
    };
    let nanos = unit_nanos(unit).ok_or("malformed")?;
    if digits.is_empty() || digits.len() > MAX_GRPC_DIGITS || !digits.is_ascii() {
        return Err("malformed");
    }
    let text = std::str::from_utf8(digits).map_err(|_| "malformed")?;
    if !text.bytes().all(|b| b.is_ascii_digit()) {
        return Err("malformed");
    }
    let n: u128 = text.parse().map_err(|_| "malformed")?;
    Ok(n * nanos)
}

/// The fuzz target's body: one value through the parser, then the bytes split at `\n`
/// into header values for `parse_grpc_timeout` and `read_budget`.
pub fn grpc_timeout(data: &[u8]) {
    let got = parse_grpc_value(data);
    match (&got, expected_grpc(data)) {
        (Ok(d), Ok(nanos)) => assert_eq!(d.as_nanos(), nanos, "{data:?}"),
        (Err(InvalidValue::TooLong), Err("too long"))
        | (Err(InvalidValue::Empty), Err("empty")) => {}
        (Err(InvalidValue::NotAGrpcTimeout(echo)), Err("malformed")) => {
            assert!(echo.chars().count() <= 32, "echo too long: {echo:?}");
        }
        (got, expected) => panic!("{data:?}: got {got:?}, expected {expected:?}"),
    }

    let mut headers = HeaderMap::new();
    for part in data.split(|&b| b == b'\n') {
        if let Ok(value) = HeaderValue::from_bytes(part) {
            headers.append(GRPC_TIMEOUT_HEADER, value);
        }
    }
    // What parse_grpc_timeout must answer: the values in order, the first problem met
    // wins (an invalid value, or one that disagrees with the first), as for our header.
    let mut expected: Result<Option<Duration>, InvalidValue> = Ok(None);
    for value in headers.get_all(GRPC_TIMEOUT_HEADER) {
        let Ok(previous) = expected else { break };
        expected = match parse_grpc_value(value.as_bytes()) {
            Err(err) => Err(err),
            Ok(d) if previous.is_some_and(|p| p != d) => Err(InvalidValue::Conflicting),
            Ok(d) => Ok(Some(d)),
        };
    }
    assert_eq!(parse_grpc_timeout(&headers), expected, "{data:?}");
    let budget = read_budget(&headers);
    match expected {
        Err(err) => {
            let message = format!("{}", budget.as_ref().unwrap_err());
            let invalid = budget.as_ref().unwrap_err();
            assert_eq!(invalid.header(), GRPC_TIMEOUT_HEADER_DISPLAY, "{data:?}");
            assert_eq!(invalid.reason(), &err, "{data:?}");
            assert!(message.starts_with("grpc-timeout "), "{message}");
        }
        Ok(None) => assert_eq!(budget, Ok(None)),
        Ok(Some(d)) => {
            // Whole milliseconds, rounded up: never less than the caller asked for.
            let ms = budget.expect("valid").expect("present");
            assert!(
                ms >= d && ms - d < Duration::from_millis(1),
                "{d:?} -> {ms:?}"
            );
            assert_eq!(ms.subsec_nanos() % 1_000_000, 0);
        }
    }
}

//! gRPC's `grpc-timeout` (PROTOCOL-HTTP2.md): 1 to 8 ASCII digits and a unit, `H`, `M`,
//! `S`, `m`, `u` or `n`, case-sensitive (`1s` is not a timeout). At most 8 digits never
//! overflow. As tonic, `0` is valid (the clamp raises it to 1 ms); unlike tonic's
//! `u64::from_str`, a sign is not a digit.

use std::time::Duration;

use super::millis::{echo, fold_digits};
use super::{InvalidValue, MAX_VALUE_BYTES};

/// The most digits the spec allows before the unit.
pub(crate) const MAX_GRPC_DIGITS: usize = 8;

/// Parses one `grpc-timeout` value. Surrounding spaces and tabs are tolerated, as for
/// every HTTP field value; anything else outside the grammar is refused.
pub(crate) fn parse_grpc_value(raw: &[u8]) -> Result<Duration, InvalidValue> {
    if raw.len() > MAX_VALUE_BYTES {
        return Err(InvalidValue::TooLong);
    }
    let value = raw.trim_ascii();
    let Some((&unit, digits)) = value.split_last() else {
        return Err(InvalidValue::Empty);
    };
    let malformed = || InvalidValue::NotAGrpcTimeout(echo(value));
    if digits.is_empty() || digits.len() > MAX_GRPC_DIGITS || !digits.iter().all(u8::is_ascii_digit)
    {
        return Err(malformed());
    }
    // At most 8 digits: no overflow, here or below.
    let n = fold_digits(digits).ok_or_else(malformed)?;
    Ok(match unit {
        b'H' => Duration::from_secs(n * 3600),
        b'M' => Duration::from_secs(n * 60),
        b'S' => Duration::from_secs(n),
        b'm' => Duration::from_millis(n),
        b'u' => Duration::from_micros(n),
        b'n' => Duration::from_nanos(n),
        _ => return Err(malformed()),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::header::{
        GRPC_TIMEOUT_HEADER, GRPC_TIMEOUT_HEADER_DISPLAY, InvalidBudget, read_values,
    };
    use http::{HeaderMap, HeaderValue};

    fn parse_grpc_timeout(headers: &HeaderMap) -> Result<Option<Duration>, InvalidValue> {
        read_values(headers, &GRPC_TIMEOUT_HEADER, parse_grpc_value)
    }
    use proptest::prelude::*;

    #[test]
    fn the_specs_units() {
        for (raw, expected) in [
            ("1H", Duration::from_secs(3600)),
            ("1M", Duration::from_secs(60)),
            ("1S", Duration::from_secs(1)),
            ("100m", Duration::from_millis(100)),
            ("1000000u", Duration::from_secs(1)),
            ("1u", Duration::from_micros(1)),
            ("1n", Duration::from_nanos(1)),
            ("0m", Duration::ZERO),
            ("00000250m", Duration::from_millis(250)),
            (" 250m\t", Duration::from_millis(250)),
            ("99999999H", Duration::from_secs(99_999_999 * 3600)),
        ] {
            assert_eq!(parse_grpc_value(raw.as_bytes()), Ok(expected), "{raw:?}");
        }
    }

    #[test]
    fn outside_the_grammar_is_refused() {
        assert_eq!(parse_grpc_value(b""), Err(InvalidValue::Empty));
        assert_eq!(parse_grpc_value(b"  "), Err(InvalidValue::Empty));
        for raw in [
            "1",          // no unit
            "m",          // no digits
            "123456789m", // 9 digits
            "000000001m", // 9 digits, even if they are zeros
            "-1S",
            "+1S",
            "1.5S",
            "1s", // units are case-sensitive
            "1h",
            "1ms",
            "1 m",
            "1e3m",
            "1x",
            "١m", // an Arabic-Indic digit
        ] {
            assert_eq!(
                parse_grpc_value(raw.as_bytes()),
                Err(InvalidValue::NotAGrpcTimeout(raw.trim().to_owned())),
                "{raw:?}"
            );
        }
        let long = format!("{}1m", " ".repeat(MAX_VALUE_BYTES));
        assert_eq!(
            parse_grpc_value(long.as_bytes()),
            Err(InvalidValue::TooLong)
        );
    }

    #[test]
    fn repeated_values_must_agree_by_value() {
        let parse = |values: &[&str]| {
            let mut headers = HeaderMap::new();
            for value in values {
                headers.append(GRPC_TIMEOUT_HEADER, HeaderValue::from_str(value).unwrap());
            }
            parse_grpc_timeout(&headers)
        };
        assert_eq!(parse(&[]), Ok(None));
        assert_eq!(parse(&["1000m", "1S"]), Ok(Some(Duration::from_secs(1))));
        assert_eq!(parse(&["1S", "2S"]), Err(InvalidValue::Conflicting));
        assert_eq!(
            parse(&["1S", "1s"]),
            Err(InvalidValue::NotAGrpcTimeout("1s".into()))
        );
    }

    #[test]
    fn every_error_message_names_the_header() {
        for reason in [
            InvalidValue::Empty,
            InvalidValue::TooLong,
            InvalidValue::Conflicting,
            InvalidValue::NotAGrpcTimeout("1".into()),
        ] {
            let err = InvalidBudget::new(GRPC_TIMEOUT_HEADER_DISPLAY, reason).to_string();
            assert!(err.starts_with("grpc-timeout "), "{err}");
        }
    }

    fn unit() -> impl Strategy<Value = (char, Duration)> {
        prop_oneof![
            Just(('H', Duration::from_secs(3600))),
            Just(('M', Duration::from_secs(60))),
            Just(('S', Duration::from_secs(1))),
            Just(('m', Duration::from_millis(1))),
            Just(('u', Duration::from_micros(1))),
            Just(('n', Duration::from_nanos(1))),
        ]
    }

    proptest! {
        #[test]
        fn arbitrary_bytes_never_panic(raw in proptest::collection::vec(any::<u8>(), 0..300)) {
            let _ = parse_grpc_value(&raw);
        }

        #[test]
        fn every_valid_value_round_trips(n in 0u32..100_000_000, (letter, per) in unit()) {
            let text = format!("{n}{letter}");
            prop_assert_eq!(parse_grpc_value(text.as_bytes()), Ok(per * n));
        }

        #[test]
        fn nine_digits_are_always_refused(n in 100_000_000u64..1_000_000_000, (letter, _) in unit()) {
            let text = format!("{n}{letter}");
            prop_assert!(parse_grpc_value(text.as_bytes()).is_err());
        }
    }
}

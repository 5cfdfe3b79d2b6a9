//! The budget headers a request may carry, read by [`read_budget`]: ours
//! (`X-Request-Timeout-Ms`), Envoy's `x-envoy-expected-rq-timeout-ms` (the same
//! grammar) and gRPC's `grpc-timeout`, so a caller behind a proxy or a gRPC stub is
//! heard too. Each is parsed as tonic parses `grpc-timeout`: absent, valid or invalid,
//! never a panic; a value longer than [`MAX_VALUE_BYTES`] is refused unread.

use std::time::Duration;

use http::{HeaderMap, HeaderName};

mod grpc_timeout;
mod millis;

pub(crate) use grpc_timeout::{MAX_GRPC_DIGITS, parse_grpc_value};
use millis::echo;
pub(crate) use millis::parse_millis;

/// Our budget header: the caller's remaining budget in whole milliseconds.
pub const REQUEST_TIMEOUT_HEADER: HeaderName = HeaderName::from_static("x-request-timeout-ms");
/// How many attempts a caller that owns retries made before this one (0 on its first).
pub const PREVIOUS_ATTEMPTS_HEADER: HeaderName = HeaderName::from_static("x-previous-attempts");
/// gRPC's own count of earlier attempts (gRFC A6), read and sent beside ours.
pub(crate) const GRPC_PREVIOUS_ATTEMPTS_HEADER: HeaderName =
    HeaderName::from_static("grpc-previous-rpc-attempts");
/// gRPC's budget header (PROTOCOL-HTTP2.md).
pub(crate) const GRPC_TIMEOUT_HEADER: HeaderName = HeaderName::from_static("grpc-timeout");
/// Envoy's budget header for the request it forwards.
const ENVOY_TIMEOUT_HEADER: HeaderName = HeaderName::from_static("x-envoy-expected-rq-timeout-ms");

/// Our header as problems name it.
pub(crate) const REQUEST_TIMEOUT_HEADER_DISPLAY: &str = "X-Request-Timeout-Ms";
/// `grpc-timeout` as problems name it.
pub(crate) const GRPC_TIMEOUT_HEADER_DISPLAY: &str = "grpc-timeout";
const ENVOY_TIMEOUT_HEADER_DISPLAY: &str = "x-envoy-expected-rq-timeout-ms";

/// The longest header value looked at: a real client sends at most 20 digits.
pub(crate) const MAX_VALUE_BYTES: usize = 256;

/// Why one value of a budget header was refused, without the header's name.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[doc(hidden)]
pub enum InvalidValue {
    /// Nothing but whitespace.
    #[error("is empty")]
    Empty,
    /// Something other than ASCII digits where a whole number of milliseconds belongs.
    #[error("must be a whole number of milliseconds, got {0:?}")]
    NotAnInteger(String),
    /// A value larger than a `u64` can hold.
    #[error("is too large to be a number of milliseconds")]
    TooLarge,
    /// Longer than [`MAX_VALUE_BYTES`], whatever it holds.
    #[error("is longer than {MAX_VALUE_BYTES} bytes")]
    TooLong,
    /// The header appears more than once with values that disagree.
    #[error("is repeated with different values")]
    Conflicting,
    /// A `grpc-timeout` that is not 1 to 8 ASCII digits followed by one of the units.
    #[error(
        "must be 1 to {MAX_GRPC_DIGITS} ASCII digits and a unit (H, M, S, m, u or n), got {0:?}"
    )]
    NotAGrpcTimeout(String),
}

/// Which budget header was refused, and why; the message starts with its name.
///
/// ```
/// use http::{HeaderMap, HeaderValue};
/// use deadline_propagation::read_budget;
///
/// let mut headers = HeaderMap::new();
/// headers.insert("grpc-timeout", HeaderValue::from_static("10 parsecs"));
/// let invalid = read_budget(&headers).unwrap_err();
/// assert!(invalid.to_string().starts_with("grpc-timeout "));
/// ```
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{header} {reason}")]
pub struct InvalidBudget {
    header: &'static str,
    reason: InvalidValue,
}

impl InvalidBudget {
    pub(crate) fn new(header: &'static str, reason: InvalidValue) -> Self {
        Self { header, reason }
    }

    /// The header that was refused, as the 400 problem's `header` member names it.
    pub fn header(&self) -> &'static str {
        self.header
    }

    /// What was wrong with the value (for the fuzz targets' oracles).
    #[cfg(feature = "test-util")]
    #[doc(hidden)]
    pub fn reason(&self) -> &InvalidValue {
        &self.reason
    }
}

/// The caller's budget: the smallest of the budget headers present (each is a promise
/// from someone on the path to stop waiting after that long), `Ok(None)` when none is,
/// or the first error in the order ours, `grpc-timeout`, Envoy's. A malformed header
/// fails the request even next to a valid one, so a broken client or proxy is noticed;
/// a repeated one must agree with itself, by value. Rounded **up** to whole
/// milliseconds (`1500u` is 2 ms), so a caller never gets less than it asked for.
///
/// ```
/// use std::time::Duration;
/// use http::{HeaderMap, HeaderValue};
/// use deadline_propagation::{REQUEST_TIMEOUT_HEADER, read_budget};
///
/// let mut headers = HeaderMap::new();
/// assert_eq!(read_budget(&headers), Ok(None));
/// headers.insert(REQUEST_TIMEOUT_HEADER, HeaderValue::from_static("700"));
/// headers.insert("grpc-timeout", HeaderValue::from_static("1500u"));
/// assert_eq!(read_budget(&headers), Ok(Some(Duration::from_millis(2))));
/// ```
pub fn read_budget(headers: &HeaderMap) -> Result<Option<Duration>, InvalidBudget> {
    // One walk over the request's headers: a lookup of each name would hash it.
    let mut ours = Values::new(parse_millis);
    let mut grpc = Values::new(parse_grpc_value);
    let mut envoy = Values::new(parse_millis);
    for (name, value) in headers {
        let raw = value.as_bytes();
        if *name == REQUEST_TIMEOUT_HEADER {
            ours.push(raw);
        } else if *name == GRPC_TIMEOUT_HEADER {
            grpc.push(raw);
        } else if *name == ENVOY_TIMEOUT_HEADER {
            envoy.push(raw);
        }
    }
    let invalid = |header| move |reason| InvalidBudget::new(header, reason);
    let ours = ours.read.map_err(invalid(REQUEST_TIMEOUT_HEADER_DISPLAY))?;
    let grpc = grpc.read.map_err(invalid(GRPC_TIMEOUT_HEADER_DISPLAY))?;
    let envoy = envoy.read.map_err(invalid(ENVOY_TIMEOUT_HEADER_DISPLAY))?;
    let [ours, envoy] = [ours, envoy].map(|ms| ms.map(Duration::from_millis));
    Ok([ours, grpc, envoy]
        .into_iter()
        .flatten()
        .min()
        .map(ceil_millis))
}

/// `budget` rounded up to a whole number of milliseconds.
fn ceil_millis(budget: Duration) -> Duration {
    let whole = Duration::new(budget.as_secs(), budget.subsec_millis() * 1_000_000);
    match whole == budget {
        true => whole,
        false => whole.saturating_add(Duration::from_millis(1)),
    }
}

/// The attempts a caller made before this one, if it says: `X-Previous-Attempts` or
/// gRPC's `grpc-previous-rpc-attempts` (gRFC A6), the larger when both come; or which
/// header is not a whole number, and why (read with the grammar of milliseconds).
pub(crate) fn read_previous_attempts(
    headers: &HeaderMap,
) -> Result<Option<u32>, (&'static str, String)> {
    let mut attempts = None;
    for (name, shown) in [
        (PREVIOUS_ATTEMPTS_HEADER, "X-Previous-Attempts"),
        (GRPC_PREVIOUS_ATTEMPTS_HEADER, "grpc-previous-rpc-attempts"),
    ] {
        let Some(raw) = headers.get(&name).map(|v| v.as_bytes()) else {
            continue;
        };
        let n = parse_millis(raw).ok().and_then(|n| u32::try_from(n).ok());
        let why = || format!("must be a whole number of attempts, got {:?}", echo(raw));
        attempts = attempts.max(Some(n.ok_or_else(|| (shown, why()))?));
    }
    Ok(attempts)
}

/// The values of one header in the request's order: `Ok(None)` before the first, the
/// value while all agree, else the first error.
struct Values<T> {
    read: Result<Option<T>, InvalidValue>,
    parse: fn(&[u8]) -> Result<T, InvalidValue>,
}

impl<T: PartialEq> Values<T> {
    fn new(parse: fn(&[u8]) -> Result<T, InvalidValue>) -> Self {
        Self {
            read: Ok(None),
            parse,
        }
    }

    fn push(&mut self, raw: &[u8]) {
        let Ok(read) = &mut self.read else {
            return;
        };
        match (self.parse)(raw) {
            Err(invalid) => self.read = Err(invalid),
            Ok(next) if read.as_ref().is_some_and(|previous| *previous != next) => {
                self.read = Err(InvalidValue::Conflicting);
            }
            Ok(next) => *read = Some(next),
        }
    }
}

/// Every value of the header `name`, as [`read_budget`] reads it (the tests hold the
/// one walk to a lookup of each name).
#[cfg(any(test, feature = "test-util"))]
pub(crate) fn read_values<T: PartialEq>(
    headers: &HeaderMap,
    name: &HeaderName,
    parse: fn(&[u8]) -> Result<T, InvalidValue>,
) -> Result<Option<T>, InvalidValue> {
    let mut values = Values::new(parse);
    for value in headers.get_all(name) {
        values.push(value.as_bytes());
    }
    values.read
}

#[cfg(test)]
mod tests {
    use super::*;
    use http::HeaderValue;
    use proptest::prelude::*;

    fn parse_request_timeout(h: &HeaderMap) -> Result<Option<Duration>, InvalidValue> {
        read_values(h, &REQUEST_TIMEOUT_HEADER, parse_millis)
            .map(|ms| ms.map(Duration::from_millis))
    }

    fn parse_grpc_timeout(h: &HeaderMap) -> Result<Option<Duration>, InvalidValue> {
        read_values(h, &GRPC_TIMEOUT_HEADER, parse_grpc_value)
    }

    fn parse_envoy_timeout(h: &HeaderMap) -> Result<Option<Duration>, InvalidValue> {
        read_values(h, &ENVOY_TIMEOUT_HEADER, parse_millis).map(|ms| ms.map(Duration::from_millis))
    }

    const MS: fn(u64) -> Duration = Duration::from_millis;

    fn headers(pairs: &[(&HeaderName, &str)]) -> HeaderMap {
        let mut map = HeaderMap::new();
        for (name, value) in pairs {
            map.append((*name).clone(), HeaderValue::from_str(value).unwrap());
        }
        map
    }

    #[test]
    fn previous_attempts_come_from_either_header_the_larger_winning() {
        let ours = &PREVIOUS_ATTEMPTS_HEADER;
        let grpc = &GRPC_PREVIOUS_ATTEMPTS_HEADER;
        let read = |pairs: &[(&HeaderName, &str)]| read_previous_attempts(&headers(pairs));
        assert_eq!(read(&[]), Ok(None));
        assert_eq!(read(&[(grpc, "1")]), Ok(Some(1)));
        assert_eq!(
            read(&[(ours, "2"), (grpc, "4294967295")]),
            Ok(Some(u32::MAX))
        );
        // The error names the header that is wrong, whichever it is.
        let wrong = |pairs: &[(&HeaderName, &str)]| read(pairs).unwrap_err().0;
        assert_eq!(
            wrong(&[(ours, "2"), (grpc, "4294967296")]),
            "grpc-previous-rpc-attempts"
        );
        assert_eq!(wrong(&[(ours, "x"), (grpc, "1")]), "X-Previous-Attempts");
    }

    #[test]
    fn no_budget_header_is_none() {
        assert_eq!(read_budget(&HeaderMap::new()), Ok(None));
    }

    #[test]
    fn each_header_alone_is_honoured() {
        for (name, value, expected) in [
            (&REQUEST_TIMEOUT_HEADER, "250", MS(250)),
            (&GRPC_TIMEOUT_HEADER, "250m", MS(250)),
            (&GRPC_TIMEOUT_HEADER, "2S", MS(2000)),
            (&ENVOY_TIMEOUT_HEADER, "250", MS(250)),
        ] {
            assert_eq!(
                read_budget(&headers(&[(name, value)])),
                Ok(Some(expected)),
                "{name}: {value}"
            );
        }
    }

    #[test]
    fn the_smallest_budget_wins_whichever_header_carries_it() {
        let cases = [
            ("900", "1S", "250", MS(250)),
            ("900", "100m", "250", MS(100)),
            ("50", "100m", "250", MS(50)),
            ("900", "1M", "60000", MS(900)),
        ];
        for (ours, grpc, envoy, expected) in cases {
            let map = headers(&[
                (&REQUEST_TIMEOUT_HEADER, ours),
                (&GRPC_TIMEOUT_HEADER, grpc),
                (&ENVOY_TIMEOUT_HEADER, envoy),
            ]);
            assert_eq!(
                read_budget(&map),
                Ok(Some(expected)),
                "{ours} {grpc} {envoy}"
            );
        }
        let two = headers(&[
            (&REQUEST_TIMEOUT_HEADER, "900"),
            (&ENVOY_TIMEOUT_HEADER, "250"),
        ]);
        assert_eq!(read_budget(&two), Ok(Some(MS(250))));
    }

    #[test]
    fn sub_millisecond_grpc_budgets_round_up_to_whole_milliseconds() {
        for (grpc, expected) in [
            ("1n", MS(1)),
            ("1u", MS(1)),
            ("1500u", MS(2)),
            ("1000000n", MS(1)),
            ("1000001n", MS(2)),
            ("0n", MS(0)),
        ] {
            let map = headers(&[(&GRPC_TIMEOUT_HEADER, grpc)]);
            assert_eq!(read_budget(&map), Ok(Some(expected)), "{grpc}");
        }
    }

    #[test]
    fn a_malformed_header_fails_the_request_even_next_to_a_valid_one_and_is_named() {
        let cases = [
            (&GRPC_TIMEOUT_HEADER, "1.5S", "grpc-timeout"),
            (
                &ENVOY_TIMEOUT_HEADER,
                "-1",
                "x-envoy-expected-rq-timeout-ms",
            ),
            (&REQUEST_TIMEOUT_HEADER, "abc", "X-Request-Timeout-Ms"),
        ];
        for (name, bad, display) in cases {
            let mut map = headers(&[
                (&REQUEST_TIMEOUT_HEADER, "900"),
                (&GRPC_TIMEOUT_HEADER, "1S"),
            ]);
            map.insert(name.clone(), HeaderValue::from_str(bad).unwrap());
            let err = read_budget(&map).expect_err(bad);
            assert_eq!(err.header(), display, "{err}");
            assert!(err.to_string().starts_with(display), "{err}");
        }
    }

    #[test]
    fn the_first_error_is_ours_then_grpc_then_envoy() {
        let map = headers(&[
            (&ENVOY_TIMEOUT_HEADER, "x"),
            (&GRPC_TIMEOUT_HEADER, "x"),
            (&REQUEST_TIMEOUT_HEADER, "x"),
        ]);
        assert_eq!(
            read_budget(&map).unwrap_err().header(),
            "X-Request-Timeout-Ms"
        );
        let map = headers(&[(&ENVOY_TIMEOUT_HEADER, "x"), (&GRPC_TIMEOUT_HEADER, "x")]);
        assert_eq!(read_budget(&map).unwrap_err().header(), "grpc-timeout");
    }

    #[test]
    fn ceil_millis_keeps_whole_milliseconds_and_raises_the_rest() {
        assert_eq!(ceil_millis(MS(u64::MAX)), MS(u64::MAX));
        assert_eq!(ceil_millis(Duration::ZERO), Duration::ZERO);
        assert_eq!(ceil_millis(Duration::from_nanos(999_999_999)), MS(1000));
        assert_eq!(ceil_millis(Duration::MAX), Duration::MAX);
    }

    /// What `read_budget` answers by definition: each header read on its own (by its
    /// name's lookup), the first error in the documented order, else the smallest.
    fn read_each(headers: &HeaderMap) -> Result<Option<Duration>, InvalidBudget> {
        let invalid = |header| move |reason| InvalidBudget::new(header, reason);
        let ours =
            parse_request_timeout(headers).map_err(invalid(REQUEST_TIMEOUT_HEADER_DISPLAY))?;
        let grpc = parse_grpc_timeout(headers).map_err(invalid(GRPC_TIMEOUT_HEADER_DISPLAY))?;
        let envoy = parse_envoy_timeout(headers).map_err(invalid(ENVOY_TIMEOUT_HEADER_DISPLAY))?;
        Ok([ours, grpc, envoy]
            .into_iter()
            .flatten()
            .min()
            .map(ceil_millis))
    }

    proptest! {
        #[test]
        fn one_walk_over_the_headers_reads_what_a_lookup_of_each_reads(
            pairs in proptest::collection::vec(
                (
                    prop::sample::select(vec![
                        REQUEST_TIMEOUT_HEADER,
                        GRPC_TIMEOUT_HEADER,
                        ENVOY_TIMEOUT_HEADER,
                        HeaderName::from_static("x-request-timeout"),
                        http::header::HOST,
                    ]),
                    prop::sample::select(vec!["250", "250m", "1S", "1000", "x", "", "0", "7n"]),
                ),
                0..8,
            )
        ) {
            // Repeats, conflicts, errors after and before a value, other headers between.
            let mut map = HeaderMap::new();
            for (name, value) in &pairs {
                map.append(name.clone(), HeaderValue::from_static(value));
            }
            prop_assert_eq!(read_budget(&map), read_each(&map));
        }
    }

    proptest! {
        #[test]
        fn three_valid_budgets_give_the_smallest_rounded_up(
            ours in any::<u32>(),
            grpc in 0u32..100_000_000,
            unit in prop::sample::select(vec![('S', 1_000_000_000u64), ('m', 1_000_000), ('u', 1_000), ('n', 1)]),
            envoy in any::<u32>(),
        ) {
            let grpc_text = format!("{grpc}{}", unit.0);
            let map = headers(&[
                (&REQUEST_TIMEOUT_HEADER, &ours.to_string()),
                (&GRPC_TIMEOUT_HEADER, &grpc_text),
                (&ENVOY_TIMEOUT_HEADER, &envoy.to_string()),
            ]);
            let grpc_ms = (u64::from(grpc) * unit.1).div_ceil(1_000_000);
            let expected = u64::from(ours).min(grpc_ms).min(u64::from(envoy));
            prop_assert_eq!(read_budget(&map), Ok(Some(MS(expected))));
        }
    }

    proptest! {
        #[test]
        fn any_three_values_never_panic_and_an_ok_is_the_smallest(
            ours in "[ 0-9a-zA-Z.+-]{0,24}",
            grpc in "[ 0-9a-zA-Z.+-]{0,12}",
            envoy in "[ 0-9a-zA-Z.+-]{0,24}",
        ) {
            let map = headers(&[
                (&REQUEST_TIMEOUT_HEADER, &ours),
                (&GRPC_TIMEOUT_HEADER, &grpc),
                (&ENVOY_TIMEOUT_HEADER, &envoy),
            ]);
            if let Ok(Some(budget)) = read_budget(&map) {
                let each = [
                    parse_millis(ours.as_bytes()).map(MS).ok(),
                    parse_grpc_value(grpc.as_bytes()).ok().map(ceil_millis),
                    parse_millis(envoy.as_bytes()).map(MS).ok(),
                ];
                prop_assert!(each.iter().all(|b| b.is_some_and(|b| budget <= b)));
                prop_assert!(each.contains(&Some(budget)));
            }
        }
    }
}

//! [`Wire`]: the network's share of a call, kept back from the budget sent on: the
//! downstream's clock starts when it has read the request, so the round trip is the
//! caller's to pay. A downstream running this crate's ingress reports its own time in
//! `Server-Timing`; the call time less that, averaged, is kept back beside the reserve.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use http::HeaderMap;

/// Each new sample moves the average by this share (1/8) of its distance.
const SMOOTHING: u64 = 8;

/// The client's estimate of the wire's round trip to one downstream. Share it behind
/// an `Arc`.
#[derive(Debug, Default)]
pub(crate) struct Wire {
    /// The moving average in nanoseconds; 0 until the first sample.
    nanos: AtomicU64,
}

impl Wire {
    /// The round trip to keep back from a budget sent now.
    pub(crate) fn estimate(&self) -> Duration {
        Duration::from_nanos(self.nanos.load(Ordering::Relaxed))
    }

    /// Learns from one answered call that took `took` here, of which the downstream
    /// says it spent `server`.
    pub(crate) fn record(&self, took: Duration, server: Duration) {
        let sample = u64::try_from(took.saturating_sub(server).as_nanos()).unwrap_or(u64::MAX);
        let update = |old: u64| {
            Some(if old == 0 {
                sample.max(1)
            } else if sample >= old {
                old + (sample - old) / SMOOTHING
            } else {
                old - (old - sample) / SMOOTHING
            })
        };
        let _ = self
            .nanos
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, update);
    }
}

/// The `total` entry of a `Server-Timing` header: the time the downstream says it
/// spent on the request. `None` when it sent none, or none that parses; never a panic,
/// whatever the header holds.
pub(crate) fn server_total(headers: &HeaderMap) -> Option<Duration> {
    headers
        .get_all(http::header::HeaderName::from_static("server-timing"))
        .iter()
        .filter_map(|value| value.to_str().ok())
        .flat_map(|value| value.split(','))
        .find_map(|metric| {
            let mut parts = metric.split(';').map(str::trim);
            if parts.next()? != "total" {
                return None;
            }
            let ms: f64 = parts.find_map(|p| p.strip_prefix("dur="))?.parse().ok()?;
            // `try_`: a finite value can still be past what a `Duration` holds (1e30).
            Duration::try_from_secs_f64(ms / 1000.0).ok()
        })
}

#[cfg(test)]
mod tests {
    use super::*;
    use http::HeaderValue;

    const MS: fn(u64) -> Duration = Duration::from_millis;

    fn headers(values: &[&str]) -> HeaderMap {
        let mut map = HeaderMap::new();
        for value in values {
            map.append("server-timing", HeaderValue::from_str(value).unwrap());
        }
        map
    }

    #[test]
    fn the_total_is_read_from_wherever_it_stands() {
        let total = server_total(&headers(&["catalog;dur=12.4, total;dur=16.5"]));
        assert_eq!(total, Some(Duration::from_micros(16_500)));
        let split = server_total(&headers(&["db;dur=3", "total ; desc=\"x\" ; dur=4"]));
        assert_eq!(split, Some(MS(4)));
    }

    #[test]
    fn a_missing_or_malformed_total_is_none() {
        for bad in [
            "",
            "db;dur=3",
            "total",
            "total;dur=",
            "total;dur=abc",
            "total;dur=-1",
            "total;dur=NaN",
            "total;dur=inf",
            "totals;dur=3",
            "total;dur=1e30",
            "total;dur=1e23",
            "total;dur=-0.5",
        ] {
            assert_eq!(server_total(&headers(&[bad])), None, "{bad:?}");
        }
        assert_eq!(server_total(&HeaderMap::new()), None);
    }

    #[test]
    fn the_first_sample_is_taken_whole_and_later_ones_move_it_an_eighth() {
        let wire = Wire::default();
        assert_eq!(wire.estimate(), Duration::ZERO);
        wire.record(MS(110), MS(10));
        assert_eq!(wire.estimate(), MS(100));
        wire.record(MS(190), MS(10)); // 180 ms on the wire: 80 above
        assert_eq!(wire.estimate(), MS(110));
        wire.record(MS(10), MS(10)); // none: 110 below
        assert_eq!(wire.estimate(), MS(110) - MS(110) / 8);
    }

    #[test]
    fn a_downstream_that_reports_more_than_the_call_took_means_no_wire() {
        let wire = Wire::default();
        wire.record(MS(5), MS(7));
        assert!(wire.estimate() <= Duration::from_nanos(1));
    }

    proptest::proptest! {
        #[test]
        fn any_number_as_the_total_is_read_or_refused_never_a_panic(ms in proptest::num::f64::ANY) {
            let total = server_total(&headers(&[&format!("total;dur={ms}")]));
            proptest::prop_assert_eq!(total, Duration::try_from_secs_f64(ms / 1000.0).ok());
        }

        #[test]
        fn reading_the_total_never_panics(value in "\\PC{0,64}") {
            if let Ok(value) = HeaderValue::from_str(&value) {
                let mut map = HeaderMap::new();
                map.insert("server-timing", value);
                let _ = server_total(&map);
            }
        }
    }
}

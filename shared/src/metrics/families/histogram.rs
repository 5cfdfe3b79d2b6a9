//! [`Histogram`]: the latency histogram of the families without exemplars, observed
//! with a binary search and two atomic operations instead of a lock and a scan.
//!
//! Why not prometheus-client's own: its `observe` takes a lock and walks the buckets
//! from the first, and the deadline families observe at every stage of every request
//! (docs/performance.md has the count). Here an observation is a binary search, the
//! bucket's increment and an add to the sum.
//!
//! The text is the same as prometheus-client's (the test below compares them): what a
//! scrape shows, and every query and dashboard built on it, does not change.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use prometheus_client::encoding::{EncodeMetric, MetricEncoder, NoLabelSet};
use prometheus_client::metrics::{MetricType, TypedMetric};

/// A histogram with fixed bucket bounds, cheap to clone (the clones share the counts).
#[derive(Clone, Debug)]
pub(crate) struct Histogram {
    inner: Arc<Inner>,
}

#[derive(Debug)]
struct Inner {
    /// The finite upper bounds, ascending; `+Inf` is implied.
    bounds: &'static [f64],
    /// One count per bound, then the `+Inf` bucket's: observations in that bucket
    /// only, not cumulative (the encoder sums them).
    counts: Box<[AtomicU64]>,
    /// The sum of the observations, as the bits of an `f64`.
    sum: AtomicU64,
}

impl Histogram {
    /// A histogram with the ascending upper bounds `bounds`.
    pub(crate) fn new(bounds: &'static [f64]) -> Self {
        debug_assert!(bounds.is_sorted() && bounds.iter().all(|b| b.is_finite()));
        Self {
            inner: Arc::new(Inner {
                bounds,
                counts: (0..=bounds.len()).map(|_| AtomicU64::new(0)).collect(),
                sum: AtomicU64::new(0.0_f64.to_bits()),
            }),
        }
    }

    /// Counts `value` in the first bucket whose bound is at least `value` (`+Inf`
    /// when none is, and for NaN, as prometheus-client does).
    pub(crate) fn observe(&self, value: f64) {
        let inner = &*self.inner;
        let bucket = if value.is_nan() {
            inner.bounds.len()
        } else {
            inner.bounds.partition_point(|&bound| bound < value)
        };
        inner.counts[bucket].fetch_add(1, Ordering::Relaxed);
        // An atomic add of an f64: nearly always one compare-and-swap, since the
        // observations of one series rarely race.
        let _ = inner
            .sum
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |bits| {
                Some((f64::from_bits(bits) + value).to_bits())
            });
    }
}

impl TypedMetric for Histogram {
    const TYPE: MetricType = MetricType::Histogram;
}

impl EncodeMetric for Histogram {
    /// The count is the buckets' total, so `_count` and the `+Inf` bucket always
    /// agree; an observation made while a scrape reads may be in the buckets but not
    /// yet in `_sum`, which the next scrape shows.
    fn encode(&self, mut encoder: MetricEncoder) -> Result<(), std::fmt::Error> {
        let inner = &*self.inner;
        let buckets: Vec<(f64, u64)> = inner
            .bounds
            .iter()
            .copied()
            .chain(std::iter::once(f64::INFINITY))
            .zip(
                inner
                    .counts
                    .iter()
                    .map(|count| count.load(Ordering::Relaxed)),
            )
            .collect();
        let count = buckets.iter().map(|&(_, n)| n).sum();
        let sum = f64::from_bits(inner.sum.load(Ordering::Relaxed));
        encoder.encode_histogram::<NoLabelSet>(sum, count, &buckets, None)
    }

    fn metric_type(&self) -> MetricType {
        Self::TYPE
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use prometheus_client::encoding::text::encode;
    use prometheus_client::registry::Registry;
    use proptest::prelude::*;

    const BOUNDS: &[f64] = &super::super::LATENCY_BUCKETS;

    /// The text a registry holding only `metric` renders.
    fn rendered(
        metric: impl EncodeMetric + Clone + std::fmt::Debug + Send + Sync + 'static,
    ) -> String {
        let mut registry = Registry::default();
        registry.register("latency_seconds", "Latency", metric);
        let mut text = String::new();
        encode(&mut text, &registry).unwrap();
        text
    }

    /// Both histograms fed `values`, rendered.
    fn both(values: &[f64]) -> (String, String) {
        let ours = Histogram::new(BOUNDS);
        let theirs = prometheus_client::metrics::histogram::Histogram::new(BOUNDS.iter().copied());
        for &value in values {
            ours.observe(value);
            theirs.observe(value);
        }
        (rendered(ours), rendered(theirs))
    }

    #[test]
    fn renders_what_prometheus_clients_histogram_renders() {
        // On a bound, between bounds, below the first, past the last, and NaN.
        let (ours, theirs) = both(&[0.001, 0.0012, 0.7, 0.69, 0.0, 10.0, 11.0, f64::NAN]);
        assert_eq!(ours, theirs);
        assert!(
            ours.contains("latency_seconds_bucket{le=\"0.7\"} 5"),
            "{ours}"
        );
    }

    #[test]
    fn an_empty_histogram_renders_zeros() {
        let (ours, theirs) = both(&[]);
        assert_eq!(ours, theirs);
    }

    #[test]
    fn clones_share_their_counts() {
        let histogram = Histogram::new(BOUNDS);
        histogram.clone().observe(0.3);
        assert!(rendered(histogram).contains("latency_seconds_count 1"));
    }

    proptest! {
        #[test]
        fn any_observations_render_as_prometheus_clients_do(
            values in proptest::collection::vec(0.0..12.0_f64, 0..40)
        ) {
            // Sums of the same values in the same order are the same f64.
            let (ours, theirs) = both(&values);
            prop_assert_eq!(ours, theirs);
        }
    }
}

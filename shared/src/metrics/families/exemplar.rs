//! Exemplars: the latency histograms remember, per bucket, the `trace_id` of the last
//! sampled request that landed there (OpenMetrics exemplars).
//!
//! Why: a p99 panel says *that* some requests were slow; the exemplar on its bucket is
//! one of them, and Grafana opens its trace in Jaeger with one click. Only a sampled
//! span has a trace a backend will have stored, so without an OpenTelemetry layer (no
//! `OTEL_EXPORTER_OTLP_ENDPOINT`) or for an unsampled request nothing is attached, and
//! the exposition is byte for byte what it was without exemplars.

use std::time::SystemTime;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::exemplar::HistogramWithExemplars;

use super::LATENCY_BUCKETS;

/// The exemplar's label set: `{trace_id="4bf92f3577b34da6a3ce929d0e0e4736"}`, the name
/// Grafana's exemplar link looks for by default.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(crate) struct TraceExemplar {
    trace_id: String,
}

/// A latency histogram ([`LATENCY_BUCKETS`]) that carries exemplars.
pub(crate) type LatencyHistogram = HistogramWithExemplars<TraceExemplar>;

pub(crate) fn latency_histogram_with_exemplars() -> LatencyHistogram {
    HistogramWithExemplars::new(LATENCY_BUCKETS.into_iter())
}

/// Observes `seconds`, attaching the current span's trace when it is sampled. The
/// timestamp lets Prometheus store the exemplar once rather than at every scrape.
pub(crate) fn observe_traced(histogram: &LatencyHistogram, seconds: f64) {
    let exemplar = crate::trace::sampled_trace_id().map(|trace_id| TraceExemplar { trace_id });
    let timestamp = exemplar.as_ref().map(|_| SystemTime::now());
    histogram.observe(seconds, exemplar, timestamp);
}

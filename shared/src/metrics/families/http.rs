//! `http_server_requests_seconds` and `http_server_requests_in_flight`.

use std::time::Duration;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;

use super::exemplar::{LatencyHistogram, latency_histogram_with_exemplars, observe_traced};
use crate::metrics::names::{HTTP_SERVER_REQUESTS_IN_FLIGHT, HTTP_SERVER_REQUESTS_SECONDS};

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct RequestLabels {
    method: &'static str,
    uri: String,
    status: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct UriLabel {
    uri: String,
}

/// `http_server_requests_seconds` and `http_server_requests_in_flight`.
///
/// Request times carry the sampled `trace_id` as an exemplar (families/exemplar.rs).
#[derive(Clone, Debug)]
pub(crate) struct HttpServerMetrics {
    requests: Family<RequestLabels, LatencyHistogram, fn() -> LatencyHistogram>,
    in_flight: Family<UriLabel, Gauge>,
}

impl HttpServerMetrics {
    pub(crate) fn register(registry: &mut Registry) -> Self {
        let this = Self {
            requests: Family::new_with_constructor(latency_histogram_with_exemplars),
            in_flight: Family::default(),
        };
        registry.register(
            HTTP_SERVER_REQUESTS_SECONDS,
            "Server response time by method, route template and status",
            this.requests.clone(),
        );
        registry.register(
            HTTP_SERVER_REQUESTS_IN_FLIGHT,
            "Requests being handled now, by route template",
            this.in_flight.clone(),
        );
        this
    }

    /// Records one request's time (`method` from a fixed set, `uri` a route template),
    /// with the current trace as exemplar when sampled.
    pub(crate) fn observe_request(
        &self,
        method: &'static str,
        uri: &str,
        status: &str,
        took: Duration,
    ) {
        let labels = RequestLabels {
            method,
            uri: uri.to_owned(),
            status: status.to_owned(),
        };
        observe_traced(&self.requests.get_or_create(&labels), took.as_secs_f64());
    }

    /// The in-flight gauge of the route `uri`.
    pub(crate) fn in_flight(&self, uri: &str) -> Gauge {
        self.in_flight
            .get_or_create(&UriLabel {
                uri: uri.to_owned(),
            })
            .clone()
    }
}

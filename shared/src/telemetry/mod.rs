//! Logs and traces for the binaries.
//!
//! - Logs: readable text by default; JSON lines with `LOG_FORMAT=json`, where each line
//!   carries the fields of the spans it happened in, the request's `trace_id` among
//!   them. The level comes from `RUST_LOG` (default `info`).
//! - Traces: OpenTelemetry through `tracing-opentelemetry`, exported over OTLP/HTTP only
//!   when `OTEL_EXPORTER_OTLP_ENDPOINT` is set. Otherwise no OpenTelemetry layer is
//!   installed at all: nothing is exported and nothing is slowed down.
//! - Propagation ([`propagation`]): W3C `traceparent` is extracted on ingress (by the
//!   HTTP middleware) and injected into outbound calls (by the budgeted client), so one
//!   trace crosses both services and every stage span sits under its request.
//!
//! Propagation is always built (the budgeted client and the HTTP middleware call it),
//! and does nothing without the `otel` feature: with no OpenTelemetry layer there is
//! no trace context to carry. Everything else here needs `otel`.

pub mod propagation;

#[cfg(feature = "otel")]
mod setup;
#[cfg(feature = "otel")]
#[cfg_attr(docsrs, doc(cfg(feature = "otel")))]
pub use setup::{LogFormat, TelemetryGuard, init, layer};

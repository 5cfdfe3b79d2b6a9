//! Logs and traces for the binaries.
//!
//! - Logs: readable text by default; JSON lines with `LOG_FORMAT=json`, where each line
//!   carries the fields of the spans it happened in, the request's `trace_id` among
//!   them. The level comes from `RUST_LOG` (default `info`).
//! - Traces: OpenTelemetry through `tracing-opentelemetry`, exported over OTLP/HTTP only
//!   when `OTEL_EXPORTER_OTLP_ENDPOINT` is set. Otherwise no OpenTelemetry layer is
//!   installed at all: nothing is exported and nothing is slowed down. The service is
//!   named in the traces by `OTEL_SERVICE_NAME` (or `service.name` in
//!   `OTEL_RESOURCE_ATTRIBUTES`), by the binary's own name when neither says.
//! - Propagation: the library (feature `otel`) extracts W3C `traceparent` at the
//!   ingress and injects it into outbound calls once the global propagator is set,
//!   which [`init`] does when it exports, so one trace crosses both services.

use opentelemetry::trace::TracerProvider as _;
use opentelemetry_sdk::trace::SdkTracerProvider;
use tracing_subscriber::EnvFilter;
use tracing_subscriber::Layer as _;
use tracing_subscriber::filter::LevelFilter;
use tracing_subscriber::layer::SubscriberExt;
use tracing_subscriber::util::SubscriberInitExt;

/// How log lines are written.
///
/// ```
/// use service_kit::telemetry::LogFormat;
///
/// // With the `clap` feature it is a `ValueEnum`: `--log-format json`, `LOG_FORMAT=json`.
/// assert_eq!(LogFormat::default(), LogFormat::Text);
/// ```
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, clap::ValueEnum)]
pub enum LogFormat {
    /// Human-readable lines.
    #[default]
    Text,
    /// One JSON object per line.
    Json,
}

/// Flushes and shuts the trace exporter down when dropped: keep it alive in `main`.
///
/// ```no_run
/// use service_kit::telemetry::{LogFormat, init};
///
/// let _telemetry = init("orders-service", LogFormat::Json);
/// // ... run the service; traces are flushed when `_telemetry` is dropped.
/// ```
#[must_use = "dropping the guard stops trace export"]
#[derive(Debug)]
pub struct TelemetryGuard {
    provider: Option<SdkTracerProvider>,
}

impl Drop for TelemetryGuard {
    fn drop(&mut self) {
        if let Some(provider) = self.provider.take() {
            let _ = provider.shutdown();
        }
    }
}

/// Installs the global subscriber for `service`. Call once, from `main`.
///
/// ```no_run
/// use service_kit::telemetry::{LogFormat, init};
///
/// # #[tokio::main] async fn main() {
/// // In `main`, first: RUST_LOG and OTEL_EXPORTER_OTLP_ENDPOINT are read here.
/// let _telemetry = init("catalog-service", LogFormat::Text);
/// # }
/// ```
pub fn init(service: &'static str, format: LogFormat) -> TelemetryGuard {
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("info"));
    let provider = match std::env::var("OTEL_EXPORTER_OTLP_ENDPOINT") {
        Ok(endpoint) if !endpoint.is_empty() => match otlp_provider(service) {
            Ok(provider) => Some(provider),
            Err(err) => {
                eprintln!("OTEL_EXPORTER_OTLP_ENDPOINT={endpoint}: cannot export traces: {err}");
                None
            }
        },
        _ => None,
    };
    // Each layer filters on its own: logs follow RUST_LOG, while the exporter sees the
    // per-stage spans (at `debug`) too. Without export, those spans are never even
    // created, so the technique's bookkeeping costs nothing when nobody looks.
    let otel = provider
        .as_ref()
        .map(|p| layer(p, service).with_filter(LevelFilter::DEBUG));
    let registry = tracing_subscriber::registry().with(otel);
    let _ = match format {
        LogFormat::Text => registry
            .with(tracing_subscriber::fmt::layer().with_filter(filter))
            .try_init(),
        LogFormat::Json => registry
            .with(
                tracing_subscriber::fmt::layer()
                    .json()
                    .flatten_event(true)
                    .with_current_span(false)
                    .with_span_list(true)
                    .with_filter(filter),
            )
            .try_init(),
    };
    if provider.is_some() {
        opentelemetry::global::set_text_map_propagator(
            opentelemetry_sdk::propagation::TraceContextPropagator::new(),
        );
    }
    TelemetryGuard { provider }
}

/// The `tracing` layer that turns spans into OpenTelemetry spans of `provider`.
/// Public so tests can use an in-memory exporter.
///
/// ```
/// use opentelemetry_sdk::trace::{InMemorySpanExporter, SdkTracerProvider};
/// use tracing_subscriber::layer::SubscriberExt;
///
/// // A test that looks at the spans: export them to memory instead of OTLP.
/// let exporter = InMemorySpanExporter::default();
/// let provider = SdkTracerProvider::builder().with_simple_exporter(exporter.clone()).build();
/// let subscriber = tracing_subscriber::registry().with(service_kit::telemetry::layer(&provider, "test"));
/// tracing::subscriber::with_default(subscriber, || tracing::info_span!("work").in_scope(|| {}));
/// let _ = provider.force_flush();
/// assert_eq!(exporter.get_finished_spans().unwrap().len(), 1);
/// ```
pub fn layer<S>(
    provider: &SdkTracerProvider,
    service: &'static str,
) -> tracing_opentelemetry::OpenTelemetryLayer<S, opentelemetry_sdk::trace::Tracer>
where
    S: tracing::Subscriber + for<'span> tracing_subscriber::registry::LookupSpan<'span>,
{
    tracing_opentelemetry::layer().with_tracer(provider.tracer(service))
}

/// A provider that batches spans to the OTLP/HTTP endpoint named by the standard
/// `OTEL_EXPORTER_OTLP_*` variables.
fn otlp_provider(
    service: &'static str,
) -> Result<SdkTracerProvider, opentelemetry_otlp::ExporterBuildError> {
    let exporter = opentelemetry_otlp::SpanExporter::builder()
        .with_http()
        .build()?;
    Ok(SdkTracerProvider::builder()
        .with_batch_exporter(exporter)
        .with_resource(resource(service))
        .build())
}

/// The resource the standard variables describe (`OTEL_SERVICE_NAME`,
/// `OTEL_RESOURCE_ATTRIBUTES`), named `service` only where they name no service.
fn resource(service: &'static str) -> opentelemetry_sdk::Resource {
    let detected = opentelemetry_sdk::Resource::builder().build();
    let named = detected
        .get(&opentelemetry::Key::from_static_str("service.name"))
        .is_some_and(|name| !name.as_str().starts_with("unknown_service"));
    match named {
        true => detected,
        false => opentelemetry_sdk::Resource::builder()
            .with_service_name(service)
            .build(),
    }
}

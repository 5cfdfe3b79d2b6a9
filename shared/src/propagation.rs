//! W3C trace context across the hop: `traceparent` in, `traceparent` out, and the
//! sampled trace an exemplar names.
//!
//! Written against OpenTelemetry's own propagator and `opentelemetry-http`'s header
//! adapters rather than reqwest-tracing, which lags OpenTelemetry's releases. Without the
//! `otel` feature no OpenTelemetry layer can be installed, so there is no context to
//! carry: the same three functions, doing nothing, stand in. With it, they use the
//! global propagator: set `TraceContextPropagator` as it where you set up tracing.
//!
//! The module is built with the parts that cross a hop, and each function where
//! something calls it: `continue_trace` for the ingress's HTTP middleware, which opens
//! the request's span (features `axum` and `metrics`), `inject` for the client
//! (`http-client`), `sampled_trace_id` for the latency histograms' exemplars
//! (`metrics`).

#[cfg(feature = "otel")]
use traced as chosen;
#[cfg(not(feature = "otel"))]
use untraced as chosen;

#[cfg(all(feature = "axum", feature = "metrics"))]
pub(crate) use chosen::continue_trace;
#[cfg(feature = "http-client")]
pub(crate) use chosen::inject;
#[cfg(all(feature = "metrics", any(feature = "axum", feature = "http-client")))]
pub(crate) use chosen::sampled_trace_id;

#[cfg(feature = "otel")]
mod traced {
    use tracing_opentelemetry::OpenTelemetrySpanExt as _;

    /// Makes `span` a child of the trace the caller sent in `headers`, if any, and
    /// records the trace id on the span (the JSON logs print it).
    #[cfg(all(feature = "axum", feature = "metrics"))]
    pub(crate) fn continue_trace(span: &tracing::Span, headers: &http::HeaderMap) {
        use opentelemetry::trace::TraceContextExt as _;

        let parent = opentelemetry::global::get_text_map_propagator(|p| {
            p.extract(&opentelemetry_http::HeaderExtractor(headers))
        });
        let _ = span.set_parent(parent);
        let trace_id = span.context().span().span_context().trace_id();
        if trace_id != opentelemetry::trace::TraceId::INVALID {
            span.record("trace_id", tracing::field::display(trace_id));
        }
    }

    /// Writes `span`'s trace context into outbound `headers`.
    #[cfg(feature = "http-client")]
    pub(crate) fn inject(span: &tracing::Span, headers: &mut http::HeaderMap) {
        let context = span.context();
        opentelemetry::global::get_text_map_propagator(|p| {
            p.inject_context(&context, &mut opentelemetry_http::HeaderInjector(headers));
        });
    }

    /// The trace id (32 hex digits) of the current span, if an OpenTelemetry layer is
    /// installed and the span is sampled: only then will a backend have stored it.
    #[cfg(all(feature = "metrics", any(feature = "axum", feature = "http-client")))]
    pub(crate) fn sampled_trace_id() -> Option<String> {
        use opentelemetry::trace::TraceContextExt as _;

        let context = tracing::Span::current().context();
        let span = context.span();
        let span_context = span.span_context();
        (span_context.is_valid() && span_context.is_sampled())
            .then(|| span_context.trace_id().to_string())
    }
}

#[cfg(not(feature = "otel"))]
mod untraced {
    #[cfg(all(feature = "axum", feature = "metrics"))]
    pub(crate) fn continue_trace(_span: &tracing::Span, _headers: &http::HeaderMap) {}

    #[cfg(feature = "http-client")]
    pub(crate) fn inject(_span: &tracing::Span, _headers: &mut http::HeaderMap) {}

    #[cfg(all(feature = "metrics", any(feature = "axum", feature = "http-client")))]
    pub(crate) fn sampled_trace_id() -> Option<String> {
        None
    }
}

//! W3C trace context across the hop, with OpenTelemetry's own propagator (set
//! `TraceContextPropagator` as the global one): each function does nothing without the
//! `otel` feature, and is built only where the client or the metrics call it.

/// Makes `span` a child of the trace the caller sent in `headers`, if any, and records
/// the trace id on the span (the JSON logs print it).
#[cfg(any(feature = "metrics", feature = "grpc"))]
pub(crate) fn continue_trace(span: &tracing::Span, headers: &http::HeaderMap) {
    #[cfg(feature = "otel")]
    {
        use opentelemetry::trace::TraceContextExt as _;
        use tracing_opentelemetry::OpenTelemetrySpanExt as _;

        let parent = opentelemetry::global::get_text_map_propagator(|p| {
            p.extract(&opentelemetry_http::HeaderExtractor(headers))
        });
        let _ = span.set_parent(parent);
        let trace_id = span.context().span().span_context().trace_id();
        if trace_id != opentelemetry::trace::TraceId::INVALID {
            span.record("trace_id", tracing::field::display(trace_id));
        }
    }
    #[cfg(not(feature = "otel"))]
    let _ = (span, headers);
}

/// Writes `span`'s trace context into outbound `headers`.
#[cfg(any(feature = "http-client", feature = "grpc"))]
pub(crate) fn inject(span: &tracing::Span, headers: &mut http::HeaderMap) {
    #[cfg(feature = "otel")]
    {
        use tracing_opentelemetry::OpenTelemetrySpanExt as _;

        let context = span.context();
        opentelemetry::global::get_text_map_propagator(|p| {
            p.inject_context(&context, &mut opentelemetry_http::HeaderInjector(headers));
        });
    }
    #[cfg(not(feature = "otel"))]
    let _ = (span, headers);
}

/// The trace id (32 hex digits) of the current span, if an OpenTelemetry layer is
/// installed and the span is sampled: only then will a backend have stored it.
#[cfg(feature = "metrics")]
pub(crate) fn sampled_trace_id() -> Option<String> {
    #[cfg(feature = "otel")]
    {
        use opentelemetry::trace::TraceContextExt as _;
        use tracing_opentelemetry::OpenTelemetrySpanExt as _;

        let context = tracing::Span::current().context();
        let span = context.span();
        let span_context = span.span_context();
        (span_context.is_valid() && span_context.is_sampled())
            .then(|| span_context.trace_id().to_string())
    }
    #[cfg(not(feature = "otel"))]
    None
}

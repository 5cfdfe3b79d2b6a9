//! W3C trace context across the hop: `traceparent` in, `traceparent` out.
//!
//! Hand-written rather than reqwest-tracing, which lags OpenTelemetry releases
//! (docs/design.md §10); it is a dozen lines. Without the `otel` feature no
//! OpenTelemetry layer can be installed, so there is no context to carry and
//! [`continue_trace`] and [`inject`] do nothing. With it, they use the global
//! propagator: set `TraceContextPropagator` as it where you set up tracing.

use http::HeaderMap;

/// Makes `span` a child of the trace the caller sent in `headers`, if any, and
/// records the trace id on the span (the JSON logs print it).
pub(crate) fn continue_trace(span: &tracing::Span, headers: &HeaderMap) {
    #[cfg(feature = "otel")]
    otel::continue_trace(span, headers);
    #[cfg(not(feature = "otel"))]
    let _ = (span, headers);
}

/// Writes `span`'s trace context into outbound `headers`.
pub(crate) fn inject(span: &tracing::Span, headers: &mut HeaderMap) {
    #[cfg(feature = "otel")]
    otel::inject(span, headers);
    #[cfg(not(feature = "otel"))]
    let _ = (span, headers);
}

#[cfg(feature = "otel")]
mod otel {
    use http::HeaderMap;
    use opentelemetry::propagation::{Extractor, Injector};
    use tracing_opentelemetry::OpenTelemetrySpanExt;

    pub(super) fn continue_trace(span: &tracing::Span, headers: &HeaderMap) {
        let parent =
            opentelemetry::global::get_text_map_propagator(|p| p.extract(&HeaderRead(headers)));
        let _ = span.set_parent(parent);
        let trace_id = {
            use opentelemetry::trace::TraceContextExt as _;
            span.context().span().span_context().trace_id()
        };
        if trace_id != opentelemetry::trace::TraceId::INVALID {
            span.record("trace_id", tracing::field::display(trace_id));
        }
    }

    pub(super) fn inject(span: &tracing::Span, headers: &mut HeaderMap) {
        let context = span.context();
        opentelemetry::global::get_text_map_propagator(|p| {
            p.inject_context(&context, &mut HeaderWrite(headers));
        });
    }

    struct HeaderRead<'a>(&'a HeaderMap);

    impl Extractor for HeaderRead<'_> {
        fn get(&self, key: &str) -> Option<&str> {
            self.0.get(key).and_then(|v| v.to_str().ok())
        }

        fn keys(&self) -> Vec<&str> {
            self.0.keys().map(http::HeaderName::as_str).collect()
        }
    }

    struct HeaderWrite<'a>(&'a mut HeaderMap);

    impl Injector for HeaderWrite<'_> {
        fn set(&mut self, key: &str, value: String) {
            if let (Ok(name), Ok(value)) = (
                http::HeaderName::from_bytes(key.as_bytes()),
                http::HeaderValue::from_str(&value),
            ) {
                self.0.insert(name, value);
            }
        }
    }
}

//! Recording a field on the span current where the ingress runs: the request's server
//! span, which the HTTP middleware opened and declared the field on.

/// Records `value` as `field` of the current span, when there is one and it declares
/// the field: what `tracing::Span::current().record(field, value)` does, without the
/// `Span` handle. The handle clones the span in the subscriber's registry and closes
/// that clone when it drops, a few hundred instructions of every request for a handle
/// used once; here the dispatcher is asked for the current span's id, and the value is
/// recorded on it directly.
pub(crate) fn record(field: &str, value: u64) {
    tracing::dispatcher::get_default(|dispatch| {
        let Some((id, metadata)) = dispatch.current_span().into_inner() else {
            return;
        };
        let fields = metadata.fields();
        let Some(field) = fields.field(field) else {
            return;
        };
        let values = [(&field, Some(&value as &dyn tracing::Value))];
        dispatch.record(&id, &tracing::span::Record::new(&fields.value_set(&values)));
    });
}

#[cfg(test)]
mod tests {
    use std::sync::{Arc, Mutex};

    use tracing::field::{Field, Visit};
    use tracing::span::{Id, Record};
    use tracing_subscriber::layer::{Context, SubscriberExt as _};

    /// A layer that keeps every `u64` recorded on a span after it opened.
    #[derive(Clone, Default)]
    struct Recorded(Arc<Mutex<Vec<(String, u64)>>>);

    impl Visit for Recorded {
        fn record_u64(&mut self, field: &Field, value: u64) {
            self.0
                .lock()
                .unwrap()
                .push((field.name().to_owned(), value));
        }
        fn record_debug(&mut self, _: &Field, _: &dyn std::fmt::Debug) {}
    }

    impl<S: tracing::Subscriber> tracing_subscriber::Layer<S> for Recorded {
        fn on_record(&self, _: &Id, values: &Record<'_>, _: Context<'_, S>) {
            values.record(&mut self.clone());
        }
    }

    #[test]
    fn a_declared_field_is_recorded_on_the_current_span_and_nothing_else_is() {
        let recorded = Recorded::default();
        let subscriber = tracing_subscriber::registry().with(recorded.clone());
        tracing::subscriber::with_default(subscriber, || {
            // No current span: nothing to record on.
            super::record("budget_ms", 1);
            let span = tracing::info_span!("request", budget_ms = tracing::field::Empty);
            span.in_scope(|| {
                super::record("budget_ms", 700);
                super::record("not_declared", 2);
            });
        });
        assert_eq!(*recorded.0.lock().unwrap(), [("budget_ms".to_owned(), 700)]);
    }
}

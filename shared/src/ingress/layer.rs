//! [`DeadlineLayer`]: configuration only.

use std::sync::Arc;

use tower::Layer;

use super::service::DeadlineService;
use super::{DeadlineMode, LiveMode};
use crate::deadline::DeadlinePolicy;
#[cfg(feature = "metrics")]
use crate::metrics::DeadlineMetrics;
use crate::timing::StageLog;

/// Wraps a service so that every request runs under a [`Deadline`](crate::Deadline).
///
/// ```
/// use axum::{Router, routing::get};
/// use deadline_propagation::{Deadline, DeadlineLayer, DeadlinePolicy};
///
/// async fn handler(deadline: Deadline) -> String {
///     format!("{} ms left", deadline.remaining().as_millis())
/// }
///
/// let layer = DeadlineLayer::new(DeadlinePolicy::from_millis(2000, 1000));
/// // A route layer: it runs after routing, so it sees the matched route.
/// let app: Router = Router::new().route("/", get(handler)).route_layer(layer);
/// ```
#[derive(Clone, Debug)]
pub struct DeadlineLayer {
    config: Arc<IngressConfig>,
}

#[derive(Clone, Debug)]
pub(crate) struct IngressConfig {
    pub(crate) policy: DeadlinePolicy,
    pub(crate) mode: LiveMode,
    /// Whether a request may ask to be observed (`X-Deadline-Mode: observe`).
    pub(crate) honour_mode_header: bool,
    #[cfg(feature = "metrics")]
    pub(crate) metrics: Option<DeadlineMetrics>,
}

impl IngressConfig {
    /// A new request's log, reporting to the metrics unless the request is a probe:
    /// a probe's budget and stages are nobody's budget.
    pub(crate) fn stage_log(&self, probe: bool) -> StageLog {
        #[cfg(feature = "metrics")]
        if let Some(metrics) = self.metrics.as_ref().filter(|_| !probe) {
            return StageLog::with_metrics(metrics.clone());
        }
        #[cfg(not(feature = "metrics"))]
        let _ = probe;
        StageLog::default()
    }
}

impl DeadlineLayer {
    /// A layer that applies `policy` to every request.
    pub fn new(policy: DeadlinePolicy) -> Self {
        Self {
            config: Arc::new(IngressConfig {
                policy,
                mode: LiveMode::new(DeadlineMode::Propagate),
                honour_mode_header: false,
                #[cfg(feature = "metrics")]
                metrics: None,
            }),
        }
    }

    /// Sets the mode; in [`DeadlineMode::Legacy`] every budget header is ignored and the handler
    /// is not bounded, as in a service written without the technique.
    pub fn mode(self, mode: DeadlineMode) -> Self {
        self.live_mode(LiveMode::new(mode))
    }

    /// Reads the mode from `mode` for every request, so it can be switched at run time.
    ///
    /// ```
    /// use deadline_propagation::LiveMode;
    /// use deadline_propagation::{DeadlineLayer, DeadlineMode, DeadlinePolicy};
    ///
    /// let mode = LiveMode::new(DeadlineMode::Observe);
    /// let layer = DeadlineLayer::new(DeadlinePolicy::from_millis(2000, 1000)).live_mode(mode.clone());
    /// // Later, from an admin endpoint: the next request runs in propagate.
    /// mode.set(DeadlineMode::Propagate);
    /// ```
    pub fn live_mode(self, mode: LiveMode) -> Self {
        self.map(|c| c.mode = mode)
    }

    /// Runs a request that carries `X-Deadline-Mode: observe` in observe mode, whatever
    /// the mode in force (unless that is legacy, which reads no budget header): the
    /// caller is observing, and a refusal here would be a real one to its client.
    ///
    /// Honour it in services that only other services call, never at the edge: there,
    /// any client could switch the protection off for its own requests. A value other
    /// than `observe` is a 400 naming the header.
    pub fn honour_mode_header(self, honour: bool) -> Self {
        self.map(|c| c.honour_mode_header = honour)
    }

    /// Reports budgets, clamps, stage starts and expiries to `metrics`.
    #[cfg(feature = "metrics")]
    #[cfg_attr(docsrs, doc(cfg(feature = "metrics")))]
    pub fn metrics(self, metrics: &crate::metrics::Metrics) -> Self {
        let policy = self.config.policy;
        metrics
            .settings()
            .set_deadline_policy(policy.max, policy.default, None);
        let deadline = metrics.deadline().clone();
        self.map(|c| c.metrics = Some(deadline))
    }

    fn map(self, f: impl FnOnce(&mut IngressConfig)) -> Self {
        let mut config = Arc::unwrap_or_clone(self.config);
        f(&mut config);
        Self {
            config: Arc::new(config),
        }
    }
}

impl<S> Layer<S> for DeadlineLayer {
    type Service = DeadlineService<S>;

    fn layer(&self, inner: S) -> Self::Service {
        DeadlineService::new(inner, Arc::clone(&self.config))
    }
}

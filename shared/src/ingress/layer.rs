//! [`DeadlineLayer`]: configuration only.

use std::sync::Arc;

use tower::Layer;

use super::service::DeadlineService;
use crate::deadline::{DeadlinePolicy, LiveMode};
use crate::mode::DeadlineMode;
use crate::timing::{Reporter, StageLog};

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
    /// Routes whose requests are not reported (see [`DeadlineLayer::probes`]).
    pub(crate) probes: Vec<&'static str>,
    pub(crate) report: Reporter,
}

impl IngressConfig {
    /// A new request's log, reporting unless the request is a probe: a probe's budget
    /// and stages are nobody's budget.
    pub(crate) fn stage_log(&self, probe: bool) -> StageLog {
        match probe {
            true => StageLog::default(),
            false => StageLog::reporting(self.report.clone()),
        }
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
                probes: Vec::new(),
                report: None,
            }),
        }
    }

    /// Sets the mode: [`DeadlineMode::Observe`] runs every handler to its end and
    /// counts the refusals propagate would make.
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
    /// the mode in force: the caller is observing, and a refusal here would be a real one to its client.
    ///
    /// Honour it in services that only other services call, never at the edge: there,
    /// any client could switch the protection off for its own requests. A value other
    /// than `observe` is a 400 naming the header.
    pub fn honour_mode_header(self, honour: bool) -> Self {
        self.map(|c| c.honour_mode_header = honour)
    }

    /// Routes that load balancers and scrapers call (`/healthz`, `/readyz`, `/metrics`):
    /// still bounded by the layer, but none of their budgets or stages is reported.
    /// They come every few seconds with budgets of their callers' choosing; counted
    /// with the clients' requests they would fill the deadline histograms with numbers
    /// that describe no client. Matched against the route template, or the path where
    /// no route matched. [`instrument`](crate::instrument) adds the metrics route.
    ///
    /// ```
    /// use deadline_propagation::{DeadlineLayer, DeadlinePolicy};
    ///
    /// let layer = DeadlineLayer::new(DeadlinePolicy::from_millis(2000, 1000))
    ///     .probes(["/healthz", "/readyz"]);
    /// ```
    pub fn probes(self, paths: impl IntoIterator<Item = &'static str>) -> Self {
        self.map(|c| c.probes.extend(paths))
    }

    /// The same layer, reporting to `report` (the metrics attach themselves this way).
    #[cfg(feature = "metrics")]
    pub(crate) fn reporting(self, report: Reporter) -> Self {
        self.map(|c| c.report = report)
    }

    /// The policy the layer applies (the metrics export it).
    #[cfg(feature = "metrics")]
    pub(crate) fn policy(&self) -> DeadlinePolicy {
        self.config.policy
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

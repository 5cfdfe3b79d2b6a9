//! [`DeadlineLayer`]: the configuration.

use std::sync::Arc;

use tower::Layer;

use super::service::{DeadlineService, IngressConfig};
use crate::deadline::DeadlinePolicy;
use crate::mode::{DeadlineMode, LiveMode};
#[cfg(feature = "metrics")]
use crate::timing::Report;

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

impl DeadlineLayer {
    /// A layer that applies `policy` to every request, in propagate mode.
    pub fn new(policy: DeadlinePolicy) -> Self {
        Self {
            config: Arc::new(IngressConfig {
                policy,
                mode: LiveMode::new(DeadlineMode::Propagate),
                honour_mode_header: false,
                probes: Vec::new(),
                timing_stages: true,
                report: None,
            }),
        }
    }

    /// Reads the mode from `mode` for every request, so that an admin endpoint can
    /// switch it at run time.
    pub fn live_mode(self, mode: LiveMode) -> Self {
        self.map(|c| c.mode = mode)
    }

    /// Sets the mode once and for all.
    pub fn mode(self, mode: DeadlineMode) -> Self {
        self.live_mode(LiveMode::new(mode))
    }

    /// Runs a request marked `X-Deadline-Mode: observe` in observe mode (a refusal here
    /// would be a real one to an observing caller's client); any other value is a 400.
    /// Honour it in services that only other services call, never at the edge.
    pub fn honour_mode_header(self, honour: bool) -> Self {
        self.map(|c| c.honour_mode_header = honour)
    }

    /// Whether `Server-Timing` names every stage (the default) or only `total`: the stages
    /// name the downstreams and time the database, so say only `total` at a public edge.
    pub fn server_timing_stages(self, stages: bool) -> Self {
        self.map(|c| c.timing_stages = stages)
    }

    /// Routes that load balancers and scrapers call (`/healthz`): bounded, but their
    /// budgets describe no client and are not reported.
    pub fn probes(self, paths: impl IntoIterator<Item = &'static str>) -> Self {
        self.map(|c| c.probes.extend(paths))
    }

    /// The same layer, reporting to `report` (the metrics attach themselves this way).
    #[cfg(feature = "metrics")]
    pub(crate) fn reporting(self, report: Arc<dyn Report>) -> Self {
        self.map(|c| c.report = Some(report))
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

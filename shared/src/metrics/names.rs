//! The names of the crate's metric families, as the exposition spells them, in one
//! place: the families register under these, and tests, load scripts and dashboard
//! checks read them from here, so a renamed family breaks the build instead of a
//! dashboard.
//!
//! Counters carry the `_total` suffix prometheus-client appends (they are registered
//! without it); histograms are named by family (their series add
//! `_bucket`, `_sum` and `_count`).

/// Server response time by `method`, `uri` (route template) and `status` (histogram).
pub const HTTP_SERVER_REQUESTS_SECONDS: &str = "http_server_requests_seconds";
/// Requests being handled now, by `uri` (gauge).
pub const HTTP_SERVER_REQUESTS_IN_FLIGHT: &str = "http_server_requests_in_flight";

/// Budgets accepted at the ingress, by `service` (histogram).
pub const DEADLINE_INBOUND_BUDGET_SECONDS: &str = "deadline_inbound_budget_seconds";
/// Budgets clamped to the maximum, by `service` (counter).
pub const DEADLINE_CLAMPED_TOTAL: &str = "deadline_clamped_total";
/// Budget left when a stage starts, by `service` and `stage` (histogram).
pub const DEADLINE_REMAINING_SECONDS: &str = "deadline_remaining_seconds";
/// How late past its deadline a service answered (0 in time), by `service` (histogram).
pub const DEADLINE_OVERRUN_SECONDS: &str = "deadline_overrun_seconds";
/// Budgets that ran out, by `service` and `stage` (counter).
pub const DEADLINE_EXCEEDED_TOTAL: &str = "deadline_exceeded_total";
/// In `observe` mode, what propagate would have refused, by `service`, `stage` and
/// `reason` (counter).
pub const DEADLINE_WOULD_REFUSE_TOTAL: &str = "deadline_would_refuse_total";
/// The configured budget policy by `service` and `kind` (gauge).
pub const DEADLINE_POLICY_SECONDS: &str = "deadline_policy_seconds";

/// The downstream call, pool wait excluded, by `client` and `status` (histogram).
pub const HTTP_CLIENT_REQUESTS_SECONDS: &str = "http_client_requests_seconds";
/// Calls waiting for a bulkhead slot, by `client` (gauge).
pub const HTTP_CLIENT_POOL_PENDING_ACQUIRES: &str = "http_client_pool_pending_acquires";
/// Bulkhead slots in use, by `client` (gauge).
pub const HTTP_CLIENT_POOL_ACTIVE_CONNECTIONS: &str = "http_client_pool_active_connections";
/// Time spent waiting for a slot, by `client` (histogram).
pub const HTTP_CLIENT_POOL_ACQUIRE_SECONDS: &str = "http_client_pool_acquire_seconds";
/// Early refusals by `client` and `reason` (counter).
pub const HTTP_CLIENT_POOL_REJECTIONS_TOTAL: &str = "http_client_pool_rejections_total";
/// The bulkhead's limits by `client` and `kind` (gauge).
pub const HTTP_CLIENT_POOL_LIMIT: &str = "http_client_pool_limit";
/// Calls retried once, by `client` (counter).
pub const HTTP_CLIENT_RETRIES_TOTAL: &str = "http_client_retries_total";
/// Calls refused because the latency estimate says they cannot finish (counter).
pub const HTTP_CLIENT_ADMISSION_REJECTIONS_TOTAL: &str = "http_client_admission_rejections_total";
/// Calls predicted late but sent anyway to notice recovery, by `client` (counter).
pub const HTTP_CLIENT_ADMISSION_PROBES_TOTAL: &str = "http_client_admission_probes_total";
/// The latency estimate admission decides on, by `client` (gauge).
pub const HTTP_CLIENT_LATENCY_ESTIMATE_SECONDS: &str = "http_client_latency_estimate_seconds";
/// The round trip on the wire kept back from the budget sent, by `client` (gauge).
pub const HTTP_CLIENT_WIRE_SECONDS: &str = "http_client_wire_seconds";
/// Attempts of calls by `client`, `kind` and `outcome` (counter).
pub const HTTP_CLIENT_ATTEMPTS_TOTAL: &str = "http_client_attempts_total";
/// How long a first attempt runs before its hedge, by `client` (gauge).
pub const HTTP_CLIENT_HEDGE_DELAY_SECONDS: &str = "http_client_hedge_delay_seconds";

/// PostgreSQL pool connections by `state` (`idle`, `in_use`) (gauge).
pub const DB_POOL_CONNECTIONS: &str = "db_pool_connections";
/// Callers waiting for a PostgreSQL connection (gauge).
pub const DB_POOL_PENDING_ACQUIRES: &str = "db_pool_pending_acquires";

/// Tool calls by `tool_name` and `outcome` (counter).
pub const TOOL_CALLS_TOTAL: &str = "tool_calls_total";

/// The histogram families.
pub const HISTOGRAMS: &[&str] = &[
    HTTP_SERVER_REQUESTS_SECONDS,
    HTTP_CLIENT_REQUESTS_SECONDS,
    HTTP_CLIENT_POOL_ACQUIRE_SECONDS,
    DEADLINE_INBOUND_BUDGET_SECONDS,
    DEADLINE_REMAINING_SECONDS,
    DEADLINE_OVERRUN_SECONDS,
];

/// Every other family (gauges and counters).
pub const SCALARS: &[&str] = &[
    HTTP_SERVER_REQUESTS_IN_FLIGHT,
    DEADLINE_CLAMPED_TOTAL,
    DEADLINE_EXCEEDED_TOTAL,
    DEADLINE_WOULD_REFUSE_TOTAL,
    DEADLINE_POLICY_SECONDS,
    HTTP_CLIENT_POOL_PENDING_ACQUIRES,
    HTTP_CLIENT_POOL_ACTIVE_CONNECTIONS,
    HTTP_CLIENT_POOL_REJECTIONS_TOTAL,
    HTTP_CLIENT_POOL_LIMIT,
    HTTP_CLIENT_RETRIES_TOTAL,
    HTTP_CLIENT_ADMISSION_REJECTIONS_TOTAL,
    HTTP_CLIENT_ADMISSION_PROBES_TOTAL,
    HTTP_CLIENT_LATENCY_ESTIMATE_SECONDS,
    HTTP_CLIENT_WIRE_SECONDS,
    HTTP_CLIENT_ATTEMPTS_TOTAL,
    HTTP_CLIENT_HEDGE_DELAY_SECONDS,
    DB_POOL_CONNECTIONS,
    DB_POOL_PENDING_ACQUIRES,
    TOOL_CALLS_TOTAL,
];

/// The name a family is registered under: a counter's without the `_total` that
/// prometheus-client appends when it writes the exposition.
pub(crate) fn registered(name: &'static str) -> &'static str {
    name.strip_suffix("_total").unwrap_or(name)
}

/// Whether `series` (as written in a query or an exposition) belongs to one of these
/// families: a scalar's name, or a histogram's `_bucket`, `_sum` or `_count`.
pub fn is_series(series: &str) -> bool {
    SCALARS.contains(&series)
        || HISTOGRAMS.iter().any(|h| {
            series
                .strip_prefix(h)
                .is_some_and(|s| matches!(s, "_bucket" | "_sum" | "_count"))
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn histogram_series_and_scalars_are_series_of_the_families() {
        assert!(is_series("http_server_requests_seconds_bucket"));
        assert!(is_series("db_pool_pending_acquires"));
        assert!(!is_series("http_server_requests_seconds"));
        assert!(!is_series("http_server_request_seconds_count"));
    }

    #[test]
    fn counters_register_without_their_total() {
        assert_eq!(registered(TOOL_CALLS_TOTAL), "tool_calls");
    }

    /// Every family the crate registers has a name from this module (the `# TYPE`
    /// lines name the families; counters there lack `_total`).
    #[test]
    fn every_registered_family_is_named_here() {
        let metrics = crate::metrics::Metrics::new("test");
        let text = metrics.render();
        let families: Vec<&str> = text
            .lines()
            .filter_map(|l| l.strip_prefix("# TYPE "))
            .filter_map(|l| l.split_whitespace().next())
            .collect();
        assert!(!families.is_empty(), "{text}");
        for family in families {
            let known = HISTOGRAMS.contains(&family)
                || SCALARS.contains(&family)
                || SCALARS.contains(&format!("{family}_total").as_str());
            assert!(
                known,
                "{family} is not in deadline_propagation::metrics::names"
            );
        }
    }
}

//! Metrics and traces, as the dashboards and a trace backend see them.

mod common;

use std::sync::OnceLock;

use common::{MS, json_of, spawn_app, spawn_app_with};
use opentelemetry::trace::{SpanKind, TraceId};
use opentelemetry_sdk::trace::{InMemorySpanExporter, SdkTracerProvider, SpanData};
use reqwest::StatusCode;
use test_support::{metric_value, wait_until};
use tracing_subscriber::layer::SubscriberExt;

#[tokio::test]
async fn every_contract_metric_is_present_with_its_labels_after_a_request() {
    let app = spawn_app().await;
    let order = json_of(app.order("SKU-00001", 1, Some(60_000)).await).await;
    let read = app.get(&format!("/api/orders/{}", order["id"])).await;
    assert_eq!(read.status(), StatusCode::OK);
    let text = app.metrics();
    let samples = [
        r#"http_server_requests_seconds_bucket{le="0.001",method="POST",uri="/api/orders",status="201"}"#,
        // The template, never the raw path: one series for every order id.
        r#"http_server_requests_seconds_count{method="GET",uri="/api/orders/{id}",status="200"}"#,
        r#"http_server_requests_in_flight{uri="/api/orders"}"#,
        r#"http_client_requests_seconds_count{client="catalog",status="200"}"#,
        r#"http_client_pool_pending_acquires{client="catalog"}"#,
        r#"http_client_pool_active_connections{client="catalog"}"#,
        r#"http_client_pool_acquire_seconds_count{client="catalog"}"#,
        r#"http_client_pool_rejections_total{client="catalog",reason="queue_full"}"#,
        r#"http_client_pool_rejections_total{client="catalog",reason="acquire_timeout"}"#,
        r#"http_client_pool_rejections_total{client="catalog",reason="deadline"}"#,
        r#"deadline_inbound_budget_seconds_count{service="orders-service"}"#,
        r#"deadline_clamped_total{service="orders-service"}"#,
        r#"deadline_remaining_seconds_count{service="orders-service",stage="catalog"}"#,
        r#"deadline_remaining_seconds_count{service="orders-service",stage="db"}"#,
        r#"deadline_exceeded_total{service="orders-service",stage="catalog_pool"}"#,
        r#"db_pool_connections{state="idle"}"#,
        r#"db_pool_connections{state="in_use"}"#,
        "db_pool_pending_acquires",
    ];
    for sample in samples {
        let found = text
            .lines()
            .any(|line| line.starts_with(&format!("{sample} ")));
        assert!(found, "missing {sample} in\n{text}");
    }
    assert!(text.contains("# TYPE http_server_requests_seconds histogram"));
    let clamped = metric_value(
        &text,
        "deadline_clamped_total",
        r#"service="orders-service""#,
    );
    assert_eq!(clamped, Some(1.0), "the 60 s request was clamped");
}

#[tokio::test]
async fn in_flight_returns_to_zero_after_clients_give_up() {
    let app = spawn_app().await;
    app.slow_catalog(3000);
    let in_flight = || {
        metric_value(
            &app.metrics(),
            "http_server_requests_in_flight",
            r#"uri="/api/orders""#,
        )
        .unwrap_or(0.0)
    };
    let impatient = reqwest::Client::builder().timeout(MS(300)).build().unwrap();
    let url = format!("{}/api/orders", app.base);
    let calls = (0..5).map(|_| {
        let (client, url) = (impatient.clone(), url.clone());
        tokio::spawn(async move {
            client
                .post(url)
                .json(&serde_json::json!({"sku": "SKU-00001", "quantity": 1}))
                .send()
                .await
        })
    });
    let calls: Vec<_> = calls.collect();
    wait_until("all five are in flight", MS(2000), || async {
        in_flight() == 5.0
    })
    .await;
    for call in calls {
        assert!(call.await.unwrap().is_err(), "the client gave up");
    }
    wait_until("in-flight is back to 0", MS(1000), || async {
        in_flight() == 0.0
    })
    .await;
    assert_eq!(
        metric_value(
            &app.metrics(),
            "http_client_pool_active_connections",
            r#"client="catalog""#
        ),
        Some(0.0),
        "the dropped calls released their connection slots"
    );
}

/// The label sets of `family` in a scrape, e.g. `method="GET",uri="/api/orders",status="201"`.
fn label_sets<'a>(text: &'a str, family: &str) -> Vec<&'a str> {
    text.lines()
        .filter_map(|line| line.strip_prefix(family)?.strip_prefix('{'))
        .filter_map(|rest| Some(rest.rsplit_once("} ")?.0))
        .collect()
}

/// Every sample line of a scrape: one per series (buckets included).
fn sample_count(text: &str) -> usize {
    text.lines().filter(|line| !line.starts_with('#')).count()
}

/// One round of requests no client of ours sends: invented methods (a new one every
/// time), standard methods on paths nobody routes, random route parameters.
async fn send_hostile_round(app: &common::TestApp, base: &str, round: usize) {
    let methods = ["GET", "POST", "DELETE", "BREW", "X-SCAN"];
    let paths = ["/x", "/api/orders", "/mcp", "/catalog", "/.env"];
    let calls = methods.iter().enumerate().flat_map(|(m, method)| {
        paths.iter().map(move |path| {
            let salt = format!("{round}{m}{:x}", round * 7919 + m * 104_729);
            let method = match *method {
                // An invented method with a different name every time.
                invented @ ("BREW" | "X-SCAN") => format!("{invented}{salt}"),
                standard => standard.to_owned(),
            };
            let method = reqwest::Method::from_bytes(method.as_bytes()).unwrap();
            let url = format!("{base}{path}/{salt}");
            let client = app.client.clone();
            async move { client.request(method, url).send().await.map(drop) }
        })
    });
    for result in futures_util::future::join_all(calls).await {
        result.expect("the service answers hostile requests");
    }
}

/// An unknown method is `_OTHER`, a path without a route shares one label, so no client
/// can grow the number of series a scrape returns (docs/design.md §7).
#[tokio::test]
async fn hostile_methods_and_paths_do_not_grow_the_series_of_either_service() {
    let app = spawn_app().await;
    for base in [app.base.clone(), app.catalog_url.clone()] {
        // The first round shows every kind of answer once (404, 405, ...).
        send_hostile_round(&app, &base, 0).await;
        let before = app.scrape(&base).await;
        for round in 1..=12 {
            send_hostile_round(&app, &base, round).await;
        }
        let after = app.scrape(&base).await;
        let series = |text| label_sets(text, "http_server_requests_seconds_count");
        assert_eq!(
            (sample_count(&before), series(&before).len()),
            (sample_count(&after), series(&after).len()),
            "(samples, request series) before and after 300 more hostile requests to \
             {base}; now: {:#?}",
            series(&after)
        );
        assert!(series(&after).len() <= 16, "{:#?}", series(&after));
        let methods = ["GET", "POST", "DELETE", "_OTHER"].map(|m| format!(r#"method="{m}""#));
        for labels in series(&after) {
            let method = labels.split(',').next().unwrap_or_default();
            assert!(methods.iter().any(|m| m == method), "{labels}");
        }
    }
}

/// Load balancers probe every few seconds and Prometheus scrapes: none of it is a
/// client's budget, so none of it may show in `deadline_inbound_budget_seconds`.
#[tokio::test]
async fn probes_and_scrapes_are_not_counted_as_inbound_budgets() {
    let app = spawn_app().await;
    let services = [
        (&app.base, "orders-service", "/api/orders/no-such-order"),
        (&app.catalog_url, "catalog-service", "/catalog/SKU-00001"),
    ];
    for (base, service, real_request) in services {
        let budgets = || async {
            let text = app.scrape(base).await;
            let labels = format!(r#"service="{service}""#);
            metric_value(&text, "deadline_inbound_budget_seconds_count", &labels).unwrap_or(0.0)
        };
        let before = budgets().await;
        for path in ["/healthz", "/readyz", "/metrics"].repeat(3) {
            app.client
                .get(format!("{base}{path}"))
                .header("X-Request-Timeout-Ms", "800")
                .send()
                .await
                .expect("probe sent");
        }
        assert_eq!(budgets().await, before, "{service}: probes were counted");
        // The same count does move for a request of a client.
        app.client
            .get(format!("{base}{real_request}"))
            .send()
            .await
            .expect("request sent");
        assert_eq!(budgets().await, before + 1.0, "{service}");
    }
}

fn attribute(span: &SpanData, key: &str) -> Option<String> {
    span.attributes
        .iter()
        .find(|kv| kv.key.as_str() == key)
        .map(|kv| kv.value.to_string())
}

/// The span named `name` of `kind`; in `trace` when given (other tests of this binary
/// run in parallel and their spans land in the same exporter).
fn find<'a>(
    spans: &'a [SpanData],
    name: &str,
    kind: SpanKind,
    trace: Option<TraceId>,
) -> &'a SpanData {
    spans
        .iter()
        .find(|s| {
            s.name == name
                && s.span_kind == kind
                && trace.is_none_or(|t| s.span_context.trace_id() == t)
                && (trace.is_some() || attribute(s, "deadline.budget_ms").as_deref() == Some("700"))
        })
        .unwrap_or_else(|| {
            let names: Vec<_> = spans.iter().map(|s| (&s.name, &s.span_kind)).collect();
            panic!("no {kind:?} span {name:?} among {names:?}")
        })
}

/// The in-memory exporter every traced test of this binary shares: a process has one
/// global subscriber, installed by whichever test asks first.
fn traced() -> &'static (InMemorySpanExporter, SdkTracerProvider) {
    static TRACING: OnceLock<(InMemorySpanExporter, SdkTracerProvider)> = OnceLock::new();
    TRACING.get_or_init(|| {
        let exporter = InMemorySpanExporter::default();
        let provider = SdkTracerProvider::builder()
            .with_simple_exporter(exporter.clone())
            .build();
        let subscriber =
            tracing_subscriber::registry().with(service_kit::telemetry::layer(&provider, "test"));
        tracing::subscriber::set_global_default(subscriber).expect("the only subscriber here");
        opentelemetry::global::set_text_map_propagator(
            opentelemetry_sdk::propagation::TraceContextPropagator::new(),
        );
        (exporter, provider)
    })
}

/// Both services run in this test process under one in-memory exporter; the trace must
/// still cross the hop through the `traceparent` header, as between two hosts.
#[tokio::test]
async fn a_trace_crosses_the_hop_and_spans_carry_the_budget() {
    let (exporter, provider) = traced();
    let app = spawn_app().await;
    let response = app.order("SKU-00001", 1, Some(700)).await;
    assert_eq!(response.status(), StatusCode::CREATED);
    provider.force_flush().unwrap();
    let spans = exporter.get_finished_spans().unwrap();

    // This test's request is the only one with a 700 ms budget.
    let orders = find(&spans, "POST /api/orders", SpanKind::Server, None);
    let trace = orders.span_context.trace_id();
    assert_ne!(trace, TraceId::INVALID);
    let client = find(&spans, "GET catalog", SpanKind::Client, Some(trace));
    // Found in the same trace: the catalog continued the trace from `traceparent`.
    let catalog = find(&spans, "GET /catalog/{sku}", SpanKind::Server, Some(trace));
    assert_eq!(catalog.parent_span_id, client.span_context.span_id());

    assert_eq!(
        attribute(orders, "deadline.budget_ms").as_deref(),
        Some("700")
    );
    let sent = attribute(client, "deadline.remaining_ms").unwrap();
    assert!(sent.parse::<u64>().unwrap() <= 700);
    for stage in ["catalog_pool", "catalog", "db_pool", "db"] {
        let span = spans
            .iter()
            .find(|s| s.name == stage && s.span_context.trace_id() == trace)
            .unwrap_or_else(|| panic!("no {stage} span in the trace"));
        assert_eq!(
            attribute(span, "deadline.budget_ms").as_deref(),
            Some("700"),
            "{stage}"
        );
        assert!(
            attribute(span, "deadline.remaining_ms").is_some(),
            "{stage}"
        );
    }
    // The catalog's budget is the one orders propagated: less than the client's 700 ms.
    let catalog_budget: u64 = attribute(catalog, "deadline.budget_ms")
        .unwrap()
        .parse()
        .unwrap();
    assert!(catalog_budget < 700 && catalog_budget > 0);
}

/// A scrape that asks for OpenMetrics (as Prometheus does) shows, on the request's
/// bucket, an exemplar with the trace id of that very request: the link from a slow
/// bucket to its trace. The outbound call's histogram carries the same trace.
#[tokio::test]
async fn a_traced_request_leaves_its_trace_id_as_an_exemplar() {
    let (exporter, provider) = traced();
    let app = spawn_app().await;
    // 650 ms: no other test of this binary uses that budget, so its span is this one.
    let response = app.order("SKU-00002", 1, Some(650)).await;
    assert_eq!(response.status(), StatusCode::CREATED);
    provider.force_flush().unwrap();
    let spans = exporter.get_finished_spans().unwrap();
    let span = spans
        .iter()
        .find(|s| {
            s.name == "POST /api/orders"
                && attribute(s, "deadline.budget_ms").as_deref() == Some("650")
        })
        .expect("the request's server span");
    let trace_id = span.span_context.trace_id().to_string();

    let scrape = app
        .client
        .get(format!("{}/metrics", app.base))
        .header("Accept", "application/openmetrics-text; version=1.0.0")
        .send()
        .await
        .unwrap();
    assert!(
        scrape.headers()["content-type"]
            .to_str()
            .unwrap()
            .starts_with("application/openmetrics-text")
    );
    let text = scrape.text().await.unwrap();
    let exemplar = format!(r#" # {{trace_id="{trace_id}"}} "#);
    for series in [
        r#"http_server_requests_seconds_bucket{le="#,
        r#"http_client_requests_seconds_bucket{le="#,
    ] {
        let line = text
            .lines()
            .find(|line| line.starts_with(series) && line.contains(&exemplar))
            .unwrap_or_else(|| panic!("no {series} line with {exemplar} in\n{text}"));
        // `bucket_count # {trace_id="..."} observed_seconds timestamp`
        let after = line.split_once(&exemplar).unwrap().1;
        let fields: Vec<f64> = after.split(' ').map(|f| f.parse().unwrap()).collect();
        assert!(
            fields.len() == 2 && fields[0] > 0.0 && fields[0] < 0.65,
            "{line}"
        );
    }
}

/// The configured limits, the process, its runtime and every tool's series are in a real scrape,
/// with the values the service was started with.
#[tokio::test]
async fn settings_process_and_tool_series_are_exported_from_start_up() {
    let app = spawn_app_with(|config| {
        config.deadline_max_ms = 1500;
        config.deadline_default_ms = 700;
        config.deadline_reserve_ms = 7;
        config.catalog_pool_max_connections = 9;
        config.catalog_pool_pending_max = 11;
        config.catalog_pool_acquire_timeout_ms = 33;
    })
    .await;
    let text = app.scrape(&app.base).await;
    let value = |name: &str, labels: &str| {
        metric_value(&text, name, labels).unwrap_or_else(|| panic!("no {name}{{{labels}}}"))
    };
    let policy = |kind| format!(r#"service="orders-service",kind="{kind}""#);
    assert_eq!(value("deadline_policy_seconds", &policy("max")), 1.5);
    assert_eq!(value("deadline_policy_seconds", &policy("default")), 0.7);
    assert_eq!(value("deadline_policy_seconds", &policy("reserve")), 0.007);
    let limit = |kind| format!(r#"client="catalog",kind="{kind}""#);
    assert_eq!(
        value("http_client_pool_limit", &limit("max_connections")),
        9.0
    );
    assert_eq!(value("http_client_pool_limit", &limit("pending_max")), 11.0);
    assert_eq!(
        value("http_client_pool_limit", &limit("acquire_timeout_seconds")),
        0.033
    );
    assert!(value("process_resident_memory_bytes", "") > 1_000_000.0);
    assert!(value("process_cpu_seconds_total", "") >= 0.0);
    // The runtime that serves the scrape (this test's), read at scrape time.
    assert!(value("tokio_workers", "") >= 1.0);
    assert!(value("tokio_worker_busy_seconds_total", "") >= 0.0);
    assert!(value("tokio_alive_tasks", "") >= 1.0);
    assert!(value("tokio_global_queue_depth", "") >= 0.0);
    // Before any assistant turn: every tool × outcome, at 0.
    for tool in ["catalog_lookup", "inventory_check"] {
        for outcome in ["ok", "error", "timeout", "refused", "cancelled"] {
            let labels = format!(r#"tool_name="{tool}",outcome="{outcome}""#);
            assert_eq!(value("tool_calls_total", &labels), 0.0, "{labels}");
        }
    }
    // Only the catalog injects faults: orders exports the family without a series.
    assert!(metric_value(&text, "catalog_fault_delay_seconds", "").is_none());
}

//! The budget across the hop to catalog-service, over real HTTP.

mod common;

use common::{MS, json_of, spawn_app, spawn_app_with, spawn_app_with_catalog};
use futures_util::future::join_all;
use orders_service::Mode;
use reqwest::StatusCode;
use test_support::metric_value;
use tokio::time::Instant;

#[tokio::test]
async fn every_catalog_call_receives_a_budget_below_the_clients_and_above_zero() {
    let app = spawn_app().await;
    for budget in [800, 300, 50, 2000, 60_000] {
        let response = app.order("SKU-00007", 1, Some(budget)).await;
        assert_eq!(response.status(), StatusCode::CREATED, "budget {budget}");
    }
    let seen = app.catalog_budgets.lock().unwrap().clone();
    assert_eq!(seen.len(), 5);
    // 60 000 is clamped to the 2000 ms maximum before it is propagated.
    for (sent, client) in seen.iter().zip([800, 300, 50, 2000, 2000]) {
        let sent = sent.expect("every call carries the header");
        assert!(
            sent > 0 && sent < client,
            "client {client} ms, catalog got {sent} ms"
        );
    }
}

#[tokio::test]
async fn order_times_out_at_its_budget_when_catalog_is_slow() {
    let app = spawn_app().await;
    app.slow_catalog(1000);
    let started = Instant::now();
    let response = app.order("SKU-00001", 1, Some(300)).await;
    let took = started.elapsed();
    assert_eq!(response.status(), StatusCode::GATEWAY_TIMEOUT);
    assert!(took < MS(400), "answered after {took:?}");
    let timing = response.headers()["server-timing"]
        .to_str()
        .unwrap()
        .to_owned();
    let problem = json_of(response).await;
    assert_eq!(problem["stage"], "catalog", "{problem}");
    assert_eq!(problem["budget_ms"], 300);
    assert!(timing.contains("catalog;dur="), "{timing}");
    assert_eq!(app.order_rows().await, 0, "no partial order");
}

#[tokio::test]
async fn legacy_mode_waits_for_the_slow_catalog_and_succeeds() {
    let app = spawn_app_with(|c| c.deadline_mode = Mode::Legacy).await;
    app.slow_catalog(1000);
    let started = Instant::now();
    let response = app.order("SKU-00001", 1, Some(300)).await;
    let took = started.elapsed();
    assert_eq!(response.status(), StatusCode::CREATED);
    assert!(took >= MS(1000) && took < MS(2000), "took {took:?}");
    assert_eq!(
        app.catalog_budgets.lock().unwrap()[0],
        None,
        "legacy sends no budget"
    );
}

/// Legacy's pool sits beside the envelope's: once the service leaves legacy, the
/// connections legacy opened close on their own (pg_stat_activity says), so the two
/// pools do not hold twice the connections for long.
#[tokio::test]
async fn the_connections_legacy_opened_close_soon_after_a_switch_out_of_legacy() {
    let app = spawn_app_with(|c| c.deadline_mode = Mode::Legacy).await;
    let before = app.service_backends().await;
    let orders =
        ["SKU-00001", "SKU-00002", "SKU-00003", "SKU-00004"].map(|sku| app.order(sku, 1, None));
    for response in join_all(orders).await {
        assert_eq!(response.status(), StatusCode::CREATED);
    }
    let legacy: Vec<i32> = app
        .service_backends()
        .await
        .difference(&before)
        .copied()
        .collect();
    assert!(!legacy.is_empty(), "legacy opened connections of its own");
    app.switch_mode("propagate").await;
    let deadline = Instant::now() + MS(30_000);
    loop {
        let open = app.service_backends().await;
        let left: Vec<_> = legacy.iter().filter(|pid| open.contains(pid)).collect();
        if left.is_empty() {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "legacy's sessions {left:?} still open"
        );
        tokio::time::sleep(MS(200)).await;
    }
}

/// Legacy is the service without the technique: it never reads a budget header, so
/// even a malformed one is no 400, and its answers say nothing of stages.
#[tokio::test]
async fn legacy_mode_reads_no_budget_header_even_a_malformed_one() {
    let app = spawn_app_with(|c| c.deadline_mode = Mode::Legacy).await;
    for (name, value) in [
        ("X-Request-Timeout-Ms", "not a number"),
        ("grpc-timeout", "1s"),
        ("x-envoy-expected-rq-timeout-ms", "-1"),
    ] {
        let response = app
            .client
            .post(format!("{}/api/orders", app.base))
            .header(name, value)
            .json(&serde_json::json!({"sku": "SKU-00002", "quantity": 1}))
            .send()
            .await
            .unwrap();
        assert_eq!(response.status(), StatusCode::CREATED, "{name}: {value}");
        assert!(
            !response.headers().contains_key("server-timing"),
            "legacy times no stages"
        );
    }
}

#[tokio::test]
async fn a_saturated_pool_refuses_the_extra_requests_early_and_keeps_its_queue_bounded() {
    let app = spawn_app_with(|c| {
        c.catalog_pool_max_connections = 4;
        c.catalog_pool_pending_max = 4;
        c.catalog_pool_acquire_timeout_ms = 40;
    })
    .await;
    app.slow_catalog(1000);

    let sampler = {
        let metrics = app.state.metrics.clone();
        tokio::spawn(async move {
            let mut worst = 0.0_f64;
            let until = Instant::now() + MS(1500);
            while Instant::now() < until {
                let gauge = metric_value(
                    &metrics.render(),
                    "http_client_pool_pending_acquires",
                    r#"client="catalog""#,
                )
                .unwrap_or(0.0);
                worst = worst.max(gauge);
                tokio::time::sleep(MS(2)).await;
            }
            worst
        })
    };

    let calls = (0..20).map(|i| {
        let app = &app;
        async move {
            let started = Instant::now();
            let response = app.order(&format!("SKU-{:05}", i + 1), 1, Some(1500)).await;
            (
                response.status(),
                started.elapsed(),
                json_of(response).await,
            )
        }
    });
    let results = join_all(calls).await;

    let created = results
        .iter()
        .filter(|(s, ..)| *s == StatusCode::CREATED)
        .count();
    let refused: Vec<_> = results
        .iter()
        .filter(|(s, ..)| *s == StatusCode::SERVICE_UNAVAILABLE)
        .collect();
    assert_eq!(created, 4, "four calls hold the four connections");
    assert_eq!(refused.len(), 16, "{results:?}");
    for (_, took, problem) in &refused {
        assert_eq!(problem["stage"], "catalog_pool");
        assert!(
            *took < MS(140),
            "a refusal took {took:?}, past 40 ms + 100 ms"
        );
    }
    let worst = sampler.await.unwrap();
    assert!(worst <= 4.0, "pending reached {worst}");
    assert!(
        worst >= 1.0,
        "the pending gauge never rose while the pool was saturated"
    );
    let text = app.metrics();
    let gauge = |name| metric_value(&text, name, r#"client="catalog""#);
    assert_eq!(gauge("http_client_pool_pending_acquires"), Some(0.0));
    assert_eq!(gauge("http_client_pool_active_connections"), Some(0.0));
    let rejected = |reason| {
        metric_value(
            &text,
            "http_client_pool_rejections_total",
            &format!(r#"client="catalog",reason="{reason}""#),
        )
        .unwrap()
    };
    assert_eq!(rejected("queue_full") + rejected("acquire_timeout"), 16.0);
}

#[tokio::test]
async fn a_catalog_error_is_a_502_well_inside_the_budget() {
    let app = spawn_app().await;
    app.faults.set(catalog_service::FaultConfig {
        error_rate: 1.0,
        ..Default::default()
    });
    let started = Instant::now();
    let response = app.order("SKU-00001", 1, Some(1000)).await;
    assert_eq!(response.status(), StatusCode::BAD_GATEWAY);
    assert!(started.elapsed() < MS(500));
    assert_eq!(json_of(response).await["stage"], "catalog");
}

#[tokio::test]
async fn an_unreachable_catalog_is_a_502_well_inside_the_budget() {
    let closed = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let url = format!("http://{}", closed.local_addr().unwrap());
    drop(closed);
    let app = spawn_app_with(|c| c.catalog_url = url).await;
    let started = Instant::now();
    let response = app.order("SKU-00001", 1, Some(1000)).await;
    assert_eq!(response.status(), StatusCode::BAD_GATEWAY);
    assert!(started.elapsed() < MS(500));
    // A refused connection sent nothing: it is retried once, and counted.
    let retries = metric_value(
        &app.metrics(),
        "http_client_retries_total",
        r#"client="catalog""#,
    );
    assert_eq!(retries, Some(1.0));
}

#[tokio::test]
async fn a_catalog_that_runs_out_of_budget_is_a_504_and_is_not_retried() {
    // The catalog's own maximum (100 ms) is far below what orders sends (about 895 ms),
    // so the 504 comes from the catalog side of the hop with most of the budget still
    // left: time enough for a retry, which must not happen (the deadline is shared).
    let app = spawn_app_with_catalog(
        test_support::test_database().await,
        |catalog| catalog.deadline_max_ms = 100,
        |_| {},
    )
    .await;
    app.slow_catalog(400);
    let started = Instant::now();
    let response = app.order("SKU-00001", 1, Some(900)).await;
    let took = started.elapsed();
    assert_eq!(response.status(), StatusCode::GATEWAY_TIMEOUT);
    assert_eq!(json_of(response).await["stage"], "catalog");
    assert!(
        took < MS(400),
        "answered when the catalog's 504 came, not at the 900 ms budget: {took:?}"
    );
    assert_eq!(
        app.catalog_budgets.lock().unwrap().len(),
        1,
        "one call, no retry"
    );
    let retries = metric_value(
        &app.metrics(),
        "http_client_retries_total",
        r#"client="catalog""#,
    );
    assert_eq!(retries, Some(0.0));
}

#[tokio::test]
async fn a_budget_no_larger_than_the_reserve_is_spent_and_sends_nothing() {
    // This hop keeps 500 ms for itself, so of a 300 ms budget nothing is left to hand on.
    let app = spawn_app_with(|c| c.deadline_reserve_ms = 500).await;
    let response = app.order("SKU-00001", 1, Some(300)).await;
    assert_eq!(response.status(), StatusCode::GATEWAY_TIMEOUT);
    assert_eq!(json_of(response).await["stage"], "catalog");
    assert_eq!(
        app.catalog_budgets.lock().unwrap().clone(),
        Vec::<Option<u64>>::new(),
        "the catalog received a call on a spent budget"
    );
    // With more than the reserve the same service does call the catalog.
    let response = app.order("SKU-00001", 1, Some(2000)).await;
    assert_eq!(response.status(), StatusCode::CREATED);
    assert_eq!(app.catalog_budgets.lock().unwrap().len(), 1);
}

#[tokio::test]
async fn grpc_and_envoy_budgets_reach_the_catalog_below_the_smallest_and_above_zero() {
    let app = spawn_app().await;
    let cases: [&[(&str, &str)]; 3] = [
        &[("grpc-timeout", "250m")],
        &[("x-envoy-expected-rq-timeout-ms", "250")],
        // Ours at 900 and Envoy's at 250: the proxy stops waiting first, so 250 wins.
        &[
            ("X-Request-Timeout-Ms", "900"),
            ("x-envoy-expected-rq-timeout-ms", "250"),
        ],
    ];
    for headers in cases {
        let mut request = app
            .client
            .post(format!("{}/api/orders", app.base))
            .json(&serde_json::json!({"sku": "SKU-00007", "quantity": 1}));
        for (name, value) in headers {
            request = request.header(*name, *value);
        }
        let response = request.send().await.expect("request sent");
        assert_eq!(response.status(), StatusCode::CREATED, "{headers:?}");
    }
    let seen = app.catalog_budgets.lock().unwrap().clone();
    assert_eq!(seen.len(), 3, "one catalog call per order: {seen:?}");
    for (sent, headers) in seen.iter().zip(cases) {
        let sent = sent.expect("every call carries the header");
        assert!(
            sent > 0 && sent < 250,
            "{headers:?}: the catalog got {sent} ms"
        );
    }
}

//! Admission over real HTTP: a real catalog-service that records every call it receives.

mod common;

use std::time::Duration;

use common::{MS, TestApp, json_of, spawn_app, spawn_app_with};
use deadline_propagation::testing::PROBE_INTERVAL;
use orders_service::Mode;
use reqwest::StatusCode;
use serde_json::{Value, json};
use test_support::{metric_value, wait_until};
use tokio::time::Instant;

const SKU: &str = "SKU-00042";
const BUDGET_MS: u64 = 700;
const PREDICTED_LATE: &str = r#"client="catalog",reason="predicted_late""#;

fn would_refuse(stage: &str, reason: &str) -> String {
    format!(r#"service="orders-service",stage="{stage}",reason="{reason}""#)
}

fn counter(app: &TestApp, name: &str, labels: &str) -> f64 {
    metric_value(&app.metrics(), name, labels).unwrap_or(0.0)
}

/// Catalog calls admission refused as predicted late.
fn predicted_late(app: &TestApp) -> f64 {
    counter(
        app,
        "http_client_admission_rejections_total",
        PREDICTED_LATE,
    )
}

/// The client's latency estimate, as `/metrics` shows it.
fn estimate(app: &TestApp) -> Duration {
    let seconds = metric_value(
        &app.metrics(),
        "http_client_latency_estimate_seconds",
        r#"client="catalog""#,
    )
    .expect("admission is on");
    Duration::from_secs_f64(seconds)
}

/// Sends `n` orders from `workers` concurrent clients; returns (status, elapsed, body).
async fn orders(app: &TestApp, n: usize, workers: usize) -> Vec<(StatusCode, Duration, Value)> {
    let per_worker = n / workers;
    let runs = (0..workers).map(|_| async {
        let mut answers = Vec::new();
        for _ in 0..per_worker {
            let started = Instant::now();
            let response = app.order(SKU, 1, Some(BUDGET_MS)).await;
            let status = response.status();
            let retry_after = response.headers().get("retry-after").cloned();
            let mut body = response.json::<Value>().await.unwrap_or(Value::Null);
            if let Some(value) = retry_after {
                body["retry_after_header"] = json!(value.to_str().unwrap());
            }
            answers.push((status, started.elapsed(), body));
        }
        answers
    });
    futures_util::future::join_all(runs)
        .await
        .into_iter()
        .flatten()
        .collect()
}

/// Drives orders through a catalog slower than the budget until admission has learned it.
/// The catalog's delay in these tests: far past every budget.
const SLOW_CATALOG_MS: u64 = 1000;

async fn learn_slow_catalog(app: &TestApp) {
    app.slow_catalog(SLOW_CATALOG_MS);
    wait_until(
        "admission learned the slow catalog",
        Duration::from_secs(10),
        || async {
            let _ = orders(app, 4, 4).await;
            estimate(app) > MS(BUDGET_MS)
        },
    )
    .await;
}

/// Sends 5 orders at once: all but the probe of the current interval (one call per
/// interval is sent anyway, to learn) are refused with 503. A lone sequential client
/// would get only probes: each of its late calls takes longer than the interval.
async fn refused_but_the_probe(app: &TestApp) {
    let answers = orders(app, 5, 5).await;
    let refused = answers
        .iter()
        .filter(|(s, ..)| *s == StatusCode::SERVICE_UNAVAILABLE)
        .count();
    assert!(refused >= 4, "{refused} of 5 refused: {answers:?}");
}

async fn put_mode(app: &TestApp, body: &str) -> reqwest::Response {
    app.client
        .put(format!("{}/admin/mode", app.admin))
        .header("content-type", "application/json")
        .body(body.to_owned())
        .send()
        .await
        .expect("admin request sent")
}

#[tokio::test]
async fn a_catalog_slower_than_every_budget_gets_few_calls_and_callers_a_fast_503() {
    let app = spawn_app().await;
    learn_slow_catalog(&app).await;

    let before = app.catalog_calls();
    let started = Instant::now();
    let answers = orders(&app, 400, 20).await;
    let reached = app.catalog_calls() - before;
    // Only probes go out: at most one per interval, and at most a tenth of the calls.
    let probes = started.elapsed().as_millis() / PROBE_INTERVAL.as_millis() + 2;
    assert!(
        reached as u128 <= probes,
        "the catalog received {reached} calls in {:?}",
        started.elapsed()
    );
    assert!(reached <= 40, "the catalog received {reached} of 400 calls");

    let refused: Vec<_> = answers
        .iter()
        .filter(|(status, ..)| *status == StatusCode::SERVICE_UNAVAILABLE)
        .collect();
    assert!(refused.len() >= 360, "{} of 400 refused", refused.len());
    for (_, _, body) in &refused {
        assert_eq!(body["stage"], "catalog", "{body}");
        assert!(
            body["retry_after_header"].is_string(),
            "Retry-After: {body}"
        );
    }
    let mut times: Vec<Duration> = refused.iter().map(|(_, took, _)| *took).collect();
    times.sort();
    // Refused without waiting: the median answer comes in a tenth of the time the
    // catalog would take (the rest is the margin for a loaded 2-core machine).
    let median = times[times.len() / 2];
    let fast = MS(SLOW_CATALOG_MS / 10);
    assert!(
        median < fast,
        "a refusal takes {median:?} (median), over {fast:?}"
    );
    assert!(predicted_late(&app) >= 360.0);
    assert!(
        metric_value(
            &app.metrics(),
            "http_client_latency_estimate_seconds",
            r#"client="catalog""#
        )
        .unwrap()
            > 0.7
    );

    // The latency goes away: probes notice, and orders succeed again within about 1 s.
    app.slow_catalog(0);
    let removed = Instant::now();
    wait_until(
        "an order succeeds again",
        Duration::from_secs(5),
        || async { app.order(SKU, 1, Some(BUDGET_MS)).await.status() == StatusCode::CREATED },
    )
    .await;
    let recovered = removed.elapsed();
    assert!(recovered < MS(1500), "served again after {recovered:?}");
}

#[tokio::test]
async fn a_healthy_catalog_is_never_refused() {
    let app = spawn_app().await;
    let answers = orders(&app, 300, 10).await;
    let created = answers
        .iter()
        .filter(|(s, ..)| *s == StatusCode::CREATED)
        .count();
    assert_eq!(created, 300);
    assert_eq!(predicted_late(&app), 0.0);
    assert!(estimate(&app) < MS(BUDGET_MS / 2), "{:?}", estimate(&app));
}

#[tokio::test]
async fn observe_refuses_nothing_and_counts_what_propagate_would_refuse() {
    let app = spawn_app_with(|c| c.deadline_mode = Mode::Observe).await;
    learn_slow_catalog(&app).await;

    let before = app.catalog_calls();
    let answers = orders(&app, 20, 4).await;
    assert_eq!(
        app.catalog_calls() - before,
        20,
        "every call reached the catalog"
    );
    assert!(
        answers
            .iter()
            .all(|(s, ..)| *s != StatusCode::SERVICE_UNAVAILABLE)
    );
    assert_eq!(predicted_late(&app), 0.0);
    let counted = counter(
        &app,
        "deadline_would_refuse_total",
        &would_refuse("catalog", "predicted_late"),
    );
    assert!(counted >= 20.0, "counted {counted}");

    // A header propagate would answer 400 for is served with the default budget.
    app.slow_catalog(0);
    let response = app
        .client
        .post(format!("{}/api/orders", app.base))
        .header("X-Request-Timeout-Ms", "soon")
        .json(&json!({"sku": SKU, "quantity": 1}))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), StatusCode::CREATED);
    let invalid = counter(
        &app,
        "deadline_would_refuse_total",
        &would_refuse("ingress", "invalid_header"),
    );
    assert_eq!(invalid, 1.0);
}

#[tokio::test]
async fn the_admin_api_switches_the_mode_live() {
    let app = spawn_app().await;
    let mode = |body: Value| body["mode"].as_str().unwrap().to_owned();
    let get = || async {
        let response = app
            .client
            .get(format!("{}/admin/mode", app.admin))
            .send()
            .await
            .unwrap();
        assert_eq!(response.status(), StatusCode::OK);
        mode(json_of(response).await)
    };
    assert_eq!(get().await, "propagate");
    learn_slow_catalog(&app).await;
    refused_but_the_probe(&app).await;

    // Observe: the same order is sent to the catalog, not refused here.
    assert_eq!(
        put_mode(&app, r#"{"mode":"observe"}"#).await.status(),
        StatusCode::OK
    );
    assert_eq!(get().await, "observe");
    let shown = |m: &str| {
        metric_value(
            &app.metrics(),
            "deadline_mode",
            &format!(r#"service="orders-service",mode="{m}""#),
        )
    };
    assert_eq!(
        (shown("observe"), shown("propagate")),
        (Some(1.0), Some(0.0))
    );
    let before = app.catalog_calls();
    assert_ne!(
        app.order(SKU, 1, Some(BUDGET_MS)).await.status(),
        StatusCode::SERVICE_UNAVAILABLE
    );
    assert_eq!(app.catalog_calls(), before + 1);

    // Legacy: no budget at all, so the slow catalog answers and the order is created.
    assert_eq!(
        put_mode(&app, r#"{"mode":"legacy"}"#).await.status(),
        StatusCode::OK
    );
    let response = app.order(SKU, 1, Some(BUDGET_MS)).await;
    assert_eq!(response.status(), StatusCode::CREATED);
    assert_eq!(app.catalog_budgets.lock().unwrap().last(), Some(&None));

    // Back to propagate: refused again, without a restart.
    assert_eq!(
        put_mode(&app, r#"{"mode":"propagate"}"#).await.status(),
        StatusCode::OK
    );
    refused_but_the_probe(&app).await;
}

#[tokio::test]
async fn the_admin_api_says_what_is_wrong_with_a_bad_body() {
    let app = spawn_app().await;
    let cases = [
        ("not json", StatusCode::BAD_REQUEST, ""),
        (
            r#"{"mode":"fast"}"#,
            StatusCode::UNPROCESSABLE_ENTITY,
            "fast",
        ),
        ("{}", StatusCode::UNPROCESSABLE_ENTITY, "mode"),
        (
            r#"{"mode":"observe","why":1}"#,
            StatusCode::UNPROCESSABLE_ENTITY,
            "why",
        ),
    ];
    for (body, status, named) in cases {
        let response = put_mode(&app, body).await;
        assert_eq!(response.status(), status, "{body}");
        assert_eq!(
            response.headers()["content-type"],
            "application/problem+json",
            "{body}"
        );
        let detail = json_of(response).await["detail"]
            .as_str()
            .unwrap()
            .to_owned();
        assert!(detail.contains(named), "{body}: {detail}");
    }
    let current = app
        .client
        .get(format!("{}/admin/mode", app.admin))
        .send()
        .await
        .unwrap();
    assert_eq!(
        json_of(current).await["mode"],
        "propagate",
        "a bad body changes nothing"
    );
}

/// A spent budget is a 504 at once, whichever header carried it: never admission's
/// 503, whose `Retry-After` would tell a caller with no time left to come back later.
/// Admission has an estimate here (an order went through), so before any budget check
/// it would refuse every call with less than that left.
#[tokio::test]
async fn a_spent_budget_is_a_504_whichever_header_carried_it() {
    let app = spawn_app().await;
    assert_eq!(
        app.order(SKU, 1, Some(BUDGET_MS)).await.status(),
        StatusCode::CREATED
    );
    assert!(estimate(&app) > Duration::ZERO);
    let spent = [
        ("x-request-timeout-ms", "0"),
        ("x-request-timeout-ms", "3"),
        ("grpc-timeout", "0m"),
        ("grpc-timeout", "2000u"),
        ("x-envoy-expected-rq-timeout-ms", "0"),
    ];
    let before = app.catalog_calls();
    // Several of each: the first refused call of an interval would be admission's probe.
    for (header, value) in spent.iter().cycle().take(3 * spent.len()) {
        let started = Instant::now();
        let response = app
            .client
            .post(format!("{}/api/orders", app.base))
            .header(*header, *value)
            .json(&json!({"sku": SKU, "quantity": 1}))
            .send()
            .await
            .unwrap();
        let took = started.elapsed();
        assert_eq!(
            response.status(),
            StatusCode::GATEWAY_TIMEOUT,
            "{header}: {value}"
        );
        assert!(response.headers().get("retry-after").is_none());
        let body = json_of(response).await;
        assert_eq!(body["stage"], "catalog", "{header}: {value}: {body}");
        assert!(
            took < Duration::from_secs(1),
            "{header}: {value} took {took:?}"
        );
    }
    assert_eq!(app.catalog_calls(), before, "nothing was sent");
    assert_eq!(predicted_late(&app), 0.0);
}

/// Open arrivals for `period`: `rate` orders a second, each with `budget_ms`. Returns
/// once every answer is in.
async fn arrivals(app: &TestApp, period: Duration, rate: u32, budget_ms: u64) {
    let mut ticks = tokio::time::interval(Duration::from_secs(1) / rate);
    let end = Instant::now() + period;
    let mut sent = Vec::new();
    while ticks.tick().await < end {
        let request = app
            .client
            .post(format!("{}/api/orders", app.base))
            .header("X-Request-Timeout-Ms", budget_ms)
            .json(&json!({"sku": SKU, "quantity": 1}));
        sent.push(tokio::spawn(request.send()));
    }
    for answer in sent {
        let _ = answer.await;
    }
}

/// Deep in a call chain, callers near the end of their budget are normal. Mixed in
/// with the usual ones, they must not keep admission open to a catalog that turned
/// slow. From a cold start, as production starts: the catalog was fast, and only the
/// calls cut at their deadlines can teach admission that it is not any more; a caller
/// with 25 ms, cut, says only that the catalog took more than 20 ms.
#[tokio::test]
async fn from_a_cold_start_callers_with_a_few_ms_left_do_not_keep_admission_open() {
    let app = spawn_app().await;
    // A fast catalog, with both kinds of callers: the history production has.
    let fast = Duration::from_secs(1);
    tokio::join!(
        arrivals(&app, fast, 60, BUDGET_MS),
        arrivals(&app, fast, 8, 25),
    );
    app.slow_catalog(SLOW_CATALOG_MS);
    let turned_slow = app.catalog_calls();
    let period = Duration::from_secs(8);
    // The first two seconds are the learning: calls sent before the first cut calls
    // come back. After them, only probes may go out.
    let learned = async {
        tokio::time::sleep(Duration::from_secs(2)).await;
        (app.catalog_calls(), Instant::now())
    };
    let ((), (), (after_learning, since)) = tokio::join!(
        arrivals(&app, period, 60, BUDGET_MS),
        arrivals(&app, period, 8, 25),
        learned,
    );
    let steady = (app.catalog_calls() - after_learning) as f64 / since.elapsed().as_secs_f64();
    let learning = after_learning - turned_slow;
    let probes_per_s = 1.0 / PROBE_INTERVAL.as_secs_f64();
    eprintln!(
        "the slow catalog received {learning} calls while admission learned, then \
         {steady:.1} calls/s ({probes_per_s} probes/s)"
    );
    assert!(
        steady <= 2.0 * probes_per_s,
        "the slow catalog received {steady:.1} calls/s; probes alone are {probes_per_s}/s"
    );
    // 68 arrivals a second: about a second and a half of them got through to learn.
    assert!(
        learning <= 150,
        "{learning} calls got through while learning"
    );
}

/// Legacy's calls wait for a catalog slot with no limit, and go on waiting after a
/// switch to propagate. They were promised no limit; the orders that follow must not
/// find propagate's queue full of them (503 `queue_full`), but wait their turn.
#[tokio::test]
async fn after_a_switch_from_legacy_its_waiters_do_not_fill_the_queue() {
    const DELAY_MS: u64 = 200;
    const LEGACY_ORDERS: usize = 4;
    let app = spawn_app_with(|c| {
        c.deadline_mode = Mode::Legacy;
        c.catalog_pool_max_connections = 1;
        c.catalog_pool_pending_max = 1;
        // Long enough to wait for every legacy call ahead, with room to spare.
        c.catalog_pool_acquire_timeout_ms = 10 * DELAY_MS * LEGACY_ORDERS as u64;
        c.deadline_max_ms = 20 * DELAY_MS * LEGACY_ORDERS as u64;
    })
    .await;
    app.slow_catalog(DELAY_MS);
    let pending = || {
        counter(
            &app,
            "http_client_pool_pending_acquires",
            r#"client="catalog""#,
        )
    };

    let legacy = futures_util::future::join_all(
        (0..LEGACY_ORDERS).map(|_| async { app.order(SKU, 1, None).await.status() }),
    );
    let switched = async {
        wait_until(
            "the legacy calls queue",
            Duration::from_secs(10),
            || async { pending() == (LEGACY_ORDERS - 1) as f64 },
        )
        .await;
        assert_eq!(
            put_mode(&app, r#"{"mode":"propagate"}"#).await.status(),
            StatusCode::OK
        );
        // Behind the legacy waiters, over a queue limit of 1.
        let budget = 20 * DELAY_MS * LEGACY_ORDERS as u64;
        let response = app.order(SKU, 1, Some(budget)).await;
        let status = response.status();
        (status, json_of(response).await)
    };
    let (legacy, (status, body)) = tokio::join!(legacy, switched);
    assert_eq!(status, StatusCode::CREATED, "{body}");
    assert!(
        legacy.iter().all(|s| *s == StatusCode::CREATED),
        "{legacy:?}"
    );
    assert_eq!(
        counter(
            &app,
            "http_client_pool_rejections_total",
            r#"client="catalog",reason="queue_full""#
        ),
        0.0
    );
}

/// This machine's address on its default route, if it has one: a client connecting
/// from it is not a loopback client. (Connecting a UDP socket sends nothing.)
fn non_loopback_address() -> Option<std::net::IpAddr> {
    let socket = std::net::UdpSocket::bind("0.0.0.0:0").ok()?;
    socket.connect("192.0.2.1:9").ok()?;
    let ip = socket.local_addr().ok()?.ip();
    (!ip.is_loopback() && !ip.is_unspecified()).then_some(ip)
}

/// Whoever reaches the admin API can switch the protection off, so it answers
/// loopback clients only: over real HTTP, a client connecting from this machine's
/// network address gets 403, until `ORDERS_ADMIN_ALLOW_REMOTE` lets it in.
#[tokio::test]
async fn the_admin_api_refuses_clients_that_are_not_on_loopback() {
    let Some(ip) = non_loopback_address() else {
        eprintln!("SKIPPED: this machine has no non-loopback address to connect from");
        return;
    };
    for allow_remote in [false, true] {
        let app = spawn_app_with(|c| {
            c.admin_addr = "0.0.0.0:0".parse().unwrap();
            c.admin_allow_remote = allow_remote;
        })
        .await;
        let port = app.admin.rsplit(':').next().unwrap();
        let remote = format!("http://{ip}:{port}/admin/mode");
        let get = app.client.get(&remote).send().await.unwrap();
        let put = put_mode_at(&app, &remote).await;
        let local = app.client.get(format!("{}/admin/mode", app.admin)).send();
        assert_eq!(local.await.unwrap().status(), StatusCode::OK);
        if allow_remote {
            assert_eq!(
                (get.status(), put.status()),
                (StatusCode::OK, StatusCode::OK)
            );
            continue;
        }
        for response in [get, put] {
            assert_eq!(response.status(), StatusCode::FORBIDDEN);
            assert_eq!(
                response.headers()["content-type"],
                "application/problem+json"
            );
            let body = json_of(response).await;
            assert!(
                body["detail"]
                    .as_str()
                    .unwrap()
                    .contains("ORDERS_ADMIN_ALLOW_REMOTE"),
                "{body}"
            );
        }
        assert_eq!(app.state.mode.get(), Mode::Propagate, "nothing changed");
    }
}

async fn put_mode_at(app: &TestApp, url: &str) -> reqwest::Response {
    app.client
        .put(url)
        .header("content-type", "application/json")
        .body(r#"{"mode":"legacy"}"#)
        .send()
        .await
        .expect("admin request sent")
}

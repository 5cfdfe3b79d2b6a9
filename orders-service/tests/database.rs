//! PostgreSQL under the deadline: server-side cancellation, clean connections, restarts.

mod common;

use common::{MS, json_of, own_cluster, sleep_on_server, spawn_app, spawn_app_on, spawn_app_with};
use deadline_propagation::testing::deadline_in;
use deadline_propagation::{Deadline, DeadlineMode, Stage};
use futures_util::future::join_all;
use reqwest::StatusCode;
use test_support::wait_until;
use tokio::time::Instant;

#[tokio::test]
async fn a_long_statement_is_cancelled_by_the_server_at_the_budget() {
    let app = spawn_app().await;
    let deadline = Deadline::after(MS(300));
    let started = Instant::now();
    let result = sleep_on_server(&app.state.db, &deadline).await;
    let took = started.elapsed();
    match result {
        Err(deadline_propagation::db::DbError::Deadline(exceeded)) => {
            assert_eq!(exceeded.stage, Stage::Db)
        }
        other => panic!("expected a deadline error, got {other:?}"),
    }
    assert!(took < MS(400), "took {took:?}");
    // A client-side timeout alone would leave pg_sleep running for 5 s.
    wait_until("no pg_sleep runs on the server", MS(200), || async {
        sqlx::query_scalar::<_, i64>(
            "SELECT count(*) FROM pg_stat_activity WHERE query LIKE 'SELECT pg_sleep%' AND state = 'active'",
        )
        .fetch_one(&app.side)
        .await
        .unwrap()
            == 0
    })
    .await;
}

#[tokio::test]
async fn orders_answer_503_while_postgres_is_down_and_recover_when_it_is_back() {
    let (cluster, database) = own_cluster().await;
    let app = spawn_app_on(database, |_| {}).await;
    assert_eq!(
        app.order("SKU-00001", 1, None).await.status(),
        StatusCode::CREATED
    );
    app.side.close().await;

    let cluster = std::sync::Arc::new(cluster);
    let c = cluster.clone();
    tokio::task::spawn_blocking(move || c.stop())
        .await
        .unwrap()
        .unwrap();
    let started = Instant::now();
    let response = app.order("SKU-00001", 1, Some(1000)).await;
    assert_eq!(response.status(), StatusCode::SERVICE_UNAVAILABLE);
    assert!(response.headers().contains_key("retry-after"));
    assert!(started.elapsed() < MS(1000));
    // Still ready: PostgreSQL's outage is every replica's, and shows where people look.
    assert_eq!(app.get("/readyz").await.status(), StatusCode::OK);
    let report = json_of(app.get("/health/dependencies").await).await;
    assert_eq!(report["status"], "degraded", "{report}");
    assert_ne!(report["database"], "ok", "{report}");

    let c = cluster.clone();
    tokio::task::spawn_blocking(move || c.resume())
        .await
        .unwrap()
        .unwrap();
    wait_until(
        "orders succeed again",
        std::time::Duration::from_secs(10),
        || async { app.order("SKU-00001", 1, None).await.status() == StatusCode::CREATED },
    )
    .await;
    let report = json_of(app.get("/health/dependencies").await).await;
    assert_eq!(report["database"], "ok", "{report}");
}

#[tokio::test]
async fn ten_identical_retries_at_once_make_one_order() {
    let app = spawn_app().await;
    let before = app.stock("SKU-00010").await;
    let body = serde_json::json!({"sku": "SKU-00010", "quantity": 2});
    let calls = (0..10).map(|_| app.post_order(body.clone(), Some(2000), Some("retry-me")));
    let responses = join_all(calls).await;
    let mut ids = Vec::new();
    for response in responses {
        assert_eq!(response.status(), StatusCode::CREATED);
        ids.push(json_of(response).await["id"].as_i64().unwrap());
    }
    ids.dedup();
    assert_eq!(ids.len(), 1, "every retry got the same order");
    assert_eq!(app.order_rows().await, 1);
    assert_eq!(app.stock("SKU-00010").await, before - 2);
}

#[tokio::test]
async fn a_body_that_panics_leaves_no_transaction_open() {
    let app = spawn_app().await;
    let deadline = Deadline::after(MS(2000));
    let result = app
        .state
        .db
        .transaction(&deadline, |conn| {
            Box::pin(async move {
                sqlx::query(
                    "UPDATE inventory SET available = available - 1 WHERE sku = 'SKU-00041'",
                )
                .execute(&mut *conn)
                .await?;
                panic!("a bug in the body, mid-transaction");
                #[allow(unreachable_code)]
                Ok(deadline_propagation::db::End::Commit(()))
            })
        })
        .await;
    assert!(result.is_err(), "{result:?}");
    // The connection must not go back to the pool inside the open transaction (holding
    // the row lock, handed to the next request): it is closed, and the server ends it.
    wait_until("no session is idle in transaction", MS(500), || async {
        app.backends_in_state("idle in transaction").await == 0
            && app.backends_in_state("idle in transaction (aborted)").await == 0
    })
    .await;
    assert_eq!(
        app.order("SKU-00041", 1, Some(1000)).await.status(),
        StatusCode::CREATED
    );
}

#[tokio::test]
async fn the_database_limits_follow_the_mode_in_force_not_the_one_at_start_up() {
    // Started in propagate (the default), switched to observe: observe now runs as code
    // without the technique, with no server-side limit left over from start-up.
    let app = spawn_app_with(|config| config.deadline_max_ms = 300).await;
    app.switch_mode("observe").await;
    let deadline = deadline_in(DeadlineMode::Observe, MS(300));
    let slept = app
        .state
        .db
        .read(&deadline, |conn| {
            Box::pin(async move {
                sqlx::query("SELECT pg_sleep(0.6)")
                    .execute(conn)
                    .await
                    .map(drop)
            })
        })
        .await;
    assert!(slept.is_ok(), "an observed statement was cut: {slept:?}");

    // And back to propagate: the limit comes from the request's budget again.
    let deadline = Deadline::after(MS(300));
    let started = Instant::now();
    let cut = sleep_on_server(&app.state.db, &deadline).await;
    assert!(
        matches!(cut, Err(deadline_propagation::db::DbError::Deadline(_))),
        "{cut:?}"
    );
    assert!(started.elapsed() < MS(1000), "took {:?}", started.elapsed());
}

#[tokio::test]
async fn the_limit_in_force_on_the_server_is_what_is_left_of_the_budget() {
    let app = spawn_app().await;
    let deadline = Deadline::after(MS(500));
    // Read back from the server, inside the transaction: the limit PostgreSQL applies,
    // not the one the service meant to set.
    let setting: String = app
        .state
        .db
        .read(&deadline, |conn| {
            Box::pin(sqlx::query_scalar("SHOW statement_timeout").fetch_one(conn))
        })
        .await
        .unwrap();
    let ms: u64 = setting
        .strip_suffix("ms")
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("statement_timeout is {setting:?}"));
    assert!((300..500).contains(&ms), "statement_timeout is {ms} ms");
}

/// The limit a transaction sends stays in force on its session for the next ones whose
/// budgets are alike (no statement per transaction), so what the server applies depends
/// on what came before on that session. Whatever came before (longer or shorter budgets,
/// commits and rollbacks), the limit in force, read from the server inside the
/// transaction, is never later than what that transaction had left, and at most a
/// sixteenth earlier. One connection, so every transaction meets the one before.
#[tokio::test]
async fn the_limit_in_force_is_never_later_than_what_is_left_whatever_ran_before_on_the_session() {
    use deadline_propagation::db::End;

    let app = spawn_app_with(|config| config.db_pool_max_connections = 1).await;
    let db = &app.state.db;
    // (budget ms, commit) in an order that leaves each kind of limit behind.
    let steps = [
        (2000, true),
        (300, true),
        (300, true),
        (2000, false),
        (300, true),
        (2000, true),
        (1900, true),
        (250, false),
        (2000, true),
    ];
    for (budget, commit) in steps {
        let started = Instant::now();
        let deadline = Deadline::after(MS(budget));
        let ms: String = db
            .transaction(&deadline, move |conn| {
                Box::pin(async move {
                    let ms = sqlx::query_scalar(
                        "SELECT setting FROM pg_settings WHERE name = 'statement_timeout'",
                    )
                    .fetch_one(conn)
                    .await?;
                    Ok(if commit {
                        End::Commit(ms)
                    } else {
                        End::Rollback(ms)
                    })
                })
            })
            .await
            .unwrap();
        let ms: u64 = ms.parse().unwrap();
        let took = started.elapsed().as_millis() as u64;
        // What was left at BEGIN lies between budget - took and budget, less the margin
        // the server is given (10 ms).
        let latest = budget - 10;
        let earliest = (budget - 10).saturating_sub(took);
        assert!(
            ms <= latest,
            "budget {budget} ms: the server's limit {ms} ms is later than what was left"
        );
        assert!(
            ms >= earliest - earliest / 16,
            "budget {budget} ms: the server's limit {ms} ms is far earlier than the {earliest} ms left"
        );
    }
}

/// A propagate transaction leaves its limit on its session; an observed transaction on
/// that session, after a switch at run time, must still run as code without the
/// technique: no server-side limit at all. One connection, so the observed transaction
/// meets it.
#[tokio::test]
async fn an_observed_transaction_does_not_run_under_a_limit_propagate_left_on_its_session() {
    let app = spawn_app_with(|config| config.db_pool_max_connections = 1).await;
    assert_eq!(
        app.order("SKU-00023", 1, Some(500)).await.status(),
        StatusCode::CREATED
    );
    app.switch_mode("observe").await;
    let deadline = deadline_in(DeadlineMode::Observe, MS(300));
    let read = app
        .state
        .db
        .read(&deadline, |conn| {
            Box::pin(async move {
                sqlx::query_scalar::<_, String>(
                    "SELECT setting FROM pg_settings, pg_sleep(0.6) WHERE name = 'statement_timeout'",
                )
                .fetch_one(conn)
                .await
            })
        })
        .await;
    match read {
        Ok(setting) => assert_eq!(setting, "0", "observe ran under a limit"),
        Err(err) => panic!("an observed statement was cut: {err:?}"),
    }
}

/// A transaction that ends while its caller waits runs inside the caller's future; its
/// answer must not wake that future's own task while the task is polling it. tokio
/// queues a task woken during its own poll again and may wake another worker to run it:
/// a futex and two context switches per order for nothing (the happy path's cost,
/// docs/performance.md).
#[tokio::test]
async fn a_transaction_that_ends_in_time_does_not_wake_its_own_task() {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
    use std::task::{Context, Wake, Waker};

    /// Forwards every wake to the task's waker, counting those that come while the
    /// transaction is being polled.
    struct Probe {
        task: std::sync::Mutex<Option<Waker>>,
        polling: AtomicBool,
        during_poll: AtomicUsize,
    }
    impl Wake for Probe {
        fn wake(self: Arc<Self>) {
            self.wake_by_ref();
        }
        fn wake_by_ref(self: &Arc<Self>) {
            if self.polling.load(Ordering::SeqCst) {
                self.during_poll.fetch_add(1, Ordering::SeqCst);
            }
            if let Some(task) = self.task.lock().unwrap().as_ref() {
                task.wake_by_ref();
            }
        }
    }

    let app = spawn_app().await;
    let deadline = deadline_in(DeadlineMode::Propagate, MS(2000));
    for _ in 0..3 {
        let probe = Arc::new(Probe {
            task: std::sync::Mutex::new(None),
            polling: AtomicBool::new(false),
            during_poll: AtomicUsize::new(0),
        });
        let waker = Waker::from(probe.clone());
        let mut transaction = std::pin::pin!(app.state.db.transaction(&deadline, |conn| {
            Box::pin(async move {
                sqlx::query("UPDATE inventory SET available = available WHERE sku = 'SKU-00007'")
                    .execute(&mut *conn)
                    .await?;
                Ok(deadline_propagation::db::End::Commit(()))
            })
        }));
        std::future::poll_fn(|cx| {
            *probe.task.lock().unwrap() = Some(cx.waker().clone());
            probe.polling.store(true, Ordering::SeqCst);
            let polled = transaction.as_mut().poll(&mut Context::from_waker(&waker));
            probe.polling.store(false, Ordering::SeqCst);
            polled
        })
        .await
        .unwrap();
        assert_eq!(
            probe.during_poll.load(Ordering::SeqCst),
            0,
            "the transaction woke the task that was polling it"
        );
    }
}

/// sqlx pings every connection on its way out of the pool unless told not to; the pool
/// pings only a connection that sat idle for more than a second (as pgx's does). Such a
/// connection whose session died meanwhile is found dead and replaced: the order goes
/// through.
#[tokio::test]
async fn a_connection_idle_for_over_a_second_is_checked_before_a_transaction_meets_it() {
    let app = spawn_app().await;
    assert_eq!(
        app.order("SKU-00021", 1, None).await.status(),
        StatusCode::CREATED
    );
    terminate_service_sessions(&app).await;
    // The policy is about time spent idle: this wait is the condition, not a guess.
    tokio::time::sleep(MS(1100)).await;
    assert_eq!(
        app.order("SKU-00021", 1, None).await.status(),
        StatusCode::CREATED
    );
}

/// The price of not pinging a connection used a moment ago: when its session died in
/// that moment, the transaction meets the dead connection. The answer is then a 503
/// that wrote nothing (the client may retry), never a 500, and the connection is
/// replaced: each pooled connection costs at most one such 503, and then orders go
/// through on new connections.
#[tokio::test]
async fn a_connection_that_died_a_moment_ago_costs_at_most_a_503_that_wrote_nothing() {
    let app = spawn_app().await;
    assert_eq!(
        app.order("SKU-00022", 1, None).await.status(),
        StatusCode::CREATED
    );
    let (rows, stock) = (app.order_rows().await, app.stock("SKU-00022").await);
    let pooled = app.service_backends().await.len();
    terminate_service_sessions(&app).await;
    let mut refused = 0;
    loop {
        let response = app.order("SKU-00022", 1, None).await;
        match response.status() {
            StatusCode::CREATED => break,
            StatusCode::SERVICE_UNAVAILABLE => {
                assert!(response.headers().contains_key("retry-after"));
                assert_eq!(app.order_rows().await, rows, "a 503 wrote an order");
                assert_eq!(app.stock("SKU-00022").await, stock, "a 503 took stock");
                refused += 1;
                assert!(
                    refused <= pooled,
                    "{refused} 503s for {pooled} dead connections"
                );
            }
            other => panic!("expected 201 or 503, got {other}"),
        }
    }
    assert_eq!(
        app.order("SKU-00022", 1, None).await.status(),
        StatusCode::CREATED
    );
}

/// Ends every session of the service's pool on the server, and waits until they are gone.
async fn terminate_service_sessions(app: &common::TestApp) {
    macro_rules! service_sessions {
        () => {
            "FROM pg_stat_activity WHERE backend_type = 'client backend' \
             AND pid <> pg_backend_pid() AND datname = current_database() \
             AND application_name NOT IN ('test-side', 'deadline-side')"
        };
    }
    let ended: Vec<bool> = sqlx::query_scalar(concat!(
        "SELECT pg_terminate_backend(pid) ",
        service_sessions!()
    ))
    .fetch_all(&app.side)
    .await
    .unwrap();
    assert!(!ended.is_empty(), "the service had no session to end");
    wait_until("the service's sessions are gone", MS(2000), || async {
        let left: i64 = sqlx::query_scalar(concat!("SELECT count(*) ", service_sessions!()))
            .fetch_one(&app.side)
            .await
            .unwrap();
        left == 0
    })
    .await;
}

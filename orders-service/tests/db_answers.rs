//! What the database edge answers when PostgreSQL ends a transaction for a reason other
//! than the budget: a deadlock (40P01), a serialization failure (40001), a lock the
//! statement was told not to wait for (55P03); and a budget larger than the
//! `statement_timeout` PostgreSQL takes. Each is provoked on a real server, and the
//! answer is checked beside the table: a 503 must have written nothing.

mod common;

use std::time::Duration;

use axum::response::IntoResponse as _;
use common::{MS, TestApp, spawn_app, spawn_app_with, take_one};
use deadline_propagation::db::End;
use deadline_propagation::{Deadline, DeadlineMode, Problem, Stage};
use futures_util::future::BoxFuture;
use orders_service::budget::Budget;
use reqwest::StatusCode;
use sqlx::{Connection as _, PgConnection};
use test_support::wait_until;

/// A 503 that says nothing was written and when to retry, naming the database, and
/// not a 504 that blames the budget.
fn assert_retry_later(problem: Problem, words: &str) {
    assert_eq!(problem.stage(), Some(Stage::Db), "{problem:?}");
    assert!(
        problem.detail().contains(words),
        "the answer does not say what happened ({words}): {problem:?}"
    );
    assert!(
        problem.detail().contains("nothing was written"),
        "{problem:?}"
    );
    let response = problem.into_response();
    assert_eq!(response.status(), StatusCode::SERVICE_UNAVAILABLE);
    assert!(response.headers().contains_key("retry-after"));
}

/// Gives a closure the higher-ranked signature of a transaction's body, so that one
/// body can run twice (it is `Copy`).
fn statements<F>(body: F) -> F
where
    F: for<'c> FnOnce(&'c mut PgConnection) -> BoxFuture<'c, Result<End<()>, sqlx::Error>>,
{
    body
}

/// Runs `body` through the handlers' way to the database, in propagate mode.
async fn order_transaction<B>(app: &TestApp, budget_ms: u64, body: B) -> Result<(), Problem>
where
    B: deadline_propagation::db::Statements<()>,
{
    let budget = Budget::Deadline(Deadline::after(MS(budget_ms)));
    app.state.store().transaction(&budget, body).await
}

#[tokio::test]
async fn a_deadlock_is_a_503_to_retry_and_writes_nothing() {
    let app = spawn_app().await;
    let (mine, theirs) = ("SKU-00031", "SKU-00032");
    let (stock_mine, stock_theirs) = (app.stock(mine).await, app.stock(theirs).await);
    // The other transaction locks `theirs`; it never runs the deadlock check itself
    // (its timer is a minute), so the service's transaction is the one PostgreSQL ends.
    let mut other = app.side_connection().await;
    sqlx::raw_sql("SET deadlock_timeout = '60s'")
        .execute(&mut other)
        .await
        .unwrap();
    let mut other_tx = other.begin().await.unwrap();
    sqlx::query("UPDATE inventory SET available = available - 1 WHERE sku = $1")
        .bind(theirs)
        .execute(&mut *other_tx)
        .await
        .unwrap();

    let state = app.state.clone();
    let service = tokio::spawn(async move {
        let budget = Budget::Deadline(Deadline::after(MS(10_000)));
        state
            .store()
            .transaction(&budget, move |conn| {
                Box::pin(async move {
                    for sku in [mine, theirs] {
                        sqlx::query(
                            "UPDATE inventory SET available = available - 1 WHERE sku = $1",
                        )
                        .bind(sku)
                        .execute(&mut *conn)
                        .await?;
                    }
                    Ok(End::Commit(()))
                })
            })
            .await
    });
    wait_until("the service waits on the other's row", MS(5000), || async {
        app.service_lock_waiters().await == 1
    })
    .await;
    // Now the other waits on the service's row: a cycle, which PostgreSQL breaks by
    // ending the service's transaction, and the other's update goes through.
    sqlx::query("UPDATE inventory SET available = available - 1 WHERE sku = $1")
        .bind(mine)
        .execute(&mut *other_tx)
        .await
        .expect("the other transaction survives the deadlock");
    other_tx.rollback().await.unwrap();

    let problem = service
        .await
        .unwrap()
        .expect_err("a deadlock cannot commit");
    assert_retry_later(problem, "deadlock");
    assert_eq!(app.stock(mine).await, stock_mine, "a 503 took stock");
    assert_eq!(app.stock(theirs).await, stock_theirs, "a 503 took stock");
}

#[tokio::test]
async fn a_serialization_failure_is_a_503_to_retry_and_writes_nothing() {
    let app = spawn_app().await;
    let sku = "SKU-00033";
    let before = app.stock(sku).await;
    let rows = app.order_rows().await;
    let side = app.side.clone();
    let answer = order_transaction(&app, 5000, move |conn| {
        Box::pin(async move {
            sqlx::raw_sql("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ")
                .execute(&mut *conn)
                .await?;
            // The snapshot is taken here ...
            sqlx::query("SELECT available FROM inventory WHERE sku = $1")
                .bind(sku)
                .execute(&mut *conn)
                .await?;
            // ... another transaction changes the row and commits ...
            sqlx::query("UPDATE inventory SET available = available - 1 WHERE sku = $1")
                .bind(sku)
                .execute(&side)
                .await?;
            // ... and this one cannot update what its snapshot no longer shows.
            sqlx::query("UPDATE inventory SET available = available - 5 WHERE sku = $1")
                .bind(sku)
                .execute(&mut *conn)
                .await?;
            sqlx::query(
                "INSERT INTO orders (sku, quantity, unit_price_cents, total_cents) \
                 VALUES ($1, 5, 100, 500)",
            )
            .bind(sku)
            .execute(&mut *conn)
            .await?;
            Ok(End::Commit(()))
        })
    })
    .await;
    assert_retry_later(answer.expect_err("40001 cannot commit"), "conflicted");
    assert_eq!(app.stock(sku).await, before - 1, "only the other's update");
    assert_eq!(app.order_rows().await, rows, "a 503 wrote an order");
}

/// A trigger run at COMMIT that fails as SERIALIZABLE fails there (most of its conflicts
/// are found only at COMMIT): PostgreSQL's own words, deterministically.
const CONFLICT_AT_COMMIT: &str = "
    CREATE FUNCTION conflict_at_commit() RETURNS trigger LANGUAGE plpgsql AS $$
    BEGIN
        RAISE EXCEPTION 'could not serialize access' USING ERRCODE = '40001';
    END $$;
    CREATE CONSTRAINT TRIGGER conflict_at_commit AFTER UPDATE ON inventory
        DEFERRABLE INITIALLY DEFERRED FOR EACH ROW EXECUTE FUNCTION conflict_at_commit();
";

/// A COMMIT that PostgreSQL refuses with 40001 wrote nothing: a 503 to retry in
/// propagate and in observe alike (observe once answered it as a 500).
#[tokio::test]
async fn a_serialization_failure_at_commit_is_a_503_in_propagate_and_observe() {
    let app = spawn_app().await;
    sqlx::raw_sql(CONFLICT_AT_COMMIT)
        .execute(&app.side)
        .await
        .unwrap();
    let sku = "SKU-00037";
    let before = app.stock(sku).await;
    for mode in [DeadlineMode::Propagate, DeadlineMode::Observe] {
        let deadline = Deadline::after(MS(5000)).with_mode(mode);
        let answer = take_one(&app, &deadline, sku).await;
        let problem = Problem::from(answer.expect_err("40001 at COMMIT cannot commit"));
        assert_retry_later(problem, "conflicted");
        assert_eq!(app.stock(sku).await, before, "{mode:?}: a 503 took stock");
    }
}

/// `NOWAIT`, or a `lock_timeout` the body set itself (the crate sets none: its
/// `statement_timeout` bounds lock waits), end a statement with 55P03 long before the
/// budget: that is a row someone else holds, not a deadline, in both paths.
#[tokio::test]
async fn a_lock_not_waited_for_is_a_503_not_a_deadline_in_propagate_and_legacy() {
    let app = spawn_app().await;
    let (locked, written) = ("SKU-00034", "SKU-00035");
    let mut holder = app.side_connection().await;
    let mut holding = holder.begin().await.unwrap();
    sqlx::query("SELECT 1 FROM inventory WHERE sku = $1 FOR UPDATE")
        .bind(locked)
        .execute(&mut *holding)
        .await
        .unwrap();
    let before = app.stock(written).await;

    let not_waiting = [
        "SELECT 1 FROM inventory WHERE sku = $1 FOR UPDATE NOWAIT",
        "SET LOCAL lock_timeout = 20; UPDATE inventory SET available = 0 WHERE sku = $1",
    ];
    for statement in not_waiting {
        let body = statements(move |conn| {
            Box::pin(async move {
                sqlx::query("UPDATE inventory SET available = available - 1 WHERE sku = $1")
                    .bind(written)
                    .execute(&mut *conn)
                    .await?;
                let (setting, locking) = match statement.split_once("; ") {
                    Some((setting, locking)) => (Some(setting), locking),
                    None => (None, statement),
                };
                if let Some(setting) = setting {
                    sqlx::raw_sql(setting).execute(&mut *conn).await?;
                }
                sqlx::query(locking)
                    .bind(locked)
                    .execute(&mut *conn)
                    .await?;
                Ok(End::Commit(()))
            })
        });
        let propagate = order_transaction(&app, 5000, body).await;
        assert_retry_later(propagate.expect_err(statement), "locked");
        let legacy = app.state.plain_db.transaction(body).await;
        assert_retry_later(legacy.expect_err(statement), "locked");
        assert_eq!(
            app.stock(written).await,
            before,
            "{statement}: a 503 took stock"
        );
    }
    holding.rollback().await.unwrap();
}

/// PostgreSQL takes a `statement_timeout` of at most `INT_MAX` ms (about 24.8 days): a
/// budget beyond it, from a policy's maximum or `Duration::MAX`, still runs, under the
/// largest limit the server takes.
#[tokio::test]
async fn a_budget_beyond_what_postgres_takes_still_commits() {
    const THIRTY_DAYS_MS: u64 = 30 * 24 * 3600 * 1000;
    let app = spawn_app_with(|config| config.deadline_max_ms = THIRTY_DAYS_MS).await;
    let sku = "SKU-00036";
    let before = app.stock(sku).await;

    for budget in [Duration::MAX, MS(THIRTY_DAYS_MS)] {
        let limit: String = app
            .state
            .db
            .transaction(&Deadline::after(budget), move |conn| {
                Box::pin(async move {
                    sqlx::query("UPDATE inventory SET available = available - 1 WHERE sku = $1")
                        .bind(sku)
                        .execute(&mut *conn)
                        .await?;
                    let limit = sqlx::query_scalar(
                        "SELECT setting FROM pg_settings WHERE name = 'statement_timeout'",
                    )
                    .fetch_one(&mut *conn)
                    .await?;
                    Ok(End::Commit(limit))
                })
            })
            .await
            .unwrap_or_else(|err| panic!("a budget of {budget:?}: {err:?}"));
        let limit: i64 = limit.parse().unwrap();
        assert!(limit > 20 * 24 * 3600 * 1000, "limit {limit} ms");
    }
    assert_eq!(app.stock(sku).await, before - 2);

    // And through the front door: a client granted thirty days places its order.
    let response = app.order(sku, 1, Some(THIRTY_DAYS_MS)).await;
    assert_eq!(response.status(), StatusCode::CREATED);
    assert_eq!(app.stock(sku).await, before - 3);
}

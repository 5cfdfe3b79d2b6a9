//! The queue's promises against a real PostgreSQL, read from its tables: an expired job
//! never starts, a caller's 504 and the job's effect are never both true, a 2xx always
//! has its effect, a worker killed mid-job leaves each effect at most once and none
//! after its deadline, and a worker whose clock is off changes none of it.

mod common;

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use common::{Stack, orders_service, worker_config, worker_in_process, worker_process};
use deadline_propagation::Deadline;
use deadline_propagation::db::{Db, DbConfig};
use deadline_propagation::queue::{JobState, Queue, QueueConfig};
use rand::Rng as _;
use reqwest::StatusCode;
use tokio::time::Instant;

/// Deferred work of up to 80 ms in every COMMIT that books a shipment.
const SLOW_COMMIT: &str = "
CREATE FUNCTION slow_commit() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN PERFORM pg_sleep(random() * 0.08); RETURN NULL; END $$;
CREATE CONSTRAINT TRIGGER slow_commit AFTER INSERT ON shipments
    DEFERRABLE INITIALLY DEFERRED FOR EACH ROW EXECUTE FUNCTION slow_commit();";

/// The test's own producer: the crate's database envelope with a wait for a connection
/// long enough for a cold cluster's first connections on a loaded machine (the
/// default, 250 ms, is a service's answer to its callers; the producer here has none).
fn producer_db(url: &str) -> Db {
    let mut config = DbConfig::default();
    config.acquire_timeout = Duration::from_secs(5);
    Db::connect_lazy(url, config).unwrap()
}

/// Every answer to a waiting caller against the table: 201 has exactly its shipment,
/// 504 and 503 (a pool that could not serve in time, cold or full) none; 500 (outcome
/// unknown) promises nothing. Returns how many of each.
async fn check_answers(stack: &Stack, answers: &[(i64, StatusCode)]) -> HashMap<u16, usize> {
    let booked: HashMap<i64, i64> = sqlx::query_as::<_, (i64, i64)>(
        "SELECT order_id, count(*) FROM shipments GROUP BY order_id",
    )
    .fetch_all(&stack.db)
    .await
    .unwrap()
    .into_iter()
    .collect();
    let mut seen = HashMap::new();
    for &(order, status) in answers {
        let effects = booked.get(&order).copied().unwrap_or(0);
        match status.as_u16() {
            201 => assert_eq!(effects, 1, "order {order}: 201 with {effects} shipments"),
            504 => assert_eq!(
                effects, 0,
                "order {order}: 504, yet its shipment was booked"
            ),
            503 => assert_eq!(
                effects, 0,
                "order {order}: 503, yet its shipment was booked"
            ),
            500 => assert!(effects <= 1, "order {order}: {effects} shipments"),
            other => panic!("order {order}: unexpected {other}"),
        }
        *seen.entry(status.as_u16()).or_insert(0) += 1;
    }
    seen
}

/// One waiting request per order, `concurrency` at a time, each with `budget_ms`.
async fn ship_all(
    stack: &Arc<Stack>,
    orders: Vec<i64>,
    budget_ms: u64,
    concurrency: usize,
) -> Vec<(i64, StatusCode)> {
    let orders = Arc::new(std::sync::Mutex::new(orders));
    let mut callers = Vec::new();
    for _ in 0..concurrency {
        let (stack, orders) = (stack.clone(), orders.clone());
        callers.push(tokio::spawn(async move {
            let mut answers = Vec::new();
            loop {
                let Some(order) = orders.lock().unwrap().pop() else {
                    return answers;
                };
                let (status, _) = stack.ship(order, budget_ms, false).await;
                answers.push((order, status));
            }
        }));
    }
    let mut answers = Vec::new();
    for caller in callers {
        answers.extend(caller.await.unwrap());
    }
    answers
}

/// 1,000 waiting callers whose job's work ends near their deadline (jittered across
/// it), so the caller's expire and the worker's fence meet: never a 504 with the
/// effect, never a 201 without it, and no attempt started without the minimum useful
/// time left.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_504_and_the_effect_are_never_both_true_over_1000_races() {
    let stack = Arc::new(orders_service(60).await);
    let orders = stack.seed_orders(1000).await;
    // A COMMIT that takes up to 80 ms more (deferred work, as a slow disk would): the
    // fence holds the job's row through it, so a caller's expire that comes meanwhile
    // waits on the row and sees the outcome.
    sqlx::raw_sql(SLOW_COMMIT).execute(&stack.db).await.unwrap();
    // A 400 ms budget leaves the job about 335 ms; the booking takes 220 to 370 ms.
    let worker = worker_in_process(worker_config(&stack.url, 8, 220, 150)).await;
    let answers = ship_all(&stack, orders, 400, 8).await;
    stack.settle(Duration::from_secs(30)).await;
    let seen = check_answers(&stack, &answers).await;
    let tally = stack.check_the_table().await;
    println!("answers {seen:?}; jobs {tally:?}");
    // Both sides of the race were met often, or the test proved nothing.
    let (created, expired) = (
        seen.get(&201).copied().unwrap_or(0),
        seen.get(&504).copied().unwrap_or(0),
    );
    assert!(
        created >= 100 && expired >= 100,
        "too one-sided to be races: {seen:?}"
    );
    assert!(
        tally.expired_started >= 100,
        "few expiries met a running job: {tally:?}"
    );
    let near = stack.attempts_ending_near_their_deadline(50).await;
    println!("attempts ending within 50 ms of their job's deadline: {near}");
    assert!(near >= 200, "too few attempts met their deadline: {near}");
    worker.shutdown().await;
}

/// 1,000 callers that expire their job at a jittered moment while a worker books it,
/// with its deadline far ahead: the expire comes before the claim, during the work, on
/// the fence's row lock (a COMMIT slowed by deferred work) or after the commit. The
/// expire that succeeds means no shipment; the one that finds the job done means its
/// shipment.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_callers_expire_and_a_workers_fence_never_both_win_over_1000_races() {
    let stack = Arc::new(orders_service(60).await);
    let orders = stack.seed_orders(1000).await;
    sqlx::raw_sql(SLOW_COMMIT).execute(&stack.db).await.unwrap();
    let worker = worker_in_process(worker_config(&stack.url, 8, 10, 60)).await;
    let db = producer_db(&stack.url);
    let queue = Queue::new(db, "shipments", QueueConfig::default());
    let mut callers = tokio::task::JoinSet::new();
    let orders = Arc::new(std::sync::Mutex::new(orders));
    for _ in 0..8 {
        let (queue, orders) = (queue.clone(), orders.clone());
        callers.spawn(async move {
            let mut outcomes = Vec::new();
            loop {
                let next = orders.lock().unwrap().pop();
                let Some(order) = next else { break };
                let deadline = Deadline::after(Duration::from_secs(5));
                let by = Instant::now() + Duration::from_secs(3);
                let payload = serde_json::json!({ "order_id": order });
                let job = queue.enqueue(&deadline, &payload, Some(by)).await.unwrap();
                // A quarter expire at once, so that the expire before the claim is
                // met often (a worker claims within a few ms); the rest at a moment
                // spread over the work and the fence.
                if !rand::rng().random_bool(0.25) {
                    let jitter = rand::rng().random_range(0..160);
                    tokio::time::sleep(Duration::from_millis(jitter)).await;
                }
                let status = queue.expire(&deadline, job).await.unwrap();
                outcomes.push((job, status.state));
            }
            outcomes
        });
    }
    let outcomes: Vec<(i64, JobState)> = callers.join_all().await.into_iter().flatten().collect();
    stack.settle(Duration::from_secs(30)).await;
    let booked: HashMap<i64, i64> =
        sqlx::query_as::<_, (i64, i64)>("SELECT job_id, count(*) FROM shipments GROUP BY job_id")
            .fetch_all(&stack.db)
            .await
            .unwrap()
            .into_iter()
            .collect();
    let mut seen: HashMap<&str, usize> = HashMap::new();
    for (job, state) in &outcomes {
        let effects = booked.get(job).copied().unwrap_or(0);
        match state {
            JobState::Expired => assert_eq!(effects, 0, "job {job}: expired, yet booked"),
            JobState::Done => assert_eq!(effects, 1, "job {job}: done with {effects} shipments"),
            other => panic!("job {job}: the expire left it {other:?}"),
        }
        *seen.entry(state.as_str()).or_insert(0) += 1;
    }
    let tally = stack.check_the_table().await;
    println!("expires {seen:?}; jobs {tally:?}");
    assert_eq!(outcomes.len(), 1000);
    // Each place the expire can land was met: before the claim, during the work (the
    // fence then found the job expired), and after the fence.
    assert!(tally.expired_unstarted >= 10, "{tally:?}");
    assert!(tally.fenced_attempts >= 50, "{tally:?}");
    assert!(tally.done >= 50, "{tally:?}");
    worker.shutdown().await;
}

/// Jobs with less than the minimum useful time left when a worker comes are never
/// started: expired on the queue, no attempt in the table.
#[tokio::test]
async fn a_job_with_less_than_the_minimum_useful_time_left_never_starts() {
    let stack = orders_service(60).await;
    let orders = stack.seed_orders(20).await;
    let db = producer_db(&stack.url);
    let queue = Queue::new(db, "shipments", QueueConfig::default());
    let deadline = Deadline::after(Duration::from_secs(5));
    let by = Instant::now() + Duration::from_millis(180);
    for order in orders {
        let payload = serde_json::json!({ "order_id": order });
        queue.enqueue(&deadline, &payload, Some(by)).await.unwrap();
    }
    // The worker comes when less than 100 ms is left.
    tokio::time::sleep_until(by - Duration::from_millis(90)).await;
    let worker = worker_in_process(worker_config(&stack.url, 4, 0, 0)).await;
    stack.settle(Duration::from_secs(10)).await;
    let tally = stack.check_the_table().await;
    assert_eq!((tally.expired_unstarted, tally.done), (20, 0), "{tally:?}");
    worker.shutdown().await;
}

/// A worker process killed with SIGKILL 50 times while jobs run (waiting and async
/// callers both): every job's effect at most once, none after its deadline, done
/// exactly when its effect exists, no start without the minimum useful time left.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_worker_killed_mid_job_50_times_leaves_each_effect_at_most_once() {
    let stack = Arc::new(orders_service(60).await);
    let orders = stack.seed_orders(3000).await;
    let config = worker_config(&stack.url, 4, 150, 100);
    let stop = Arc::new(AtomicBool::new(false));
    let load = tokio::spawn(load(stack.clone(), orders, stop.clone()));
    let mut rng = rand::rng();
    for _ in 0..50 {
        let mut worker = worker_process(&config, 400, None);
        tokio::time::sleep(Duration::from_millis(rng.random_range(150..450))).await;
        worker.kill();
    }
    let survivor = worker_process(&config, 400, None);
    stop.store(true, Ordering::Relaxed);
    let answers = load.await.unwrap();
    stack.settle(Duration::from_secs(30)).await;
    let seen = check_answers(&stack, &answers).await;
    let tally = stack.check_the_table().await;
    println!("answers {seen:?}; jobs {tally:?}");
    assert!(
        tally.unended_attempts >= 25,
        "few kills hit a job mid-way: {tally:?}"
    );
    assert!(tally.done > 0, "nothing was ever booked: {tally:?}");
    drop(survivor);
}

/// The worker's clock 5 s ahead, then 5 s behind (Debian's `faketime`): the deadline is
/// on the database's clock, so the same promises hold.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_worker_clock_5_s_off_changes_no_promise() {
    for offset in ["+5s", "-5s"] {
        assert_faketime_shifts(offset);
        let stack = Arc::new(orders_service(60).await);
        let orders = stack.seed_orders(200).await;
        let worker = worker_process(
            &worker_config(&stack.url, 8, 250, 150),
            30_000,
            Some(offset),
        );
        let answers = ship_all(&stack, orders, 400, 8).await;
        stack.settle(Duration::from_secs(30)).await;
        let seen = check_answers(&stack, &answers).await;
        let tally = stack.check_the_table().await;
        println!("clock {offset}: answers {seen:?}; jobs {tally:?}");
        assert!(
            tally.done >= 20,
            "clock {offset}: too few booked: {tally:?}"
        );
        drop(worker);
    }
}

/// `Prefer: respond-async`: 202 and `Location` at once; the job's state there is the
/// table's; a job whose deadline passes before any worker comes is expired and never
/// starts, even once a worker comes. A budget too short for any worker to start the
/// job is refused (504) before anything is queued.
#[tokio::test]
async fn respond_async_answers_202_and_an_expired_job_never_starts() {
    let stack = orders_service(60).await;
    let orders = stack.seed_orders(3).await;

    let (status, location) = stack.ship(orders[0], 300, true).await;
    assert_eq!(status, StatusCode::ACCEPTED);
    let location = location.expect("a Location");
    let state = |body: serde_json::Value| body["state"].as_str().unwrap().to_owned();
    let read = || async {
        let response = stack
            .client
            .get(format!("{}{location}", stack.base))
            .send()
            .await
            .unwrap();
        assert_eq!(response.status(), StatusCode::OK);
        response.json::<serde_json::Value>().await.unwrap()
    };
    assert_eq!(state(read().await), "queued");
    // No worker yet: the deadline passes with the job on the queue.
    tokio::time::sleep(Duration::from_millis(400)).await;
    assert_eq!(state(read().await), "expired");
    let worker = worker_in_process(worker_config(&stack.url, 2, 10, 0)).await;
    let (status, location_2) = stack.ship(orders[1], 2000, true).await;
    assert_eq!(status, StatusCode::ACCEPTED);
    test_support::wait_until(
        "the second job is done",
        Duration::from_secs(10),
        || async {
            let response = stack
                .client
                .get(format!("{}{}", stack.base, location_2.as_deref().unwrap()))
                .send()
                .await
                .unwrap();
            response.json::<serde_json::Value>().await.unwrap()["state"] == "done"
        },
    )
    .await;
    let body = read().await;
    assert_eq!(
        state(body),
        "expired",
        "the worker must never have started the expired job"
    );

    // 150 ms less the 60 ms reserve leaves less than the 100 ms minimum useful time.
    let (status, _) = stack.ship(orders[2], 150, false).await;
    assert_eq!(status, StatusCode::GATEWAY_TIMEOUT);
    let queued: i64 =
        sqlx::query_scalar("SELECT count(*) FROM queue_jobs WHERE payload->>'order_id' = $1")
            .bind(orders[2].to_string())
            .fetch_one(&stack.db)
            .await
            .unwrap();
    assert_eq!(queued, 0, "a job no worker would start was queued");
    assert_eq!(stack.shipments_of(orders[0]).await, 0);
    let tally = stack.check_the_table().await;
    assert_eq!((tally.done, tally.expired_unstarted), (1, 1), "{tally:?}");
    worker.shutdown().await;
}

/// Callers, half waiting and half `respond-async`, at about 25 orders/s until `stop`;
/// the waiting ones' answers, once every request sent has been answered.
async fn load(
    stack: Arc<Stack>,
    orders: Vec<i64>,
    stop: Arc<AtomicBool>,
) -> Vec<(i64, StatusCode)> {
    let mut tasks = tokio::task::JoinSet::new();
    let mut every = tokio::time::interval(Duration::from_millis(40));
    for (n, order) in orders.into_iter().enumerate() {
        every.tick().await;
        if stop.load(Ordering::Relaxed) {
            break;
        }
        let stack = stack.clone();
        tasks.spawn(async move {
            let respond_async = n % 2 == 0;
            let (status, _) = stack.ship(order, 1500, respond_async).await;
            (!respond_async).then_some((order, status))
        });
    }
    tasks.join_all().await.into_iter().flatten().collect()
}

/// `faketime` really shifts the clock of what it runs.
fn assert_faketime_shifts(offset: &str) {
    let output = std::process::Command::new("faketime")
        .args(["-f", offset, "date", "+%s"])
        .output()
        .expect("faketime runs (apt-get install faketime)");
    let shifted: i64 = String::from_utf8_lossy(&output.stdout)
        .trim()
        .parse()
        .unwrap();
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs() as i64;
    let expected: i64 = offset.trim_end_matches('s').parse().unwrap();
    assert!(
        (shifted - now - expected).abs() <= 1,
        "faketime {offset} gave {shifted}, now {now}"
    );
}

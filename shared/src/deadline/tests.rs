//! The time logic of [`Deadline`], under `tokio::time::pause`.

use super::*;

const MS: fn(u64) -> Duration = Duration::from_millis;

fn policy() -> DeadlinePolicy {
    DeadlinePolicy::new(MS(500), MS(300))
}

/// What the ingress makes of a requested budget: the deadline, and whether it was
/// clamped.
impl Deadline {
    fn inbound(requested: Option<Duration>, policy: &DeadlinePolicy) -> (Self, bool) {
        let (budget, clamped) = policy.accept(requested);
        (Self::after(budget), clamped)
    }
}

#[tokio::test(start_paused = true)]
async fn a_budget_above_the_maximum_is_clamped_to_it() {
    let (deadline, clamped) = Deadline::inbound(Some(MS(60_000)), &policy());
    assert_eq!(deadline.budget(), MS(500));
    assert_eq!(deadline.remaining(), MS(500));
    assert!(clamped);
}

#[tokio::test(start_paused = true)]
async fn a_zero_budget_is_raised_to_one_millisecond() {
    let (deadline, clamped) = Deadline::inbound(Some(MS(0)), &policy());
    assert_eq!(deadline.budget(), MS(1));
    assert!(clamped);
}

#[tokio::test(start_paused = true)]
async fn a_budget_within_bounds_is_kept_and_not_counted_as_clamped() {
    let (deadline, clamped) = Deadline::inbound(Some(MS(250)), &policy());
    assert_eq!(deadline.budget(), MS(250));
    assert!(!clamped);
}

#[tokio::test(start_paused = true)]
async fn an_absent_budget_gets_the_default() {
    let (deadline, clamped) = Deadline::inbound(None, &policy());
    assert_eq!(deadline.budget(), MS(300));
    assert!(!clamped);
}

#[test]
fn a_default_above_the_maximum_is_clamped_too() {
    assert_eq!(
        DeadlinePolicy::new(MS(100), MS(5000)).default_budget(),
        MS(100)
    );
}

#[tokio::test(start_paused = true)]
async fn remaining_saturates_at_zero() {
    let deadline = Deadline::after(MS(100));
    tokio::time::advance(MS(60)).await;
    assert_eq!(deadline.remaining(), MS(40));
    assert!(!deadline.is_expired());
    tokio::time::advance(MS(500)).await;
    assert_eq!(deadline.remaining(), Duration::ZERO);
    assert!(deadline.is_expired());
}

#[tokio::test(start_paused = true)]
async fn the_outbound_budget_subtracts_the_reserve_and_is_spent_at_the_reserve() {
    let deadline = Deadline::after(MS(300));
    assert_eq!(deadline.outbound_millis(MS(5)), Some(295));
    tokio::time::advance(MS(294)).await;
    assert_eq!(deadline.outbound_millis(MS(5)), Some(1));
    tokio::time::advance(Duration::from_micros(500)).await;
    assert_eq!(
        deadline.outbound_millis(MS(5)),
        None,
        "less than 1 ms to hand on"
    );
    tokio::time::advance(MS(1)).await;
    assert_eq!(
        deadline.outbound_millis(MS(5)),
        None,
        "no more than the reserve"
    );
    tokio::time::advance(MS(10)).await;
    assert_eq!(deadline.outbound_millis(MS(5)), None);
}

#[tokio::test(start_paused = true)]
async fn a_budget_too_large_for_the_clock_saturates_instead_of_panicking() {
    let endless = Deadline::after(Duration::MAX);
    assert!(!endless.is_expired());
    assert!(endless.remaining() > Duration::from_secs(365 * 24 * 3600));
    assert_eq!(endless.child(Duration::MAX).instant(), endless.instant());
    let short = Deadline::after(MS(100));
    assert_eq!(short.child(Duration::MAX).instant(), short.instant());
}

#[tokio::test(start_paused = true)]
async fn a_child_never_outlives_its_parent() {
    let parent = Deadline::after(MS(1000));
    let short = parent.child(MS(800));
    assert_eq!(short.instant(), parent.instant() - MS(200));
    tokio::time::advance(MS(600)).await;
    let late = parent.child(MS(800));
    assert_eq!(late.instant(), parent.instant());
    assert_eq!(late.budget(), MS(400));
}

#[tokio::test(start_paused = true)]
async fn run_cuts_a_slow_step_at_the_deadline() {
    let deadline = Deadline::after(MS(300));
    let result = deadline
        .run(Stage::named("catalog"), tokio::time::sleep(MS(1000)))
        .await;
    let err = result.expect_err("a 1 s step under 300 ms must time out");
    assert_eq!(err.stage, Stage::named("catalog"));
    assert_eq!(err.elapsed, MS(300));
}

#[tokio::test(start_paused = true)]
async fn run_never_starts_a_step_once_the_deadline_has_passed() {
    let deadline = Deadline::after(MS(10));
    tokio::time::advance(MS(10)).await;
    let started = std::sync::atomic::AtomicBool::new(false);
    let result = deadline
        .run(Stage::Db, async {
            started.store(true, std::sync::atomic::Ordering::SeqCst);
        })
        .await;
    assert_eq!(result.map_err(|e| e.stage), Err(Stage::Db));
    assert!(!started.load(std::sync::atomic::Ordering::SeqCst));
}

#[tokio::test(start_paused = true)]
async fn run_records_each_stage_in_the_shared_log() {
    let deadline = Deadline::after(MS(1000));
    let child = deadline.child(MS(100));
    deadline
        .run(Stage::named("catalog"), tokio::time::sleep(MS(20)))
        .await
        .unwrap();
    child
        .run(Stage::Tool, tokio::time::sleep(MS(5)))
        .await
        .unwrap();
    let entries = deadline.log().entries();
    assert_eq!(
        entries,
        vec![(Stage::named("catalog"), MS(20)), (Stage::Tool, MS(5))]
    );
}

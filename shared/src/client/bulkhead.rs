//! [`Bulkhead`]: a cap on concurrent outbound calls with a bounded, timed queue.
//!
//! reqwest keeps idle connections but puts no cap on how many are open, so it has no pool
//! queue to bound. This models what Reactor Netty calls `maxConnections`,
//! `pendingAcquireMaxCount` and `pendingAcquireTimeout`: at most `max_in_flight` calls
//! hold a slot, at most `pending_max` wait for one, and a waiter gives up after its
//! wait. A slot is held until the response *body* has been read (tower's
//! `ConcurrencyLimit` would release at the headers and undercount).
//!
//! The queue limit is propagate's. Observe calls (and slots taken with
//! `wait_for_slot`) wait with no limit (they
//! refuse nothing), and a call keeps the mode it started in, so after a switch to
//! propagate the calls admitted before it may still be waiting. They were promised no
//! limit and wait on, ahead in the same queue, but they do not count against the limit:
//! otherwise every propagate call would find the queue full of them (503 `queue_full`)
//! until they drained. The pending count and its gauge show every waiter.
//!
//! The pending count is the signal the dashboards use: it rises when calls queue for a
//! slot, which is a different fault from a slow downstream. Its gauge, like the active
//! one, moves by one step with every transition, in the same guards that undo the
//! transition ([`Slot`] and the queue place), so it returns to 0 with the last of them
//! however many complete or are cancelled at once.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use tokio::sync::{OwnedSemaphorePermit, Semaphore};

use crate::metrics::PoolGauges;

/// Why no slot was given.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum AcquireError {
    /// `pending_max` calls were already waiting: refused without waiting at all.
    QueueFull,
    /// The wait passed its limit.
    TimedOut,
}

/// A concurrency cap with a bounded queue. Share it behind an `Arc`.
pub(crate) struct Bulkhead {
    slots: Arc<Semaphore>,
    max_in_flight: usize,
    pending_max: Option<usize>,
    pending: AtomicUsize,
    /// Of the waiters, those the queue limit applies to.
    limited: AtomicUsize,
    gauges: PoolGauges,
}

impl std::fmt::Debug for Bulkhead {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Bulkhead")
            .field("max_in_flight", &self.max_in_flight)
            .field("pending_max", &self.pending_max)
            .field("pending", &self.pending())
            .field("active", &self.active())
            .finish()
    }
}

/// A held slot of a client's bulkhead; dropping it frees the slot.
#[derive(Debug)]
pub struct Slot {
    _permit: OwnedSemaphorePermit,
    bulkhead: Arc<Bulkhead>,
}

impl Drop for Slot {
    fn drop(&mut self) {
        self.bulkhead.gauges.active.dec();
    }
}

/// Counts a waiter for as long as it waits, including when its future is dropped;
/// `limited` when it also counts against the queue limit.
struct Waiting<'a> {
    bulkhead: &'a Bulkhead,
    limited: bool,
}

impl Drop for Waiting<'_> {
    fn drop(&mut self) {
        if self.limited {
            self.bulkhead.limited.fetch_sub(1, Ordering::SeqCst);
        }
        self.bulkhead.pending.fetch_sub(1, Ordering::SeqCst);
        self.bulkhead.gauges.pending.dec();
    }
}

impl Bulkhead {
    /// At most `max_in_flight` calls at once; at most `pending_max` waiting (`None`:
    /// no limit, as code without the technique does).
    pub(crate) fn new(max_in_flight: usize, pending_max: Option<usize>) -> Self {
        let max_in_flight = max_in_flight.max(1);
        Self {
            slots: Arc::new(Semaphore::new(max_in_flight)),
            max_in_flight,
            pending_max,
            pending: AtomicUsize::new(0),
            limited: AtomicUsize::new(0),
            gauges: PoolGauges::default(),
        }
    }

    /// Reports the queue and the slots in use to `gauges` (by default, gauges nobody
    /// reads).
    pub(crate) fn with_gauges(mut self, gauges: PoolGauges) -> Self {
        self.gauges = gauges;
        self
    }

    /// Takes a slot, waiting at most `wait` (`None`: as long as it takes), or refuses
    /// at once when `pending_max` calls like this one already wait.
    pub(crate) async fn acquire(
        self: &Arc<Self>,
        wait: Option<Duration>,
    ) -> Result<Slot, AcquireError> {
        if let Ok(permit) = Arc::clone(&self.slots).try_acquire_owned() {
            return Ok(self.slot(permit));
        }
        let waiting = self.join_queue(self.pending_max)?;
        let permit = match wait {
            Some(wait) => tokio::time::timeout(wait, Arc::clone(&self.slots).acquire_owned())
                .await
                .map_err(|_| AcquireError::TimedOut)?,
            None => Arc::clone(&self.slots).acquire_owned().await,
        }
        .expect("the semaphore is never closed");
        drop(waiting);
        Ok(self.slot(permit))
    }

    /// Takes a slot however long the queue and the wait (observe mode and `wait_for_slot`, which
    /// refuse nothing), without counting against the queue limit. The flag says whether
    /// the queue was already at `pending_max`: propagate would have refused this call.
    pub(crate) async fn acquire_unbounded(self: &Arc<Self>) -> (Slot, bool) {
        if let Ok(permit) = Arc::clone(&self.slots).try_acquire_owned() {
            return (self.slot(permit), false);
        }
        let over = self.pending() >= self.pending_max.unwrap_or(usize::MAX);
        let waiting = self.join_queue(None).expect("an unlimited queue has room");
        let permit = Arc::clone(&self.slots)
            .acquire_owned()
            .await
            .expect("the semaphore is never closed");
        drop(waiting);
        (self.slot(permit), over)
    }

    /// A slot if one is free now, without waiting or joining the queue (a hedge, which
    /// must not queue behind the calls it would overtake: tokio's semaphore gives no
    /// permit to a newcomer while anyone waits).
    pub(crate) fn try_acquire(self: &Arc<Self>) -> Option<Slot> {
        let permit = Arc::clone(&self.slots).try_acquire_owned().ok()?;
        Some(self.slot(permit))
    }

    /// Calls waiting for a slot now.
    pub(crate) fn pending(&self) -> usize {
        self.pending.load(Ordering::SeqCst)
    }

    /// Calls holding a slot now.
    pub(crate) fn active(&self) -> usize {
        self.max_in_flight - self.slots.available_permits()
    }

    /// The cap on concurrent calls.
    pub(crate) fn max_in_flight(&self) -> usize {
        self.max_in_flight
    }

    /// Joins the queue: as one of the waiters `limit` applies to (refused when that
    /// many already wait), or, with `None`, outside the limit.
    fn join_queue(&self, limit: Option<usize>) -> Result<Waiting<'_>, AcquireError> {
        if let Some(limit) = limit {
            // Check and increment in one step: two callers must never both take the
            // last place.
            self.limited
                .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| {
                    (n < limit).then_some(n + 1)
                })
                .map_err(|_| AcquireError::QueueFull)?;
        }
        self.pending.fetch_add(1, Ordering::SeqCst);
        // Nothing can fail between these steps and the guard that undoes them.
        self.gauges.pending.inc();
        Ok(Waiting {
            bulkhead: self,
            limited: limit.is_some(),
        })
    }

    fn slot(self: &Arc<Self>, permit: OwnedSemaphorePermit) -> Slot {
        self.gauges.active.inc();
        Slot {
            _permit: permit,
            bulkhead: Arc::clone(self),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn a_full_queue_refuses_at_once_and_a_waiter_times_out() {
        let bulkhead = Arc::new(Bulkhead::new(1, Some(1)));
        let held = bulkhead.acquire(None).await.unwrap();
        assert_eq!(bulkhead.active(), 1);
        let b = Arc::clone(&bulkhead);
        let waiter =
            tokio::spawn(async move { b.acquire(Some(Duration::from_millis(40))).await.map(drop) });
        tokio::task::yield_now().await;
        assert_eq!(bulkhead.pending(), 1);
        assert_eq!(
            bulkhead
                .acquire(Some(Duration::from_secs(1)))
                .await
                .map(drop),
            Err(AcquireError::QueueFull)
        );
        assert_eq!(waiter.await.unwrap(), Err(AcquireError::TimedOut));
        assert_eq!(bulkhead.pending(), 0);
        drop(held);
        assert_eq!(bulkhead.active(), 0);
    }

    #[tokio::test(start_paused = true)]
    async fn a_released_slot_goes_to_the_waiter() {
        let bulkhead = Arc::new(Bulkhead::new(1, None));
        let held = bulkhead.acquire(None).await.unwrap();
        let b = Arc::clone(&bulkhead);
        let waiter =
            tokio::spawn(async move { b.acquire(Some(Duration::from_secs(1))).await.map(drop) });
        tokio::task::yield_now().await;
        drop(held);
        assert_eq!(waiter.await.unwrap(), Ok(()));
    }

    /// Calls admitted in observe were promised no queue limit, and keep
    /// waiting after a switch to propagate. The limit is propagate's: it counts only
    /// the waiters it binds, so the unbounded ones do not fill the queue for the calls
    /// that follow (they still wait ahead of them, and count in `pending`).
    #[tokio::test(start_paused = true)]
    async fn unbounded_waiters_do_not_fill_the_bounded_queue() {
        let bulkhead = Arc::new(Bulkhead::new(1, Some(1)));
        let held = bulkhead.acquire(None).await.unwrap();
        let unbounded: Vec<_> = (0..3)
            .map(|_| {
                let b = Arc::clone(&bulkhead);
                tokio::spawn(async move { drop(b.acquire_unbounded().await) })
            })
            .collect();
        tokio::task::yield_now().await;
        assert_eq!(bulkhead.pending(), 3);

        let b = Arc::clone(&bulkhead);
        let waiter =
            tokio::spawn(async move { b.acquire(Some(Duration::from_secs(1))).await.map(drop) });
        tokio::task::yield_now().await;
        assert_eq!(bulkhead.pending(), 4, "the bounded call waits too");
        // The limit still holds among the calls it binds.
        assert_eq!(
            bulkhead
                .acquire(Some(Duration::from_secs(1)))
                .await
                .map(drop),
            Err(AcquireError::QueueFull)
        );
        // The slot goes round: the unbounded waiters first, in order, then the bounded one.
        drop(held);
        for task in unbounded {
            task.await.unwrap();
        }
        assert_eq!(waiter.await.unwrap(), Ok(()));
        assert_eq!(bulkhead.pending(), 0);
    }

    #[tokio::test(start_paused = true)]
    async fn a_dropped_waiter_leaves_the_queue() {
        let bulkhead = Arc::new(Bulkhead::new(1, Some(4)));
        let _held = bulkhead.acquire(None).await.unwrap();
        let b = Arc::clone(&bulkhead);
        let waiter = tokio::spawn(async move { b.acquire(None).await.map(drop) });
        tokio::task::yield_now().await;
        assert_eq!(bulkhead.pending(), 1);
        waiter.abort();
        let _ = waiter.await;
        assert_eq!(bulkhead.pending(), 0);
    }

    /// Thousands of slot holders finishing, waiters timing out and tasks aborted at any
    /// point, on several worker threads at once: when all of them are gone, both gauges
    /// must read exactly 0 as the exposition shows them. A gauge that is *set* from
    /// counts read a moment earlier can be overwritten by a stale value and stay above 0
    /// forever.
    #[cfg(feature = "metrics")]
    #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
    async fn the_gauges_return_to_exactly_zero_after_a_storm_of_completions_and_cancellations() {
        use crate::testing::metric_value;

        let metrics = crate::metrics::Metrics::new("test");
        let gauges = metrics.client().pool_gauges("catalog");
        let bulkhead = Arc::new(Bulkhead::new(3, Some(100_000)).with_gauges(gauges));
        let scraped = || {
            let text = metrics.render();
            let gauge = |name| metric_value(&text, name, r#"client="catalog""#);
            (
                gauge("http_client_pool_pending_acquires"),
                gauge("http_client_pool_active_connections"),
            )
        };
        for round in 0..40 {
            let tasks: Vec<_> = (0..600)
                .map(|i| {
                    let bulkhead = Arc::clone(&bulkhead);
                    tokio::spawn(async move {
                        // Every third waiter gives up after a few microseconds.
                        let wait = if i % 3 == 1 {
                            Duration::from_micros(50)
                        } else {
                            Duration::from_secs(10)
                        };
                        if let Ok(slot) = bulkhead.acquire(Some(wait)).await {
                            tokio::task::yield_now().await;
                            drop(slot);
                        }
                    })
                })
                .collect();
            // Cancel every fifth task wherever it happens to be: waiting, or holding a slot.
            for task in tasks.iter().step_by(5) {
                task.abort();
            }
            for task in tasks {
                let _ = task.await;
            }
            assert_eq!((bulkhead.pending(), bulkhead.active()), (0, 0));
            assert_eq!(
                scraped(),
                (Some(0.0), Some(0.0)),
                "round {round}: (pending, active) as rendered for /metrics"
            );
        }
    }
}

//! [`Bulkhead`]: a cap on concurrent outbound calls with a bounded, timed queue.
//!
//! reqwest keeps idle connections but puts no cap on how many are open, so it has no
//! pool queue to bound. This is what Reactor Netty calls `maxConnections`,
//! `pendingAcquireMaxCount` and `pendingAcquireTimeout`: at most `max_in_flight` calls
//! hold a slot, at most `pending_max` wait for one, and a waiter gives up after its
//! wait. A slot is held until the response *body* has been read (tower's
//! `ConcurrencyLimit` would release at the headers and undercount).
//!
//! The queue limit is propagate's. Observe calls, and slots taken with
//! `wait_for_slot`, wait with no limit, as code without the technique does. They wait
//! ahead in the same queue but do not count against the limit: otherwise, after a
//! switch to propagate, every propagate call would find the queue full of them until
//! they drained. The pending count shows every waiter; it is the signal the dashboards
//! use, rising when calls queue for a slot, a different fault from a slow downstream.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use tokio::sync::{OwnedSemaphorePermit, Semaphore};

/// Why no slot was given.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum AcquireError {
    /// `pending_max` calls were already waiting: refused without waiting at all.
    QueueFull,
    /// The wait passed its limit.
    TimedOut,
}

/// The slots and the queue of one client.
#[derive(Debug)]
pub(crate) struct Bulkhead {
    slots: Arc<Semaphore>,
    max_in_flight: usize,
    pending_max: Option<usize>,
    /// Every waiter.
    pending: AtomicUsize,
    /// The waiters the limit binds.
    limited: AtomicUsize,
}

/// A held slot of a client's bulkhead; dropping it frees the slot.
#[derive(Debug)]
pub struct Slot {
    _permit: OwnedSemaphorePermit,
}

/// A place in the queue; leaving it (with a slot, or by giving up) undoes the counts.
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
    }
}

impl Bulkhead {
    /// `max_in_flight` slots (at least 1); at most `pending_max` bounded waiters (`None`:
    /// no limit).
    pub(crate) fn new(max_in_flight: usize, pending_max: Option<usize>) -> Self {
        let max_in_flight = max_in_flight.max(1);
        Self {
            slots: Arc::new(Semaphore::new(max_in_flight)),
            max_in_flight,
            pending_max,
            pending: AtomicUsize::new(0),
            limited: AtomicUsize::new(0),
        }
    }

    /// Takes a slot, waiting at most `wait` (`None`: as long as it takes), or refuses
    /// at once when `pending_max` calls like this one already wait.
    pub(crate) async fn acquire(&self, wait: Option<Duration>) -> Result<Slot, AcquireError> {
        if let Some(slot) = self.try_acquire() {
            return Ok(slot);
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
        Ok(Slot { _permit: permit })
    }

    /// Takes a slot however long the queue and the wait; says whether the bounded queue
    /// was full when it joined (what observe counts as propagate's refusal).
    pub(crate) async fn acquire_unbounded(&self) -> (Slot, bool) {
        if let Some(slot) = self.try_acquire() {
            return (slot, false);
        }
        let over = self.pending() >= self.pending_max.unwrap_or(usize::MAX);
        let waiting = self.join_queue(None).expect("an unlimited queue has room");
        let permit = Arc::clone(&self.slots)
            .acquire_owned()
            .await
            .expect("the semaphore is never closed");
        drop(waiting);
        (Slot { _permit: permit }, over)
    }

    /// A slot if one is free now (a hedge takes no other).
    pub(crate) fn try_acquire(&self) -> Option<Slot> {
        let permit = Arc::clone(&self.slots).try_acquire_owned().ok()?;
        Some(Slot { _permit: permit })
    }

    /// Calls waiting for a slot.
    pub(crate) fn pending(&self) -> usize {
        self.pending.load(Ordering::SeqCst)
    }

    /// Slots in use.
    pub(crate) fn active(&self) -> usize {
        self.max_in_flight - self.slots.available_permits()
    }

    /// Slots in all.
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
        Ok(Waiting {
            bulkhead: self,
            limited: limit.is_some(),
        })
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
    /// point, on several worker threads at once: when all of them are gone, both counts
    /// (which the metrics read at each scrape) are exactly 0.
    #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
    async fn the_counts_return_to_exactly_zero_after_a_storm_of_completions_and_cancellations() {
        let bulkhead = Arc::new(Bulkhead::new(3, Some(100_000)));
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
            assert_eq!(
                (bulkhead.pending(), bulkhead.active()),
                (0, 0),
                "round {round}"
            );
        }
    }
}

//! [`Bulkhead`]: a cap on concurrent calls with a bounded, timed queue (Reactor Netty's
//! `maxConnections`, `pendingAcquireMaxCount`, `pendingAcquireTimeout`), since reqwest
//! caps neither. A slot is held until the *body* has been read (tower's
//! `ConcurrencyLimit` releases at the headers). Observe calls and `wait_for_slot` wait
//! without the limit, ahead in the same queue but not counting against it. The pending
//! count, every waiter, is what tells a queue for slots from a slow downstream.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use tokio::sync::{OwnedSemaphorePermit, Semaphore};

/// Why no slot was given.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum AcquireError {
    /// `pending_max` calls were already waiting: refused without waiting.
    QueueFull,
    /// The wait passed its limit.
    TimedOut,
}

/// The slots and the queue of one client.
#[derive(Debug)]
pub(crate) struct Bulkhead {
    slots: Arc<Semaphore>,
    max_in_flight: usize,
    pending_max: usize,
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

/// A place in the queue; leaving it, with a slot or without, undoes the counts.
struct Waiting<'a>(&'a Bulkhead, bool);

impl Drop for Waiting<'_> {
    fn drop(&mut self) {
        if self.1 {
            self.0.limited.fetch_sub(1, Ordering::SeqCst);
        }
        self.0.pending.fetch_sub(1, Ordering::SeqCst);
    }
}

impl Bulkhead {
    pub(crate) fn new(max_in_flight: usize, pending_max: usize) -> Self {
        let max_in_flight = max_in_flight.max(1);
        Self {
            slots: Arc::new(Semaphore::new(max_in_flight)),
            max_in_flight,
            pending_max,
            pending: AtomicUsize::new(0),
            limited: AtomicUsize::new(0),
        }
    }

    /// A slot within `wait`, or a refusal at once when `pending_max` wait already.
    pub(crate) async fn acquire(&self, wait: Duration) -> Result<Slot, AcquireError> {
        if let Some(slot) = self.try_acquire() {
            return Ok(slot);
        }
        // Check and increment in one step: two callers never both take the last place.
        self.limited
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| {
                (n < self.pending_max).then_some(n + 1)
            })
            .map_err(|_| AcquireError::QueueFull)?;
        let _waiting = self.join(true);
        let acquired = tokio::time::timeout(wait, Arc::clone(&self.slots).acquire_owned()).await;
        let permit = acquired.map_err(|_| AcquireError::TimedOut)?;
        Ok(Slot {
            _permit: permit.expect("the semaphore is never closed"),
        })
    }

    /// A slot however long the queue and the wait; and whether the bounded queue was
    /// full when it joined (what observe counts as propagate's refusal).
    pub(crate) async fn acquire_unbounded(&self) -> (Slot, bool) {
        if let Some(slot) = self.try_acquire() {
            return (slot, false);
        }
        let over = self.pending() >= self.pending_max;
        let _waiting = self.join(false);
        let permit = Arc::clone(&self.slots).acquire_owned().await;
        let slot = Slot {
            _permit: permit.expect("the semaphore is never closed"),
        };
        (slot, over)
    }

    /// A slot if one is free now (a hedge takes no other).
    pub(crate) fn try_acquire(&self) -> Option<Slot> {
        let permit = Arc::clone(&self.slots).try_acquire_owned().ok()?;
        Some(Slot { _permit: permit })
    }

    pub(crate) fn pending(&self) -> usize {
        self.pending.load(Ordering::SeqCst)
    }

    pub(crate) fn active(&self) -> usize {
        self.max_in_flight - self.slots.available_permits()
    }

    pub(crate) fn max_in_flight(&self) -> usize {
        self.max_in_flight
    }

    fn join(&self, limited: bool) -> Waiting<'_> {
        self.pending.fetch_add(1, Ordering::SeqCst);
        Waiting(self, limited)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn a_full_queue_refuses_at_once_and_a_waiter_times_out() {
        let bulkhead = Arc::new(Bulkhead::new(1, 1));
        let held = bulkhead.acquire(Duration::from_secs(3600)).await.unwrap();
        assert_eq!(bulkhead.active(), 1);
        let b = Arc::clone(&bulkhead);
        let waiter =
            tokio::spawn(async move { b.acquire(Duration::from_millis(40)).await.map(drop) });
        tokio::task::yield_now().await;
        assert_eq!(bulkhead.pending(), 1);
        assert_eq!(
            bulkhead.acquire(Duration::from_secs(1)).await.map(drop),
            Err(AcquireError::QueueFull)
        );
        assert_eq!(waiter.await.unwrap(), Err(AcquireError::TimedOut));
        assert_eq!(bulkhead.pending(), 0);
        drop(held);
        assert_eq!(bulkhead.active(), 0);
    }

    #[tokio::test(start_paused = true)]
    async fn a_released_slot_goes_to_the_waiter() {
        let bulkhead = Arc::new(Bulkhead::new(1, usize::MAX));
        let held = bulkhead.acquire(Duration::from_secs(3600)).await.unwrap();
        let b = Arc::clone(&bulkhead);
        let waiter = tokio::spawn(async move { b.acquire(Duration::from_secs(1)).await.map(drop) });
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
        let bulkhead = Arc::new(Bulkhead::new(1, 1));
        let held = bulkhead.acquire(Duration::from_secs(3600)).await.unwrap();
        let unbounded: Vec<_> = (0..3)
            .map(|_| {
                let b = Arc::clone(&bulkhead);
                tokio::spawn(async move { drop(b.acquire_unbounded().await) })
            })
            .collect();
        tokio::task::yield_now().await;
        assert_eq!(bulkhead.pending(), 3);

        let b = Arc::clone(&bulkhead);
        let waiter = tokio::spawn(async move { b.acquire(Duration::from_secs(1)).await.map(drop) });
        tokio::task::yield_now().await;
        assert_eq!(bulkhead.pending(), 4, "the bounded call waits too");
        // The limit still holds among the calls it binds.
        assert_eq!(
            bulkhead.acquire(Duration::from_secs(1)).await.map(drop),
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
        let bulkhead = Arc::new(Bulkhead::new(1, 4));
        let _held = bulkhead.acquire(Duration::from_secs(3600)).await.unwrap();
        let b = Arc::clone(&bulkhead);
        let waiter =
            tokio::spawn(async move { b.acquire(Duration::from_secs(3600)).await.map(drop) });
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
        let bulkhead = Arc::new(Bulkhead::new(3, 100_000));
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
                        if let Ok(slot) = bulkhead.acquire(wait).await {
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

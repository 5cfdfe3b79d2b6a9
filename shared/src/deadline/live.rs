//! [`LiveMode`]: the [`DeadlineMode`] in force, switchable at run time (from an admin
//! endpoint, say) rather than by a restart.
//!
//! The ingress reads the mode once per request and stamps it on the request's
//! [`Deadline`](crate::Deadline); the client and the database read it from there. So a
//! switch applies to the next request, and a request in flight never runs half in one
//! mode and half in another.

use std::sync::Arc;
use std::sync::atomic::{AtomicU8, Ordering};

use crate::mode::DeadlineMode;

/// The mode in force now; clones share it. One atomic load per request.
///
/// ```
/// use deadline_propagation::{DeadlineMode, LiveMode};
///
/// let mode = LiveMode::new(DeadlineMode::Observe);
/// let seen_by_the_layer = mode.clone();
/// assert_eq!(mode.set(DeadlineMode::Propagate), DeadlineMode::Observe);
/// assert_eq!(seen_by_the_layer.get(), DeadlineMode::Propagate);
/// ```
#[derive(Clone, Debug)]
pub struct LiveMode {
    current: Arc<AtomicU8>,
}

impl LiveMode {
    /// Starts in `mode`.
    pub fn new(mode: DeadlineMode) -> Self {
        Self {
            current: Arc::new(AtomicU8::new(mode.to_u8())),
        }
    }

    /// The mode in force.
    pub fn get(&self) -> DeadlineMode {
        DeadlineMode::from_u8(self.current.load(Ordering::Relaxed))
    }

    /// Switches to `mode` for every request that starts from now on; returns the mode
    /// it replaced.
    pub fn set(&self, mode: DeadlineMode) -> DeadlineMode {
        DeadlineMode::from_u8(self.current.swap(mode.to_u8(), Ordering::Relaxed))
    }
}

impl From<DeadlineMode> for LiveMode {
    fn from(mode: DeadlineMode) -> Self {
        Self::new(mode)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_switch_is_seen_by_every_clone() {
        let mode = LiveMode::new(DeadlineMode::Observe);
        let seen_by_ingress = mode.clone();
        for next in DeadlineMode::ALL {
            mode.set(next);
            assert_eq!(seen_by_ingress.get(), next);
        }
    }
}

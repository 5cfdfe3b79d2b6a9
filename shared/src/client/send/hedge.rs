//! The hedge (feature `hedging`): a second attempt beside a slow first one, when a
//! plugin times one. Without the feature a call is its first attempt and perhaps a retry.

use std::pin::pin;
use std::time::Duration;

use http::HeaderMap;

use super::{AttemptKind, BudgetedClient, CallRequest, Deadline, Event, Tried};

impl Tried {
    /// An answer the call can end with: any status but a 5xx.
    fn is_good(&self) -> bool {
        matches!(&self.outcome, Ok(Ok(reply)) if !reply.status.is_server_error())
    }
}

impl BudgetedClient {
    /// The first attempt, and a hedge beside it after the plugin's delay if the checks
    /// allow; the first good answer wins, the other is dropped (pushed onto `ran`).
    pub(super) async fn hedged(
        &self,
        deadline: &Deadline,
        request: &CallRequest<'_>,
        trace: &HeaderMap,
        first: impl Future<Output = Tried>,
        ran: &mut Vec<(AttemptKind, bool)>,
    ) -> (Tried, AttemptKind) {
        let (first_kind, hedge_kind) = (AttemptKind::First, AttemptKind::Hedge);
        let Some(delay) = self.hedge_delay(deadline, request) else {
            return (first.await, first_kind);
        };
        let mut first = pin!(first);
        tokio::select! {
            biased;
            tried = &mut first => return (tried, first_kind),
            () = tokio::time::sleep(delay) => {}
        }
        let slot = match self.extra_allowed(deadline, || self.bulkhead.try_acquire()) {
            Ok(slot) => slot,
            Err(refused) => {
                self.emit(Event::Counted(hedge_kind, refused));
                return (first.await, first_kind);
            }
        };
        let mut hedge = pin!(self.try_once(deadline, request, trace, slot, 1));
        // A loser dropped unfinished lost; one that failed first may have been cut.
        let (winner, loser) = tokio::select! {
            tried = &mut first => match tried.is_good() {
                true => ((tried, first_kind), (hedge_kind, false)),
                false => ((hedge.await, hedge_kind), (first_kind, tried.cut)),
            },
            tried = &mut hedge => match tried.is_good() {
                true => ((tried, hedge_kind), (first_kind, false)),
                false => ((first.await, first_kind), (hedge_kind, tried.cut)),
            },
        };
        ran.push(loser);
        winner
    }

    /// When the first attempt may be hedged: propagate, safe to send twice, and no
    /// caller above that owns extra attempts.
    fn hedge_delay(&self, deadline: &Deadline, request: &CallRequest<'_>) -> Option<Duration> {
        let hedgeable = request.repeatable()
            && request.admission
            && deadline.mode().enforces()
            && deadline.previous_attempts().is_none();
        hedgeable
            .then(|| self.plugins.iter().find_map(|p| p.hedge_after()))
            .flatten()
    }
}

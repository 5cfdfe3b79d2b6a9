//! The client's refusals before any I/O, with its bulkhead taken and a plugin that
//! refuses everything: nothing here reaches a socket (what does is in
//! `tests/client.rs`).

use std::time::Duration;

use axum::http::{Method, StatusCode, header};

use super::{Admit, BudgetedClient, CallError, CallErrorKind, CallStart, ClientConfig, Plugin};
use crate::{Deadline, Downstream, Problem};

/// Admission that predicts every call late.
#[derive(Debug)]
struct RefuseAll;

impl Plugin for RefuseAll {
    fn admit(&self, _call: &CallStart) -> Admit {
        Admit::Refuse {
            needed: Duration::from_secs(10),
        }
    }
}

const MS: fn(u64) -> Duration = Duration::from_millis;

/// A budget no larger than the reserve is spent: the answer is 504 at once, before
/// admission or the bulkhead can answer 503. A 503 says "try again later", which
/// is true only of a call that still had time; a spent one has no later.
#[tokio::test]
async fn a_spent_budget_is_a_504_even_where_admission_and_the_queue_would_refuse() {
    // Port 9 (discard) on loopback: were anything sent, it would be refused.
    let name = Downstream::new("inventory").unwrap();
    let mut config = ClientConfig::new(name, "http://127.0.0.1:9");
    config.max_connections = 1;
    config.pending_max = 0;
    let client = BudgetedClient::new(config).unwrap().plugin(RefuseAll);
    let reserve = client.config().reserve;
    // The one slot is taken and the queue holds none: the bulkhead refuses.
    let _held = client.bulkhead.acquire(MS(1000)).await.unwrap();

    let answer = |err: CallError| {
        let response = axum::response::IntoResponse::into_response(Problem::from(err));
        (
            response.status(),
            response.headers().get(header::RETRY_AFTER).cloned(),
        )
    };
    for budget in [Duration::ZERO, MS(1), reserve] {
        for request in [
            client.request(Method::POST, "/check"),
            client.request(Method::POST, "/check").health_check(),
        ] {
            let err = request.send(&Deadline::after(budget)).await.unwrap_err();
            assert!(
                matches!(err.kind(), CallErrorKind::Deadline(_)),
                "{budget:?}: {err:?}"
            );
            assert_eq!(
                answer(err),
                (StatusCode::GATEWAY_TIMEOUT, None),
                "{budget:?}"
            );
        }
    }
    // A call that still has time is refused as before: 503 with Retry-After.
    let err = client
        .request(Method::POST, "/check")
        .send(&Deadline::after(Duration::from_secs(1)))
        .await
        .unwrap_err();
    let (status, retry_after) = answer(err);
    assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE);
    assert!(retry_after.is_some());
}

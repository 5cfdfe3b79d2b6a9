//! The admin API: `GET|PUT /admin/mode`, on the admin address only (`ORDERS_ADMIN_ADDR`),
//! and `POST /admin/profile/start|stop` (a CPU flamegraph, with the `profiling` feature:
//! [`service_kit::profiling`]).
//!
//! The deadline mode is the rollout switch: `observe` first (everything runs, nothing is
//! refused, `deadline_would_refuse_total` counts what propagate would refuse), then
//! `propagate`, and back to `legacy` or `observe` at once if something goes wrong. A
//! switch needs no restart: it applies to every request that starts after it (each
//! request reads the mode once, at the ingress).
//!
//! Only loopback clients are served unless `ORDERS_ADMIN_ALLOW_REMOTE` is set: whoever
//! reaches this API can switch the service's protection off, so binding it to loopback
//! is not left as the only line of defence. Malformed JSON is 400; a missing field, an
//! unknown field or an unknown mode is 422; each is a problem that says what was wrong.

use axum::extract::State;
use axum::routing::get;
use axum::{Json, Router};
use serde::{Deserialize, Serialize};
use service_kit::json::JsonBody;

use crate::mode::{Mode, ModeSwitch};

/// The body of `GET` and `PUT /admin/mode`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ModeBody {
    /// `legacy`, `observe` or `propagate`.
    pub mode: Mode,
}

/// The admin router; `allow_remote` lets non-loopback clients in.
pub fn router(mode: ModeSwitch, allow_remote: bool) -> Router {
    let router = Router::new()
        .route("/admin/mode", get(get_mode).put(put_mode))
        .with_state(mode)
        .merge(service_kit::profiling::router());
    service_kit::admin::guard(router, allow_remote, "ORDERS_ADMIN_ALLOW_REMOTE")
}

async fn get_mode(State(mode): State<ModeSwitch>) -> Json<ModeBody> {
    Json(ModeBody { mode: mode.get() })
}

async fn put_mode(
    State(mode): State<ModeSwitch>,
    JsonBody(body): JsonBody<ModeBody>,
) -> Json<ModeBody> {
    let before = mode.set(body.mode);
    tracing::warn!(
        from = before.as_str(),
        to = body.mode.as_str(),
        "deadline mode switched"
    );
    Json(body)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::SocketAddr;

    use axum::body::Body;
    use axum::extract::{ConnectInfo, Request};
    use axum::http::StatusCode;
    use tower::ServiceExt;

    async fn send(peer: &str, allow_remote: bool, request: Request) -> (StatusCode, String) {
        let mut request = request;
        let addr: SocketAddr = peer.parse().unwrap();
        request.extensions_mut().insert(ConnectInfo(addr));
        let mut registry = prometheus_client::registry::Registry::default();
        let mode = ModeSwitch::new(Mode::Propagate, "orders", &mut registry);
        let response = router(mode, allow_remote).oneshot(request).await.unwrap();
        let status = response.status();
        let body = axum::body::to_bytes(response.into_body(), 4096)
            .await
            .unwrap();
        (status, String::from_utf8_lossy(&body).into_owned())
    }

    fn get_request() -> Request {
        Request::get("/admin/mode").body(Body::empty()).unwrap()
    }

    #[tokio::test]
    async fn remote_clients_are_refused_unless_allowed() {
        assert_eq!(
            send("127.0.0.1:5000", false, get_request()).await.0,
            StatusCode::OK
        );
        assert_eq!(
            send("[::1]:5000", false, get_request()).await.0,
            StatusCode::OK
        );
        let (status, body) = send("10.1.2.3:5000", false, get_request()).await;
        assert_eq!(status, StatusCode::FORBIDDEN);
        assert!(body.contains("ORDERS_ADMIN_ALLOW_REMOTE"), "{body}");
        assert_eq!(
            send("10.1.2.3:5000", true, get_request()).await.0,
            StatusCode::OK
        );
    }

    #[tokio::test]
    async fn a_remote_client_cannot_switch_the_mode() {
        let put = Request::put("/admin/mode")
            .header("content-type", "application/json")
            .body(Body::from(r#"{"mode":"legacy"}"#))
            .unwrap();
        assert_eq!(
            send("192.168.1.9:40000", false, put).await.0,
            StatusCode::FORBIDDEN
        );
    }
}

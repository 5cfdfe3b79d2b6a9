//! The admin API: `GET|PUT|DELETE /admin/faults`, on the admin address only, and
//! `POST /admin/profile/start|stop` (a CPU flamegraph, with the `profiling` feature:
//! [`service_kit::profiling`]).
//!
//! Only loopback clients are served unless `CATALOG_ADMIN_ALLOW_REMOTE` is set: whoever
//! reaches this API can make the service slow, so binding it to loopback is not left as
//! the only line of defence.
//!
//! PUT replaces the faults (missing fields are 0), DELETE resets them. Malformed JSON is
//! 400, unknown fields or out-of-range values are 422, each with a problem that names
//! the field.

use axum::Router;

use service_kit::faults::{self, Faults};

/// The admin router; `allow_remote` lets non-loopback clients in.
pub fn router(faults: Faults, allow_remote: bool) -> Router {
    let router = faults::routes(faults).merge(service_kit::profiling::router());
    service_kit::admin::guard(router, allow_remote, "CATALOG_ADMIN_ALLOW_REMOTE")
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::http::StatusCode;
    use std::net::SocketAddr;

    use axum::body::Body;
    use axum::extract::{ConnectInfo, Request};
    use tower::ServiceExt;

    async fn get_from(peer: &str, allow_remote: bool) -> StatusCode {
        let mut request = Request::get("/admin/faults").body(Body::empty()).unwrap();
        let addr: SocketAddr = peer.parse().unwrap();
        request.extensions_mut().insert(ConnectInfo(addr));
        router(Faults::default(), allow_remote)
            .oneshot(request)
            .await
            .unwrap()
            .status()
    }

    #[tokio::test]
    async fn remote_clients_are_refused_unless_allowed() {
        assert_eq!(get_from("127.0.0.1:5000", false).await, StatusCode::OK);
        assert_eq!(get_from("[::1]:5000", false).await, StatusCode::OK);
        assert_eq!(
            get_from("10.1.2.3:5000", false).await,
            StatusCode::FORBIDDEN
        );
        assert_eq!(get_from("10.1.2.3:5000", true).await, StatusCode::OK);
    }

    #[tokio::test]
    async fn the_profile_routes_are_behind_the_same_guard() {
        let send = |peer: &str| {
            let mut request = Request::post("/admin/profile/stop?bogus=1")
                .body(Body::empty())
                .unwrap();
            let addr: SocketAddr = peer.parse().unwrap();
            request.extensions_mut().insert(ConnectInfo(addr));
            router(Faults::default(), false).oneshot(request)
        };
        let remote = send("10.1.2.3:5000").await.unwrap();
        assert_eq!(remote.status(), StatusCode::FORBIDDEN);
        // From loopback the route answers (here: an unknown parameter).
        let local = send("127.0.0.1:5000").await.unwrap();
        assert_eq!(local.status(), StatusCode::BAD_REQUEST);
    }
}

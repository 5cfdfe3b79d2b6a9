//! Admin APIs (fault injection, the deadline mode): small bodies, loopback clients only.
//!
//! Whoever reaches an admin API can make a service slow or switch its protection off, so
//! binding it to a loopback address is not left as the only line of defence: the router
//! itself answers 403 to any client that is not on this machine, unless the deployment
//! says otherwise (a compose network or a Kubernetes namespace, with its own policy).

use std::net::SocketAddr;

use axum::Router;
use axum::extract::{ConnectInfo, Request};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};

use crate::answers::Answers as _;
use deadline_propagation::Problem;

/// The largest admin request body: a configuration is a few dozen bytes.
pub const MAX_BODY_BYTES: usize = 4 * 1024;

/// Guards `router`: bodies over [`MAX_BODY_BYTES`] are 413, and non-loopback clients get
/// a 403 naming `allow_setting` (the variable that lets them in) unless `allow_remote`.
/// The peer address comes from axum's `ConnectInfo`, which the server runner provides.
///
/// ```
/// use axum::{Router, routing::put};
///
/// let admin: Router = Router::new().route("/admin/faults", put(|| async { "set" }));
/// // Loopback clients only, unless CATALOG_ADMIN_ALLOW_REMOTE says otherwise.
/// let admin = service_kit::admin::guard(admin, false, "CATALOG_ADMIN_ALLOW_REMOTE");
/// ```
pub fn guard<S>(router: Router<S>, allow_remote: bool, allow_setting: &'static str) -> Router<S>
where
    S: Clone + Send + Sync + 'static,
{
    let router = crate::json::limit_bodies(router, MAX_BODY_BYTES);
    if allow_remote {
        return router;
    }
    router.layer(middleware::from_fn(move |request: Request, next: Next| {
        loopback_only(allow_setting, request, next)
    }))
}

async fn loopback_only(allow_setting: &'static str, request: Request, next: Next) -> Response {
    let peer = request
        .extensions()
        .get::<ConnectInfo<SocketAddr>>()
        .map(|ConnectInfo(addr)| addr.ip());
    match peer {
        Some(ip) if ip.is_loopback() => next.run(request).await,
        _ => Problem::forbidden(format!(
            "the admin API only answers loopback clients (see {allow_setting})"
        ))
        .into_response(),
    }
}

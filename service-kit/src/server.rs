//! Serving an axum `Router` with the limits a service under load needs.
//!
//! `axum::serve` has no header read timeout, so this runs hyper directly: a client that
//! trickles its headers is dropped after [`ServerOptions::header_read_timeout`] instead of
//! holding a connection forever. Shutdown is passed in as a future (as in mini-redis), so
//! `main` wires it to SIGTERM/Ctrl-C and tests to a oneshot channel. On shutdown the
//! listener closes at once and in-flight requests drain, for at most
//! [`ServerOptions::drain_timeout`].

use std::future::Future;
use std::net::SocketAddr;
use std::time::Duration;

use axum::Router;
use axum::extract::ConnectInfo;
use hyper::body::Incoming;
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::server::graceful::GracefulShutdown;
use tokio::net::TcpListener;
use tower::ServiceExt;

/// Connection-level limits.
///
/// ```
/// use std::time::Duration;
/// use service_kit::server::{ServerOptions, drain_timeout};
///
/// let options = ServerOptions {
///     drain_timeout: drain_timeout(Duration::from_millis(2000)),
///     ..ServerOptions::default()
/// };
/// assert_eq!(options.header_read_timeout, Duration::from_secs(5));
/// ```
#[derive(Clone, Copy, Debug)]
pub struct ServerOptions {
    /// How long a client may take to send its request headers.
    pub header_read_timeout: Duration,
    /// The largest request head (request line plus headers) accepted, in bytes.
    pub max_header_bytes: usize,
    /// How long in-flight requests may take to finish after shutdown starts: see
    /// [`drain_timeout`] (no request can legitimately need more).
    pub drain_timeout: Duration,
}

impl Default for ServerOptions {
    fn default() -> Self {
        Self {
            header_read_timeout: Duration::from_secs(5),
            max_header_bytes: 16 * 1024,
            drain_timeout: Duration::from_secs(10),
        }
    }
}

/// The drain a service with `max_budget` as its largest budget needs: every in-flight
/// request ends within its budget, plus a second to write the answers. Deployments size
/// their termination grace period from this (`deploy/k8s`, checked in CI).
pub fn drain_timeout(max_budget: Duration) -> Duration {
    max_budget + Duration::from_secs(1)
}

/// Serves `app` on `listener` until `shutdown` resolves, then drains.
///
/// Handlers can read the peer address with `ConnectInfo<SocketAddr>`.
///
/// ```
/// use axum::{Router, routing::get};
/// use service_kit::server::{ServerOptions, serve};
///
/// # #[tokio::main(flavor = "current_thread")] async fn main() -> std::io::Result<()> {
/// let app = Router::new().route("/healthz", get(|| async { "ok" }));
/// let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
/// let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
/// let server = tokio::spawn(serve(listener, app, async { let _ = stopped.await; }, ServerOptions::default()));
/// // ... serve requests; then shut down and drain:
/// let _ = stop.send(());
/// server.await.unwrap();
/// # Ok(()) }
/// ```
pub async fn serve(
    listener: TcpListener,
    app: Router,
    shutdown: impl Future<Output = ()> + Send,
    options: ServerOptions,
) {
    let mut http = hyper::server::conn::http1::Builder::new();
    http.timer(TokioTimer::new())
        .header_read_timeout(options.header_read_timeout)
        // hyper's buffer bounds the head it will parse; bigger heads get 431.
        .max_buf_size(options.max_header_bytes.max(8192));
    let graceful = GracefulShutdown::new();
    tokio::pin!(shutdown);

    loop {
        let (stream, peer) = tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok(conn) => conn,
                Err(err) => {
                    // Out of file descriptors or similar: back off instead of spinning.
                    tracing::warn!(error = %err, "accept failed");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            },
            () = &mut shutdown => break,
        };
        let _ = stream.set_nodelay(true);
        let app = app.clone();
        let service = hyper::service::service_fn(move |mut request: http::Request<Incoming>| {
            request
                .extensions_mut()
                .insert(ConnectInfo::<SocketAddr>(peer));
            app.clone().oneshot(request)
        });
        let connection = graceful.watch(http.serve_connection(TokioIo::new(stream), service));
        tokio::spawn(async move {
            if let Err(err) = connection.await {
                tracing::debug!(error = %err, %peer, "connection ended with an error");
            }
        });
    }

    drop(listener);
    tracing::info!("shutting down: draining in-flight requests");
    if tokio::time::timeout(options.drain_timeout, graceful.shutdown())
        .await
        .is_err()
    {
        tracing::warn!(timeout = ?options.drain_timeout, "drain timed out; closing the rest");
    }
}

/// Resolves on Ctrl-C or SIGTERM: what `main` passes to [`serve`].
///
/// ```no_run
/// use axum::Router;
/// use service_kit::server::{ServerOptions, serve, shutdown_signal};
///
/// # async fn run(app: Router) -> std::io::Result<()> {
/// let listener = tokio::net::TcpListener::bind("0.0.0.0:8080").await?;
/// serve(listener, app, shutdown_signal(), ServerOptions::default()).await;
/// # Ok(()) }
/// ```
pub async fn shutdown_signal() {
    let ctrl_c = async {
        if tokio::signal::ctrl_c().await.is_err() {
            std::future::pending::<()>().await;
        }
    };
    #[cfg(unix)]
    let terminate = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut signal) => {
                signal.recv().await;
            }
            Err(_) => std::future::pending::<()>().await,
        }
    };
    #[cfg(not(unix))]
    let terminate = std::future::pending::<()>();
    tokio::select! {
        () = ctrl_c => {},
        () = terminate => {},
    }
}

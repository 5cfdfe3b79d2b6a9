//! CPU profiles on the admin port, a recorder with two calls:
//!
//! - `POST /admin/profile/start` starts sampling every thread of the process 99 times
//!   a second, and answers 202 once the sampler runs (409 if it runs already);
//! - `POST /admin/profile/stop?title=T` stops it and answers what it recorded as a
//!   flamegraph SVG (`image/svg+xml`) titled T (409 if none runs).
//!
//! A recording nobody stops ends by itself after [`MAX_SECONDS`]. In-process sampling
//! with the `pprof` crate (a `SIGPROF` timer and a backtrace per sample), behind the
//! `profiling` feature, off by default: `cargo xtask experiment --profile-cpu` builds the
//! services with it and records each one around the measured window. Built without
//! the feature both routes answer 404, saying so.
//!
//! The sampler keeps its samples in a table it allocates when it first starts (tens of
//! MiB) and allocates again when it stops: start it before, and stop it after, any
//! memory measurement it must not disturb, as the experiment does.
//!
//! Mount the router beside an admin API, behind its loopback guard
//! ([`crate::admin::guard`]): a profile costs the process CPU and memory while it runs.

use crate::answers::Answers as _;
use axum::Router;
use axum::extract::Query;
use axum::response::Response;
use axum::routing::post;
use deadline_propagation::Problem;
use serde::Deserialize;

/// The longest recording, in seconds: one nobody stops ends then.
pub const MAX_SECONDS: u64 = 600;
/// Samples per second and thread (a prime, so the timer does not beat with periodic work).
pub const FREQUENCY_HZ: i32 = 99;

/// `POST /admin/profile/start` and `/stop`, to merge into an admin router before its
/// guard.
pub fn router() -> Router {
    Router::new()
        .route("/admin/profile/start", post(start))
        .route("/admin/profile/stop", post(stop))
}

/// The query of `POST /admin/profile/stop`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct StopQuery {
    #[serde(default)]
    #[cfg_attr(not(feature = "profiling"), allow(dead_code))]
    title: Option<String>,
}

async fn stop(
    query: Result<Query<StopQuery>, axum::extract::rejection::QueryRejection>,
) -> Result<Response, Problem> {
    let Query(query) = query.map_err(|e| Problem::bad_request(e.body_text()))?;
    recorder::stop(query.title).await
}

async fn start() -> Result<Response, Problem> {
    recorder::start().await
}

#[cfg(not(feature = "profiling"))]
mod recorder {
    use super::*;

    fn absent() -> Problem {
        Problem::not_found(
            "this build has no CPU profiler: build the service with `--features profiling`",
        )
    }

    pub(super) async fn start() -> Result<Response, Problem> {
        Err(absent())
    }

    pub(super) async fn stop(_: Option<String>) -> Result<Response, Problem> {
        Err(absent())
    }
}

#[cfg(feature = "profiling")]
mod recorder {
    use std::sync::Mutex;
    use std::sync::mpsc;
    use std::time::Duration;

    use axum::http::StatusCode;
    use axum::response::IntoResponse as _;
    use tokio::sync::oneshot;

    use super::*;

    /// What stops the recording: the title, and where its flamegraph goes.
    type StopRequest = (Option<String>, oneshot::Sender<Result<Vec<u8>, String>>);

    /// The running recording's stop channel, if one runs.
    static RECORDING: Mutex<Option<mpsc::Sender<StopRequest>>> = Mutex::new(None);

    fn recording() -> std::sync::MutexGuard<'static, Option<mpsc::Sender<StopRequest>>> {
        RECORDING
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    pub(super) async fn start() -> Result<Response, Problem> {
        let (stop_tx, stop_rx) = mpsc::channel::<StopRequest>();
        {
            let mut running = recording();
            if running.is_some() {
                return Err(Problem::conflict("a profile is being recorded already"));
            }
            *running = Some(stop_tx);
        }
        let (started_tx, started_rx) = oneshot::channel();
        // The profiler's guard is not `Send`: a thread of its own holds it for the whole
        // recording, and symbolises on it, so no worker of the runtime it measures is
        // taken.
        std::thread::Builder::new()
            .name("cpu-profile".into())
            .spawn(move || record(stop_rx, started_tx))
            .map_err(Problem::internal)?;
        match started_rx.await {
            Ok(Ok(())) => Ok(StatusCode::ACCEPTED.into_response()),
            Ok(Err(err)) => Err(Problem::internal(err)),
            Err(err) => Err(Problem::internal(err)),
        }
    }

    pub(super) async fn stop(title: Option<String>) -> Result<Response, Problem> {
        let Some(stop_tx) = recording().take() else {
            return Err(Problem::conflict("no profile is being recorded"));
        };
        let (svg_tx, svg_rx) = oneshot::channel();
        stop_tx
            .send((title, svg_tx))
            .map_err(|_| Problem::conflict("the recording ended by itself"))?;
        let svg = svg_rx
            .await
            .map_err(Problem::internal)?
            .map_err(Problem::internal)?;
        Ok(([(http::header::CONTENT_TYPE, "image/svg+xml")], svg).into_response())
    }

    /// The recording thread: samples until it is asked to stop (or [`MAX_SECONDS`]
    /// pass), then answers the flamegraph.
    fn record(stop_rx: mpsc::Receiver<StopRequest>, started: oneshot::Sender<Result<(), String>>) {
        let guard = match pprof::ProfilerGuardBuilder::default()
            .frequency(FREQUENCY_HZ)
            .blocklist(&["libc", "libgcc", "pthread", "vdso"])
            .build()
        {
            Ok(guard) => guard,
            Err(err) => {
                recording().take();
                let _ = started.send(Err(err.to_string()));
                return;
            }
        };
        let _ = started.send(Ok(()));
        let Ok((title, answer)) = stop_rx.recv_timeout(Duration::from_secs(MAX_SECONDS)) else {
            // Nobody stopped it: free the slot, unless a stop is taking it right now.
            recording().take();
            return;
        };
        let svg = (|| {
            let report = guard.report().build()?;
            drop(guard);
            let mut options = pprof::flamegraph::Options::default();
            if let Some(title) = title {
                options.title = title;
            }
            let mut svg = Vec::new();
            report.flamegraph_with_options(&mut svg, &mut options)?;
            Ok::<_, pprof::Error>(svg)
        })();
        let _ = answer.send(svg.map_err(|e| e.to_string()));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::body::Body;
    use axum::http::{Request, StatusCode};
    use tower::ServiceExt;

    async fn post(uri: &str) -> (StatusCode, String) {
        let response = router()
            .oneshot(Request::post(uri).body(Body::empty()).unwrap())
            .await
            .unwrap();
        let status = response.status();
        let body = axum::body::to_bytes(response.into_body(), 1 << 24)
            .await
            .unwrap();
        (status, String::from_utf8_lossy(&body).into_owned())
    }

    #[tokio::test]
    async fn unknown_parameters_are_a_bad_request() {
        let (status, _) = post("/admin/profile/stop?seconds=3").await;
        assert_eq!(status, StatusCode::BAD_REQUEST);
    }

    #[cfg(not(feature = "profiling"))]
    #[tokio::test]
    async fn without_the_feature_the_routes_say_how_to_get_them() {
        for uri in ["/admin/profile/start", "/admin/profile/stop"] {
            let (status, body) = post(uri).await;
            assert_eq!(status, StatusCode::NOT_FOUND, "{uri}");
            assert!(body.contains("--features profiling"), "{body}");
        }
    }

    /// A thread that spins in a function of its own while a recording runs: the
    /// flamegraph names it; a second start, and a stop with nothing running, are refused.
    #[cfg(feature = "profiling")]
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_recording_is_a_flamegraph_of_where_the_time_went() {
        #[inline(never)]
        fn spin_for_the_profiler(until: std::time::Instant) {
            while std::time::Instant::now() < until {
                std::hint::spin_loop();
            }
        }
        assert_eq!(post("/admin/profile/stop").await.0, StatusCode::CONFLICT);
        assert_eq!(post("/admin/profile/start").await.0, StatusCode::ACCEPTED);
        let (status, body) = post("/admin/profile/start").await;
        assert_eq!(status, StatusCode::CONFLICT);
        assert!(body.contains("already"), "{body}");
        let until = std::time::Instant::now() + std::time::Duration::from_millis(600);
        tokio::task::spawn_blocking(move || spin_for_the_profiler(until))
            .await
            .unwrap();
        let (status, svg) = post("/admin/profile/stop?title=spinning").await;
        assert_eq!(status, StatusCode::OK, "{svg}");
        assert!(svg.starts_with("<?xml"), "{}", &svg[..svg.len().min(200)]);
        assert!(svg.contains("spinning"), "the title");
        assert!(
            svg.contains("spin_for_the_profiler"),
            "the spinning function"
        );
        // The recorder is free again.
        assert_eq!(post("/admin/profile/stop").await.0, StatusCode::CONFLICT);
    }
}

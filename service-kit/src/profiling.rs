//! CPU profiles on the admin port: `GET /admin/profile?seconds=N&title=T` samples every
//! thread of the process 99 times a second for N seconds (1 to 600) and answers the
//! profile as a flamegraph SVG (`image/svg+xml`) titled T.
//!
//! In-process sampling with the `pprof` crate (a `SIGPROF` timer and a backtrace per
//! sample), behind the `profiling` feature, off by default: `cargo xtask experiment
//! --profile-cpu` builds the services with it and records each one during the measured
//! window. Built without the feature the route answers 404, saying so. One profile at a
//! time (409 otherwise): the sampler is process-wide. Bad parameters are 400 (not a
//! number) or 422 (out of range), as problems.
//!
//! Mount the router beside an admin API, behind its loopback guard
//! ([`crate::admin::guard`]): a profile costs the process a little CPU while it runs.

use axum::Router;
use axum::extract::Query;
use axum::response::Response;
use axum::routing::get;
use deadline_propagation::Problem;
use serde::Deserialize;

/// The longest profile, in seconds.
pub const MAX_SECONDS: u64 = 600;
/// Samples per second and thread (a prime, so the timer does not beat with periodic work).
pub const FREQUENCY_HZ: i32 = 99;

/// `GET /admin/profile`, to merge into an admin router before its guard.
pub fn router() -> Router {
    Router::new().route("/admin/profile", get(profile))
}

/// The query of `GET /admin/profile`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct ProfileQuery {
    seconds: u64,
    #[serde(default)]
    #[cfg_attr(not(feature = "profiling"), allow(dead_code))]
    title: Option<String>,
}

async fn profile(
    query: Result<Query<ProfileQuery>, axum::extract::rejection::QueryRejection>,
) -> Result<Response, Problem> {
    let Query(query) = query.map_err(|e| Problem::bad_request(e.body_text()))?;
    if !(1..=MAX_SECONDS).contains(&query.seconds) {
        return Err(Problem::unprocessable(format!(
            "seconds must be from 1 to {MAX_SECONDS}"
        )));
    }
    record(query).await
}

#[cfg(not(feature = "profiling"))]
async fn record(_: ProfileQuery) -> Result<Response, Problem> {
    Err(Problem::not_found(
        "this build has no CPU profiler: build the service with `--features profiling`",
    ))
}

/// Whether a profile is being recorded.
#[cfg(feature = "profiling")]
static RUNNING: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

#[cfg(feature = "profiling")]
async fn record(query: ProfileQuery) -> Result<Response, Problem> {
    use axum::response::IntoResponse as _;
    use std::sync::atomic::Ordering;

    /// Frees the profiler when the recording ends, however it ends.
    struct Running;
    impl Drop for Running {
        fn drop(&mut self) {
            RUNNING.store(false, Ordering::Release);
        }
    }

    if RUNNING.swap(true, Ordering::AcqRel) {
        return Err(Problem::conflict("a profile is being recorded already"));
    }
    let running = Running;
    // The profiler's guard is not `Send`, and symbolising costs CPU: a blocking thread
    // of its own holds it, so no worker of the runtime it measures is taken.
    let svg = tokio::task::spawn_blocking(move || {
        let _running = running;
        let guard = pprof::ProfilerGuardBuilder::default()
            .frequency(FREQUENCY_HZ)
            .blocklist(&["libc", "libgcc", "pthread", "vdso"])
            .build()?;
        std::thread::sleep(std::time::Duration::from_secs(query.seconds));
        let report = guard.report().build()?;
        drop(guard);
        let mut options = pprof::flamegraph::Options::default();
        if let Some(title) = query.title {
            options.title = title;
        }
        let mut svg = Vec::new();
        report.flamegraph_with_options(&mut svg, &mut options)?;
        Ok::<_, pprof::Error>(svg)
    })
    .await
    .map_err(Problem::internal)?
    .map_err(Problem::internal)?;
    Ok(([(http::header::CONTENT_TYPE, "image/svg+xml")], svg).into_response())
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::body::Body;
    use axum::http::{Request, StatusCode};
    use tower::ServiceExt;

    async fn get(uri: &str) -> (StatusCode, String) {
        let response = router()
            .oneshot(Request::get(uri).body(Body::empty()).unwrap())
            .await
            .unwrap();
        let status = response.status();
        let body = axum::body::to_bytes(response.into_body(), 1 << 24)
            .await
            .unwrap();
        (status, String::from_utf8_lossy(&body).into_owned())
    }

    #[tokio::test]
    async fn bad_parameters_are_problems() {
        assert_eq!(get("/admin/profile").await.0, StatusCode::BAD_REQUEST);
        assert_eq!(
            get("/admin/profile?seconds=x").await.0,
            StatusCode::BAD_REQUEST
        );
        for seconds in [0, MAX_SECONDS + 1] {
            let (status, body) = get(&format!("/admin/profile?seconds={seconds}")).await;
            assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY, "{body}");
            assert!(body.contains("seconds must be"), "{body}");
        }
    }

    #[cfg(not(feature = "profiling"))]
    #[tokio::test]
    async fn without_the_feature_the_route_says_how_to_get_it() {
        let (status, body) = get("/admin/profile?seconds=1").await;
        assert_eq!(status, StatusCode::NOT_FOUND);
        assert!(body.contains("--features profiling"), "{body}");
    }

    /// A second of a thread that spins in a function of its own: the flamegraph names
    /// it, and a second profile at the same time is refused.
    #[cfg(feature = "profiling")]
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_profile_is_a_flamegraph_of_where_the_time_went() {
        #[inline(never)]
        fn spin_for_the_profiler(until: std::time::Instant) {
            while std::time::Instant::now() < until {
                std::hint::spin_loop();
            }
        }
        let until = std::time::Instant::now() + std::time::Duration::from_millis(1500);
        let spinner = std::thread::spawn(move || spin_for_the_profiler(until));
        let first = tokio::spawn(get("/admin/profile?seconds=1&title=spinning"));
        // The first recording holds the profiler for a second: once it has it, a second
        // one is refused.
        let started = std::time::Instant::now();
        while !RUNNING.load(std::sync::atomic::Ordering::Acquire) {
            assert!(started.elapsed().as_secs() < 5, "the profile never started");
            tokio::time::sleep(std::time::Duration::from_millis(1)).await;
        }
        let (status, second) = get("/admin/profile?seconds=1").await;
        assert_eq!(status, StatusCode::CONFLICT, "{second}");
        assert!(second.contains("already"), "{second}");
        let (status, svg) = first.await.unwrap();
        spinner.join().unwrap();
        assert_eq!(status, StatusCode::OK, "{svg}");
        assert!(svg.starts_with("<?xml"), "{}", &svg[..svg.len().min(200)]);
        assert!(svg.contains("spinning"), "the title");
        assert!(
            svg.contains("spin_for_the_profiler"),
            "the spinning function"
        );
    }
}

//! What the two demo services share and the technique does not need.
//!
//! The library in `shared/` (`deadline_propagation`) holds the technique and nothing
//! else, so it can be copied alone. Every service also needs a way to serve, to log
//! and to guard its admin port; those parts live here, written once for
//! orders-service and catalog-service. A service of your own brings its own.
//!
//! - [`answers`]: the demo's own problem answers (400, 403, 409, 413, 415, 422).
//! - [`faults`]: the fault injector of the demo's downstreams and its admin routes.
//! - [`server`]: serving a router with a header read timeout and graceful shutdown,
//!   the shutdown passed in (as in mini-redis), so tests can stop a server.
//! - [`admin`]: the loopback-only guard of an admin API.
//! - [`json`]: [`JsonBody`](json::JsonBody), a JSON extractor whose rejections are
//!   problems, and a body size limit that refuses an announced oversize at once.
//! - [`layers`]: tower-http's layers at the edge: `x-request-id` on every request and
//!   answer, and a panicking handler answered 500 as a problem.
//! - [`telemetry`]: logs (text or JSON) and OpenTelemetry traces over OTLP/HTTP.
//! - [`secret`]: settings whose `Debug` never shows their secret (an API key, a
//!   database URL's password).
//! - [`metrics`]: the service's metric registry: the library's families plus the
//!   process's memory and CPU and the tokio runtime's workers and queues.
//! - [`openapi`]: what the layers add to each service's OpenAPI document (the budget
//!   headers, their 400, the 504, `Server-Timing`), around the handlers' own answers.
//! - [`profiling`]: `POST /admin/profile/start|stop`, a CPU flamegraph of the process (feature
//!   `profiling`, off by default).

pub mod admin;
pub mod answers;
pub mod faults;
pub mod json;
pub mod layers;
pub mod metrics;
pub mod openapi;
pub mod profiling;
pub mod secret;
pub mod server;
pub mod telemetry;

//! The harness of the deadline-propagation project, run as `cargo xtask <command>`.
//! PostgreSQL, the services and `/metrics` parsing come from test-support, as in the
//! tests.
//!
//! The experiment, in the order it runs: [`experiment`] runs every repeat of a
//! [`scenario`]; [`run`] runs one side (database, services, warm-up, fault, k6 from
//! [`k6`] with the [`sampler`] beside it, drain; [`partition`] cuts the link to
//! PostgreSQL); [`stats`] turns k6's request log into figures; [`summary`] aggregates
//! them, [`chart`] draws the seconds, [`diagnosis`] answers "pool queue, slow
//! downstream or saturated executor?", [`check`] applies the acceptance rules; [`prometheus`] runs the
//! [`dashboards`]' queries against real series. [`tables`] renders
//! the committed summaries into the docs. [`cost`] prices the technique in PostgreSQL
//! alone, with pgbench; [`cpu`] as CPU per order, read by a [`meter`]. [`images`] and
//! [`compose`] are the Docker path; [`backlog`] runs the queue hop under a backlog; [`examples`] and [`copy_check`] prove the crate's
//! ladder and its copy.

pub mod backlog;
pub mod chart;
pub mod check;
pub mod compose;
pub mod copy_check;
pub mod cost;
pub mod cpu;
pub mod dashboards;
pub mod diagnosis;
pub mod examples;
pub mod experiment;
pub mod images;
pub mod k6;
pub mod meter;
pub mod partition;
pub mod prometheus;
pub mod run;
pub mod sampler;
pub mod scenario;
pub mod stack;
pub mod stats;
pub mod summary;
pub mod tables;

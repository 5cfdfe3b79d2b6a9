//! The harness of the deadline-propagation project, run as `cargo xtask <command>`.
//! PostgreSQL, the services and `/metrics` parsing come from test-support, as in the tests.
//!
//! [`experiment`] runs every repeat of a [`scenario`]; [`run`] runs one side (k6 from [`k6`],
//! the [`sampler`] beside it, [`partition`] cutting PostgreSQL's link); [`stats`] turns k6's
//! log into figures, [`summary`] aggregates them, [`chart`] draws them, [`diagnosis`] and
//! [`check`] judge them; [`prometheus`] runs the [`dashboards`]' queries; [`tables`] renders
//! the summaries into the docs. [`cost`] and [`cpu`] (read by a [`meter`]) price the
//! technique; [`images`] and [`compose`] are the Docker path; [`backlog`] is the queue hop;
//! [`examples`] and [`copy_check`] prove the crate's ladder and its copy.

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

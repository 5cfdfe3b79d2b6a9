//! The harness of the deadline-propagation project, run as `cargo xtask <command>`
//! (the binary in `main.rs` only parses the command line and calls in here).
//!
//! One implementation of each thing, shared with the tests through test-support:
//! PostgreSQL from [`test_support::PgCluster`], the services from
//! [`test_support::ServiceProcess`], `/metrics` read by [`test_support::exposition`],
//! metric names from [`deadline_propagation::metrics::names`].
//!
//! The experiment, in the order it runs: [`experiment`] parses the command line and
//! runs every repeat; [`run`] runs one mode (database, services, warm-up, fault, k6 from
//! [`k6`] with the [`sampler`] beside it, drain); [`stats`] turns k6's request log into
//! figures; [`summary`] aggregates them; [`check`] applies the acceptance rules;
//! [`chart`] draws; [`prometheus`] and [`dashboards`] (with [`promql`]) check the
//! dashboards' queries and the rules;
//! [`tables`] renders the committed summaries into the result tables of the docs. [`cost`] measures the technique's cost to PostgreSQL alone, with
//! pgbench; [`cpu`] prices it as CPU per order of each process at a fixed rate, read by
//! a [`meter`]. [`partition`] cuts the link to PostgreSQL during the `partition` scenario
//! and watches what the server holds meanwhile.
//!
//! The Docker path: [`images`] makes the images docker-compose.yml runs without a
//! registry; [`compose`] brings that stack up and checks it from the host.

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
pub mod promql;
pub mod run;
pub mod sampler;
pub mod scenario;
pub mod stack;
pub mod stats;
pub mod summary;
pub mod tables;

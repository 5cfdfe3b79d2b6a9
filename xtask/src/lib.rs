//! The harness of the deadline-propagation project, run as `cargo xtask <command>`
//! (the binary in `main.rs` only parses the command line and calls in here).
//!
//! One implementation of each thing, shared with the tests through test-support:
//! PostgreSQL from [`test_support::PgCluster`], the services from
//! [`test_support::ServiceProcess`], `/metrics` read by [`test_support::exposition`],
//! metric names from [`shared::metrics::names`].

pub mod stack;

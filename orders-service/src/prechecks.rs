//! Prechecks: extra downstreams, named by configuration, that each order must pass
//! before it is written (`ORDERS_PRECHECKS=fraud=http://fraud:8083/check`).
//!
//! Each check is `POST {url}` with `{"sku":..,"quantity":..}` as JSON, sent through a
//! [`BudgetedClient`] named after the check, under what is left of the order's budget.
//! So a new downstream needs no code: its 504s, 503s, metrics (`client="fraud"`) and
//! `Server-Timing` carry its own name, and it never gets more time than the order has.
//!
//! What a check's answer becomes:
//!
//! | check answers | the order's answer |
//! | --- | --- |
//! | 2xx | passed; the next step runs |
//! | 409 | 409 `urn:problem:conflict`: the check refused this order as it stands |
//! | 422 | 422 `urn:problem:validation`: the check found the request itself unacceptable |
//! | 504, or our own budget ran out | 504, stage `{name}` (or `{name}_pool`) |
//! | 503 | 503 stage `{name}`, its `Retry-After` passed on |
//! | anything else, 404 included, or unreachable | 502 stage `{name}` |
//!
//! A 404 is the check's URL being wrong, not the client's SKU, so it is a 502. Checks run
//! concurrently, after the catalog price and before the database: a refused or failed
//! check means nothing was written. A check must be safe to ask again: an
//! `Idempotency-Key` replay of a created order asks the checks again before it finds the
//! order.

use anyhow::Context as _;
use deadline_propagation::Downstream;
use deadline_propagation::Problem;
use deadline_propagation::client::{BudgetedClient, CallError, CallErrorKind};
use deadline_propagation::metrics::Metrics;
use futures_util::future::try_join_all;
use http::{Method, StatusCode};
use tokio::time::Instant;

use crate::budget::Budget;
use crate::config::Config;
use crate::legacy::{Failure, PlainClient};
use service_kit::answers::Answers as _;

/// The configured checks, each with its own client (cheap to clone).
#[derive(Clone, Debug, Default)]
pub struct Prechecks {
    checks: Vec<Check>,
}

/// One check: its budgeted client, its plain one (legacy), and its path.
#[derive(Clone, Debug)]
struct Check {
    client: BudgetedClient,
    plain: PlainClient,
    path: String,
}

impl Prechecks {
    /// Builds one client per configured check, with the catalog's pool settings. Two
    /// checks with the same name would share metric series and stage names, so that
    /// fails start-up.
    pub fn new(config: &Config, metrics: &Metrics) -> anyhow::Result<Self> {
        let mut checks = Vec::with_capacity(config.prechecks.len());
        for (i, spec) in config.prechecks.iter().enumerate() {
            if config.prechecks[..i].iter().any(|s| s.name == spec.name) {
                anyhow::bail!(
                    "ORDERS_PRECHECKS names {} twice: each check needs a name of its own",
                    spec.name
                );
            }
            let client =
                crate::catalog::pooled_client(config, spec.name, spec.base_url.clone(), metrics)
                    .with_context(|| {
                        format!("cannot build the client of precheck {}", spec.name)
                    })?;
            let plain = PlainClient::new(&client, metrics)?;
            checks.push(Check {
                client,
                plain,
                path: spec.path.clone(),
            });
        }
        Ok(Self { checks })
    }

    /// The names of the configured checks, in configuration order.
    pub fn names(&self) -> Vec<&'static str> {
        self.checks
            .iter()
            .map(|check| check.client.downstream().name())
            .collect()
    }

    /// Asks every check about `order` under `budget`, concurrently; the first
    /// failure is the answer (the others are dropped, which cancels them).
    pub async fn pass(&self, budget: &Budget, sku: &str, quantity: i32) -> Result<(), Problem> {
        let body = serde_json::json!({"sku": sku, "quantity": quantity});
        let asks = self.checks.iter().map(|check| {
            let body = &body;
            async move {
                let Budget::Deadline(deadline) = budget else {
                    return check.pass_unbudgeted(body).await;
                };
                // A check changes nothing: cut at the deadline it is a 504, as a GET is.
                let request = check.client.request(Method::POST, &check.path);
                let request = request.read_only().json(body);
                match request.send(deadline).await {
                    Ok(_) => Ok(()),
                    Err(err) => Err(refusal(err, check.client.downstream())),
                }
            }
        });
        try_join_all(asks).await.map(drop)
    }
}

impl Check {
    /// The check as legacy asks it: no budget.
    async fn pass_unbudgeted(&self, body: &serde_json::Value) -> Result<(), Problem> {
        let started = Instant::now();
        let check = self.plain.downstream();
        match self.plain.send(Method::POST, &self.path, Some(body)).await {
            Ok(_) => Ok(()),
            Err(Failure::Status(StatusCode::CONFLICT)) => Err(conflict(check)),
            Err(Failure::Status(StatusCode::UNPROCESSABLE_ENTITY)) => Err(invalid(check)),
            Err(Failure::Status(StatusCode::NOT_FOUND)) => Err(not_there(check)),
            Err(failure) => Err(failure.into_problem(check, started)),
        }
    }
}

fn conflict(check: Downstream) -> Problem {
    Problem::conflict(format!("the {check} check refused this order"))
}

fn invalid(check: Downstream) -> Problem {
    Problem::unprocessable(format!("the {check} check found this order invalid"))
}

/// The check's URL is wrong; the client cannot fix that.
fn not_there(check: Downstream) -> Problem {
    Problem::bad_gateway(check.call(), "the check answered 404")
}

/// The answer for a check that did not pass.
fn refusal(err: CallError, check: Downstream) -> Problem {
    match err.kind() {
        CallErrorKind::Status(StatusCode::CONFLICT) => conflict(check),
        CallErrorKind::Status(StatusCode::UNPROCESSABLE_ENTITY) => invalid(check),
        CallErrorKind::NotFound => not_there(check),
        _ => err.into(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::parse_spec;

    #[test]
    fn a_spec_is_split_into_name_origin_and_path() {
        let spec = parse_spec("fraud=http://127.0.0.1:8083/v1/check?strict=1").unwrap();
        assert_eq!(spec.name.name(), "fraud");
        assert_eq!(spec.name.pool().as_str(), "fraud_pool");
        assert_eq!(spec.base_url, "http://127.0.0.1:8083");
        assert_eq!(spec.path, "/v1/check?strict=1");
        let spec = parse_spec(" payment = https://payments.internal ").unwrap();
        assert_eq!(spec.base_url, "https://payments.internal");
        assert_eq!(spec.path, "/");
    }

    #[test]
    fn bad_specs_are_refused_with_a_message_naming_the_problem() {
        for (value, says) in [
            ("fraud", "name=url"),
            ("=http://x", "invalid"),
            ("Fraud=http://x", "invalid"),
            ("db=http://x", "reserved"),
            ("fraud_pool=http://x", "reserved"),
            ("catalog=http://x", "catalog"),
            ("fraud=not a url", "not a url"),
            ("fraud=ftp://x/check", "http"),
            ("fraud=http://user:pw@x/check", "credentials"),
        ] {
            let err = parse_spec(value).expect_err(value);
            assert!(err.contains(says), "{value}: {err}");
        }
    }

    #[test]
    fn the_flag_repeats_and_a_bad_value_stops_parsing_naming_the_flag() {
        use clap::Parser;
        let config = Config::try_parse_from([
            "orders-service",
            "--precheck",
            "fraud=http://127.0.0.1:8083/check",
            "--precheck=payment=http://pay:81/p,stock=http://stock/s",
        ])
        .unwrap();
        let names: Vec<_> = config.prechecks.iter().map(|s| s.name.name()).collect();
        assert_eq!(names, ["fraud", "payment", "stock"]);
        let err = Config::try_parse_from(["orders-service", "--precheck", "DB=http://x"])
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("--precheck") && err.contains("\"DB\""),
            "{err}"
        );
        let none = Config::try_parse_from(["orders-service"]).unwrap();
        assert!(none.prechecks.is_empty() || std::env::var_os("ORDERS_PRECHECKS").is_some());
    }

    #[test]
    fn the_same_name_twice_fails_start_up() {
        let mut config = Config::for_tests("http://127.0.0.1:9", "postgres://x@127.0.0.1/x");
        config.prechecks = vec![
            parse_spec("fraud=http://127.0.0.1:1/a").unwrap(),
            parse_spec("fraud=http://127.0.0.1:2/b").unwrap(),
        ];
        let err = Prechecks::new(&config, &Metrics::new("test")).unwrap_err();
        assert!(err.to_string().contains("fraud twice"), "{err}");
    }
}

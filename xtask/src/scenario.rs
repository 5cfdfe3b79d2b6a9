//! The scenarios of the experiment (docs/design.md §9): what load, what fault, for how long.
//!
//! A scenario is data. Both sides of one invocation run the same [`Load`], so every
//! difference in the figures comes from what differs between the sides ([`Versus`]):
//! the mode, by default.

use std::time::Duration;

use serde::Serialize;

/// Which experiment to run.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Scenario {
    /// The headline: an open model above the catalog's capacity, slow and variable
    /// catalog, clients waiting at most a second past their budget. Goodput = 201s
    /// within the budget/s.
    Goodput,
    /// The seed's run: a closed loop of 250 users, 1 s of catalog latency.
    Seed,
    /// The latency goes away while the load goes on: how fast is the service well again?
    Recovery,
    /// A closed loop with 400 ms of catalog latency: some orders fit the budget, some not.
    Mixed,
    /// No fault: the technique's cost, as throughput propagate / legacy.
    Happy,
    /// The catalog's executor saturated: every call spins on a worker thread, fewer
    /// users than pool slots, so the pool's gauges stay flat while latency rises.
    Saturation,
    /// A pool queue: a catalog of normal speed behind two pool slots and more users
    /// than slots, so calls wait for a slot while the call itself stays fast.
    PoolQueue,
    /// The goodput load while the link to PostgreSQL is cut (every packet dropped both
    /// ways, no reset) for a while and healed: answers by the budget, the transactions
    /// left on the server without a client, and goodput after the heal.
    Partition,
    /// A catalog of 10 to 30 ms where 1 % of calls stall a second: the tail hedging
    /// cuts, and what it costs in calls.
    Stragglers,
    /// The stragglers with budgets drawn from 20 to 120 ms per order, so many calls are
    /// near their deadline: what the deadline rule of extra attempts saves.
    Tight,
    /// The catalog refuses every call (503) for 10 s, then recovers: catalog calls per
    /// order while it is down.
    Outage,
    /// Three hops: the goodput load with the slowness one hop further down, in
    /// pricing-service behind the catalog (gRPC): each hop's answers against its own
    /// deadline, and calls per order at each hop.
    PricingSlow,
    /// Three hops, pricing-service refusing every call (`UNAVAILABLE`): how many pricing
    /// calls an order costs when every hop could retry.
    PricingDown,
}

/// How k6 sends orders.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
#[serde(rename_all = "snake_case", tag = "model")]
pub enum Model {
    /// `rate` orders per second whatever the service does (constant-arrival-rate).
    Open { rate: u32 },
    /// `vus` users, each sending its next order `think_ms` after its last answer (the
    /// same in both modes, randomised ±1/3).
    Closed { vus: u32, think_ms: u64 },
}

/// The catalog fault injected through its admin API.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize)]
pub struct Fault {
    /// Fixed delay of every catalog answer.
    pub delay_ms: u64,
    /// Extra random delay, uniform in `0..=jitter_ms`.
    pub jitter_ms: u64,
    /// CPU spent spinning on a catalog worker thread per call, before the delay.
    pub busy_ms: u64,
    /// Share of calls that wait `straggler_ms` more.
    pub straggler_rate: f64,
    pub straggler_ms: u64,
    /// Share of calls refused at once with 503.
    pub unavailable_rate: f64,
}

/// Everything that defines the load of one run: its scenario, how orders arrive, and
/// for how long k6 sends them.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Load {
    pub scenario: Scenario,
    pub model: Model,
    #[serde(with = "crate::stats::secs")]
    pub duration: Duration,
    /// The budget each order carries (`X-Request-Timeout-Ms`).
    pub budget_ms: u64,
    /// When the client gives up (k6's timeout): by default [`CLIENT_PATIENCE_MS`] late.
    pub timeout_ms: u64,
    /// The catalog fault during the load, if any.
    pub fault: Option<Fault>,
    /// The catalog's usual speed during the warm-up (the history hedging is timed from).
    pub warm_up_fault: Option<Fault>,
    /// For `outage`: the fault is injected this long into the load (else at the start).
    #[serde(with = "opt_secs")]
    pub fault_from: Option<Duration>,
    /// For `recovery` and `outage`: the fault is removed this long into the load.
    #[serde(with = "opt_secs")]
    pub fault_removed_after: Option<Duration>,
    /// For `tight`: each order's budget drawn uniformly from this range (ms).
    pub budget_range_ms: Option<(u64, u64)>,
    /// orders-service's catalog bulkhead: slots in flight.
    pub pool_max_connections: u32,
    /// For `partition`: the link to PostgreSQL cut during the load.
    pub partition: Option<Partition>,
    /// Time (ms) the order's statement spends on the server holding its row locks.
    pub db_statement_ms: u64,
    /// Three hops: pricing-service behind the catalog, with this fault (`None`: two hops).
    pub pricing_fault: Option<Fault>,
    /// orders-service hedges its catalog calls too (`CATALOG_HEDGE=on`).
    pub hedging: bool,
}

/// A cut of the link between orders-service and PostgreSQL (test_support::net): every
/// packet dropped both ways from `after` into the load, for `length`, then healed.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct Partition {
    #[serde(with = "crate::stats::secs")]
    pub after: Duration,
    #[serde(with = "crate::stats::secs")]
    pub length: Duration,
}

/// How long past its budget a client of the open scenarios waits before it gives up: one
/// giving up *at* the budget would cut every latency there, and the p99 check pass.
pub const CLIENT_PATIENCE_MS: u64 = 1000;

impl Load {
    /// The same load with `vus` users or `rate` arrivals, and `pool_slots` pool slots.
    pub fn with_overrides(
        mut self,
        vus: Option<u32>,
        rate: Option<u32>,
        pool_slots: Option<u32>,
    ) -> Self {
        match &mut self.model {
            Model::Closed { vus: v, .. } => *v = vus.unwrap_or(*v),
            Model::Open { rate: r } => *r = rate.unwrap_or(*r),
        }
        self.pool_max_connections = pool_slots.unwrap_or(self.pool_max_connections);
        self
    }
}

/// A closed loop of `vus` users pausing `think_ms` after every answer.
fn closed(vus: u32, think_ms: u64) -> Model {
    Model::Closed { vus, think_ms }
}

/// A catalog that answers every call `delay_ms` late.
pub fn delay(delay_ms: u64) -> Fault {
    Fault {
        delay_ms,
        ..Fault::default()
    }
}

impl Scenario {
    /// The scenario's load; `duration` overrides its default length.
    pub fn load(self, duration: Option<Duration>, budget_ms: u64) -> Load {
        let secs = |s| duration.unwrap_or(Duration::from_secs(s));
        let base = Load {
            scenario: self,
            model: Model::Open { rate: 150 },
            duration: secs(30),
            budget_ms,
            timeout_ms: budget_ms + CLIENT_PATIENCE_MS,
            fault: None,
            warm_up_fault: None,
            fault_from: None,
            fault_removed_after: None,
            budget_range_ms: None,
            pool_max_connections: 50,
            partition: None,
            db_statement_ms: 0,
            pricing_fault: None,
            hedging: false,
        };
        // 50 slots at 200 to 800 ms (500 ms mean) serve about 100 orders/s: 150/s is
        // half again what the catalog can take.
        let variable = Fault {
            delay_ms: 200,
            jitter_ms: 600,
            ..Fault::default()
        };
        let seed_fault = delay(1000);
        // 10 to 30 ms per call, and one call in a hundred stalls a second more.
        let usual = Fault {
            delay_ms: 10,
            jitter_ms: 20,
            ..Fault::default()
        };
        let stragglers = Fault {
            straggler_rate: 0.01,
            straggler_ms: 1000,
            ..usual
        };
        match self {
            Self::Goodput => Load {
                fault: Some(variable),
                ..base
            },
            // Clients wait 60 s: legacy's queue shows as latency, not cut by the client.
            Self::Seed => Load {
                model: closed(250, 750),
                timeout_ms: 60_000,
                fault: Some(seed_fault),
                ..base
            },
            Self::Recovery => {
                let duration = secs(30);
                Load {
                    duration,
                    fault: Some(seed_fault),
                    fault_removed_after: Some(duration / 2),
                    ..base
                }
            }
            Self::Mixed => Load {
                model: closed(250, 750),
                timeout_ms: 60_000,
                fault: Some(delay(400)),
                ..base
            },
            Self::Happy => Load {
                model: closed(50, 0),
                ..base
            },
            // 20 ms of spinning per call: 30 users without a pause keep the catalog's
            // workers busy with calls queued on them, within the budget and under the
            // 50 slots of orders-service's pool.
            Self::Saturation => Load {
                model: closed(30, 0),
                fault: Some(Fault {
                    busy_ms: 20,
                    ..Fault::default()
                }),
                ..base
            },
            // 20 ms per call through 2 slots: 30 users without a pause keep most of their
            // calls waiting for a slot, under the pool's queue limit (50). Legacy's wait
            // their turn; propagate's are refused (503 `catalog_pool`) after the pool's
            // acquire timeout. The call itself stays far below the budget.
            Self::PoolQueue => Load {
                model: closed(30, 0),
                fault: Some(delay(20)),
                pool_max_connections: 2,
                ..base
            },
            // 200 orders a second for 40 s: 8,000 orders, enough for a p99.9.
            Self::Stragglers => Load {
                model: Model::Open { rate: 200 },
                duration: secs(40),
                fault: Some(stragglers),
                warm_up_fault: Some(usual),
                ..base
            },
            // Budgets from 20 to 120 ms: a hedge at the p99 (about 30 ms) often finds
            // less left than a call takes.
            Self::Tight => Load {
                model: Model::Open { rate: 200 },
                duration: secs(40),
                fault: Some(stragglers),
                warm_up_fault: Some(usual),
                budget_ms: 120,
                timeout_ms: 120 + CLIENT_PATIENCE_MS,
                budget_range_ms: Some((20, 120)),
                ..base
            },
            // The usual catalog, then every call refused for the middle third.
            Self::Outage => {
                let duration = secs(30);
                Load {
                    duration,
                    fault: Some(Fault {
                        unavailable_rate: 1.0,
                        ..usual
                    }),
                    warm_up_fault: Some(usual),
                    fault_from: Some(duration / 3),
                    fault_removed_after: Some(duration * 2 / 3),
                    ..base
                }
            }
            // The goodput load's fault a hop further down, in the catalog's prices.
            Self::PricingSlow => Load {
                warm_up_fault: Some(usual),
                fault: Some(usual),
                pricing_fault: Some(variable),
                hedging: true,
                ..base
            },
            Self::PricingDown => Load {
                warm_up_fault: Some(usual),
                fault: Some(usual),
                pricing_fault: Some(Fault {
                    unavailable_rate: 1.0,
                    ..Fault::default()
                }),
                hedging: true,
                ..base
            },
            // 10 s of the goodput load, 20 s with the database cut off, and the minute
            // after the heal (a shorter --duration keeps those shares). The statement's
            // 50 ms on the server leave write transactions holding row locks when the
            // cut comes; a COMMIT on the wire then is answered 500 outcome-unknown.
            Self::Partition => {
                let duration = secs(90);
                Load {
                    duration,
                    fault: Some(variable),
                    db_statement_ms: 50,
                    partition: Some(Partition {
                        after: duration / 9,
                        length: duration * 2 / 9,
                    }),
                    ..base
                }
            }
        }
    }

    /// The name on the command line, and of its folder under `docs/results/`.
    pub fn name(self) -> String {
        let value = clap::ValueEnum::to_possible_value(&self).expect("no variant is skipped");
        value.get_name().to_owned()
    }
}

mod opt_secs {
    pub(super) fn serialize<S: serde::Serializer>(
        d: &Option<std::time::Duration>,
        s: S,
    ) -> Result<S::Ok, S::Error> {
        match d {
            Some(d) => s.serialize_f64(d.as_secs_f64()),
            None => s.serialize_none(),
        }
    }
}

/// What the two sides of an invocation differ in.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Versus {
    /// `legacy` against `propagate`: what the technique changes.
    Modes,
    /// Both in propagate mode, the services' runtime metrics off (`metrics-off`) against
    /// on (`metrics-on`): what exporting the `tokio_*` families costs.
    RuntimeMetrics,
    /// Both in propagate mode, the database sessions' own bounds for a silent network
    /// off (`bounds-off`: `DB_IDLE_IN_TRANSACTION_TIMEOUT_MS` and `DB_LIVENESS_TIMEOUT_MS`
    /// 0) against on (`bounds-on`): what they do for a partition, and what they cost.
    SessionBounds,
    /// Both in propagate mode, hedging of catalog calls off (`hedging-off`) against on
    /// (`hedging-on`).
    Hedging,
    /// Both hedging, the deadline rule of extra attempts off (`deadline-blind`) against
    /// on (`deadline-aware`).
    HedgeDeadline,
    /// Both in propagate mode, the catalog retrying pricing under a caller that retries
    /// too (`every-hop`: `PRICING_RETRY_EVERY_HOP=true`) against one layer owning
    /// retries (`one-hop`): what retries compounding across hops cost.
    RetryHops,
}

/// One side of a comparison: its name in tables and folders, orders-service's
/// `DEADLINE_MODE` (k6 checks p99 against the budget in `propagate`), and its extra
/// settings, given to both services (each ignores the other's).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Side {
    pub name: &'static str,
    pub mode: &'static str,
    pub env: &'static [(&'static str, &'static str)],
}

impl Versus {
    /// The two sides, in table order; ratios are the second's over the first's.
    pub fn sides(self) -> [Side; 2] {
        let side = |name, mode, env| Side { name, mode, env };
        let bounds_off = &[
            ("DB_IDLE_IN_TRANSACTION_TIMEOUT_MS", "0"),
            ("DB_LIVENESS_TIMEOUT_MS", "0"),
        ];
        let blind = &[
            ("CATALOG_HEDGE", "on"),
            ("CATALOG_HEDGE_DEADLINE_AWARE", "false"),
        ];
        match self {
            Self::Modes => [
                side("legacy", "legacy", &[]),
                side("propagate", "propagate", &[]),
            ],
            Self::RuntimeMetrics => [
                side("metrics-off", "propagate", &[("RUNTIME_METRICS", "false")]),
                side("metrics-on", "propagate", &[("RUNTIME_METRICS", "true")]),
            ],
            Self::SessionBounds => [
                side("bounds-off", "propagate", bounds_off),
                side("bounds-on", "propagate", &[]),
            ],
            Self::Hedging => [
                side("hedging-off", "propagate", &[("CATALOG_HEDGE", "off")]),
                side("hedging-on", "propagate", &[("CATALOG_HEDGE", "on")]),
            ],
            Self::HedgeDeadline => [
                side("deadline-blind", "propagate", blind),
                side("deadline-aware", "propagate", &[("CATALOG_HEDGE", "on")]),
            ],
            Self::RetryHops => [
                side(
                    "every-hop",
                    "propagate",
                    &[("PRICING_RETRY_EVERY_HOP", "true")],
                ),
                side("one-hop", "propagate", &[]),
            ],
        }
    }

    /// The suffix of the results folder (`docs/results/<scenario><suffix>`).
    pub fn suffix(self) -> String {
        match clap::ValueEnum::to_possible_value(&self).expect("no variant is skipped") {
            _ if self == Self::Modes => String::new(),
            value => format!("-{}", value.get_name()),
        }
    }
}

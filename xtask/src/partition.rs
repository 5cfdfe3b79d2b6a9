//! The `partition` scenario's own parts: the cut of the link between orders-service and
//! PostgreSQL during the load (test_support::net), what PostgreSQL holds meanwhile
//! (sampled through its UNIX socket, which the cut does not reach), and the figures
//! that come of it.

use std::time::Duration;

use anyhow::Context as _;
use serde::Serialize;
use sqlx::postgres::{PgConnectOptions, PgPool, PgPoolOptions};
use test_support::net::Link;
use tokio::sync::watch;
use tokio::task::JoinHandle;

use crate::scenario::Partition;
use crate::stats::{Second, unix_ms};

/// A transaction older than this has lost its client: the service grants no budget
/// longer (`DEADLINE_MAX_MS`), so nothing a client still waits for runs this long.
pub const STALE_AFTER: Duration = Duration::from_secs(2);

/// The cut beside the load: the link taken at once (a machine where it cannot be fails
/// before the load), cut after the partition's delay, healed after its length.
pub struct Cut {
    task: JoinHandle<anyhow::Result<(u64, u64)>>,
}

impl Cut {
    /// Takes the link to PostgreSQL's `port` and schedules `partition` on it.
    pub async fn start(port: u16, partition: Partition) -> anyhow::Result<Self> {
        let link = tokio::task::spawn_blocking(move || {
            std::panic::catch_unwind(|| Link::to(port)).map_err(|_| {
                anyhow::anyhow!("cannot cut the link to PostgreSQL (root and iptables are needed)")
            })
        })
        .await??;
        let task = tokio::spawn(async move {
            tokio::time::sleep(partition.after).await;
            let link = tokio::task::spawn_blocking(move || {
                link.partition();
                link
            })
            .await?;
            let cut = unix_ms();
            tokio::time::sleep(partition.length).await;
            // The link is dropped (its rules removed) on the blocking thread too.
            tokio::task::spawn_blocking(move || link.heal()).await?;
            Ok((cut, unix_ms()))
        });
        Ok(Self { task })
    }

    /// When the link was cut and when it was healed, ms since the epoch.
    pub async fn finish(self) -> anyhow::Result<(u64, u64)> {
        self.task.await.context("the cut's task failed")?
    }
}

/// One reading, `t` s into the load, of the service's write transactions on the server
/// (holding row locks); `stale`: older than [`STALE_AFTER`], left without a client.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize)]
pub struct Held {
    pub t: f64,
    pub writes: f64,
    pub stale: f64,
    pub oldest_ms: f64,
}

/// Reads [`Held`] ten times a second through the UNIX socket until stopped: a ghost
/// the session bounds end within half a second is still seen.
pub struct Observer {
    stop: watch::Sender<bool>,
    task: JoinHandle<Vec<Held>>,
}

const HELD: &str = "\
    SELECT count(*)::float8, \
           count(*) FILTER (WHERE clock_timestamp() - xact_start > make_interval(secs => $1))::float8, \
           coalesce(max(extract(epoch FROM clock_timestamp() - xact_start)) * 1000, 0)::float8 \
    FROM pg_stat_activity \
    WHERE datname = current_database() AND backend_type = 'client backend' \
      AND pid <> pg_backend_pid() AND backend_xid IS NOT NULL";

impl Observer {
    /// Starts reading the database of `socket_url` (a UNIX-socket URL).
    pub async fn start(socket_url: &str) -> anyhow::Result<Self> {
        let options: PgConnectOptions = socket_url.parse()?;
        let pool: PgPool = PgPoolOptions::new()
            .max_connections(1)
            .connect_with(options.application_name("experiment-observer"))
            .await
            .context("cannot observe PostgreSQL through its socket")?;
        let (stop, mut stopped) = watch::channel(false);
        let task = tokio::spawn(async move {
            let started = std::time::Instant::now();
            let mut held = Vec::new();
            loop {
                let read: Result<(f64, f64, f64), _> = sqlx::query_as(HELD)
                    .bind(STALE_AFTER.as_secs_f64())
                    .fetch_one(&pool)
                    .await;
                if let Ok((writes, stale, oldest_ms)) = read {
                    held.push(Held {
                        t: started.elapsed().as_secs_f64(),
                        writes,
                        stale,
                        oldest_ms,
                    });
                }
                tokio::select! {
                    _ = tokio::time::sleep(Duration::from_millis(100)) => {}
                    _ = stopped.changed() => break,
                }
            }
            pool.close().await;
            held
        });
        Ok(Self { stop, task })
    }

    /// Stops reading; every reading taken.
    pub async fn stop(self) -> Vec<Held> {
        let _ = self.stop.send(true);
        self.task.await.unwrap_or_default()
    }
}

/// The figures of a run cut from `cut_s` to `healed_s` (s into the load): the longest a
/// write transaction was seen open (its locks held), the most left without a client at
/// once, and from a second after the heal (ghosts that survived it), and the goodput
/// before the cut and from the heal to the end.
pub fn figures(held: &[Held], seconds: &[Second], cut_s: f64, healed_s: f64) -> [(String, f64); 5] {
    let peak = |from_s: f64, value: fn(&Held) -> f64| {
        let after = held.iter().filter(|h| h.t >= from_s);
        after.map(value).fold(0.0, f64::max)
    };
    let goodput = |from: f64, to: f64| {
        let inside: Vec<f64> = seconds
            .iter()
            .filter(|s| (s.t as f64) >= from && ((s.t + 1) as f64) <= to)
            .map(|s| s.good as f64)
            .collect();
        inside.iter().sum::<f64>() / inside.len().max(1) as f64
    };
    let end = seconds.last().map_or(healed_s, |s| (s.t + 1) as f64);
    [
        ("longest_write_xact_ms", peak(0.0, |h| h.oldest_ms)),
        ("clientless_xacts_peak", peak(0.0, |h| h.stale)),
        (
            "clientless_xacts_after_heal",
            peak(healed_s + 1.0, |h| h.stale),
        ),
        ("goodput_before_cut_per_s", goodput(1.0, cut_s)),
        ("goodput_after_heal_per_s", goodput(healed_s, end)),
    ]
    .map(|(name, value)| (name.to_owned(), value))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn second(t: u64, good: u64) -> Second {
        Second {
            t,
            good,
            ..Second::default()
        }
    }

    fn held(t: f64, stale: f64, oldest_ms: f64) -> Held {
        Held {
            t,
            writes: stale + 1.0,
            stale,
            oldest_ms,
        }
    }

    #[test]
    fn the_figures_split_the_run_at_the_cut_and_the_heal() {
        // Cut at 10 s, healed at 30 s; goodput 80 before, 0 during, 70 after.
        let seconds: Vec<Second> = (0..60)
            .map(|t| match t {
                0..10 => second(t, 80),
                10..30 => second(t, 0),
                _ => second(t, 70),
            })
            .collect();
        let readings = [
            held(5.0, 0.0, 12.0),
            held(20.0, 3.0, 9000.0),
            held(30.5, 1.0, 19_500.0),
            held(31.5, 0.0, 40.0),
        ];
        let f = figures(&readings, &seconds, 10.0, 30.0).map(|(_, value)| value);
        // The ghost seen at 30.5 s is within the second; goodput from the first whole one.
        assert_eq!(f, [19_500.0, 3.0, 0.0, 80.0, 70.0]);
    }

    #[test]
    fn a_ghost_that_survives_the_heal_is_counted() {
        let readings = [held(20.0, 2.0, 9000.0), held(45.0, 1.0, 35_000.0)];
        assert_eq!(figures(&readings, &[], 10.0, 30.0)[2].1, 1.0);
    }
}

//! The instrument's control: a second catalog-service that the instrument calls itself,
//! at a fixed rate, with the same call whatever the mode.
//!
//! Why it is there: on a shared machine the CPU one order costs moves by up to ±15 %
//! from one three-second segment to the next, and every process moves with it. Over the
//! 200 segments of an A/A run, orders-service's CPU per order followed catalog-service's
//! with a correlation of 0.98, and PostgreSQL's with 0.95. It is the machine that runs
//! faster or slower (other tenants, caches, frequency), not the code. Alternating sides
//! in adjacent segments cancels the slow part of that drift, not the rest: the pairs of
//! 100-pair runs still spread from 0.70 to 1.48.
//!
//! A process that does the same work in both sides measures that speed: its CPU per
//! call, segment by segment. Dividing a pair's ratio by the control's ratio takes the
//! machine's speed out. The control must not be one of the measured processes (the
//! catalog the orders call does a little more work in propagate: it reads the deadline
//! header), hence a process of its own that nothing else calls. The A/A run shows
//! whether the division is fair.

use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use test_support::ServiceProcess;
use test_support::process::{binary_dir, free_port};
use tokio::task::JoinHandle;
use tokio::time::MissedTickBehavior;

/// A catalog-service called by nothing but [`Reference`]'s own task.
pub(super) struct Reference {
    process: ServiceProcess,
    answered: Arc<AtomicU64>,
    caller: JoinHandle<()>,
}

impl Reference {
    /// Starts the control from `profile`'s binary, its log in `dir`, and calls it
    /// `rate` times a second from now on.
    pub(super) async fn start(profile: &str, dir: &Path, rate: u32) -> anyhow::Result<Self> {
        let binary = binary_dir(&crate::stack::workspace(), profile).join("catalog-service");
        let port = free_port();
        let process = ServiceProcess::start(
            &binary,
            &[
                ("CATALOG_LISTEN_ADDR", format!("127.0.0.1:{port}")),
                ("CATALOG_ADMIN_ADDR", format!("127.0.0.1:{}", free_port())),
                ("RUST_LOG", "warn".into()),
            ],
            dir.join("reference.log"),
        )?;
        let url = format!("http://127.0.0.1:{port}/catalog/SKU-00042");
        let client = reqwest::Client::new();
        wait_ready(&client, &url).await?;
        let answered = Arc::new(AtomicU64::new(0));
        let caller = tokio::spawn(call(client, url, rate, Arc::clone(&answered)));
        Ok(Self {
            process,
            answered,
            caller,
        })
    }

    /// Its process id, for the meter.
    pub(super) fn pid(&self) -> u32 {
        self.process.pid()
    }

    /// Calls answered 200 so far.
    pub(super) fn answered(&self) -> u64 {
        self.answered.load(Ordering::Relaxed)
    }
}

impl Drop for Reference {
    fn drop(&mut self) {
        self.caller.abort();
        self.process.stop(Duration::from_secs(5));
    }
}

/// Polls the item until it answers 200, for at most 30 s.
async fn wait_ready(client: &reqwest::Client, url: &str) -> anyhow::Result<()> {
    let started = Instant::now();
    loop {
        let answer = client.get(url).timeout(Duration::from_secs(1)).send().await;
        if answer.is_ok_and(|a| a.status().is_success()) {
            return Ok(());
        }
        anyhow::ensure!(
            started.elapsed() < Duration::from_secs(30),
            "the reference catalog-service at {url} was not ready after 30 s"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// One call every `1 / rate` s, one at a time (a call takes well under the period; a
/// late one is made up at once, so the rate holds over a segment).
async fn call(client: reqwest::Client, url: String, rate: u32, answered: Arc<AtomicU64>) {
    let mut ticks = tokio::time::interval(Duration::from_secs_f64(1.0 / f64::from(rate.max(1))));
    ticks.set_missed_tick_behavior(MissedTickBehavior::Burst);
    loop {
        ticks.tick().await;
        let answer = client.get(&url).send().await;
        let ok = match answer {
            Ok(a) if a.status().is_success() => a.bytes().await.is_ok(),
            _ => false,
        };
        if ok {
            answered.fetch_add(1, Ordering::Relaxed);
        }
    }
}

//! The instrument's control (docs/experiment.md, "The control"): a second catalog-service
//! that only the instrument calls, at a fixed rate, the same call in every mode. The
//! machine's speed drifts between segments and every process moves with it; the control's
//! CPU per call measures that, and a pair's ratio over the control's takes it out. It
//! cannot be a measured process: the orders' catalog reads the deadline header in propagate.

use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

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
    /// Starts the control, its log in `dir`, and calls it `rate` times a second.
    pub(super) async fn start(profile: &str, dir: &Path, rate: u32) -> anyhow::Result<Self> {
        let bin = binary_dir(&crate::stack::workspace(), profile);
        let port = free_port();
        let env = [("RUST_LOG", "warn".to_owned())];
        let log = dir.join("reference.log");
        let process = crate::stack::start_catalog(&bin, (port, free_port()), &env, log).await?;
        let url = format!("http://127.0.0.1:{port}/catalog/SKU-00042");
        let answered = Arc::new(AtomicU64::new(0));
        let caller = tokio::spawn(call(url, rate, Arc::clone(&answered)));
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

/// One call every `1 / rate` s, one at a time (a call takes well under the period; a
/// late one is made up at once, so the rate holds over a segment).
async fn call(url: String, rate: u32, answered: Arc<AtomicU64>) {
    let client = reqwest::Client::new();
    let mut ticks = tokio::time::interval(Duration::from_secs_f64(1.0 / f64::from(rate.max(1))));
    ticks.set_missed_tick_behavior(MissedTickBehavior::Burst);
    loop {
        ticks.tick().await;
        if let Ok(answer) = client.get(&url).send().await
            && answer.status().is_success()
            && answer.bytes().await.is_ok()
        {
            answered.fetch_add(1, Ordering::Relaxed);
        }
    }
}

//! Service binaries as child processes: the one way the chaos test, the experiment and
//! `cargo xtask stack` start catalog-service and orders-service.
//!
//! A child is killed when its handle is dropped, so a panicking test or an interrupted
//! experiment leaves no service behind holding a port.

use std::fs::File;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use anyhow::Context as _;

/// A service binary running as a child process, its output in a log file.
pub struct ServiceProcess {
    child: Child,
    log: PathBuf,
}

impl ServiceProcess {
    /// Starts `binary` with `env` added to this process's environment; stdout and
    /// stderr go to `log` (appended, so a restart keeps the earlier lines).
    pub fn start(binary: &Path, env: &[(&str, String)], log: PathBuf) -> anyhow::Result<Self> {
        let mut command = Command::new(binary);
        // `info` unless the caller (or its environment) says otherwise.
        command
            .env(
                "RUST_LOG",
                std::env::var("RUST_LOG").unwrap_or("info".into()),
            )
            .envs(env.iter().map(|(k, v)| (*k, v.as_str())));
        Self::spawn(command, log)
    }

    /// Starts `command` (any program: the experiment runs Prometheus this way too),
    /// stdout and stderr appended to `log`.
    pub fn spawn(mut command: Command, log: PathBuf) -> anyhow::Result<Self> {
        let file = File::options()
            .create(true)
            .append(true)
            .open(&log)
            .with_context(|| format!("cannot open {}", log.display()))?;
        let child = command
            .stdin(Stdio::null())
            .stdout(file.try_clone()?)
            .stderr(file)
            .spawn()
            .with_context(|| format!("cannot start {command:?}"))?;
        Ok(Self { child, log })
    }

    /// The process id, e.g. to read its memory from `/proc`.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Where its output goes.
    pub fn log(&self) -> &Path {
        &self.log
    }

    /// `Some(status)` once the process has exited.
    pub fn exited(&mut self) -> Option<std::process::ExitStatus> {
        self.child.try_wait().ok().flatten()
    }

    /// SIGKILL, as a crash would; waits for the process to be gone.
    pub fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    /// SIGTERM (graceful shutdown: the drain runs), then SIGKILL after `grace`.
    pub fn stop(&mut self, grace: Duration) {
        if self.exited().is_some() {
            return;
        }
        let _ = Command::new("kill")
            .args(["-TERM", &self.pid().to_string()])
            .status();
        let started = std::time::Instant::now();
        while started.elapsed() < grace {
            if self.exited().is_some() {
                return;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        self.kill();
    }

    /// Resident memory in KiB (`VmRSS` of `/proc/<pid>/status`), 0 when unknown.
    pub fn rss_kib(&self) -> u64 {
        rss_kib(self.pid())
    }

    /// The last `lines` lines of the log, to explain a failure.
    pub fn log_tail(&self, lines: usize) -> String {
        let text = std::fs::read_to_string(&self.log).unwrap_or_default();
        let all: Vec<&str> = text.lines().collect();
        all[all.len().saturating_sub(lines)..].join("\n")
    }
}

impl Drop for ServiceProcess {
    fn drop(&mut self) {
        self.kill();
    }
}

/// Resident memory of process `pid` in KiB, 0 when it cannot be read.
pub fn rss_kib(pid: u32) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .unwrap_or_default()
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap_or(0)
}

/// A port that is free on 127.0.0.1 now (the caller binds it soon after).
pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("cannot bind a loopback port")
}

/// The folder holding this workspace's binaries for `profile` (`dev` is `debug`),
/// honouring `CARGO_TARGET_DIR`.
pub fn binary_dir(workspace: &Path, profile: &str) -> PathBuf {
    let target = std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .map(|t| {
            if t.is_absolute() {
                t
            } else {
                workspace.join(t)
            }
        })
        .unwrap_or_else(|| workspace.join("target"));
    target.join(if profile == "dev" { "debug" } else { profile })
}

//! Network faults on a real link: the TCP traffic between the clients on this machine
//! and one server port on loopback, dropped, thinned or held back by the kernel.
//!
//! ```no_run
//! # fn example(catalog_port: u16) {
//! use std::time::Duration;
//! use test_support::net::{Direction, Link};
//!
//! let link = Link::to(catalog_port); // the catalog's listening port, owned by this test
//! link.partition(); // every packet both ways is lost: no reset, no FIN
//! // ... requests now meet a silent peer ...
//! link.heal();
//! link.delay(Direction::ToServer, Duration::from_millis(100), Duration::from_millis(50));
//! # }
//! // Dropped (also by a panic): every rule is gone.
//! ```
//!
//! # How
//!
//! The machines this runs on have `iptables` (with the NFQUEUE target) but no `netem`
//! qdisc, so every fault is an `iptables` rule in a chain of the link's own,
//! `dpnet-<port>`, reached from `INPUT` for packets on `lo` to or from the port. On
//! loopback every packet passes `INPUT` once, on its way in, so a rule there drops it
//! silently: the sender sees no error and no reset, as when a wire is cut. A delay
//! queues the matching packets to NFQUEUE number `<port>`, where a thread of this
//! process holds each one for its delay and then lets the kernel deliver it
//! (`--queue-bypass`: should the thread be gone, packets flow undelayed instead of
//! being lost).
//!
//! # Isolation
//!
//! A link is the traffic of one server port, so a test must own the server it cuts (its
//! own PostgreSQL cluster, its own catalog on port 0): cutting the cluster shared by a
//! test binary would cut every test running beside it. Two links on different ports
//! never touch each other's packets, and the chain's name makes a second link to the
//! same port fail, in this process or any other, while the first lives.
//!
//! # Clean-up
//!
//! Dropping the [`Link`] (at the end of the test, or while a panic unwinds) removes its
//! rules and its chain and releases every packet it held. A process killed outright
//! cannot run that; the jump rules carry its process id in a comment, and the next
//! [`Link::to`] on this machine removes the rules of processes that are gone
//! ([`sweep`]). CI fails when any `dpnet` rule is left after the test run.
//!
//! Everything here needs root (`iptables` and NFQUEUE), as in CI: a test that cuts a
//! link begins with `if !can_cut_links() { return; }`, so for a contributor who is not
//! root it says why it does not run, and passes. The docs/testing.md section "Network
//! faults" says how to write such a test.

use std::collections::BinaryHeap;
use std::io::Write as _;
use std::process::Command;
use std::sync::Arc;
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, Ordering};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use anyhow::{Context as _, bail};

/// Whether this process may cut links (`iptables` and NFQUEUE need root). When it may
/// not, writes why the calling test does not run on the test run's output and returns
/// `false`: the test then returns at once. CI runs as root, so there every one runs.
pub fn can_cut_links() -> bool {
    if crate::privilege::is_root() {
        return true;
    }
    let test = std::thread::current().name().unwrap_or("a test").to_owned();
    // Past the harness: it keeps a passing test's `eprintln!` to itself.
    let _ = writeln!(
        std::io::stderr(),
        "skipped {test}: cutting a link needs root (iptables, NFQUEUE); CI runs it as root"
    );
    false
}

/// Which packets of a link a fault applies to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Direction {
    /// From the clients to the server: requests, and the client's acknowledgements.
    ToServer,
    /// From the server to the clients: answers, and the server's acknowledgements.
    ToClient,
    /// Both ways.
    Both,
}

impl Direction {
    /// The `iptables` matches of each direction, for server port `port`.
    fn matches(self, port: u16) -> Vec<String> {
        let to_server = format!("-d 127.0.0.1 -p tcp --dport {port}");
        let to_client = format!("-s 127.0.0.1 -p tcp --sport {port}");
        match self {
            Self::ToServer => vec![to_server],
            Self::ToClient => vec![to_client],
            Self::Both => vec![to_server, to_client],
        }
    }
}

/// The link between this machine's clients and the server on `127.0.0.1:<port>`, under
/// the test's control. Faults add up until [`heal`](Self::heal); dropping the link heals
/// it and removes every trace of it.
pub struct Link {
    port: u16,
    chain: String,
    delay: Mutex<Option<Delayer>>,
}

impl std::fmt::Debug for Link {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Link").field("port", &self.port).finish()
    }
}

impl Link {
    /// Takes control of the link to the server listening on `127.0.0.1:port`, healthy
    /// to begin with. Panics when this is not root, or when another live link holds the
    /// port.
    pub fn to(port: u16) -> Self {
        Self::try_to(port)
            .unwrap_or_else(|err| panic!("cannot control the link to port {port}: {err:#}"))
    }

    fn try_to(port: u16) -> anyhow::Result<Self> {
        sweep().context("removing the rules of processes that are gone")?;
        let chain = chain_name(port);
        iptables(&["-N", &chain]).with_context(|| {
            format!("chain {chain} exists: another live link controls port {port}")
        })?;
        let link = Self {
            port,
            chain,
            delay: Mutex::new(None),
        };
        let comment = owner_comment(std::process::id());
        for direction in Direction::Both.matches(port) {
            let rule = format!(
                "-I INPUT 1 -i lo {direction} -m comment --comment {comment} -j {}",
                link.chain
            );
            iptables(&split(&rule))?;
        }
        Ok(link)
    }

    /// The server port this link leads to.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// A partition: every packet lost both ways, with no reset and no FIN, as when a
    /// host or a switch goes silent.
    pub fn partition(&self) {
        self.cut(Direction::Both);
    }

    /// Every packet in `direction` lost: [`Direction::ToClient`] is a server whose
    /// requests arrive and whose answers never do.
    pub fn cut(&self, direction: Direction) {
        for matches in direction.matches(self.port) {
            self.rule(&format!("{matches} -j DROP"));
        }
    }

    /// New connections lost: every SYN to the server is dropped, while connections
    /// already open go on working (a listener whose backlog is gone, a firewall that
    /// closed the port).
    pub fn drop_new_connections(&self) {
        let to_server = Direction::ToServer.matches(self.port).remove(0);
        self.rule(&format!("{to_server} --syn -j DROP"));
    }

    /// Each packet in `direction` lost with probability `share` (0.0 to 1.0).
    pub fn lose(&self, direction: Direction, share: f64) {
        assert!((0.0..=1.0).contains(&share), "a share of packets: {share}");
        for matches in direction.matches(self.port) {
            self.rule(&format!(
                "{matches} -m statistic --mode random --probability {share:.4} -j DROP"
            ));
        }
    }

    /// Each packet in `direction` held for `delay` plus a uniform random share of
    /// `±jitter` before the kernel delivers it. Packets stay in order (a packet waits at
    /// least as long as the one before it), as on a slow path rather than a reordering
    /// one. [`Direction::Both`] adds the delay to each way, so a round trip then takes
    /// twice as long.
    pub fn delay(&self, direction: Direction, delay: Duration, jitter: Duration) {
        assert!(
            jitter <= delay,
            "jitter {jitter:?} above the delay {delay:?}"
        );
        let mut held = self.delay.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(previous) = held.take() {
            previous.stop();
        }
        let delayer = Delayer::start(self.port, delay, jitter)
            .unwrap_or_else(|err| panic!("cannot delay port {}: {err:#}", self.port));
        *held = Some(delayer);
        for matches in direction.matches(self.port) {
            self.append(&format!(
                "{matches} -j NFQUEUE --queue-num {} --queue-bypass",
                self.port
            ));
        }
    }

    /// Removes every fault: packets flow again, and the packets held by a delay are
    /// delivered at once.
    pub fn heal(&self) {
        if let Err(err) = iptables(&["-F", &self.chain]) {
            panic!("cannot heal the link to port {}: {err:#}", self.port);
        }
        if let Some(delayer) = self.delay.lock().unwrap_or_else(|e| e.into_inner()).take() {
            delayer.stop();
        }
    }

    /// Puts a drop rule first in the link's chain, ahead of any delay.
    fn rule(&self, rule: &str) {
        let args = format!("-I {} 1 {rule}", self.chain);
        if let Err(err) = iptables(&split(&args)) {
            panic!("cannot add a fault to port {}: {err:#}", self.port);
        }
    }

    fn append(&self, rule: &str) {
        let args = format!("-A {} {rule}", self.chain);
        if let Err(err) = iptables(&split(&args)) {
            panic!("cannot add a fault to port {}: {err:#}", self.port);
        }
    }
}

impl Drop for Link {
    fn drop(&mut self) {
        // Not `heal`: a panic here, while a failed test unwinds, would abort the process
        // and hide the test's own message.
        let _ = remove_chain(&self.chain, self.port, std::process::id());
        if let Some(delayer) = self
            .delay
            .get_mut()
            .unwrap_or_else(|e| e.into_inner())
            .take()
        {
            delayer.stop();
        }
    }
}

/// Removes the links of processes that no longer run (a test run that was killed):
/// their jump rules in `INPUT` and their chains. Links of live processes are left
/// alone. Returns how many links were removed.
pub fn sweep() -> anyhow::Result<usize> {
    let rules = iptables_output(&["-S", "INPUT"])?;
    let mut removed = 0;
    // Two jump rules (one per direction) lead to each chain.
    let links: std::collections::BTreeSet<(u16, u32)> =
        rules.lines().filter_map(parse_jump).collect();
    for (port, pid) in links {
        if !std::path::Path::new(&format!("/proc/{pid}")).exists() {
            remove_chain(&chain_name(port), port, pid)?;
            removed += 1;
        }
    }
    Ok(removed)
}

/// Every `dpnet` rule on this machine, as `iptables -S` prints it: empty once every link
/// is dropped (CI checks this after the tests).
pub fn leftover_rules() -> anyhow::Result<Vec<String>> {
    let rules = iptables_output(&["-S"])?;
    Ok(rules
        .lines()
        .filter(|line| line.contains("dpnet"))
        .map(str::to_owned)
        .collect())
}

fn chain_name(port: u16) -> String {
    format!("dpnet-{port}")
}

fn owner_comment(pid: u32) -> String {
    format!("dpnet-owner-{pid}")
}

/// The port and owner of one of our jump rules in `iptables -S INPUT` output.
fn parse_jump(line: &str) -> Option<(u16, u32)> {
    let port = line.split_whitespace().skip_while(|w| *w != "-j").nth(1)?;
    let port: u16 = port.strip_prefix("dpnet-")?.parse().ok()?;
    let pid = line
        .split_whitespace()
        .find_map(|w| w.strip_prefix("dpnet-owner-"))?;
    Some((port, pid.parse().ok()?))
}

/// Deletes the jump rules of `pid` to `chain`, then the chain itself.
fn remove_chain(chain: &str, port: u16, pid: u32) -> anyhow::Result<()> {
    let comment = owner_comment(pid);
    for direction in Direction::Both.matches(port) {
        let rule = format!("-D INPUT -i lo {direction} -m comment --comment {comment} -j {chain}");
        // Absent already (a half-made link): nothing to delete.
        let _ = iptables(&split(&rule));
    }
    iptables(&["-F", chain])?;
    iptables(&["-X", chain])
}

fn split(args: &str) -> Vec<&str> {
    args.split_whitespace().collect()
}

/// Runs `iptables -w` (waiting for the lock other test processes may hold).
fn iptables(args: &[&str]) -> anyhow::Result<()> {
    iptables_output(args).map(drop)
}

fn iptables_output(args: &[&str]) -> anyhow::Result<String> {
    let out = Command::new("iptables")
        .arg("-w")
        .args(args)
        .output()
        .context("cannot run iptables (network fault tests need root and iptables)")?;
    if !out.status.success() {
        bail!(
            "iptables {}: {}",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// The thread that holds a link's queued packets for their delay.
struct Delayer {
    stop: Arc<AtomicBool>,
    thread: JoinHandle<()>,
}

impl Delayer {
    fn start(queue: u16, delay: Duration, jitter: Duration) -> anyhow::Result<Self> {
        let stop = Arc::new(AtomicBool::new(false));
        let stopping = stop.clone();
        // The queue is opened on its thread (its messages point into its buffers) and
        // the thread says whether that worked before any rule sends packets to it.
        let (opened, result) = std::sync::mpsc::channel();
        let thread = std::thread::Builder::new()
            .name(format!("dpnet-delay-{queue}"))
            .spawn(move || match open_queue(queue) {
                Ok(nfq) => {
                    let _ = opened.send(Ok(()));
                    hold(nfq, queue, delay, jitter, &stopping);
                }
                Err(err) => {
                    let _ = opened.send(Err(err));
                }
            })?;
        result
            .recv()
            .context("the delay thread ended before it opened its queue")??;
        Ok(Self { stop, thread })
    }

    /// Releases every held packet and ends the thread.
    fn stop(self) {
        self.stop.store(true, Ordering::Relaxed);
        let _ = self.thread.join();
    }
}

fn open_queue(queue: u16) -> anyhow::Result<nfq::Queue> {
    let mut nfq = nfq::Queue::open().context("cannot open an NFQUEUE socket")?;
    nfq.bind(queue).context("cannot bind the NFQUEUE")?;
    // Only the verdict is needed, never the payload; whole GSO packets, not segments.
    nfq.set_copy_range(queue, 0)?;
    nfq.set_recv_gso(queue, true)?;
    nfq.set_queue_max_len(queue, 65_536)?;
    nfq.set_fail_open(queue, true)?;
    nfq.set_nonblocking(true);
    Ok(nfq)
}

/// A packet waiting for its release time (the earliest first; the sequence number keeps
/// equal times in arrival order).
struct Held {
    release: Instant,
    seq: u64,
    message: nfq::Message,
}

impl PartialEq for Held {
    fn eq(&self, other: &Self) -> bool {
        (self.release, self.seq) == (other.release, other.seq)
    }
}

impl Eq for Held {}

impl PartialOrd for Held {
    fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}

impl Ord for Held {
    fn cmp(&self, other: &Self) -> std::cmp::Ordering {
        // BinaryHeap is a max-heap: reversed, so the earliest release is on top.
        (other.release, other.seq).cmp(&(self.release, self.seq))
    }
}

fn hold(mut nfq: nfq::Queue, queue: u16, delay: Duration, jitter: Duration, stop: &AtomicBool) {
    let mut held = BinaryHeap::new();
    let mut seq = 0_u64;
    let mut last_release = Instant::now();
    let mut random = Jitter::seeded(u64::from(queue));
    while !stop.load(Ordering::Relaxed) {
        // Take everything queued now.
        loop {
            match nfq.recv() {
                Ok(message) => {
                    let wait = random.around(delay, jitter);
                    // In order: never before the packet queued ahead of it.
                    let release = (Instant::now() + wait).max(last_release);
                    last_release = release;
                    seq += 1;
                    held.push(Held {
                        release,
                        seq,
                        message,
                    });
                }
                Err(err) if err.kind() == std::io::ErrorKind::WouldBlock => break,
                Err(_) => break,
            }
        }
        let now = Instant::now();
        while held.peek().is_some_and(|h: &Held| h.release <= now) {
            let Some(Held { mut message, .. }) = held.pop() else {
                break;
            };
            message.set_verdict(nfq::Verdict::Accept);
            let _ = nfq.verdict(message);
        }
        let next = held.peek().map_or(Duration::from_millis(1), |h| {
            h.release.saturating_duration_since(now)
        });
        std::thread::sleep(next.min(Duration::from_millis(1)));
    }
    for Held { mut message, .. } in held.into_vec() {
        message.set_verdict(nfq::Verdict::Accept);
        let _ = nfq.verdict(message);
    }
    let _ = nfq.unbind(queue);
}

/// A small xorshift generator for the jitter: reproducible per port, no dependency.
struct Jitter(u64);

impl Jitter {
    fn seeded(seed: u64) -> Self {
        Self(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1)
    }

    /// `delay` plus a uniform draw from `-jitter..=jitter`.
    fn around(&mut self, delay: Duration, jitter: Duration) -> Duration {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        let unit = (self.0 >> 11) as f64 / (1_u64 << 53) as f64; // 0.0..1.0
        let offset = jitter.as_secs_f64() * (2.0 * unit - 1.0);
        Duration::from_secs_f64((delay.as_secs_f64() + offset).max(0.0))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_jump_rule_names_its_port_and_owner() {
        let line = "-A INPUT -s 127.0.0.1/32 -i lo -p tcp -m tcp --sport 5432 -m comment \
                    --comment dpnet-owner-4242 -j dpnet-5432";
        assert_eq!(parse_jump(line), Some((5432, 4242)));
        assert_eq!(parse_jump("-A INPUT -j DOCKER"), None);
        assert_eq!(parse_jump("-A INPUT -i lo -j dpnet-x"), None);
    }

    #[test]
    fn jitter_stays_within_its_bounds_and_spreads() {
        let mut random = Jitter::seeded(7);
        let draws: Vec<Duration> = (0..1000)
            .map(|_| random.around(Duration::from_millis(100), Duration::from_millis(50)))
            .collect();
        assert!(draws.iter().all(|d| (50..=150).contains(&d.as_millis())));
        assert!(draws.iter().any(|d| d.as_millis() < 60));
        assert!(draws.iter().any(|d| d.as_millis() > 140));
    }
}

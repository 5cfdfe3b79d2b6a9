#!/usr/bin/env python3
"""A local stack for checks: throwaway PostgreSQL, catalog-service, orders-service.

Python 3.11, standard library only. As a module:

    from stack import running_stack
    with running_stack(profile="dev", log_dir="results/mcp-check") as s:
        s.orders_url, s.catalog_url, s.admin_url, s.database_url, s.procs["orders"]

Everything runs on free loopback ports. Leaving the `with` block, on success, on an
exception or on Ctrl-C, kills both services and stops (and deletes) PostgreSQL.

As a command:

    python3 scripts/stack.py --profile dev --log-dir /tmp/stack-logs            # until Ctrl-C
    python3 scripts/stack.py --profile release -- sh -c 'curl -s $ORDERS_URL/readyz'

With a command after `--`, it runs the command with ORDERS_URL, CATALOG_URL,
CATALOG_ADMIN_URL and DATABASE_URL set, stops the stack and exits with the command's
status.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PG_SCRIPT = ROOT / "scripts" / "pg-throwaway.sh"

PROFILES = {"dev": "debug", "debug": "debug", "release": "release"}


class StackError(RuntimeError):
    """The stack could not be started."""


@dataclass
class Stack:
    """A running stack: URLs, the database, process handles and log files."""

    orders_url: str
    catalog_url: str
    admin_url: str
    database_url: str
    procs: dict[str, subprocess.Popen] = field(default_factory=dict)
    logs: dict[str, Path] = field(default_factory=dict)
    log_dir: Path | None = None
    pg_dir: Path | None = None

    @property
    def mcp_url(self) -> str:
        return f"{self.orders_url}/mcp"

    def env(self) -> dict[str, str]:
        """The URLs as environment variables, for child commands."""
        return {
            "ORDERS_URL": self.orders_url,
            "CATALOG_URL": self.catalog_url,
            "CATALOG_ADMIN_URL": self.admin_url,
            "DATABASE_URL": self.database_url,
        }

    def check_alive(self) -> None:
        """Raises StackError naming a service that has exited."""
        for name, proc in self.procs.items():
            if proc.poll() is not None:
                raise StackError(
                    f"{name} exited with status {proc.returncode}\n{log_tail(self.logs.get(name))}"
                )


def free_port() -> int:
    """A free TCP port on 127.0.0.1 (free now; the caller binds it soon after)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def binary_dir(profile: str) -> Path:
    """target/debug or target/release (CARGO_TARGET_DIR is honoured)."""
    try:
        sub = PROFILES[profile]
    except KeyError:
        raise StackError(f"unknown profile {profile!r}: use dev or release") from None
    target = Path(os.environ.get("CARGO_TARGET_DIR", ROOT / "target"))
    if not target.is_absolute():
        target = ROOT / target
    return target / sub


def log_tail(path: Path | None, lines: int = 30) -> str:
    if path is None or not path.exists():
        return "(no log)"
    text = path.read_text(errors="replace").splitlines()[-lines:]
    return f"--- last lines of {path} ---\n" + "\n".join(text)


def http_status(url: str, timeout: float = 1.0) -> int | None:
    """The status of GET url, or None when it does not answer."""
    try:
        with urllib.request.urlopen(url, timeout=timeout) as response:
            return response.status
    except urllib.error.HTTPError as err:
        return err.code
    except (OSError, ValueError):
        return None


def stop_process(proc: subprocess.Popen, grace: float = 5.0) -> None:
    """SIGTERM, then SIGKILL after `grace` seconds; always reaps the process."""
    if proc.poll() is not None:
        return
    try:
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=grace)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(timeout=grace)
    except ProcessLookupError:
        pass


def start_postgres(pg_dir: Path, port: int, log_path: Path) -> str:
    """`pg-throwaway.sh start`; returns the DATABASE_URL."""
    with open(log_path, "ab") as log:
        done = subprocess.run(
            [str(PG_SCRIPT), "start", str(pg_dir), str(port)],
            stdout=subprocess.PIPE,
            stderr=log,
            timeout=120,
            check=False,
        )
    url = done.stdout.decode().strip().splitlines()[-1:] if done.stdout else []
    if done.returncode != 0 or not url or not url[0].startswith("postgres://"):
        raise StackError(f"pg-throwaway.sh start failed ({done.returncode})\n{log_tail(log_path)}")
    return url[0]


def stop_postgres(pg_dir: Path, log_path: Path | None = None) -> None:
    """`pg-throwaway.sh stop`: stops the cluster and deletes its directory."""
    sink = open(log_path, "ab") if log_path else subprocess.DEVNULL
    try:
        subprocess.run(
            [str(PG_SCRIPT), "stop", str(pg_dir)],
            stdout=sink,
            stderr=sink,
            timeout=60,
            check=False,
        )
    finally:
        if log_path:
            sink.close()


def spawn(name: str, binary: Path, env: Mapping[str, str], log_dir: Path) -> tuple[subprocess.Popen, Path]:
    """Starts `binary` with `env` added, stdout and stderr to log_dir/<name>.log."""
    if not binary.is_file():
        raise StackError(f"{binary} is missing: cargo build -p catalog-service -p orders-service")
    log_path = log_dir / f"{name}.log"
    full_env = dict(os.environ)
    full_env.update(env)
    with open(log_path, "ab") as log:
        proc = subprocess.Popen(
            [str(binary)],
            env=full_env,
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            cwd=ROOT,
            # Own process group: a terminal's Ctrl-C reaches only us, and we stop the
            # services in order.
            start_new_session=True,
        )
    return proc, log_path


def wait_ready(stack: Stack, timeout: float) -> None:
    """Polls orders' /readyz every 100 ms until 200, at most `timeout` seconds."""
    deadline = time.monotonic() + timeout
    last = None
    while time.monotonic() < deadline:
        stack.check_alive()
        last = http_status(f"{stack.orders_url}/readyz")
        if last == 200:
            return
        time.sleep(0.1)
    raise StackError(
        f"orders-service /readyz not 200 after {timeout:.0f} s (last: {last})\n"
        f"{log_tail(stack.logs.get('orders'))}\n{log_tail(stack.logs.get('catalog'))}"
    )


@contextlib.contextmanager
def running_stack(
    profile: str = "dev",
    log_dir: str | Path | None = None,
    orders_env: Mapping[str, str] | None = None,
    catalog_env: Mapping[str, str] | None = None,
    ready_timeout: float = 60.0,
) -> Iterator[Stack]:
    """Starts PostgreSQL, catalog-service and orders-service; cleans up on exit."""
    bindir = binary_dir(profile)
    if log_dir is None:
        log_dir = Path(tempfile.mkdtemp(prefix="stack-logs-"))
    log_dir = Path(log_dir)
    log_dir.mkdir(parents=True, exist_ok=True)
    pg_log = log_dir / "postgres-setup.log"
    # A fresh path under the temp dir: pg-throwaway.sh creates it and hands it to the
    # postgres user when run as root.
    pg_dir = Path(tempfile.gettempdir()) / f"stack-pg-{os.getpid()}-{free_port()}"
    procs: dict[str, subprocess.Popen] = {}
    pg_started = False
    try:
        pg_started = True  # stop is harmless if start failed half-way
        database_url = start_postgres(pg_dir, free_port(), pg_log)

        catalog_port, admin_port, orders_port = free_port(), free_port(), free_port()
        catalog_url = f"http://127.0.0.1:{catalog_port}"
        stack = Stack(
            orders_url=f"http://127.0.0.1:{orders_port}",
            catalog_url=catalog_url,
            admin_url=f"http://127.0.0.1:{admin_port}",
            database_url=database_url,
            procs=procs,
            log_dir=log_dir,
            pg_dir=pg_dir,
        )
        env = {
            "CATALOG_LISTEN_ADDR": f"127.0.0.1:{catalog_port}",
            "CATALOG_ADMIN_ADDR": f"127.0.0.1:{admin_port}",
            **(catalog_env or {}),
        }
        procs["catalog"], stack.logs["catalog"] = spawn(
            "catalog", bindir / "catalog-service", env, log_dir
        )
        env = {
            "ORDERS_LISTEN_ADDR": f"127.0.0.1:{orders_port}",
            "CATALOG_URL": catalog_url,
            "DATABASE_URL": database_url,
            **(orders_env or {}),
        }
        procs["orders"], stack.logs["orders"] = spawn(
            "orders", bindir / "orders-service", env, log_dir
        )
        wait_ready(stack, ready_timeout)
        yield stack
    finally:
        # Shielded from a second Ctrl-C as far as Python allows: the cleanup runs
        # in full, orders first (it holds connections to the other two).
        previous = signal.signal(signal.SIGINT, signal.SIG_IGN) if _main_thread() else None
        try:
            for name in ("orders", "catalog"):
                if name in procs:
                    stop_process(procs[name])
            if pg_started:
                stop_postgres(pg_dir, pg_log)
        finally:
            if previous is not None:
                signal.signal(signal.SIGINT, previous)


def _main_thread() -> bool:
    import threading

    return threading.current_thread() is threading.main_thread()


def exit_on_sigterm() -> None:
    """Turns SIGTERM (a CI timeout, `kill`) into SystemExit so `finally` blocks run."""

    def handler(signum, frame):  # noqa: ARG001
        raise SystemExit(128 + signum)

    signal.signal(signal.SIGTERM, handler)


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    command: list[str] = []
    if "--" in argv:
        split = argv.index("--")
        argv, command = argv[:split], argv[split + 1 :]
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--profile", default="dev", choices=sorted(PROFILES))
    parser.add_argument("--log-dir", help="service logs go here (default: a new temp dir)")
    parser.add_argument(
        "--env",
        action="append",
        default=[],
        metavar="K=V",
        help="extra orders-service environment (repeatable)",
    )
    parser.add_argument(
        "--catalog-env", action="append", default=[], metavar="K=V", help="extra catalog-service environment"
    )
    parser.add_argument("--ready-timeout", type=float, default=60.0)
    args = parser.parse_args(argv)

    def pairs(items: list[str]) -> dict[str, str]:
        out = {}
        for item in items:
            key, sep, value = item.partition("=")
            if not sep:
                parser.error(f"expected K=V, got {item!r}")
            out[key] = value
        return out

    exit_on_sigterm()
    try:
        with running_stack(
            profile=args.profile,
            log_dir=args.log_dir,
            orders_env=pairs(args.env),
            catalog_env=pairs(args.catalog_env),
            ready_timeout=args.ready_timeout,
        ) as stack:
            for key, value in stack.env().items():
                print(f"{key}={value}", flush=True)
            print(f"LOG_DIR={stack.log_dir}", flush=True)
            if command:
                env = dict(os.environ)
                env.update(stack.env())
                return subprocess.run(command, env=env, check=False).returncode
            print("stack is up; Ctrl-C stops it", file=sys.stderr, flush=True)
            while True:
                stack.check_alive()
                time.sleep(1)
    except StackError as err:
        print(f"stack: {err}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())

#!/usr/bin/env python3
"""MCP acceptance check with a real MCP client (the official Python SDK, `mcp` 2.x).

Runs against a stack started by `cargo xtask stack` (scripts/mcp_check.sh does that),
which passes the URLs in ORDERS_URL, CATALOG_URL, CATALOG_ADMIN_URL and DATABASE_URL;
it connects to orders-service's `/mcp` over streamable HTTP and checks, one PASS/FAIL line each, with the numbers measured:

  a. initialize + tools/list: catalog_lookup and inventory_check, both requiring `sku`
  b. catalog_lookup succeeds with a JSON result carrying price_cents
  c. out of budget (catalog 2 s slow): an error result within the tool budget + 150 ms
  d. notifications/cancelled mid-flight, HTTP side: orders' catalog connection and the
     catalog's own in-flight request are gone within 200 ms
  e. notifications/cancelled mid-flight, SQL side: a SELECT waiting on a lock is
     cancelled on the PostgreSQL server within 200 ms; afterwards the tool works again
  f. an unknown tool is an error (not a hang); tool_calls_total has ok, timeout and
     cancelled
  g. a client that disconnects mid-call, with and without the session DELETE and with
     no notifications/cancelled: the catalog connection is released within 200 ms
     (the server's ClientGone token), not at the 800 ms tool budget

  d2. the SDK's own cancellation (cancelling the caller's task): released within 200 ms
  h. a call whose HTTP requests carry `X-Request-Timeout-Ms: 300` against a slow catalog:
     an error result within 300 + 150 ms

A check that cannot run (its precondition never came about) fails; nothing is skipped.

Exit status: 0 when every check passed, 1 otherwise, 2 when a URL is missing.

    cargo xtask stack --orders-env ASSISTANT_TOOL_BUDGET_MS=800 -- .venv/bin/python scripts/mcp_check.py
"""

from __future__ import annotations

import json
import logging
import re
import os
import shutil
import sys
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import anyio
import httpx2
from anyio.streams.buffered import BufferedByteReceiveStream
from mcp import ClientSession
from mcp import types as mcp_types
from mcp.client.streamable_http import streamable_http_client
from mcp.shared._httpx_utils import create_mcp_http_client
from mcp.shared.exceptions import MCPError
from mcp.shared.message import SessionMessage


@dataclass(frozen=True)
class Stack:
    """The URLs of the running stack, from the environment `cargo xtask stack` sets."""

    orders_url: str
    catalog_url: str
    admin_url: str
    database_url: str

    @property
    def mcp_url(self) -> str:
        return f"{self.orders_url}/mcp"

    @staticmethod
    def from_env() -> "Stack":
        names = ("ORDERS_URL", "CATALOG_URL", "CATALOG_ADMIN_URL", "DATABASE_URL")
        missing = [name for name in names if not os.environ.get(name)]
        if missing:
            raise KeyError(", ".join(missing))
        return Stack(*(os.environ[name].rstrip("/") for name in names))

TOOL_BUDGET_MS = 800  # ASSISTANT_TOOL_BUDGET_MS default; passed to the service explicitly
BUDGET_MARGIN_MS = 150
RELEASE_LIMIT_MS = 200
SLOW_CATALOG = {"delay_ms": 2000, "jitter_ms": 0, "error_rate": 0.0}
POLL_S = 0.010

ACTIVE = ("http_client_pool_active_connections", {"client": "catalog"})
CATALOG_IN_FLIGHT = ("http_server_requests_in_flight", {"uri": "/catalog/{sku}"})
LOCK_WAITERS_SQL = (
    "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
    "AND wait_event_type = 'Lock' AND query LIKE 'SELECT available FROM inventory%';"
)

WAITING_PID_SQL = (
    "SELECT coalesce(min(pid), 0) FROM pg_stat_activity WHERE datname = current_database() "
    "AND wait_event_type = 'Lock' AND query LIKE 'SELECT available FROM inventory%';"
)
BACKEND_ALIVE_SQL = "SELECT count(*) FROM pg_stat_activity WHERE pid = {pid};"


def now() -> float:
    return time.monotonic()


def ms(seconds: float) -> int:
    return round(seconds * 1000)


# --- reporting ----------------------------------------------------------------------


class Report:
    def __init__(self) -> None:
        self.failed: list[str] = []
        self.passed = 0

    def check(self, name: str, ok: bool, detail: str) -> bool:
        print(f"{'PASS' if ok else 'FAIL'} {name}: {detail}", flush=True)
        if ok:
            self.passed += 1
        else:
            self.failed.append(name)
        return ok


# --- Prometheus text ----------------------------------------------------------------

LABEL_RE = re.compile(r'(\w+)="((?:[^"\\]|\\.)*)"')


def parse_metrics(text: str) -> list[tuple[str, dict[str, str], float]]:
    samples = []
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        if "{" in line:
            name, rest = line.split("{", 1)
            labels_text, _, value_text = rest.rpartition("}")
            labels = dict(LABEL_RE.findall(labels_text))
        else:
            name, _, value_text = line.partition(" ")
            labels = {}
        try:
            value = float(value_text.split()[0])
        except (ValueError, IndexError):
            continue
        samples.append((name.strip(), labels, value))
    return samples


def metric(samples, name: str, labels: dict[str, str]) -> float | None:
    """The value of the series `name` whose labels include `labels`; None if absent."""
    for sample_name, sample_labels, value in samples:
        if sample_name == name and all(sample_labels.get(k) == v for k, v in labels.items()):
            return value
    return None


class Probe:
    """Reads the two services' /metrics and the catalog admin API."""

    def __init__(self, stack: Stack, http: httpx2.AsyncClient) -> None:
        self.stack = stack
        self.http = http

    async def samples(self, base: str):
        response = await self.http.get(f"{base}/metrics", timeout=2.0)
        response.raise_for_status()
        return parse_metrics(response.text)

    async def active(self) -> float:
        # An absent series counts as 0 (nothing registered yet).
        return metric(await self.samples(self.stack.orders_url), *ACTIVE) or 0.0

    async def catalog_in_flight(self) -> float:
        return metric(await self.samples(self.stack.catalog_url), *CATALOG_IN_FLIGHT) or 0.0

    async def released(self) -> tuple[float, float]:
        return await self.active(), await self.catalog_in_flight()

    async def set_faults(self, faults: dict[str, Any] | None) -> None:
        url = f"{self.stack.admin_url}/admin/faults"
        if faults is None:
            response = await self.http.delete(url, timeout=2.0)
        else:
            response = await self.http.put(url, json=faults, timeout=2.0)
        response.raise_for_status()


async def poll_until(
    condition: Callable[[], Awaitable[bool]], timeout: float, interval: float = POLL_S
) -> float | None:
    """Polls `condition` every `interval` s; the monotonic time it first held, or None."""
    end = now() + timeout
    while True:
        if await condition():
            return now()
        if now() >= end:
            return None
        await anyio.sleep(interval)


# --- watching what the SDK writes ---------------------------------------------------


class TapWriteStream:
    """Sits between ClientSession and the transport: records every outgoing JSON-RPC
    message (to learn the request id the SDK gave a tools/call, and whether the SDK
    itself sent notifications/cancelled), and can drop cancellations to simulate a
    client that just goes away."""

    def __init__(self, inner) -> None:
        self.inner = inner
        self.sent: list[tuple[float, Any]] = []
        self.drop_cancels = False
        self.dropped = 0

    async def send(self, item: SessionMessage) -> None:
        message = item.message
        self.sent.append((now(), message))
        if self.drop_cancels and getattr(message, "method", None) == "notifications/cancelled":
            self.dropped += 1
            return
        await self.inner.send(item)

    async def aclose(self) -> None:
        await self.inner.aclose()

    async def __aenter__(self):
        await self.inner.__aenter__()
        return self

    async def __aexit__(self, *exc):
        return await self.inner.__aexit__(*exc)

    def mark(self) -> int:
        return len(self.sent)

    def cancels_since(self, mark: int) -> list[tuple[float, Any]]:
        return [
            (t, m.params.get("requestId") if isinstance(m.params, dict) else None)
            for t, m in self.sent[mark:]
            if getattr(m, "method", None) == "notifications/cancelled"
        ]

    async def request_id_since(self, mark: int, method: str, timeout: float = 2.0):
        end = now() + timeout
        while now() < end:
            for _, message in self.sent[mark:]:
                if getattr(message, "method", None) == method and hasattr(message, "id"):
                    return message.id
            await anyio.sleep(0.002)
        raise TimeoutError(f"the SDK sent no {method} request within {timeout} s")


class CallTask:
    """A call_tool running in the background, so the check can cancel it."""

    def __init__(self, session: ClientSession, name: str, arguments: dict[str, Any]) -> None:
        self.session, self.name, self.arguments = session, name, arguments
        self.result: Any = None
        self.error: BaseException | None = None
        self.done = anyio.Event()
        self.scope = anyio.CancelScope()
        self.started = 0.0
        self.finished: float | None = None
        self.cancelled = False

    async def run(self) -> None:
        self.started = now()
        with self.scope:
            try:
                self.result = await self.session.call_tool(self.name, self.arguments)
            except MCPError as err:
                self.error = err
            finally:
                self.finished = now()
                self.done.set()
        if self.scope.cancelled_caught:
            self.cancelled = True

    async def settle(self, wait: float) -> str:
        """Waits up to `wait` s for an answer, then cancels the caller; describes what came."""
        with anyio.move_on_after(wait):
            await self.done.wait()
        if not self.done.is_set():
            self.scope.cancel()
            with anyio.move_on_after(2.0):
                await self.done.wait()
            return f"no answer to the call within {ms(wait)} ms (caller then cancelled locally)"
        if self.error is not None:
            return f"answered with JSON-RPC error {self.error}"
        return f"answered isError={self.result.is_error} {text_of(self.result)[:80]!r}"


def text_of(result: mcp_types.CallToolResult) -> str:
    return "".join(getattr(block, "text", "") for block in result.content)


async def cancel_request(session: ClientSession, request_id, reason: str) -> None:
    await session.send_notification(
        mcp_types.CancelledNotification(
            params=mcp_types.CancelledNotificationParams(request_id=request_id, reason=reason)
        )
    )


# --- psql helpers -------------------------------------------------------------------


class Psql:
    """A long-lived `psql` fed through stdin; `query` returns the first output line."""

    def __init__(self, url: str, label: str) -> None:
        self.url, self.label = url, label
        self.proc: anyio.abc.Process | None = None
        self.out: BufferedByteReceiveStream | None = None

    async def start(self) -> None:
        psql = shutil.which("psql") or "psql"
        self.proc = await anyio.open_process(
            [psql, "-X", "-q", "-A", "-t", "-v", "ON_ERROR_STOP=1", self.url],
            stdin=-1,
            stdout=-1,
            stderr=-1,
        )
        self.out = BufferedByteReceiveStream(self.proc.stdout)

    async def query(self, sql: str, timeout: float = 5.0) -> str:
        assert self.proc and self.proc.stdin and self.out
        with anyio.fail_after(timeout):
            await self.proc.stdin.send(sql.encode() + b"\n")
            return (await self.out.receive_until(b"\n", 65536)).decode().strip()

    async def send(self, sql: str) -> None:
        assert self.proc and self.proc.stdin
        await self.proc.stdin.send(sql.encode() + b"\n")

    async def close(self) -> None:
        if self.proc is None:
            return
        with anyio.move_on_after(5.0, shield=True) as scope:
            try:
                if self.proc.stdin:
                    await self.proc.stdin.aclose()
            except (anyio.BrokenResourceError, anyio.ClosedResourceError, OSError):
                pass
            await self.proc.wait()
        if scope.cancelled_caught and self.proc.returncode is None:
            self.proc.kill()
            with anyio.move_on_after(2.0, shield=True):
                await self.proc.wait()
        await self.proc.aclose()
        self.proc = None


# --- the checks ---------------------------------------------------------------------


async def wait_released(probe: Probe, timeout: float = 3.0) -> bool:
    async def idle() -> bool:
        active, in_flight = await probe.released()
        return active == 0 and in_flight == 0

    return await poll_until(idle, timeout, 0.02) is not None


async def check_listing(report: Report, session: ClientSession) -> None:
    started = now()
    init = await session.initialize()
    listing = await session.list_tools()
    took = ms(now() - started)
    tools = {tool.name: tool for tool in listing.tools}
    problems = []
    for name in ("catalog_lookup", "inventory_check"):
        tool = tools.get(name)
        if tool is None:
            problems.append(f"{name} missing")
        elif "sku" not in (tool.input_schema or {}).get("required", []):
            problems.append(f"{name} schema does not require sku: {tool.input_schema}")
    report.check(
        "a. initialize + list_tools",
        not problems,
        f"protocol {init.protocol_version}, server {init.server_info.name} "
        f"{init.server_info.version}, tools {sorted(tools)}, both require sku; {took} ms"
        if not problems
        else "; ".join(problems),
    )


async def check_lookup(report: Report, session: ClientSession) -> None:
    started = now()
    with anyio.fail_after(5):
        result = await session.call_tool("catalog_lookup", {"sku": "SKU-00042"})
    took = ms(now() - started)
    try:
        body = json.loads(text_of(result))
        ok = not result.is_error and isinstance(body.get("price_cents"), int)
    except (json.JSONDecodeError, AttributeError):
        body, ok = text_of(result), False
    report.check(
        "b. catalog_lookup SKU-00042",
        ok,
        f"isError={result.is_error}, {took} ms, content {body}",
    )


async def check_out_of_budget(report: Report, session: ClientSession, probe: Probe) -> None:
    limit = TOOL_BUDGET_MS + BUDGET_MARGIN_MS
    started = now()
    try:
        with anyio.fail_after(5):
            result = await session.call_tool("catalog_lookup", {"sku": "SKU-00042"})
    except TimeoutError:
        report.check("c. out of budget", False, "no answer within 5 s: the call hangs")
        return
    took = ms(now() - started)
    report.check(
        "c. out of budget (catalog +2000 ms)",
        result.is_error is True and took <= limit,
        f"isError={result.is_error} after {took} ms (limit {TOOL_BUDGET_MS} + {BUDGET_MARGIN_MS}): "
        f"{text_of(result)!r}",
    )
    await wait_released(probe)


async def start_call(tg, tap: TapWriteStream, session: ClientSession, name: str, args: dict[str, Any]):
    mark = tap.mark()
    call = CallTask(session, name, args)
    tg.start_soon(call.run)
    request_id = await tap.request_id_since(mark, "tools/call")
    return call, request_id, mark


async def check_cancel_http(report: Report, session: ClientSession, tap: TapWriteStream, probe: Probe) -> None:
    name = "d. cancel mid-flight, HTTP side"
    if not await wait_released(probe):
        report.check(name, False, "catalog connections still busy from an earlier step")
        return
    async with anyio.create_task_group() as tg:
        call, request_id, _ = await start_call(tg, tap, session, "catalog_lookup", {"sku": "SKU-00042"})

        async def active_one() -> bool:
            return await probe.active() == 1

        seen = await poll_until(active_one, 2.0)
        if seen is None:
            report.check(name, False, "orders never showed an active catalog connection within 2 s")
            call.scope.cancel()
            return
        catalog_busy = await probe.catalog_in_flight()
        cancel_at = now()
        await cancel_request(session, request_id, "mcp_check: cancel mid-flight")
        state: dict[str, float] = {}

        async def released() -> bool:
            state["active"], state["in_flight"] = await probe.released()
            return state["active"] == 0 and state["in_flight"] == 0

        done = await poll_until(released, 1.5)
        answer = await call.settle(1.0)
    since_start = ms(cancel_at - call.started)
    if done is None:
        report.check(
            name,
            False,
            f"request id {request_id}, cancelled {since_start} ms into the call; after 1500 ms still "
            f"active={state.get('active')} catalog in-flight={state.get('in_flight')}; {answer}",
        )
        return
    release = ms(done - cancel_at)
    report.check(
        name,
        release <= RELEASE_LIMIT_MS,
        f"request id {request_id} cancelled {since_start} ms into the call (catalog in-flight was "
        f"{catalog_busy:g}); orders active=0 and catalog in-flight=0 {release} ms after the cancel "
        f"(limit {RELEASE_LIMIT_MS}); {answer}",
    )


async def check_sdk_cancel(report: Report, session: ClientSession, tap: TapWriteStream, probe: Probe) -> None:
    """INFO: what the SDK itself does when the caller's task is cancelled."""
    name = "d2. SDK-native cancel (cancel the caller's anyio task)"
    if not await wait_released(probe):
        report.check(name, False, "could not run: catalog connections still busy from an earlier step")
        return
    async with anyio.create_task_group() as tg:
        call, request_id, mark = await start_call(tg, tap, session, "catalog_lookup", {"sku": "SKU-00007"})

        async def active_one() -> bool:
            return await probe.active() == 1

        if await poll_until(active_one, 2.0) is None:
            report.check(name, False, "could not run: orders never showed an active catalog connection")
            call.scope.cancel()
            return
        cancel_at = now()
        call.scope.cancel()
        with anyio.move_on_after(2.0):
            await call.done.wait()

        async def released() -> bool:
            active, in_flight = await probe.released()
            return active == 0 and in_flight == 0

        done = await poll_until(released, 1.5)
    cancels = [(ms(t - cancel_at), rid) for t, rid in tap.cancels_since(mark)]
    sent = f"the SDK sent notifications/cancelled {cancels}" if cancels else "the SDK sent no notifications/cancelled"
    release = f"released {ms(done - cancel_at)} ms after the task was cancelled" if done else "not released within 1500 ms"
    report.check(
        name,
        done is not None and done - cancel_at <= RELEASE_LIMIT_MS / 1000,
        f"request id {request_id}: {sent} (ms after cancel, id); {release} (limit {RELEASE_LIMIT_MS} ms)",
    )


async def check_cancel_sql(report: Report, session: ClientSession, tap: TapWriteStream, stack) -> None:
    name = "e. cancel mid-flight, SQL side"
    holder = Psql(stack.database_url, "lock holder")
    monitor = Psql(stack.database_url, "monitor")
    try:
        await holder.start()
        await monitor.start()
        await holder.send("BEGIN;")
        locked = await holder.query("LOCK TABLE inventory IN ACCESS EXCLUSIVE MODE; SELECT 'locked';")
        if locked != "locked":
            report.check(name, False, f"could not lock inventory: {locked!r}")
            return

        async def waiting() -> int:
            return int(await monitor.query(LOCK_WAITERS_SQL))

        async with anyio.create_task_group() as tg:
            call, request_id, _ = await start_call(tg, tap, session, "inventory_check", {"sku": "SKU-00001"})

            async def blocked() -> bool:
                return await waiting() >= 1

            seen = await poll_until(blocked, 2.0)
            if seen is None:
                report.check(name, False, "the tool's SELECT never showed up waiting on the lock within 2 s")
                call.scope.cancel()
                return
            # The pooled session the tool runs on: it must outlive the cancel.
            pid = int(await monitor.query(WAITING_PID_SQL))
            cancel_at = now()
            await cancel_request(session, request_id, "mcp_check: cancel mid-flight")

            async def gone() -> bool:
                return await waiting() == 0

            done = await poll_until(gone, 1.5)
            answer = await call.settle(1.0)
        since_start = ms(cancel_at - call.started)
        if done is None:
            report.check(
                name,
                False,
                f"request id {request_id} cancelled {since_start} ms into the call; the SELECT was "
                f"still waiting on the lock 1500 ms later; {answer}",
            )
        else:
            release = ms(done - cancel_at)
            report.check(
                name,
                release <= RELEASE_LIMIT_MS,
                f"request id {request_id} cancelled {since_start} ms into the call; the waiting SELECT "
                f"was gone from pg_stat_activity {release} ms after the cancel (limit "
                f"{RELEASE_LIMIT_MS}; its lock_timeout was ~{TOOL_BUDGET_MS - 10} ms); {answer}",
            )
        await holder.query("ROLLBACK; SELECT 'released';")
        alive = int(await monitor.query(BACKEND_ALIVE_SQL.format(pid=pid)))
        report.check(
            "e3. the cancelled statement's pooled session survives the cancel",
            alive == 1,
            f"backend pid {pid} {'is still connected' if alive else 'was closed (a reconnect per cancel)'}",
        )
    finally:
        await holder.close()
        await monitor.close()

    started = now()
    with anyio.fail_after(5):
        result = await session.call_tool("inventory_check", {"sku": "SKU-00001"})
    took = ms(now() - started)
    try:
        ok = not result.is_error and isinstance(json.loads(text_of(result)).get("available"), int)
    except (json.JSONDecodeError, AttributeError):
        ok = False
    report.check(
        "e2. inventory_check after the lock is released",
        ok,
        f"isError={result.is_error}, {took} ms, content {text_of(result)}",
    )


async def check_unknown_and_counters(report: Report, session: ClientSession, probe: Probe) -> None:
    started = now()
    try:
        with anyio.fail_after(5):
            result = await session.call_tool("no_such_tool", {"sku": "SKU-00001"})
        outcome = f"isError={result.is_error} {text_of(result)!r}"
        ok = result.is_error is True
    except MCPError as err:
        outcome, ok = f"JSON-RPC error {err.code}: {err}", True
    except TimeoutError:
        outcome, ok = "no answer within 5 s", False
    report.check("f. unknown tool", ok, f"{outcome} after {ms(now() - started)} ms")

    samples = await probe.samples(probe.stack.orders_url)
    series = {
        (labels.get("tool_name"), labels.get("outcome")): value
        for name, labels, value in samples
        if name == "tool_calls_total"
    }
    want = [
        ("catalog_lookup", "ok"),
        ("catalog_lookup", "timeout"),
        ("catalog_lookup", "cancelled"),
        ("inventory_check", "ok"),
        ("inventory_check", "cancelled"),
    ]
    missing = [f"{tool}/{outcome}" for tool, outcome in want if series.get((tool, outcome), 0) < 1]
    shown = ", ".join(f"{t}/{o}={v:g}" for (t, o), v in sorted(series.items()) if v)
    report.check("f2. tool_calls_total outcomes", not missing, shown + (f"; missing {missing}" if missing else ""))


async def probe_disconnect(report: Report, stack, probe: Probe, send_delete: bool) -> None:
    """g. The client goes away mid-call without notifications/cancelled."""
    how = "session closed (DELETE /mcp sent), no cancel" if send_delete else "connection dropped (no DELETE, no cancel)"
    name = f"g. disconnect: {how}"
    if not await wait_released(probe):
        report.check(name, False, "could not run: catalog connections still busy from an earlier step")
        return
    closed_at = started = 0.0
    async with streamable_http_client(stack.mcp_url, terminate_on_close=send_delete) as (read, write):
        tap = TapWriteStream(write)
        tap.drop_cancels = True
        async with ClientSession(read, tap) as session:
            with anyio.fail_after(5):
                await session.initialize()
            async with anyio.create_task_group() as tg:
                call, request_id, _ = await start_call(tg, tap, session, "catalog_lookup", {"sku": "SKU-00003"})
                started = call.started

                async def active_one() -> bool:
                    return await probe.active() == 1

                if await poll_until(active_one, 2.0) is None:
                    report.check(name, False, "could not run: orders never showed an active catalog connection")
                    tg.cancel_scope.cancel()
                    return
                closed_at = now()
                tg.cancel_scope.cancel()
        # Leaving the transport closes the POST's connection (and sends DELETE if asked).
    left_at = now()

    async def released() -> bool:
        active, in_flight = await probe.released()
        return active == 0 and in_flight == 0

    done = await poll_until(released, 2.0)
    if done is None:
        report.check(name, False, "catalog connection NOT released within 2000 ms of the disconnect")
        return
    report.check(
        name,
        done - closed_at <= 0.2,
        f"transport closed {ms(left_at - closed_at)} ms after the decision; catalog connection "
        f"released {ms(done - closed_at)} ms after the disconnect = {ms(done - started)} ms after the "
        f"call started (limit 200 ms; tool budget {TOOL_BUDGET_MS} ms; cancels suppressed: {tap.dropped})",
    )


async def probe_header_budget(report: Report, stack, probe: Probe) -> None:
    """h. X-Request-Timeout-Ms: 300 on the transport's HTTP requests bounds the tool (the
    catalog is slow: run_checks sets SLOW_CATALOG around this step)."""
    name = "h. X-Request-Timeout-Ms: 300 on the MCP requests"
    if not await wait_released(probe):
        report.check(name, False, "could not run: catalog connections still busy from an earlier step")
        return
    bounded = False
    client = create_mcp_http_client(headers={"X-Request-Timeout-Ms": "300"})
    async with client, streamable_http_client(stack.mcp_url, http_client=client) as (read, write):
        async with ClientSession(read, write) as session:
            with anyio.fail_after(5):
                await session.initialize()
            started = now()
            try:
                with anyio.fail_after(5):
                    result = await session.call_tool("catalog_lookup", {"sku": "SKU-00042"})
                took = ms(now() - started)
                bounded = bool(result.is_error) and took <= 300 + BUDGET_MARGIN_MS
                detail = f"isError={result.is_error} after {took} ms (limit 300 + {BUDGET_MARGIN_MS}): {text_of(result)!r}"
            except MCPError as err:
                detail = f"JSON-RPC error after {ms(now() - started)} ms: {err}"
            except TimeoutError:
                detail = "no answer within 5 s"
    report.check(name, bounded, detail)


async def run_checks(report: Report, stack) -> None:
    async with httpx2.AsyncClient() as http:
        probe = Probe(stack, http)
        await probe.set_faults(None)
        async with streamable_http_client(stack.mcp_url) as (read, write):
            tap = TapWriteStream(write)
            async with ClientSession(read, tap) as session:
                with anyio.fail_after(10):
                    await check_listing(report, session)
                await check_lookup(report, session)
                await probe.set_faults(SLOW_CATALOG)
                try:
                    await check_out_of_budget(report, session, probe)
                    with anyio.fail_after(15):
                        await check_cancel_http(report, session, tap, probe)
                    with anyio.fail_after(15):
                        await check_sdk_cancel(report, session, tap, probe)
                finally:
                    await probe.set_faults(None)
                with anyio.fail_after(20):
                    await check_cancel_sql(report, session, tap, stack)
                await check_unknown_and_counters(report, session, probe)
        await probe.set_faults(SLOW_CATALOG)
        try:
            for send_delete in (False, True):
                with anyio.fail_after(15):
                    await probe_disconnect(report, stack, probe, send_delete)
            with anyio.fail_after(15):
                await probe_header_budget(report, stack, probe)
        finally:
            await probe.set_faults(None)


def main() -> int:
    # The SDK logs through `logging`; mark its lines so they are not mistaken for ours
    # (e.g. "Session termination failed: 202": rmcp answers DELETE /mcp with 202).
    logging.basicConfig(level=logging.WARNING, format="  sdk log %(levelname)s %(name)s: %(message)s")
    try:
        stack = Stack.from_env()
    except KeyError as err:
        print(f"FAIL stack: {err} not set; run through scripts/mcp_check.sh (cargo xtask stack)", flush=True)
        return 2
    report = Report()
    started = now()
    try:
        anyio.run(run_checks, report, stack)
    except KeyboardInterrupt:
        print("interrupted", flush=True)
        return 130
    except Exception as err:  # noqa: BLE001 - report it as a failure
        report.check("run", False, f"{type(err).__name__}: {err}")
        import traceback

        traceback.print_exc()
    total = report.passed + len(report.failed)
    print(
        f"mcp_check: {report.passed}/{total} passed in {now() - started:.1f} s"
        + (f"; FAILED: {', '.join(report.failed)}" if report.failed else ""),
        flush=True,
    )
    return 1 if report.failed else 0


if __name__ == "__main__":
    sys.exit(main())

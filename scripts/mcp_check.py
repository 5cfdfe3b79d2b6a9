#!/usr/bin/env python3
"""MCP interop check with an outside client: the official Python SDK (`mcp` 2.x).

Only what a client other than rmcp can prove: the official SDK talks to orders-service's
`/mcp` (streamable HTTP), and its own way of giving up on a call is honoured. The rest
(the header budget capping the tool, notifications/cancelled stopping the catalog call
and the SQL statement, a client that disconnects without a word) is checked in Rust by
orders-service/tests/mcp.rs. Run by scripts/mcp_check.sh under `cargo xtask stack`
(ORDERS_URL, CATALOG_URL, CATALOG_ADMIN_URL); one PASS/FAIL line per check, with the
numbers measured:

  a. initialize + tools/list: catalog_lookup and inventory_check, both requiring `sku`
  b. catalog_lookup succeeds with a JSON result carrying price_cents
  c. out of budget (catalog 2 s slow): an error result within the tool budget + 150 ms
  d. the SDK's own cancellation (cancelling the caller's task mid-call): orders' catalog
     connection and the catalog's own in-flight request are gone within 200 ms
  e. an unknown tool is an error (not a hang)
  f. tool_calls_total has catalog_lookup ok, timeout and cancelled

A check whose precondition never came about fails; nothing is skipped. Exit status: 0
when every check passed, 1 otherwise, 2 when a URL is missing.

    cargo xtask stack --orders-env ASSISTANT_TOOL_BUDGET_MS=800 -- .venv/bin/python scripts/mcp_check.py
"""

from __future__ import annotations

import json
import logging
import os
import re
import sys
import time
import traceback
from collections.abc import Awaitable, Callable

import anyio
import httpx2
from mcp import ClientSession
from mcp.client.streamable_http import streamable_http_client
from mcp.shared.exceptions import MCPError

TOOL_BUDGET_MS = 800  # ASSISTANT_TOOL_BUDGET_MS default; passed to the service explicitly
BUDGET_MARGIN_MS = 150
RELEASE_LIMIT_MS = 200
SLOW_CATALOG = {"delay_ms": 2000, "jitter_ms": 0, "error_rate": 0.0}
SAMPLE_RE = re.compile(r"^(\w+)(?:\{(.*)\})?\s+(\S+)")
LABEL_RE = re.compile(r'(\w+)="((?:[^"\\]|\\.)*)"')
now = time.monotonic


def ms(seconds: float) -> int:
    return round(seconds * 1000)


class Report:
    def __init__(self) -> None:
        self.passed, self.failed = 0, []

    def check(self, name: str, ok: bool, detail: str) -> None:
        print(f"{'PASS' if ok else 'FAIL'} {name}: {detail}", flush=True)
        self.passed += ok
        self.failed += [] if ok else [name]


def samples(text: str):
    """(name, labels, value) for each sample of a Prometheus text exposition."""
    for match in filter(None, map(SAMPLE_RE.match, text.splitlines())):
        yield match[1], dict(LABEL_RE.findall(match[2] or "")), float(match[3])


class Probe:
    """Reads both services' /metrics and sets the catalog's faults (its admin API)."""

    def __init__(self, http: httpx2.AsyncClient) -> None:
        self.http = http
        self.orders, self.catalog, self.admin = (
            os.environ[name].rstrip("/") for name in ("ORDERS_URL", "CATALOG_URL", "CATALOG_ADMIN_URL")
        )

    async def metric(self, base: str, name: str, labels: dict[str, str]) -> float:
        response = await self.http.get(f"{base}/metrics", timeout=2.0)
        response.raise_for_status()
        for sample, sample_labels, value in samples(response.text):
            if sample == name and all(sample_labels.get(k) == v for k, v in labels.items()):
                return value
        return 0.0  # not registered yet

    async def active(self) -> float:
        return await self.metric(self.orders, "http_client_pool_active_connections", {"client": "catalog"})

    async def released(self) -> bool:
        in_flight = await self.metric(self.catalog, "http_server_requests_in_flight", {"uri": "/catalog/{sku}"})
        return in_flight == 0 and await self.active() == 0

    async def set_faults(self, faults: dict | None) -> None:
        url = f"{self.admin}/admin/faults"
        response = await (self.http.delete(url) if faults is None else self.http.put(url, json=faults))
        response.raise_for_status()


async def poll_until(condition: Callable[[], Awaitable[bool]], timeout: float) -> float | None:
    """Polls `condition` every 10 ms; the monotonic time it first held, or None."""
    end = now() + timeout
    while not await condition():
        if now() >= end:
            return None
        await anyio.sleep(0.010)
    return now()


def text_of(result) -> str:
    return "".join(getattr(block, "text", "") for block in result.content)


async def check_listing(report: Report, session: ClientSession) -> None:
    started = now()
    init = await session.initialize()
    tools = {tool.name: tool for tool in (await session.list_tools()).tools}
    took = ms(now() - started)
    problems = [
        f"{name} missing or not requiring sku"
        for name in ("catalog_lookup", "inventory_check")
        if name not in tools or "sku" not in (tools[name].input_schema or {}).get("required", [])
    ]
    server = f"protocol {init.protocol_version}, server {init.server_info.name} {init.server_info.version}"
    detail = f"{server}, tools {sorted(tools)}, both require sku; {took} ms"
    report.check("a. initialize + list_tools", not problems, "; ".join(problems) or detail)


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
    report.check("b. catalog_lookup SKU-00042", ok, f"isError={result.is_error}, {took} ms, content {body}")


async def check_out_of_budget(report: Report, session: ClientSession) -> None:
    name = "c. out of budget (catalog +2000 ms)"
    started = now()
    try:
        with anyio.fail_after(5):
            result = await session.call_tool("catalog_lookup", {"sku": "SKU-00042"})
    except TimeoutError:
        return report.check(name, False, "no answer within 5 s: the call hangs")
    took = ms(now() - started)
    report.check(
        name,
        result.is_error is True and took <= TOOL_BUDGET_MS + BUDGET_MARGIN_MS,
        f"isError={result.is_error} after {took} ms (limit {TOOL_BUDGET_MS} + {BUDGET_MARGIN_MS}): "
        f"{text_of(result)!r}",
    )


async def check_sdk_cancel(report: Report, session: ClientSession, probe: Probe) -> None:
    name = "d. SDK-native cancel (cancel the caller's anyio task)"
    if await poll_until(probe.released, 3.0) is None:
        report.check(name, False, "could not run: catalog connections still busy from an earlier step")
        return
    scope = anyio.CancelScope()

    async def caller() -> None:
        with scope:
            await session.call_tool("catalog_lookup", {"sku": "SKU-00007"})

    async def active_one() -> bool:
        return await probe.active() == 1

    async with anyio.create_task_group() as tg:
        started = now()
        tg.start_soon(caller)
        if await poll_until(active_one, 2.0) is None:
            scope.cancel()
            report.check(name, False, "could not run: orders never showed an active catalog connection")
            return
        cancel_at = now()
        scope.cancel()
    done = await poll_until(probe.released, 1.5)
    release = f"{ms(done - cancel_at)} ms after the cancel" if done else "NOT within 1500 ms of the cancel"
    report.check(
        name,
        done is not None and ms(done - cancel_at) <= RELEASE_LIMIT_MS,
        f"cancelled {ms(cancel_at - started)} ms into the call; orders active=0 and catalog in-flight=0 "
        f"{release} (limit {RELEASE_LIMIT_MS} ms; tool budget {TOOL_BUDGET_MS} ms)",
    )


async def check_unknown_and_counters(report: Report, session: ClientSession, probe: Probe) -> None:
    started = now()
    try:
        with anyio.fail_after(5):
            result = await session.call_tool("no_such_tool", {"sku": "SKU-00001"})
        outcome, ok = f"isError={result.is_error} {text_of(result)!r}", result.is_error is True
    except MCPError as err:
        outcome, ok = f"JSON-RPC error {err.code}: {err}", True
    except TimeoutError:
        outcome, ok = "no answer within 5 s", False
    report.check("e. unknown tool", ok, f"{outcome} after {ms(now() - started)} ms")

    response = await probe.http.get(f"{probe.orders}/metrics", timeout=2.0)
    series = {
        (labels.get("tool_name"), labels.get("outcome")): value
        for name, labels, value in samples(response.text)
        if name == "tool_calls_total"
    }
    missing = [o for o in ("ok", "timeout", "cancelled") if series.get(("catalog_lookup", o), 0) < 1]
    shown = ", ".join(f"{t}/{o}={v:g}" for (t, o), v in sorted(series.items()) if v)
    report.check("f. tool_calls_total outcomes", not missing, shown + (f"; missing {missing}" if missing else ""))


async def run_checks(report: Report) -> None:
    async with httpx2.AsyncClient(timeout=2.0) as http:
        probe = Probe(http)
        await probe.set_faults(None)
        async with streamable_http_client(f"{probe.orders}/mcp") as (read, write):
            async with ClientSession(read, write) as session:
                with anyio.fail_after(10):
                    await check_listing(report, session)
                await check_lookup(report, session)
                await probe.set_faults(SLOW_CATALOG)
                try:
                    await check_out_of_budget(report, session)
                    with anyio.fail_after(15):
                        await check_sdk_cancel(report, session, probe)
                finally:
                    await probe.set_faults(None)
                await check_unknown_and_counters(report, session, probe)


def main() -> int:
    # The SDK logs through `logging`; mark its lines so they are not mistaken for ours
    # (e.g. "Session termination failed: 202": rmcp answers DELETE /mcp with 202).
    logging.basicConfig(level=logging.WARNING, format="  sdk log %(levelname)s %(name)s: %(message)s")
    missing = [name for name in ("ORDERS_URL", "CATALOG_URL", "CATALOG_ADMIN_URL") if not os.environ.get(name)]
    if missing:
        print(f"FAIL stack: {', '.join(missing)} not set; run through scripts/mcp_check.sh", flush=True)
        return 2
    report = Report()
    started = now()
    try:
        anyio.run(run_checks, report)
    except Exception as err:  # noqa: BLE001 - report it as a failure
        report.check("run", False, f"{type(err).__name__}: {err}")
        traceback.print_exc()
    total = report.passed + len(report.failed)
    failed = f"; FAILED: {', '.join(report.failed)}" if report.failed else ""
    print(f"mcp_check: {report.passed}/{total} passed in {now() - started:.1f} s{failed}", flush=True)
    return 1 if report.failed else 0


if __name__ == "__main__":
    sys.exit(main())

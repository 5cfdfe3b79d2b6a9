#!/usr/bin/env python3
"""Checks the Grafana dashboards under grafana/dashboards (Python 3.11+, stdlib only).

Static checks (always):
  - every dashboard file parses as JSON, has a uid unique across the files and a
    panel list;
  - every dashboard has a `datasource` variable of type datasource whose default is
    the uid `prometheus` (the uid grafana/provisioning/datasources provides), and
    every panel, target and annotation query uses `${datasource}`;
  - every panel (rows excepted: they only group) has a non-empty description and at
    least one target; every target has a non-empty `expr` and a unique refId;
  - every `$variable` in an expr is a dashboard variable or a Grafana built-in;
  - no expr depends on the scrape job's name (`job`), and every range window is
    `$__rate_interval` (the seed query excepted: it must stay unchanged);
  - every metric name in an expr is one of the contract's families (docs/design.md
    §7), so a typo fails here, before any Prometheus is involved;
  - the seed's query appears unchanged in some dashboard (docs/design.md §7).

Live checks (with --prometheus URL): each panel expr, with dashboard variables replaced
by their defaults and $__rate_interval by 1m, runs as an instant query against that
Prometheus (GET /api/v1/query). A query that errors or returns no series fails the
run. A histogram_quantile over a window without observations returns NaN: that is
data (the series exist), and is reported as such. Annotation queries are checked
statically only (they return data only while a fault is injected).

Rules (with --prometheus URL): the rules Prometheus loaded from prometheus/rules/
(GET /api/v1/rules) must all be there, evaluated without error (health "ok"), and every
recording rule's series must exist (queried by its name, NaN allowed as above). An
alert's expression returning nothing is an alert not firing, which is not a failure.

One line per panel is printed; failures are listed again at the end, and the exit
status is non-zero when any check failed.

  python3 scripts/check_dashboards.py                          # static checks only
  python3 scripts/check_dashboards.py --prometheus http://127.0.0.1:9090 --wait 30
"""

from __future__ import annotations

import argparse
import json
import math
import re
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent
DATASOURCE_UID = "prometheus"
# Panels name the datasource through this dashboard variable, so the dashboard works
# with any Prometheus datasource; its default is DATASOURCE_UID.
DATASOURCE_REF = "${datasource}"

SEED_QUERY = (
    "histogram_quantile(0.99, sum by (le) "
    '(rate(http_server_requests_seconds_bucket{uri="/api/orders"}[1m])))'
)

# docs/design.md §7 (contract). Keep in sync with it and with shared/src/metrics.
HISTOGRAMS = {
    "http_server_requests_seconds",
    "http_client_requests_seconds",
    "http_client_pool_acquire_seconds",
    "deadline_inbound_budget_seconds",
    "deadline_remaining_seconds",
}
GAUGES = {
    "http_server_requests_in_flight",
    "http_client_pool_pending_acquires",
    "http_client_pool_active_connections",
    "db_pool_connections",
    "db_pool_pending_acquires",
    "deadline_policy_seconds",
    "http_client_pool_limit",
    "catalog_fault_delay_seconds",
    "process_resident_memory_bytes",
}
COUNTERS = {
    "http_client_pool_rejections_total",
    "deadline_clamped_total",
    "deadline_exceeded_total",
    "tool_calls_total",
    "http_client_retries_total",
    "process_cpu_seconds_total",
}
# k6's own metrics, remote-written by docker-compose's k6 (experimental-prometheus-rw):
# not the services' contract, and absent unless k6 writes them (--allow-no-data k6_).
K6_METRICS = {"k6_http_reqs_total", "k6_http_req_duration_p99", "k6_vus"}
KNOWN_METRICS = (
    GAUGES
    | COUNTERS
    | {f"{h}{suffix}" for h in HISTOGRAMS for suffix in ("_bucket", "_sum", "_count")}
    | K6_METRICS
    | {"up"}  # written by Prometheus itself for every target
)

# What an instant query gets in place of Grafana's built-in interval variables.
BUILTIN_VARIABLES = {
    "__rate_interval": "1m",
    "__interval": "1m",
    "__interval_ms": "60000",
    "__range": "15m",
    "__range_s": "900",
    "__range_ms": "900000",
}

# ${name}, ${name:format}, [[name]] and $name, as Grafana accepts them.
VARIABLE_RE = re.compile(
    r"\$\{(?P<braced>\w+)(?::[^}]*)?\}|\[\[(?P<bracketed>\w+)(?::[^\]]*)?\]\]|\$(?P<plain>\w+)"
)

PROMQL_KEYWORDS = {
    "by",
    "without",
    "on",
    "ignoring",
    "group_left",
    "group_right",
    "bool",
    "and",
    "or",
    "unless",
    "offset",
    "inf",
    "nan",
    "atan2",
    "sum",
    "min",
    "max",
    "avg",
    "count",
    "stddev",
    "stdvar",
    "topk",
    "bottomk",
    "quantile",
    "count_values",
    "group",
    "limitk",
    "limit_ratio",
}


@dataclass
class Query:
    ref_id: str
    expr: str  # as written in the dashboard
    resolved: str  # variables replaced by their defaults
    status: str = "not run"
    ok: bool = True
    detail: str = ""


@dataclass
class Panel:
    dashboard: str
    title: str
    queries: list[Query] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)

    @property
    def label(self) -> str:
        return f"{self.dashboard} / {self.title}"

    @property
    def ok(self) -> bool:
        return not self.problems and all(q.ok for q in self.queries)


# ------------------------------------------------------------------ static checks


def variable_defaults(dashboard: dict) -> dict[str, str]:
    """Each dashboard variable's default, as Grafana would interpolate it."""
    defaults: dict[str, str] = {}
    for var in dashboard.get("templating", {}).get("list", []):
        name = var.get("name")
        if not name:
            continue
        value = (var.get("current") or {}).get("value")
        if value is None:
            value = var.get("query")
            if var.get("type") == "custom" and isinstance(value, str):
                value = value.split(",")[0].strip()
        if isinstance(value, list):
            if "$__all" in value:
                value = ".*"
            else:
                value = value[0] if len(value) == 1 else "(" + "|".join(value) + ")"
        if isinstance(value, dict):  # some variable types keep {"text","value"}
            value = value.get("value")
        defaults[name] = "" if value is None else str(value)
    return defaults


def substitute(expr: str, defaults: dict[str, str]) -> tuple[str, list[str]]:
    """Returns expr with variables replaced, and the names it could not resolve."""
    unknown: list[str] = []

    def replace(match: re.Match[str]) -> str:
        name = match.group("braced") or match.group("bracketed") or match.group("plain")
        if name in defaults:
            return defaults[name]
        if name in BUILTIN_VARIABLES:
            return BUILTIN_VARIABLES[name]
        unknown.append(name)
        return match.group(0)

    return VARIABLE_RE.sub(replace, expr), unknown


def metric_names(expr: str) -> set[str]:
    """Best-effort: the metric names an expr selects (a small PromQL tokenizer)."""
    text = re.sub(r'"(?:\\.|[^"\\])*"|\'(?:\\.|[^\'\\])*\'|`[^`]*`', '""', expr)
    text = re.sub(r"\{[^}]*\}", " ", text)  # label matchers
    text = re.sub(r"\[[^\]]*\]", " ", text)  # range and subquery windows
    # Label lists of by/without/on/ignoring/group_left/group_right.
    text = re.sub(r"\b(by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)", " ", text)
    names = set()
    for match in re.finditer(r"(?<![\w.])([a-zA-Z_:][\w:]*)(\s*\()?", text):
        word, is_call = match.group(1), match.group(2)
        if is_call or word.lower() in PROMQL_KEYWORDS:
            continue
        names.add(word)
    return names


def check_dashboard(path: Path, seen_uids: dict[str, Path]) -> tuple[list[Panel], list[str], bool]:
    """Static checks of one file: its panels, the file-level problems, seed found."""
    rel = path.relative_to(REPO_ROOT) if path.is_relative_to(REPO_ROOT) else path
    try:
        dashboard = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as err:
        return [], [f"{rel}: does not parse: {err}"], False
    if not isinstance(dashboard, dict):
        return [], [f"{rel}: not a dashboard object"], False

    problems: list[str] = []
    uid = dashboard.get("uid")
    if not uid:
        problems.append(f"{rel}: no dashboard uid")
    elif uid in seen_uids:
        problems.append(f"{rel}: uid {uid!r} also used by {seen_uids[uid]}")
    else:
        seen_uids[uid] = rel
    name = path.name
    if not isinstance(dashboard.get("panels"), list) or not dashboard["panels"]:
        problems.append(f"{rel}: no panels")
        return [], problems, False

    defaults = variable_defaults(dashboard)
    panels: list[Panel] = []
    seen_ids: set[int] = set()
    seed_found = False

    def visit(raw: dict) -> None:
        nonlocal seed_found
        if raw.get("type") == "row":  # a row only groups; collapsed rows nest panels
            for inner in raw.get("panels", []):
                visit(inner)
            return
        panel = Panel(name, raw.get("title") or f"<untitled panel id {raw.get('id')}>")
        panels.append(panel)
        pid = raw.get("id")
        if pid in seen_ids:
            panel.problems.append(f"panel id {pid} is used twice")
        seen_ids.add(pid)
        if not str(raw.get("description") or "").strip():
            panel.problems.append("no description")
        ds = raw.get("datasource")
        if not isinstance(ds, dict) or ds.get("uid") != DATASOURCE_REF:
            panel.problems.append(f"datasource is {ds!r}, not uid {DATASOURCE_REF!r}")
        targets = raw.get("targets") or []
        if not targets:
            panel.problems.append("no targets")
        ref_ids: set[str] = set()
        for target in targets:
            ref = str(target.get("refId") or "?")
            if ref in ref_ids:
                panel.problems.append(f"refId {ref} is used twice")
            ref_ids.add(ref)
            tds = target.get("datasource")
            if tds is not None and (not isinstance(tds, dict) or tds.get("uid") != DATASOURCE_REF):
                panel.problems.append(f"target {ref}: datasource is {tds!r}")
            expr = str(target.get("expr") or "").strip()
            if not expr:
                panel.problems.append(f"target {ref}: no expr")
                continue
            if expr == SEED_QUERY:
                seed_found = True
            resolved, expr_problems = check_expr(expr, defaults)
            panel.problems += [f"target {ref}: {problem}" for problem in expr_problems]
            panel.queries.append(Query(ref, expr, resolved))

    for raw in dashboard["panels"]:
        visit(raw)
    problems += check_datasource_variable(dashboard, rel)
    for ann in dashboard.get("annotations", {}).get("list", []):
        if ann.get("builtIn"):
            continue
        label = f"{rel}: annotation {ann.get('name')!r}"
        ds = ann.get("datasource")
        if not isinstance(ds, dict) or ds.get("uid") != DATASOURCE_REF:
            problems.append(f"{label}: datasource is {ds!r}, not uid {DATASOURCE_REF!r}")
        expr = str(ann.get("expr") or "").strip()
        if not expr:
            problems.append(f"{label}: no expr")
            continue
        problems += [f"{label}: {problem}" for problem in check_expr(expr, defaults)[1]]
    return panels, problems, seed_found


def check_expr(expr: str, defaults: dict[str, str]) -> tuple[str, list[str]]:
    """One expr: variables resolved, and its problems (unknown variables or metrics, a
    `job` selector, a fixed range window)."""
    problems = []
    resolved, unknown = substitute(expr, defaults)
    for var in unknown:
        problems.append(f"unknown variable ${var}")
    for metric in sorted(metric_names(resolved) - KNOWN_METRICS):
        problems.append(f"{metric!r} is not a contract metric (docs/design.md §7)")
    if re.search(r"\bjob\b", expr):
        problems.append("depends on the scrape job's name (`job`): select by the metrics' own labels")
    if expr != SEED_QUERY:
        for window in re.findall(r"\[([^\]]*)\]", expr):
            if window != "$__rate_interval":
                problems.append(f"range window [{window}]: use [$__rate_interval]")
    return resolved, problems


def check_datasource_variable(dashboard: dict, rel: object) -> list[str]:
    """The `datasource` variable: a Prometheus datasource picker defaulting to ours."""
    for var in dashboard.get("templating", {}).get("list", []):
        if var.get("name") == "datasource":
            value = (var.get("current") or {}).get("value")
            if var.get("type") != "datasource" or var.get("query") != "prometheus":
                return [f"{rel}: variable datasource is not a Prometheus datasource variable"]
            if value != DATASOURCE_UID:
                return [f"{rel}: variable datasource defaults to {value!r}, not {DATASOURCE_UID!r}"]
            return []
    return [f"{rel}: no `datasource` variable (panels use {DATASOURCE_REF})"]


def provisioned_datasource_uids(directory: Path) -> set[str]:
    """The uids in Grafana's datasource provisioning files (line-based: no YAML parser
    in the stdlib, and these files are flat)."""
    uids = set()
    for path in sorted(directory.glob("*.y*ml")):
        for line in path.read_text(encoding="utf-8").splitlines():
            match = re.match(r"\s*uid:\s*['\"]?([\w-]+)['\"]?\s*(#.*)?$", line)
            if match:
                uids.add(match.group(1))
    return uids


# ------------------------------------------------------------------ live checks


def instant_query(base_url: str, expr: str, timeout: float) -> tuple[bool, str, bool, bool]:
    """Runs expr; returns (has_data, short status, query_failed, settled).

    Not settled: no data yet, or only NaN (a histogram without observations in the
    window), which --wait retries in the hope of real numbers."""
    url = base_url.rstrip("/") + "/api/v1/query?" + urllib.parse.urlencode({"query": expr})
    try:
        with urllib.request.urlopen(url, timeout=timeout) as response:
            body = json.load(response)
    except urllib.error.HTTPError as err:  # 400/422: bad query, with an error body
        try:
            body = json.load(err)
        except (json.JSONDecodeError, UnicodeDecodeError):
            return False, f"HTTP {err.code}", True, True
    if body.get("status") != "success":
        return False, f"{body.get('errorType', 'error')}: {body.get('error', body)}", True, True
    data = body.get("data", {})
    kind, result = data.get("resultType"), data.get("result")
    if kind == "scalar":
        return True, "data (scalar)", False, True
    if not result:
        return False, "no data", False, False
    values = [float(series["value"][1]) for series in result if "value" in series]
    if values and all(math.isnan(v) for v in values):
        status = f"data ({len(result)} series, all NaN: no observations in the window)"
        return True, status, False, False
    return True, f"data ({len(result)} series)", False, True


def run_live(
    panels: list[Panel],
    base_url: str,
    wait: float,
    timeout: float,
    allow_no_data: list[re.Pattern[str]],
) -> None:
    """Queries every expr; retries the unsettled ones until `wait` seconds passed."""
    pending = [q for p in panels for q in p.queries]
    deadline = time.monotonic() + wait
    while True:
        unsettled = []
        for query in pending:
            has_data, status, _failed, settled = instant_query(base_url, query.resolved, timeout)
            query.status = status
            query.ok = has_data
            if not settled:
                unsettled.append(query)
        if not unsettled or time.monotonic() + 2 > deadline:
            break
        time.sleep(2)
        pending = unsettled
    for query in (q for p in panels for q in p.queries):
        if (
            not query.ok
            and query.status == "no data"
            and any(pattern.search(query.resolved) for pattern in allow_no_data)
        ):
            query.ok = True
            query.status = "no data (allowed by --allow-no-data)"


def rule_files_loaded(directory: Path) -> int:
    """How many rule files the repository has (prometheus/rules/*.rules.yml)."""
    return len(list(directory.glob("*.rules.yml")))


def run_rules_live(base_url: str, wait: float, timeout: float, expected_files: int) -> list[str]:
    """The loaded rules: all healthy, and every recording rule's series present.
    Retries until `wait` passed: a rule evaluates once per evaluation_interval."""
    deadline = time.monotonic() + wait
    while True:
        problems: list[str] = []
        url = base_url.rstrip("/") + "/api/v1/rules"
        with urllib.request.urlopen(url, timeout=timeout) as response:
            groups = json.load(response).get("data", {}).get("groups", [])
        files = {g.get("file") for g in groups}
        if len(files) < expected_files:
            problems.append(f"Prometheus loaded {len(files)} rule file(s), the repository has "
                            f"{expected_files}: is rule_files in its configuration?")
        rules = [r for g in groups for r in g.get("rules", [])]
        for rule in rules:
            name = rule.get("name", "?")
            if rule.get("health") != "ok":
                error = rule.get("lastError") or "not evaluated yet"
                problems.append(f"rule {name}: health {rule.get('health')!r}: {error}")
            elif rule.get("type") == "recording":
                has_data, status, _failed, _settled = instant_query(base_url, name, timeout)
                if not has_data:
                    problems.append(f"recording rule {name}: {status}")
        if not problems or time.monotonic() + 2 > deadline:
            break
        time.sleep(2)
    kinds = [r.get("type") for r in rules]
    print(f"rules: {kinds.count('recording')} recording, {kinds.count('alerting')} alerting, "
          f"{len(problems)} problem(s)")
    return problems


def print_targets(base_url: str, timeout: float) -> None:
    """On failure: the scrape targets' health, the usual reason for missing data."""
    try:
        with urllib.request.urlopen(base_url.rstrip("/") + "/api/v1/targets", timeout=timeout) as r:
            targets = json.load(r)["data"]["activeTargets"]
    except (OSError, KeyError, ValueError) as err:
        print(f"  (could not list scrape targets: {err})")
        return
    print("scrape targets:")
    for t in targets:
        job = t.get("labels", {}).get("job") or t.get("scrapePool")
        error = f"  {t['lastError']}" if t.get("lastError") else ""
        print(f"  {job:<18} {t.get('scrapeUrl')}  {t.get('health')}{error}")


# ------------------------------------------------------------------ main


def main() -> int:
    parser = argparse.ArgumentParser(
        description="Check the Grafana dashboards statically and, optionally, "
        "their queries against a real Prometheus."
    )
    parser.add_argument(
        "--dashboards",
        type=Path,
        default=REPO_ROOT / "grafana" / "dashboards",
        help="folder of dashboard JSON files (default: %(default)s)",
    )
    parser.add_argument(
        "--datasources",
        type=Path,
        default=REPO_ROOT / "grafana" / "provisioning" / "datasources",
        help="Grafana datasource provisioning folder (default: %(default)s)",
    )
    parser.add_argument(
        "--rules",
        type=Path,
        default=REPO_ROOT / "prometheus" / "rules",
        help="folder of the Prometheus rule files the live check expects loaded "
        "(default: %(default)s)",
    )
    parser.add_argument(
        "--prometheus",
        metavar="URL",
        help="also run every query against this Prometheus, e.g. http://127.0.0.1:9090",
    )
    parser.add_argument(
        "--wait",
        type=float,
        default=0,
        metavar="SECONDS",
        help="retry queries without data for up to this long (rate() needs "
        "two scrapes after the load started); default 0",
    )
    parser.add_argument(
        "--timeout",
        type=float,
        default=10,
        metavar="SECONDS",
        help="HTTP timeout of one query (default: %(default)s)",
    )
    parser.add_argument(
        "--allow-no-data",
        action="append",
        default=[],
        metavar="REGEX",
        help="an expr matching REGEX may return no data (reported, not failed); "
        "repeatable, e.g. for tool_calls_total when the load made no tool calls",
    )
    args = parser.parse_args()
    try:
        allow_no_data = [re.compile(p) for p in args.allow_no_data]
    except re.error as err:
        parser.error(f"--allow-no-data: {err}")

    files = sorted(args.dashboards.glob("**/*.json"))
    file_problems: list[str] = []
    if not files:
        file_problems.append(f"no dashboard JSON files under {args.dashboards}")
    panels: list[Panel] = []
    seen_uids: dict[str, Path] = {}
    seed_found = False
    for path in files:
        found, problems, has_seed = check_dashboard(path, seen_uids)
        panels += found
        file_problems += problems
        seed_found |= has_seed
    if files and not seed_found:
        file_problems.append(f"the seed query is in no dashboard: {SEED_QUERY}")
    if args.datasources.is_dir():
        if DATASOURCE_UID not in provisioned_datasource_uids(args.datasources):
            file_problems.append(f"{args.datasources}: no datasource with uid {DATASOURCE_UID!r}")
    else:
        file_problems.append(f"{args.datasources}: not a folder")

    if args.prometheus:
        static_ok = all(not p.problems for p in panels)
        if static_ok:
            try:
                run_live(panels, args.prometheus, args.wait, args.timeout, allow_no_data)
                file_problems += run_rules_live(
                    args.prometheus, args.wait, args.timeout, rule_files_loaded(args.rules)
                )
            except (OSError, ValueError) as err:
                print(f"cannot query Prometheus at {args.prometheus}: {err}", file=sys.stderr)
                return 2
        else:
            print("static problems found: not querying Prometheus")

    width = max((len(p.label) for p in panels), default=0)
    for panel in panels:
        if panel.problems:
            summary = "; ".join(panel.problems)
        elif args.prometheus and panel.queries[0].status != "not run":
            summary = "; ".join(f"{q.ref_id}: {q.status}" for q in panel.queries)
        else:
            summary = f"{len(panel.queries)} quer{'y' if len(panel.queries) == 1 else 'ies'}"
        print(f"{'ok  ' if panel.ok else 'FAIL'}  {panel.label:<{width}}  {summary}")

    failures = (
        file_problems
        + [f"{p.label}: {problem}" for p in panels for problem in p.problems]
        + [
            f"{p.label} [{q.ref_id}]: {q.status}: {q.resolved}"
            for p in panels
            for q in p.queries
            if not q.ok
        ]
    )
    mode = f"against {args.prometheus}" if args.prometheus else "static only"
    queries = sum(len(p.queries) for p in panels)
    if failures:
        print(f"\n{len(failures)} problem(s) ({mode}):")
        for failure in failures:
            print(f"  - {failure}")
        if args.prometheus:
            print_targets(args.prometheus, args.timeout)
        return 1
    print(
        f"\n{len(files)} dashboard(s), {len(panels)} panels, {queries} queries: all good ({mode})"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())

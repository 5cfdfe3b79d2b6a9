#!/usr/bin/env python3
"""The public items the guides name exist, with the features the guides say.

docs/using.md's feature table and docs/design.md's §2 table name, row by row, what each
feature of the crate brings. For every row this writes a small program in
target/doc-items/ that depends on the crate with that feature alone (the core's row:
none) and names each item of the row (`use` for types, modules, functions, constants
and enum variants; a value for `Type::function`), then compiles it (`cargo check
--offline`). An item the crate does not export with that feature fails the check. The
`full` row must name exactly the features `full` leaves out (shared/Cargo.toml).

A name is a path from the crate's root (`Deadline`, `hedging::HedgePolicy`), or a
method of a type the row names (`Db::read` beside `db::Db`). A method is checked as
its type, and as a `pub fn` of that name in the crate's source (a generic function
cannot be named without its types). Backticked words that are not the crate's items
(feature names, gRPC's status codes, headers, SQL) are told apart by their shape, or
listed in NOT_ITEMS.

Usage: scripts/doc_items.py [--self-test]
"""

import os
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
TABLES = [("docs/using.md", "| feature | brings |", 0, 1), ("docs/design.md", "| part | feature | what |", 1, 2)]
# Backticked in the tables, and not the crate's: tonic's codes, a setting, a header.
NOT_ITEMS = {"DEADLINE_EXCEEDED", "CANCELLED", "UNAVAILABLE", "statement_timeout", "traceparent",
             "with_metrics"}
PATH = re.compile(r"^[A-Za-z_]\w*(::[A-Za-z_]\w*)*(::\{[\w, ]+\})?$")


def rows(text, header, feature_column, items_column):
    """(feature or None for the core, cell text) for each row of the table under `header`."""
    lines = text.split("\n")
    start = next(i for i, line in enumerate(lines) if line.startswith(header))
    for line in lines[start + 2:]:
        if not line.startswith("|"):
            break
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        feature = cells[feature_column]
        named = re.fullmatch(r"`([\w-]+)`", feature)
        if named:
            yield named.group(1), cells[items_column]
        elif "none" in feature:
            yield None, cells[items_column]


def items(cell, features=()):
    """The crate's items a cell names, each as a path from the crate's root."""
    found = [t for t in re.findall(r"`([^`]+)`", cell)
             if PATH.match(t) and t not in NOT_ITEMS and t not in features]
    # `Db::read` beside `db::Db`: the type where the row put it.
    known = {t.split("::")[-1]: t for t in found if "::" in t and t[0].islower()}
    out = []
    for token in found:
        braces = re.match(r"^(.*)::\{([\w, ]+)\}$", token)
        names = ([f"{braces.group(1)}::{n.strip()}" for n in braces.group(2).split(",")]
                 if braces else [token])
        for name in names:
            first, _, rest = name.partition("::")
            out.append(known[first] + f"::{rest}" if first in known and rest else name)
    return out


def method(path):
    """`(type, function)` for `Type::function`, else None."""
    parts = path.split("::")
    if len(parts) >= 2 and parts[-2][0].isupper() and parts[-1][0].islower():
        return "::".join(parts[:-1]), parts[-1]
    return None


def program(paths):
    """A `main.rs` that `use`s each path (a method's type for a method)."""
    named = sorted({method(p)[0] if method(p) else p for p in paths})
    uses = [f"#[allow(unused_imports)]\nuse deadline_propagation::{p} as _;" for p in named]
    return "\n".join(uses) + "\n\nfn main() {}\n"


def full_features():
    toml = (ROOT / "shared/Cargo.toml").read_text()
    return set(re.findall(r'"([\w-]+)"', re.search(r"^full = \[(.*)\]", toml, re.M).group(1)))


def check():
    problems, wanted = [], {}
    source = "\n".join(p.read_text() for p in (ROOT / "shared/src").rglob("*.rs"))
    for name, header, feature_column, items_column in TABLES:
        table = list(rows((ROOT / name).read_text(), header, feature_column, items_column))
        all_features = {f for f, _ in table if f}
        features = all_features - {"full", "test-util"}
        for feature, cell in table:
            if feature == "full":
                said = set(re.findall(r"`([\w-]+)`", cell))
                left_out = features - full_features()
                if said != left_out:
                    problems.append(f"{name}: `full` is every feature but {sorted(left_out)}; "
                                    f"the row says but {sorted(said)}")
                continue
            for path in items(cell, all_features):
                wanted.setdefault(feature, set()).add((name, path))
                function = method(path)
                if function and not re.search(rf"pub (async )?fn {function[1]}\b", source):
                    problems.append(f"{name}: `{path}`: no `pub fn {function[1]}` in shared/src")
    target = ROOT / "target/doc-items"
    for feature, named in sorted(wanted.items(), key=lambda kv: kv[0] or ""):
        project = target / (feature or "core")
        (project / "src").mkdir(parents=True, exist_ok=True)
        features = f', features = ["{feature}"]' if feature else ""
        (project / "Cargo.toml").write_text(
            f'[package]\nname = "doc-items"\nversion = "0.0.0"\nedition = "2024"\n\n'
            f'[dependencies]\ndeadline-propagation = {{ path = "{ROOT / "shared"}"{features} }}\n'
            "\n[workspace]\n")
        (project / "src/main.rs").write_text(program(sorted({p for _, p in named})))
        result = subprocess.run(
            ["cargo", "check", "--offline", "--quiet", "--message-format", "short"],
            cwd=project, env={**os.environ, "CARGO_TARGET_DIR": str(target / "build")},
            capture_output=True, text=True)
        label = f"feature {feature}" if feature else "the core (no feature)"
        print(f"doc-items: {label}: {len(named)} item(s)", flush=True)
        for line in result.stderr.splitlines():
            if ": error" in line:
                problems.append(f"{label}, as the guides name it: {line}")
        if result.returncode != 0 and not any(label in p for p in problems):
            problems.append(f"{label}: cargo check failed:\n{result.stderr[-2000:]}")
    for problem in problems:
        print("FAIL", problem)
    return not problems


def self_test():
    cell = ("`hedging::Hedging` and `HedgePolicy`, `DEADLINE_EXCEEDED`, `GET /metrics`, "
            "`grpc-timeout`, `Deadline::current`, `DeadlineMode::{Propagate, Observe}`")
    assert items(cell) == ["hedging::Hedging", "HedgePolicy", "Deadline::current",
                           "DeadlineMode::Propagate", "DeadlineMode::Observe"], items(cell)
    assert items("`db::Db`, `Db::read`, `metrics`", {"metrics"}) == ["db::Db", "db::Db::read"]
    assert items("`Deadline`, `Deadline::current`, `read_budget`") == [
        "Deadline", "Deadline::current", "read_budget"]
    text = "| feature | brings |\n| --- | --- |\n| *(none: the core)* | `A` |\n| `x` | `m::B` |\n\nafter"
    assert list(rows(text, "| feature | brings |", 0, 1)) == [(None, "`A`"), ("x", "`m::B`")]
    main = program(["Deadline", "Deadline::current", "db::Db::read"])
    assert main.count("use deadline_propagation::Deadline as _;") == 1, main
    assert "use deadline_propagation::db::Db as _;" in main, main
    assert method("db::Db::read") == ("db::Db", "read") and method("client::Plugin") is None
    print("doc_items: self-test passed")


if __name__ == "__main__":
    if sys.argv[1:] == ["--self-test"]:
        self_test()
    else:
        sys.exit(0 if check() else 1)

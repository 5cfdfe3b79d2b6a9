#!/usr/bin/env python3
"""Counts the lines of deadline-propagation a reader meets for a set of features.

Walks the module tree from `shared/src/lib.rs` the way the compiler would for those
features: an item under `#[cfg(..)]` that is off is skipped, a `mod x;` that is on is
followed into its file, and test code (`#[cfg(test)]`, `tests.rs`) is never counted.
Counts non-blank lines, comments included: they are read too.

Usage: scripts/crate_lines.py [--max CORE CHAIN XTASK]
Prints the core (no feature), the chain (`http-client`, `sqlx`) and everything (`full`),
each with its files, then the harness beside them: every non-blank line of `xtask/src`
(its unit tests too). With --max, exits 1 when the core, the chain or xtask is over
its limit.
"""

import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SRC = ROOT / "shared" / "src"
XTASK = ROOT / "xtask" / "src"
SETS = [
    ("core", set()),
    ("core and chain", {"http-client", "sqlx"}),
    ("core and grpc", {"grpc"}),
    ("everything", {"http-client", "sqlx", "grpc", "admission", "hedging", "retry-budget",
                    "tools", "metrics", "otel"}),
]


def parse(text, i=0):
    """A cfg predicate from `text[i:]`: (kind, value), and where it ends."""
    while text[i] in " \n\t":
        i += 1
    op = re.match(r"(any|all|not)\s*\(", text[i:])
    if op:
        i += op.end()
        args = []
        while True:
            while text[i] in " ,\n\t":
                i += 1
            if text[i] == ")":
                return (op.group(1), args), i + 1
            arg, i = parse(text, i)
            args.append(arg)
    feature = re.match(r'feature\s*=\s*"([^"]+)"', text[i:])
    if feature:
        return ("feature", feature.group(1)), i + feature.end()
    atom = re.match(r"\w+", text[i:])
    return ("atom", atom.group(0)), i + atom.end()


def holds(pred, on):
    kind, value = pred
    if kind == "feature":
        return value in on
    if kind == "atom":
        return value not in ("test", "docsrs")
    if kind == "not":
        return not holds(value[0], on)
    if kind == "any":
        return any(holds(v, on) for v in value)
    return all(holds(v, on) for v in value)


def item_end(lines, i):
    """The index after the item starting at `lines[i]` (its attributes first)."""
    while i < len(lines) and lines[i].strip().startswith("#["):
        i += 1
    depth, opened = 0, False
    while i < len(lines):
        line = re.sub(r"//.*", "", lines[i])
        depth += line.count("{") - line.count("}")
        opened |= "{" in line
        i += 1
        if (opened and depth <= 0) or (not opened and line.rstrip().endswith(";")):
            return i
    return i


def count(path, on, files):
    """Counts `path` and the module files it declares, into `files`."""
    if path.name == "tests.rs":
        return
    lines = path.read_text().split("\n")
    here = path.parent if path.name in ("lib.rs", "mod.rs") else path.with_suffix("")
    n, i = 0, 0
    while i < len(lines):
        line = lines[i].strip()
        cfg = re.match(r"#\[cfg\((.*)\)\]$", line)
        if cfg and not holds(parse(cfg.group(1))[0], on):
            i = item_end(lines, i + 1)
            continue
        module = re.match(r"(pub(\(\w+\))? )?mod (\w+);", line)
        if module:
            name = module.group(3)
            child = here / f"{name}.rs"
            count(child if child.exists() else here / name / "mod.rs", on, files)
        n += bool(line)
        i += 1
    files[path.relative_to(SRC)] = n


def main():
    limits = None
    if sys.argv[1:2] == ["--max"]:
        limits = dict(zip(["core", "core and chain", "xtask"], map(int, sys.argv[2:5])))
    over = False
    for name, on in SETS:
        files = {}
        count(SRC / "lib.rs", on, files)
        total = sum(files.values())
        features = ", ".join(sorted(on)) or "none"
        print(f"{name}: {total} lines in {len(files)} files (features: {features})")
        for file, n in sorted(files.items()):
            print(f"  {n:5d} {file}")
        if limits and name in limits and total > limits[name]:
            print(f"  over the limit of {limits[name]}")
            over = True
    xtask = sum(
        sum(1 for line in path.read_text().split("\n") if line.strip())
        for path in XTASK.rglob("*.rs")
    )
    print(f"xtask: {xtask} lines (every non-blank line of xtask/src)")
    if limits and "xtask" in limits and xtask > limits["xtask"]:
        print(f"  over the limit of {limits['xtask']}")
        over = True
    sys.exit(1 if over else 0)


if __name__ == "__main__":
    main()

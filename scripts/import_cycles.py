#!/usr/bin/env python3
"""Fails when a file of a workspace crate imports, through any chain of files, itself.

Each source file is a node; it points at every file whose module it names through
`crate::` or `super::` paths (in `use` lines and inline), outside comments and test
modules. A name the crate root re-exports (`pub use a::B;`) points at `a`; the root's own
`mod` lines are not imports, its paths into its modules are. Prints every cycle found and exits 1, or
prints the number of files read and exits 0.

Usage: scripts/import_cycles.py [CRATE_DIR ...]   (default: every workspace member)
"""

import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def members():
    text = (ROOT / "Cargo.toml").read_text()
    block = re.search(r"members\s*=\s*\[(.*?)\]", text, re.S).group(1)
    return [ROOT / m for m in re.findall(r'"([^"]+)"', block)]


def code_of(text):
    """The code without comments, strings' contents and test modules."""
    text = re.sub(r"//[^\n]*", "", text)
    cut = re.search(r"#\[cfg\(test\)\]\s*mod \w+\s*\{", text)
    if cut:
        text = text[: cut.start()]
    return re.sub(r'"(?:[^"\\]|\\.)*"', '""', text)


def module_path(src, file):
    """The module path of a file: `a/b.rs` and `a/b/mod.rs` are `a::b`."""
    parts = list(file.relative_to(src).with_suffix("").parts)
    if parts[-1] in ("lib", "main", "mod"):
        parts = parts[:-1]
    return parts


def file_of(src, parts):
    """The file defining the longest prefix of `parts` that is a module."""
    for n in range(len(parts), 0, -1):
        base = src.joinpath(*parts[:n])
        for candidate in (base.with_suffix(".rs"), base / "mod.rs"):
            if candidate.exists():
                return candidate
    return None


def paths_in(code):
    """Every path after `crate::` or `super::`, with `{a, b::c}` groups expanded."""
    found = []
    for m in re.finditer(r"\b(crate|super)((?:::super)*)::", code):
        rest = code[m.end():]
        head = [m.group(1)] + ["super"] * m.group(2).count("super")
        if rest.startswith("{"):
            depth, item, items = 0, "", []
            for c in rest[1:]:
                if c == "{":
                    depth += 1
                elif c == "}" and depth == 0:
                    break
                elif c == "}":
                    depth -= 1
                if c == "," and depth == 0:
                    items.append(item)
                    item = ""
                    continue
                item += c
            items.append(item)
            for item in items:
                segments = [s.strip() for s in item.split("::") if s.strip()]
                segments = [s for s in segments if re.fullmatch(r"\w+", s)]
                if segments:
                    found.append(head + segments)
        else:
            segments = re.match(r"(\w+(?:::\w+)*)", rest)
            if segments:
                found.append(head + segments.group(1).split("::"))
    return found


def graph(crate):
    src = crate / "src"
    files = sorted(src.rglob("*.rs"))
    root = next((src / n for n in ("lib.rs", "main.rs") if (src / n).exists()), None)
    reexports = {}
    if root:
        for m in re.finditer(r"pub use ([\w:]+)::\{?([^;]*?)\}?;", code_of(root.read_text())):
            for item in m.group(2).split(","):
                name = item.strip().split(" as ")[-1].strip()
                if name:
                    reexports[name] = m.group(1).split("::")
    declared = re.findall(r"^\s*(?:pub(?:\([^)]*\))?\s+)?mod (\w+);", root.read_text(), re.M) if root else []
    edges = {}
    for file in files:
        here = module_path(src, file)
        targets = set()
        code = code_of(file.read_text())
        if file == root:
            # The root names its modules without `crate::`.
            for name in declared:
                for _ in re.finditer(rf"(?<![\w:]){name}::", code):
                    targets.add(file_of(src, [name]))
        for path in paths_in(code):
            base = here if file.name == "mod.rs" or file == root else here[:-1]
            parts = []
            if path[0] == "crate":
                parts = path[1:]
            else:
                ups = path.count("super")
                # `super` of a file is its parent module.
                base = here[: len(here) - ups]
                parts = base + [p for p in path if p not in ("super",)]
            if parts and parts[0] in reexports and file_of(src, parts[:1]) is None:
                parts = reexports[parts[0]] + parts[1:]
            target = file_of(src, parts)
            if target is None and path[0] == "crate" and parts:
                target = root  # an item the root defines
            if target and target != file:
                targets.add(target)
        targets.discard(None)
        edges[file] = targets
    return edges


def cycles(edges):
    found, state = [], {}

    def visit(node, stack):
        state[node] = 1
        stack.append(node)
        for nxt in sorted(edges.get(node, ())):
            if state.get(nxt) == 1:
                found.append(stack[stack.index(nxt):] + [nxt])
            elif nxt not in state:
                visit(nxt, stack)
        stack.pop()
        state[node] = 2

    for node in sorted(edges):
        if node not in state:
            visit(node, [])
    return found


def main():
    crates = [Path(a).resolve() for a in sys.argv[1:]] or members()
    bad, read = [], 0
    for crate in crates:
        if not (crate / "src").is_dir():
            continue
        edges = graph(crate)
        read += len(edges)
        for cycle in cycles(edges):
            bad.append(" -> ".join(str(f.relative_to(ROOT)) for f in cycle))
    for cycle in bad:
        print("import cycle:", cycle)
    if bad:
        return 1
    print(f"import cycles: none in {read} files")
    return 0


if __name__ == "__main__":
    sys.exit(main())

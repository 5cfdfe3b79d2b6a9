#!/usr/bin/env python3
"""The commands the docs give a reader, run as written.

Every fenced block of README.md, shared/README.md and docs/*.md with a `cargo` or
`curl` line says, on the line before it, what CI does with it:

    <!-- run -->                       each command run, in the repository's root; a
                                       command that fails fails the check
    <!-- run: background PORT -->      a server: started as written, in the background,
                                       and awaited on 127.0.0.1:PORT; stopped (as by
                                       Ctrl-C) when the next server starts or the file ends
    <!-- not run: WHY -->              not run, and why (a long run, Docker, a host
                                       name only compose knows, ...)

In a `sh` block every line is a command (a `# ...` is a comment, and shows output);
in a `text` or `console` block only the lines after a `$ ` prompt are (the rest is
output). A `cargo run|build --example NAME` must name the features the example
requires (shared/Cargo.toml), or the reader gets "requires the features".

Usage: scripts/doc_commands.py --check           every block marked, examples' features
       scripts/doc_commands.py --run FILE...     run the marked blocks of FILE, in order
       scripts/doc_commands.py --self-test
"""

import glob
import os
import re
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
FENCE = re.compile(r"^(\s*)```(\w*)\s*$")
MARKER = re.compile(r"^<!-- (run|run: background (\d+)|not run: (.+)) -->$")
COMMAND = re.compile(r"^(\$ )?(cargo|curl)\b")
# How long a block may take: a `cargo run` on a cold target/ builds first.
BLOCK_TIMEOUT = 1200


def files():
    found = ["README.md", "shared/README.md"] + sorted(glob.glob("docs/*.md", root_dir=ROOT))
    return [f for f in found if (ROOT / f).exists()]


def blocks(text):
    """Each fenced block: (line number, language, marker or None, body lines)."""
    lines = text.split("\n")
    i = 0
    while i < len(lines):
        fence = FENCE.match(lines[i])
        if not fence:
            i += 1
            continue
        indent, language = fence.group(1), fence.group(2)
        end = i + 1
        while end < len(lines) and lines[end].strip() != "```":
            end += 1
        before = [line.strip() for line in lines[:i] if line.strip()]
        marker = before[-1] if before and MARKER.match(before[-1]) else None
        body = [line[len(indent):] if line.startswith(indent) else line.strip()
                for line in lines[i + 1:end]]
        yield i + 1, language, marker, body
        i = end + 1


def commands(language, body):
    """The block's shell text: all of it for `sh`, the prompted lines otherwise."""
    if language in ("sh", "bash", "shell"):
        return "\n".join(body)
    out, going_on = [], False
    for line in body:
        if line.startswith("$ ") or going_on:
            out.append(line[2:] if line.startswith("$ ") else line)
            going_on = line.rstrip().endswith("\\")
    return "\n".join(out)


def has_command(language, body):
    return language not in ("rust", "toml", "json", "yaml", "promql") and any(
        COMMAND.match(line.strip()) for line in body
    )


def example_features():
    """Each example's required features, from shared/Cargo.toml."""
    toml = (ROOT / "shared/Cargo.toml").read_text()
    need = {}
    for block in re.split(r"\n(?=\[\[)", toml):
        if block.startswith("[[example]]"):
            name = re.search(r'name\s*=\s*"([^"]+)"', block)
            features = re.search(r"required-features\s*=\s*\[([^\]]*)\]", block)
            if name and features:
                need[name.group(1)] = re.findall(r'"([^"]+)"', features.group(1))
    return need


def missing_features(line, need):
    """The features `line`'s `--example` requires that it does not name."""
    example = re.search(r"cargo (?:run|build)\b[^#\n]*--example[ =](\w+)", line)
    if not example or example.group(1) not in need or "--all-features" in line:
        return []
    named = " ".join(re.findall(r"--features[ =]\"?([\w,/ -]+)", line))
    given = {f.split("/")[-1] for f in re.findall(r"[\w/-]+", named)}
    return [f for f in need[example.group(1)] if f not in given]


def check():
    problems, need = [], example_features()
    sources = files() + sorted(glob.glob("shared/examples/*.rs", root_dir=ROOT))
    for name in sources:
        text = (ROOT / name).read_text()
        for n, line in enumerate(text.split("\n"), 1):
            missing = missing_features(line, need)
            if missing:
                problems.append(f"{name}:{n}: the example needs --features {','.join(missing)}")
        if not name.endswith(".md"):
            continue
        for n, language, marker, body in blocks(text):
            if has_command(language, body) and marker is None:
                problems.append(
                    f"{name}:{n}: a block with a cargo or curl line and no "
                    "<!-- run -->, <!-- run: background PORT --> or <!-- not run: WHY -->"
                )
    for problem in problems:
        print(problem)
    return not problems


def listening(port):
    with socket.socket() as s:
        s.settimeout(0.5)
        return s.connect_ex(("127.0.0.1", port)) == 0


def stop(server):
    if server is None or server.poll() is not None:
        return
    # As a reader's Ctrl-C: the whole process group (cargo, and what it started).
    os.killpg(server.pid, signal.SIGINT)
    try:
        server.wait(timeout=20)
    except subprocess.TimeoutExpired:
        os.killpg(server.pid, signal.SIGKILL)
        server.wait()


def run(name, logs):
    """Runs the marked blocks of `name`; returns how many failed."""
    text = (ROOT / name).read_text()
    server, failed = None, 0
    try:
        for n, language, marker, body in blocks(text):
            kind = MARKER.match(marker) if marker else None
            if not kind or kind.group(1).startswith("not run"):
                continue
            script = commands(language, body)
            where = f"{name}:{n}"
            if kind.group(2):
                stop(server)
                port = int(kind.group(2))
                log = open(logs / f"{name.replace('/', '_')}-{n}.log", "w")
                print(f"==> {where}: background, awaited on port {port}\n{script}", flush=True)
                server = subprocess.Popen(["bash", "-c", script], cwd=ROOT, stdout=log,
                                          stderr=subprocess.STDOUT, start_new_session=True)
                started = time.monotonic()
                while not listening(port):
                    if server.poll() is not None or time.monotonic() - started > BLOCK_TIMEOUT:
                        print(f"FAIL {where}: nothing listens on {port}; its log: {log.name}")
                        print(Path(log.name).read_text()[-3000:])
                        return failed + 1
                    time.sleep(0.5)
                continue
            print(f"==> {where}\n{script}", flush=True)
            try:
                result = subprocess.run(["bash", "-euo", "pipefail", "-c", script], cwd=ROOT,
                                        timeout=BLOCK_TIMEOUT)
                ok = result.returncode == 0
            except subprocess.TimeoutExpired:
                ok = False
            if not ok:
                print(f"FAIL {where}")
                failed += 1
    finally:
        stop(server)
    return failed


def self_test():
    text = ("a\n<!-- run -->\n```sh\ncurl -s x  # out\n```\n\n```text\n$ cargo run \\\n"
            "   --example ingress\noutput\n```\n<!-- not run: why -->\n\n   ```sh\n   cargo x\n   ```\n")
    found = list(blocks(text))
    assert [(n, lang, m) for n, lang, m, _ in found] == [
        (3, "sh", "<!-- run -->"), (7, "text", None), (14, "sh", "<!-- not run: why -->")
    ], found
    assert commands("text", found[1][3]) == "cargo run \\\n   --example ingress", found[1]
    assert found[2][3] == ["cargo x"]
    assert all(has_command(lang, body) for _, lang, _, body in found)
    assert not has_command("rust", ["cargo"]) and not has_command("sh", ["echo cargo"])
    need = {"client": ["http-client"], "database": ["http-client", "sqlx"]}
    assert missing_features("cargo run -p x --example client", need) == ["http-client"]
    assert missing_features("cargo run -p x --example client --features http-client", need) == []
    line = "cargo build --example database --features deadline-propagation/sqlx"
    assert missing_features(line, need) == ["http-client"]
    assert MARKER.match("<!-- run: background 3000 -->").group(2) == "3000"
    assert not MARKER.match("<!-- not run: -->")
    print("doc_commands: self-test passed")


def main():
    args = sys.argv[1:]
    if args == ["--check"]:
        sys.exit(0 if check() else 1)
    if args == ["--self-test"]:
        self_test()
        return
    if args[:1] == ["--run"] and args[1:]:
        logs = Path(tempfile.mkdtemp(prefix="doc-commands-"))
        failed = sum(run(name, logs) for name in args[1:])
        print(f"doc_commands: {failed} block(s) failed; the servers' logs are in {logs}")
        sys.exit(1 if failed else 0)
    print(__doc__)
    sys.exit(2)


if __name__ == "__main__":
    main()

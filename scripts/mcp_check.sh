#!/usr/bin/env bash
# CI step: the MCP interop check with the official Python SDK (scripts/mcp_check.py);
# the rest of the MCP checks are Rust tests (orders-service/tests/mcp.rs).
#
#   scripts/mcp_check.sh [cargo xtask stack options, e.g. --log-dir DIR]
#
# Uses the project-local virtualenv .venv (created if missing; nothing is installed
# globally) with `mcp` 2.x. `cargo xtask stack` builds nothing: it runs the debug
# binaries `cargo test` has built (built here when missing), starts PostgreSQL and both
# services on free ports, runs the check with their URLs in the environment and stops
# everything. Needs the PostgreSQL server binaries (Debian's postgresql-15).
set -euo pipefail
cd "$(dirname "$0")/.."

if [ ! -x .venv/bin/python ]; then
    python3 -m venv .venv
fi
if ! .venv/bin/python -c 'import importlib.metadata as m, sys; sys.exit(0 if m.version("mcp").split(".")[0] == "2" else 1)' 2>/dev/null; then
    .venv/bin/pip install -q 'mcp>=2,<3'
fi

target=${CARGO_TARGET_DIR:-target}
if [ ! -x "$target/debug/orders-service" ] || [ ! -x "$target/debug/catalog-service" ]; then
    cargo build -p catalog-service -p orders-service
fi

exec cargo xtask stack --profile dev --orders-env ASSISTANT_TOOL_BUDGET_MS=800 "$@" \
    -- .venv/bin/python scripts/mcp_check.py

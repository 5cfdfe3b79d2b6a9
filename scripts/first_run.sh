#!/usr/bin/env bash
# A newcomer's first run, timed: a fresh clone of COMMIT (default HEAD) with an empty
# cargo home and an empty target/ (so crates are downloaded too), then the README's two
# commands, one after the other. Prints the seconds to the experiment's table (and how
# many of them went to building), then the seconds the tests took after it.
#
#   scripts/first_run.sh [COMMIT] [DIR]      # DIR defaults to a new temporary directory
#
# Run it on an otherwise idle machine: it measures the machine as much as the project.
set -euo pipefail

repo=$(git -C "$(dirname "$0")/.." rev-parse --show-toplevel)
commit=$(git -C "$repo" rev-parse "${1:-HEAD}")
dir=${2:-$(mktemp -d)}
mkdir -p "$dir"
git clone -q "$repo" "$dir/repo"
git -C "$dir/repo" checkout -q "$commit"
export CARGO_HOME="$dir/cargo-home"
unset CARGO_TARGET_DIR
mkdir -p "$CARGO_HOME"
cd "$dir/repo"

# Each line of output with the seconds since the command started.
stamped() {
    local start=$SECONDS
    "$@" 2>&1 | while IFS= read -r line; do printf '%4d %s\n' $((SECONDS - start)) "$line"; done
    return "${PIPESTATUS[0]}"
}

status=0
stamped cargo xtask experiment > "$dir/experiment.log" || status=1
stamped cargo test --workspace > "$dir/test.log" || status=1

experiment=$(tail -n 1 "$dir/experiment.log" | awk '{print $1}')
built=$(awk '/ run 1\/1: / {print $1; exit}' "$dir/experiment.log")
tests=$(tail -n 1 "$dir/test.log" | awk '{print $1}')
tests_built=$(awk '/Finished `test` profile/ {print $1; exit}' "$dir/test.log")
echo "commit $commit, logs in $dir"
echo "cargo xtask experiment: table after ${experiment} s (${built:-?} s of it building and installing k6)"
echo "cargo test --workspace: ${tests} s after it (${tests_built:-?} s of it building)"
echo "tests: $(awk '/^ *[0-9]+ test result:/ { p += $5; f += $7 } END { printf "%d passed, %d failed", p, f }' "$dir/test.log")"
exit "$status"

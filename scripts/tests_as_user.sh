#!/usr/bin/env bash
# The test suite as a contributor who is not root meets it: every test binary of the
# workspace (the ones `cargo test --workspace` just built) run as an unprivileged user,
# each from its package's folder as cargo runs it. PostgreSQL then runs as that user
# (test_support::postgres); the suites that cut links (iptables, NFQUEUE) say why they
# do not run and pass. Fails when any binary fails, or when a suite that needs root
# ran without saying so.
#
# Usage, as root: scripts/tests_as_user.sh [USER]   (default: dp-tester, created if missing)
set -euo pipefail
user=${1:-dp-tester}
id -u "$user" >/dev/null 2>&1 ||
    useradd --system --no-create-home --home-dir /nonexistent --shell /usr/sbin/nologin "$user"

log=$(mktemp)
chmod 644 "$log"
binaries=$(cargo test --workspace --no-run --message-format=json 2>/dev/null |
    jq -r 'select(.reason == "compiler-artifact" and .profile.test == true and .executable != null)
           | "\(.executable) \(.manifest_path)"')
failed=0
# A temporary folder of the user's own: test_support's clusters live there (each one's
# watchdog removes it once its test binary has exited; the folder goes at the end).
tmp=$(runuser -u "$user" -- mktemp -d)
trap 'rm -rf "$tmp" 2>/dev/null || true' EXIT
while read -r binary manifest; do
    dir=$(dirname "$manifest")
    if ! runuser -u "$user" -- env -i PATH="$PATH" HOME=/nonexistent TMPDIR="$tmp" \
        bash -c 'cd "$1" && "$2" 2>&1' _ "$dir" "$binary" >>"$log"; then
        echo "FAILED as $user: $binary" >&2
        failed=1
    fi
done <<<"$binaries"

grep '^test result:' "$log" |
    awk '{ p += $4; f += $6 } END { printf "as %s: %d passed, %d failed\n", u, p, f }' u="$user"
skipped=$(grep -c '^skipped .*needs root' "$log" || true)
echo "as $user: $skipped tests said they need root and did not run"
if [ "$skipped" -eq 0 ]; then
    echo "no suite said it needs root: the network tests ran or failed without saying why" >&2
    failed=1
fi
if [ "$failed" -ne 0 ]; then
    grep -E '^(test .* FAILED|failures:|---- )' "$log" | head -40 >&2
    exit 1
fi

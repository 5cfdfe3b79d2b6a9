#!/usr/bin/env bash
# Static checks of the deployment files, without Docker, Grafana or a running service:
#   - promtool check config on both Prometheus configurations, and that they differ
#     only in their scrape targets;
#   - docker-compose config: the compose file is valid, and refuses to start without
#     GRAFANA_ADMIN_PASSWORD (no default admin password);
#   - cargo xtask dashboards: the dashboards' structure and metric names.
# Installs nothing: it names what to install when a tool is missing. Exits non-zero when
# any check fails (all checks run, so one run shows every problem).
set -uo pipefail
cd "$(dirname "$0")/.." || exit 2

failures=0
pass() { printf 'ok    %s\n' "$*"; }
fail() { printf 'FAIL  %s\n' "$*"; failures=$((failures + 1)); }

missing=()
command -v promtool >/dev/null || missing+=("promtool (Debian: apt-get install prometheus)")
compose=()
if command -v docker-compose >/dev/null; then
    compose=(docker-compose)
elif command -v docker >/dev/null && docker compose version >/dev/null 2>&1; then
    compose=(docker compose)
else
    missing+=("docker-compose (Debian: apt-get install docker-compose; validates without a Docker engine)")
fi
if [ ${#missing[@]} -gt 0 ]; then
    printf 'missing tools:\n' >&2
    printf '  - %s\n' "${missing[@]}" >&2
    exit 2
fi

# --- Prometheus
for config in prometheus/prometheus.yml prometheus/prometheus.local.yml; do
    if out=$(promtool check config "$config" 2>&1); then
        pass "promtool check config $config"
    else
        fail "promtool check config $config"
        printf '%s\n' "$out" | sed 's/^/      /'
    fi
done
# The local file is the compose file with loopback targets: nothing else may drift.
strip() { grep -v -e '^[[:space:]]*#' -e '^[[:space:]]*$' "$1"; }
if drift=$(diff <(strip prometheus/prometheus.yml) \
                <(strip prometheus/prometheus.local.yml \
                  | sed -e 's/"127\.0\.0\.1:8080"/"orders:8080"/' -e 's/"127\.0\.0\.1:8081"/"catalog:8081"/')); then
    pass "prometheus.local.yml differs from prometheus.yml only in its targets"
else
    fail "prometheus.local.yml and prometheus.yml differ beyond their targets"
    printf '%s\n' "$drift" | sed 's/^/      /'
fi

# --- docker-compose
# A throwaway value: `config` only interpolates, nothing is started.
if out=$(GRAFANA_ADMIN_PASSWORD=validate-only "${compose[@]}" --profile load config -q 2>&1); then
    pass "${compose[*]} config (with the load profile)"
else
    fail "${compose[*]} config"
    printf '%s\n' "$out" | sed 's/^/      /'
fi
if (unset GRAFANA_ADMIN_PASSWORD; "${compose[@]}" config -q >/dev/null 2>&1); then
    fail "docker-compose.yml starts without GRAFANA_ADMIN_PASSWORD (a default admin password?)"
else
    pass "docker-compose.yml refuses to start without GRAFANA_ADMIN_PASSWORD"
fi

# --- Grafana dashboards
if cargo xtask dashboards; then
    pass "cargo xtask dashboards (static)"
else
    fail "cargo xtask dashboards (static)"
fi

echo
if [ "$failures" -gt 0 ]; then
    echo "static validation: $failures check(s) failed"
    exit 1
fi
echo "static validation: all checks passed"

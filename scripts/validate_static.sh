#!/usr/bin/env bash
# Static checks of the deployment files, without Docker, Grafana or a running service:
#   - promtool check config on both Prometheus configurations, and that they differ
#     only in their scrape targets;
#   - promtool check rules and promtool test rules on prometheus/rules/;
#   - docker-compose config: the compose file is valid, with .env.example filled in, and
#     refuses to start without GRAFANA_ADMIN_PASSWORD, also from an unedited copy of
#     .env.example (no default admin password);
#   - cargo xtask dashboards: the dashboards' structure (their queries, metric names
#     included, run against a real Prometheus in CI's `experiment --prometheus`).
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

# --- Prometheus rules: valid, and their unit tests pass (each alert fires on what it
# names and stays quiet on its healthy twin).
rules=(prometheus/rules/*.rules.yml)
rule_tests=(prometheus/rules/tests/*.yml)
if out=$(promtool check rules "${rules[@]}" 2>&1); then
    pass "promtool check rules ${rules[*]}"
else
    fail "promtool check rules"
    printf '%s\n' "$out" | sed 's/^/      /'
fi
if out=$(promtool test rules "${rule_tests[@]}" 2>&1); then
    pass "promtool test rules ${rule_tests[*]}"
else
    fail "promtool test rules"
    printf '%s\n' "$out" | sed 's/^/      /'
fi

# --- docker-compose
# A throwaway value: `config` only interpolates, nothing is started.
if out=$(GRAFANA_ADMIN_PASSWORD=validate-only "${compose[@]}" --profile load config -q 2>&1); then
    pass "${compose[*]} config (with the load profile)"
else
    fail "${compose[*]} config"
    printf '%s\n' "$out" | sed 's/^/      /'
fi
# --env-file: a developer's own .env (with a password) must not hide the check. An
# empty file, not /dev/null: docker-compose v1 refuses that ("not a file"), which would
# pass this check for the wrong reason.
no_env=$(mktemp)
if (unset GRAFANA_ADMIN_PASSWORD; "${compose[@]}" --env-file "$no_env" config -q >/dev/null 2>&1); then
    fail "docker-compose.yml starts without GRAFANA_ADMIN_PASSWORD (a default admin password?)"
elif [[ $(unset GRAFANA_ADMIN_PASSWORD; "${compose[@]}" --env-file "$no_env" config -q 2>&1) == *GRAFANA_ADMIN_PASSWORD* ]]; then
    pass "docker-compose.yml refuses to start without GRAFANA_ADMIN_PASSWORD"
else
    fail "docker-compose config failed without GRAFANA_ADMIN_PASSWORD, but not because of it"
fi
rm -f "$no_env"
if (unset GRAFANA_ADMIN_PASSWORD; "${compose[@]}" --env-file .env.example config -q >/dev/null 2>&1); then
    fail ".env.example, copied unedited, starts Grafana with a password it ships"
else
    pass ".env.example, copied unedited, still refuses (its password is empty)"
fi
filled=$(mktemp)
sed 's/^GRAFANA_ADMIN_PASSWORD=$/GRAFANA_ADMIN_PASSWORD=validate-only/' .env.example >"$filled"
if out=$(unset GRAFANA_ADMIN_PASSWORD; "${compose[@]}" --env-file "$filled" --profile load config -q 2>&1); then
    pass ".env.example with the password filled in is all compose needs"
else
    fail ".env.example with the password filled in"
    printf '%s\n' "$out" | sed 's/^/      /'
fi
rm -f "$filled"

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

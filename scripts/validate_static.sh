#!/usr/bin/env bash
# Static checks of the deployment files, without Docker, Grafana or a running service:
#   - promtool check config on both Prometheus configurations, and that they differ
#     only in their scrape targets;
#   - promtool check rules and promtool test rules on prometheus/rules/;
#   - docker-compose config: the compose file (and its offline override) reads with no
#     .env and with .env.example as shipped, publishes on 127.0.0.1 only, and gives a
#     Grafana without a login or an account with a known password;
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
python3 -c 'import yaml' 2>/dev/null || missing+=("python3 with PyYAML (Debian: apt-get install python3-yaml)")
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
                  | sed -e 's/"127\.0\.0\.1:8080"/"orders:8080"/' -e 's/"127\.0\.0\.1:8081"/"catalog:8081"/' -e 's/"127\.0\.0\.1:9082"/"pricing:9082"/' -e 's/"127\.0\.0\.1:8083"/"shipping:8083"/')); then
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

# --- docker-compose: `docker compose up` from a fresh clone, nothing to edit. The file
# must read with no .env (an empty --env-file: a developer's own .env must not hide a
# missing default; not /dev/null, which docker-compose v1 refuses as "not a file") and
# with .env.example as it is shipped, the load profile and the offline override
# included; what it renders must publish every port on 127.0.0.1 only and give a
# Grafana without a login or an account with a known password.
no_env=$(mktemp)
rendered=$(mktemp)
for env_file in "$no_env" .env.example; do
    name=$([ "$env_file" = "$no_env" ] && echo "no .env" || echo "--env-file .env.example")
    for files in "-f docker-compose.yml" "-f docker-compose.yml -f docker-compose.offline.yml"; do
        # shellcheck disable=SC2086 # $files is two or four words on purpose
        if out=$("${compose[@]}" $files --env-file "$env_file" \
                 --profile load config 2>&1); then
            pass "${compose[*]} $files config, $name"
            [ "$files" = "-f docker-compose.yml" ] && [ "$env_file" = "$no_env" ] \
                && printf '%s\n' "$out" >"$rendered"
        else
            fail "${compose[*]} $files config, $name"
            printf '%s\n' "$out" | sed 's/^/      /'
        fi
    done
done
if [ -s "$rendered" ]; then
    if out=$(python3 - "$rendered" 2>&1 <<'PY'
import sys, yaml
services = yaml.safe_load(open(sys.argv[1]))["services"]
problems = []
for name, service in services.items():
    for port in service.get("ports", []):
        host_ip = port.get("host_ip") if isinstance(port, dict) else str(port).split(":")[0]
        if host_ip != "127.0.0.1":
            problems.append(f"{name} publishes {port} beyond 127.0.0.1")
env = services["grafana"].get("environment", {})
want = {
    "GF_AUTH_ANONYMOUS_ENABLED": {"true"},
    # Explore (an exemplar's trace in Jaeger) needs Editor or more.
    "GF_AUTH_ANONYMOUS_ORG_ROLE": {"Editor", "Admin"},
    "GF_AUTH_DISABLE_LOGIN_FORM": {"true"},
    "GF_AUTH_BASIC_ENABLED": {"false"},
    "GF_SECURITY_DISABLE_INITIAL_ADMIN_CREATION": {"true"},
}
for key, values in want.items():
    if str(env.get(key)) not in values:
        problems.append(f"grafana: {key} is {env.get(key)!r}, not one of {sorted(values)}")
for key in ("GF_SECURITY_ADMIN_USER", "GF_SECURITY_ADMIN_PASSWORD"):
    if key in env:
        problems.append(f"grafana: {key} is set: an account with a password")
print("\n".join(problems))
sys.exit(1 if problems else 0)
PY
); then
        pass "ports on 127.0.0.1 only; Grafana anonymous (Explore), no login form, no basic auth, no admin account"
    else
        fail "the rendered compose file"
        printf '%s\n' "$out" | sed 's/^/      /'
    fi
fi
rm -f "$no_env" "$rendered"

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

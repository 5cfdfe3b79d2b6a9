#!/usr/bin/env bash
# PostgreSQL's own instructions per order transaction, legacy against propagate (the
# session's limit reused, as with alike budgets) and propagate-each (a limit sent by
# every transaction, the bound on what it can cost): a
# throwaway server under callgrind (every backend it forks is counted, each into a file
# of its own), and pgbench sending each mode's transaction as `cargo xtask cost` writes
# it, over one connection, N1 and then N2 times; the difference of the two backends'
# totals over N2 - N1 leaves the connection's start-up out. Instruction counts do not
# move with what else the machine does, so they price what a few per cent of CPU time
# cannot (docs/performance.md has what they measured):
#
#   scripts/callgrind_postgres.sh        # about two minutes
#
# pgbench sends the statement as a simple query (parsed and planned every time), so the
# base is larger than the service's prepared statement's and the ratio is diluted; the
# difference per transaction is what the propagate batch adds.
set -euo pipefail
OUT=${OUT:-results/callgrind-postgres}
N1=${N1:-100} N2=${N2:-500}
PORT=${PORT:-25499}
BIN=$(ls -d /usr/lib/postgresql/*/bin | sort -V | tail -1)
rm -rf "$OUT" && mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)
# The transactions, exactly as `cargo xtask cost` sends them (one second of it).
cargo xtask cost --repeat 1 --seconds 1 --out "$OUT/cost" >/dev/null
chown -R postgres "$OUT"
runuser -u postgres -- "$BIN/initdb" -D "$OUT/data" -A trust -U postgres >/dev/null
runuser -u postgres -- valgrind --tool=callgrind --callgrind-out-file="$OUT/cg.%p.out" \
    "$BIN/postgres" -D "$OUT/data" -k "$OUT" -p "$PORT" -c listen_addresses=127.0.0.1 \
    -c fsync=off -c synchronous_commit=off -c full_page_writes=off -c autovacuum=off \
    >"$OUT/postgres.log" 2>&1 &
trap 'runuser -u postgres -- "$BIN/pg_ctl" -D "$OUT/data" stop -m immediate >/dev/null 2>&1 || true' EXIT
for _ in $(seq 1 120); do "$BIN/pg_isready" -q -h "$OUT" -p "$PORT" && break; sleep 1; done
psql -q -h "$OUT" -p "$PORT" -U postgres -c "CREATE DATABASE cost"
for migration in orders-service/migrations/*.sql; do
    psql -q -h "$OUT" -p "$PORT" -U postgres -d cost -f "$migration"
done
# The sessions carry the service's startup options, as in `cargo xtask cost`.
PGOPTIONS=$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["session_options"])' "$OUT/cost/summary.json")
export PGOPTIONS
backend_total() {  # runs $1.sql $2 times; prints the total of the backend that ran them
    local before new
    before=$(ls "$OUT"/cg.*.out 2>/dev/null || true)
    pgbench -n -M simple -c 1 -t "$2" -h 127.0.0.1 -p "$PORT" -U postgres \
        -f "$OUT/cost/$1.sql" cost >/dev/null
    # pgbench opens two sessions (a first one to look around); each backend writes its
    # file as it exits. The one that ran the transactions has the largest total.
    for _ in $(seq 1 100); do
        new=$(ls "$OUT"/cg.*.out | grep -vxF -e "$before" -e "" || true)
        [ "$(echo "$new" | grep -c .)" -ge 2 ] && break
        sleep 0.1
    done
    for file in $new; do
        grep -E '^(summary|totals):' "$file" | head -1 | awk '{print $2}'
    done | sort -n | tail -1
}
for mode in legacy propagate propagate-each legacy propagate propagate-each; do
    a=$(backend_total "$mode" "$N1"); b=$(backend_total "$mode" "$N2")
    echo "$mode: $(( (b - a) / (N2 - N1) )) instructions per transaction"
done

#!/usr/bin/env bash
# What orders-service asks of the kernel per order, legacy against propagate: a second
# orders-service beside a `cargo xtask stack`, the same binary switched at run time, k6
# sending 500 orders/s for DUR a mode while `perf stat` counts the process's task clock,
# context switches and every system call by name. Software events and tracepoints only,
# so it works where the machine has no hardware counters. Wake-ups the CPU time cannot
# explain show up here (docs/performance.md has what they measured):
#
#   cargo build --release -p orders-service -p catalog-service
#   cargo xtask stack --profile release -- scripts/perf_orders.sh
#
# Prints, per mode and per order, the task clock (inflated by perf's own tracing of every
# system call: compare the modes, not the figure) and each count that differs.
set -euo pipefail
OUT=${OUT:-results/perf}
BIN=${BIN:-target/release/orders-service}
DUR=${DUR:-10s}
RATE=${RATE:-500}
K6=${K6:-.venv/bin/k6}
ADDR=127.0.0.1:18080 ADMIN=127.0.0.1:19080
rm -rf "$OUT" && mkdir -p "$OUT"
cat >"$OUT/load.js" <<'JS'
import http from 'k6/http';
export const options = {
  scenarios: { orders: { executor: 'constant-arrival-rate', rate: Number(__ENV.RATE),
    timeUnit: '1s', duration: __ENV.DUR, preAllocatedVUs: 50 } },
};
export default function () {
  const sku = 'SKU-' + String(Math.floor(Math.random() * 1000) + 1).padStart(5, '0');
  http.post(__ENV.URL + '/api/orders', JSON.stringify({ sku: sku, quantity: 1 }),
    { headers: { 'content-type': 'application/json', 'X-Request-Timeout-Ms': '700' } });
}
JS
ORDERS_LISTEN_ADDR=$ADDR ORDERS_ADMIN_ADDR=$ADMIN RUST_LOG=warn LOG_FORMAT=text "$BIN" >"$OUT/orders.log" 2>&1 &
pid=$!
trap 'kill $pid 2>/dev/null || true' EXIT
for _ in $(seq 1 120); do curl -sf "http://$ADDR/readyz" >/dev/null && break; sleep 0.5; done
for mode in legacy propagate; do
    curl -sf -X PUT "http://$ADMIN/admin/mode" -H 'content-type: application/json' \
        -d "{\"mode\":\"$mode\"}" >/dev/null
    RATE=$RATE DUR=2s URL=http://$ADDR "$K6" run -q "$OUT/load.js" >/dev/null 2>&1   # warm
    perf stat -x, -e task-clock,context-switches,'syscalls:sys_enter_*' -p $pid \
        -o "$OUT/stat-$mode.csv" & stat=$!
    RATE=$RATE DUR=$DUR URL=http://$ADDR "$K6" run -q --summary-export "$OUT/k6-$mode.json" \
        "$OUT/load.js" >/dev/null 2>&1
    kill -INT $stat; wait $stat || true
done
python3 - "$OUT" <<'PY'
import csv, json, sys
out = sys.argv[1]
def per_order(mode):
    orders = json.load(open(f"{out}/k6-{mode}.json"))["metrics"]["http_reqs"]["count"]
    counts = {}
    for row in csv.reader(l for l in open(f"{out}/stat-{mode}.csv") if l.strip() and not l.startswith("#")):
        if row[0] and row[0][0].isdigit():
            counts[row[2].replace("syscalls:sys_enter_", "")] = float(row[0]) / orders
    return counts
legacy, propagate = per_order("legacy"), per_order("propagate")
print(f"{'per order':<20} {'legacy':>10} {'propagate':>10}")
for name in sorted(set(legacy) | set(propagate), key=lambda n: -propagate.get(n, 0)):
    a, b = legacy.get(name, 0), propagate.get(name, 0)
    if name == "task-clock" or (max(a, b) >= 0.05 and abs(a - b) >= 0.02):
        unit = " ms" if name == "task-clock" else ""
        print(f"{name:<20} {a:>10.3f} {b:>10.3f}{unit}")
PY

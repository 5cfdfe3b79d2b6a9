#!/usr/bin/env bash
# orders-service's own instructions per order, legacy against propagate: a second
# orders-service under callgrind beside a `cargo xtask stack`, the same binary switched
# at run time, 200 sequential orders a segment, legacy and propagate twice each.
# Instruction counts are the same from run to run whatever else the machine does, so
# they price a small change of the Rust side that CPU time cannot see (docs/performance.md
# has what they measured):
#
#   cargo build --release -p orders-service -p catalog-service
#   cargo xtask stack --profile release -- scripts/callgrind_orders.sh
#
# Build with CARGO_PROFILE_RELEASE_DEBUG=line-tables-only (and point BIN at that build)
# to read the counts by source file: `callgrind_annotate OUT/cg.*.out.N`.
set -euo pipefail
OUT=${OUT:-results/callgrind}
BIN=${BIN:-target/release/orders-service}
N=${N:-200}
ADDR=127.0.0.1:18080 ADMIN=127.0.0.1:19080
rm -rf "$OUT" && mkdir -p "$OUT"
ORDERS_LISTEN_ADDR=$ADDR ORDERS_ADMIN_ADDR=$ADMIN RUST_LOG=warn LOG_FORMAT=text \
    valgrind --tool=callgrind --callgrind-out-file="$OUT/cg.%p.out" "$BIN" >"$OUT/orders.log" 2>&1 &
vg=$!
trap 'kill $vg 2>/dev/null || true' EXIT
for _ in $(seq 1 120); do curl -sf "http://$ADDR/readyz" >/dev/null && break; sleep 1; done
order() {
    curl -s -o /dev/null -w '%{http_code}\n' -X POST "http://$ADDR/api/orders" \
        -H 'content-type: application/json' -H 'X-Request-Timeout-Ms: 2000' \
        -d "{\"sku\":\"SKU-$(printf %05d $((RANDOM % 1000 + 1)))\",\"quantity\":1}"
}
for mode in legacy propagate legacy propagate; do
    curl -sf -X PUT "http://$ADMIN/admin/mode" -H 'content-type: application/json' \
        -d "{\"mode\":\"$mode\"}" >/dev/null
    for _ in $(seq 1 20); do order >/dev/null; done   # this mode's paths warm
    callgrind_control -z $vg >/dev/null
    created=$(for _ in $(seq 1 "$N"); do order; done | grep -c '^201$' || true)
    callgrind_control -d "$mode" $vg >/dev/null
    file=$(ls -t "$OUT"/cg.*.out.* | head -1)
    total=$(grep '^summary:' "$file" | cut -d' ' -f2)
    echo "$mode: $created of $N orders created, $((total / N)) instructions per order ($file)"
done

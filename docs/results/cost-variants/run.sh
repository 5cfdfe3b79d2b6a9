#!/bin/bash
# Runs each variant in rotation against $DATABASE_URL.
PGB=/usr/lib/postgresql/15/bin/pgbench
cd "$(dirname "$0")"
for round in 1 2 3 4 5 6 7 8; do
  set -- A-legacy B-full C-nomarker D-markeronly
  # rotate the order each round
  for i in $(seq 1 $(( (round-1) % 4 ))); do set -- "${@:2}" "$1"; done
  for v in "$@"; do
    tps=$($PGB -n -M simple -j 2 -c 8 -T 5 -f $v.sql "$DATABASE_URL" 2>&1 | grep -oP 'tps = \K[0-9.]+')
    echo "$round $v $tps"
  done
done

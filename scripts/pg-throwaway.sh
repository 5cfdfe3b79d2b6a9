#!/usr/bin/env bash
# A throwaway PostgreSQL for local runs, from Debian's postgresql-15 binaries.
#
#   scripts/pg-throwaway.sh start DIR PORT   # initdb + start; prints the DATABASE_URL
#   scripts/pg-throwaway.sh stop DIR         # stop and delete DIR
#
# PostgreSQL refuses to run as root, so as root initdb and postgres run as the
# `postgres` user (docs/design.md §10). Data lives in DIR and is deleted by `stop`.
set -euo pipefail

bindir() {
    local dir
    dir=$(pg_config --bindir 2>/dev/null || true)
    if [ -x "$dir/initdb" ]; then echo "$dir"; return; fi
    for dir in /usr/lib/postgresql/*/bin; do
        if [ -x "$dir/initdb" ]; then echo "$dir"; return; fi
    done
    echo "no PostgreSQL server binaries: apt-get install postgresql-15" >&2
    exit 1
}

as_owner() {
    if [ "$(id -u)" = 0 ]; then runuser -u postgres -- "$@"; else "$@"; fi
}

cmd=${1:?usage: $0 start DIR PORT | stop DIR}
dir=${2:?DIR missing}
case "$cmd" in
start)
    port=${3:?PORT missing}
    bin=$(bindir)
    mkdir -p "$dir"
    dir=$(cd "$dir" && pwd)
    [ "$(id -u)" = 0 ] && chown postgres:postgres "$dir"
    as_owner "$bin/initdb" -D "$dir/data" -A trust -U postgres -E UTF8 --no-sync >"$dir/initdb.log" 2>&1
    as_owner "$bin/pg_ctl" -D "$dir/data" -l "$dir/postgres.log" -w -t 30 start \
        -o "-k $dir -p $port -c listen_addresses=127.0.0.1 -c max_connections=300 -c fsync=off -c synchronous_commit=off" >/dev/null
    as_owner "$bin/psql" -h 127.0.0.1 -p "$port" -U postgres -qc "CREATE DATABASE orders" >/dev/null
    echo "postgres://postgres@127.0.0.1:$port/orders"
    ;;
stop)
    bin=$(bindir)
    if [ -d "$dir/data" ]; then
        as_owner "$bin/pg_ctl" -D "$dir/data" -m fast -w stop >/dev/null 2>&1 || true
    fi
    rm -rf "$dir"
    ;;
*)
    echo "usage: $0 start DIR PORT | stop DIR" >&2
    exit 2
    ;;
esac

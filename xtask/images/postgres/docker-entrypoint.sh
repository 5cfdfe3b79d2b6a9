#!/bin/bash
# The entrypoint of the PostgreSQL stand-in image (see Dockerfile beside this file):
# the part of the official image's entrypoint that docker-compose.yml uses.
#
#   docker-entrypoint.sh postgres [server options...]
#
# On the first start (an empty PGDATA) it creates the cluster with POSTGRES_USER as the
# superuser and POSTGRES_PASSWORD as its password, then POSTGRES_DB, on a server that
# listens on the socket only, so a health check over TCP fails until the real server
# is up. Any other command is run as given.
set -euo pipefail

if [ "${1:-}" != postgres ]; then
    exec "$@"
fi
shift

# PostgreSQL refuses to run as root: prepare the folders, then run this script again
# as the postgres user.
if [ "$(id -u)" = 0 ]; then
    mkdir -p "$PGDATA" /var/run/postgresql
    chown postgres:postgres "$PGDATA" /var/run/postgresql
    chmod 700 "$PGDATA"
    exec setpriv --reuid=postgres --regid=postgres --init-groups "$0" postgres "$@"
fi

if [ ! -s "$PGDATA/PG_VERSION" ]; then
    : "${POSTGRES_PASSWORD:?POSTGRES_PASSWORD must be set: the password of POSTGRES_USER}"
    user=${POSTGRES_USER:-postgres}
    db=${POSTGRES_DB:-$user}
    pwfile=$(mktemp)
    printf '%s' "$POSTGRES_PASSWORD" >"$pwfile"
    initdb --pgdata="$PGDATA" --username="$user" --pwfile="$pwfile" \
        --encoding=UTF8 --locale=C.UTF-8 --auth-local=trust --auth-host=scram-sha-256
    rm -f "$pwfile"
    # Other containers connect over the network, with the password.
    echo 'host all all all scram-sha-256' >>"$PGDATA/pg_hba.conf"
    if [ "$db" != postgres ]; then
        pg_ctl --pgdata="$PGDATA" --wait --options="-c listen_addresses=''" start
        # psql quotes the name (:"db"), only in statements read from its input.
        echo 'CREATE DATABASE :"db";' | psql --no-psqlrc --set=ON_ERROR_STOP=1 \
            --username="$user" --dbname=postgres --set=db="$db"
        pg_ctl --pgdata="$PGDATA" --wait --mode=fast stop
    fi
fi

exec postgres -D "$PGDATA" -c listen_addresses='*' "$@"

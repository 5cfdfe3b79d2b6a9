#!/bin/sh
# The entrypoint of docker-compose.yml's k6 service: k6's own, but for who owns what it
# writes. The container runs as root, so it can write into ./results whoever owns it
# (Docker creates a missing bind-mount folder as root). Before k6 starts, the results
# folder and the summary file (K6_SUMMARY_EXPORT) are handed to the owner of the mounted
# k6/ folder, the user who cloned the repository; k6 then writes into a file that is
# already theirs, and nothing it leaves on the host belongs to root. `exec`: k6 is the
# container's first process, so Ctrl-C and `docker stop` reach it and its teardown()
# removes the catalog fault.
set -eu
owner=$(stat -c %u:%g /k6)
if [ -n "${K6_SUMMARY_EXPORT:-}" ]; then
    folder=$(dirname "$K6_SUMMARY_EXPORT")
    mkdir -p "$folder"
    touch "$K6_SUMMARY_EXPORT"
    chown "$owner" "$folder" "$K6_SUMMARY_EXPORT"
fi
exec k6 "$@"

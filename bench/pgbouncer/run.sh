#!/usr/bin/env bash
# Marquee behind PgBouncer (Debian's 1.18) in transaction mode: does it work? Starts the bench cluster, PgBouncer in
# front of it, `serve` through PgBouncer, and sends N concurrent writes (PUT activity types, each a transaction that
# uses prepared statements). Prints the HTTP status counts and the database errors `serve` logged.
#   MODE=transaction|session (default transaction), N (default 300), CONCURRENCY (default 16),
#   POOL_SIZE (PgBouncer's default_pool_size, default 4; `serve` opens 8)
source "$(dirname "$0")/../lib.sh"
mode=${MODE:-transaction}
n=${N:-300}
concurrency=${CONCURRENCY:-16}
bench_build
bench_pg
machine
pgbouncer --version | head -1
"$bin/marquee" migrate >/dev/null 2>&1
export MARQUEE_MASTER_KEY
MARQUEE_MASTER_KEY=$(head -c 32 /dev/urandom | base64)
app_key=$("$bin/marquee" tenant create --name pgbouncer --json | sed -n 's/.*"app":"\([^"]*\)".*/\1/p')

work=$(mktemp -d /tmp/marquee-pgbouncer.XXXXXX)
chmod 755 "$work"
bouncer_port=$((PGPORT + 1000))
api_port=$((PGPORT + 1001))
cat >"$work/pgbouncer.ini" <<INI
[databases]
marquee = host=127.0.0.1 port=$PGPORT dbname=marquee
[pgbouncer]
listen_addr = 127.0.0.1
listen_port = $bouncer_port
unix_socket_dir =
auth_type = trust
auth_file = $work/users.txt
pool_mode = $mode
default_pool_size = ${POOL_SIZE:-4}
max_client_conn = 200
; Marquee sends TimeZone, DateStyle and IntervalStyle (and the worker its role) in the \`options\` startup parameter,
; which 1.18 refuses outright; ignoring it loses those settings (see Deploy/SCALING.md).
ignore_startup_parameters = extra_float_digits,options
INI
printf '"marquee_app" ""\n' >"$work/users.txt"
chown -R postgres "$work" 2>/dev/null || true
pids=()
cleanup() { for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done; wait 2>/dev/null || true; rm -rf "$work"; }
trap cleanup EXIT
if [ "$(id -u)" = 0 ]; then su postgres -s /bin/sh -c "pgbouncer $work/pgbouncer.ini" >"$work/pgbouncer.log" 2>&1 &
else pgbouncer "$work/pgbouncer.ini" >"$work/pgbouncer.log" 2>&1 & fi
pids+=($!)
sleep 0.5
DATABASE_URL="postgresql://marquee_app@127.0.0.1:$bouncer_port/marquee" MARQUEE_LISTEN="127.0.0.1:$api_port" \
  MARQUEE_DB_POOL_SIZE=8 MARQUEE_KEY_CACHE_SECONDS=0 "$bin/marquee" serve >"$work/serve.log" 2>&1 &
pids+=($!)
for _ in $(seq 1 100); do curl -sf "http://127.0.0.1:$api_port/healthz" >/dev/null && break; sleep 0.1; done
echo "pool_mode=$mode, $n PUT /v1/activity_types/… with $concurrency in parallel:"
seq 1 "$n" | xargs -P "$concurrency" -I{} curl -s -o /dev/null -w "%{http_code}\n" -X PUT \
  "http://127.0.0.1:$api_port/v1/activity_types/com.bench.t{}" -H "Authorization: Bearer $app_key" \
  -H 'Content-Type: application/json' -d '{"attributes_type":"A","payload_profile":"marquee"}' | sort | uniq -c
echo "database errors logged by serve (SQLSTATE):"
grep -o 'server error ([0-9A-Z]*)' "$work/serve.log" | sort | uniq -c || echo "  none"

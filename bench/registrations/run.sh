#!/usr/bin/env bash
# registrations: PUT push-to-start tokens/s with wrk at 64 connections against `marquee serve` (release build,
# fsync on). Every request registers a new token for one of 1,000 devices, so each is a rotation.
source "$(dirname "$0")/../lib.sh"
MARQUEE_EXTRA_PACKAGES="wrk" "$root/Deploy/local/deps.sh"
bench_build
bench_pg
port=${PORT:-18081}
devices=${DEVICES:-1000}
export DEVICES=$devices
export MARQUEE_LISTEN=127.0.0.1:$port
MARQUEE_MASTER_KEY=$(head -c 32 /dev/urandom | base64)
export MARQUEE_MASTER_KEY MARQUEE_MIGRATIONS_DIR="$root/Migrations" MARQUEE_LOG_LEVEL=${MARQUEE_LOG_LEVEL:-warning}
export MARQUEE_DB_POOL_SIZE=${MARQUEE_DB_POOL_SIZE:-32}
"$bin/marquee" migrate >/dev/null 2>&1
created=$("$bin/marquee" tenant create --name "bench-$(date +%s)" --json)
SDK_KEY=$(echo "$created" | sed -n 's/.*"sdk":"\([^"]*\)".*/\1/p')
tenant=$(echo "$created" | sed -n 's/^{"created_at":"[^"]*","id":"\([^"]*\)".*/\1/p')
export SDK_KEY
DATABASE_URL=$APP_DATABASE_URL "$bin/marquee" serve >"$out/registrations-serve.log" 2>&1 &
pid=$!
trap 'kill -TERM $pid 2>/dev/null || true; wait $pid 2>/dev/null || true; bench_pg_stop' EXIT
for _ in $(seq 1 100); do curl -sf "http://$MARQUEE_LISTEN/healthz" >/dev/null && break; sleep 0.1; done

echo "setup: registering $devices iOS devices" >&2
seq 0 $((devices - 1)) | xargs -P 8 -I{} sh -c '
  d=$(printf "%08x" {}); tok="$d$d$d$d$d$d$d$d"
  curl -sf -o /dev/null -X PUT "http://$MARQUEE_LISTEN/v1/people/p{}/devices/$tok" \
    -H "Authorization: Bearer $SDK_KEY" -H "Content-Type: application/json" -d "{\"platform\":\"ios\"}" || echo fail'

machine
echo "== wrk -t2 -c64 -d10s PUT /v1/people/{id}/devices/{token}/push_to_start/{type} (rotating tokens)"
wrk -t2 -c64 -d10s -s "$root/bench/registrations/put-push-to-start.lua" "http://$MARQUEE_LISTEN"
psql -qtA "$DATABASE_URL" -c "SELECT status, count(*) FROM push_to_start_tokens WHERE tenant_id = '$tenant' GROUP BY status ORDER BY status"

# The same statement the endpoint runs, straight from pgbench: the database's ceiling for this write.
cat >"$out/registrations.sql" <<SQL
\\set d random(0, $((devices - 1)))
SELECT * FROM marquee_register_push_to_start('$tenant'::uuid, 'p' || :d::int, repeat(lpad(to_hex(:d::int), 8, '0'), 8),
  'com.example.delivery', md5(random()::text) || md5(random()::text), 'DeliveryAttributes', 'marquee', 'delivery');
SQL
clients=${MARQUEE_DB_POOL_SIZE}
echo "== pgbench -M prepared -c $clients -j 2 -T 10 -f registrations.sql (the endpoint's SQL)"
pgbench -n -M prepared -h 127.0.0.1 -p "$PGPORT" -U postgres -c "$clients" -j 2 -T 10 -f "$out/registrations.sql" marquee 2>&1 \
  | grep -E "^(tps|latency average|number of failed)"
echo "non-2xx in server log: $(grep -c '"http.status":[45]' "$out/registrations-serve.log" || true)"
echo "server RSS after run: $(ps -o rss= -p $pid) KiB"

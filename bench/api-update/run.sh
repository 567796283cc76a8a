#!/usr/bin/env bash
# api-update: committed updates/s and latency for POST /v1/live_notifications/update with wrk at 64 connections
# against 10,000 existing instances (one iOS activity token each), fsync on. Side by side, pgbench runs the SQL the
# endpoint runs for one request (the context read, then the write statement and a NOTIFY in one transaction),
# which is what PostgreSQL allows without group commit.
# APIS=N (default 1) runs N `marquee serve` processes on consecutive ports, with one wrk per process sharing the 64
# connections, and reports the sum (scale-out: bench/scaleout).
source "$(dirname "$0")/../lib.sh"
MARQUEE_EXTRA_PACKAGES="wrk" "$root/Deploy/local/deps.sh"
bench_build
bench_pg
port=${PORT:-18083}
apis=${APIS:-1}
instances=${INSTANCES:-10000}
export INSTANCES=$instances
export MARQUEE_LISTEN=127.0.0.1:$port
MARQUEE_MASTER_KEY=$(head -c 32 /dev/urandom | base64)
export MARQUEE_MASTER_KEY MARQUEE_MIGRATIONS_DIR="$root/Migrations" MARQUEE_LOG_LEVEL=${MARQUEE_LOG_LEVEL:-warning}
export MARQUEE_DB_POOL_SIZE=${MARQUEE_DB_POOL_SIZE:-16}
"$bin/marquee" migrate >/dev/null 2>&1
created=$("$bin/marquee" tenant create --name "bench-$(date +%s)" --json)
APP_KEY=$(echo "$created" | sed -n 's/.*"app":"\([^"]*\)".*/\1/p')
tenant=$(echo "$created" | sed -n 's/^{"created_at":"[^"]*","id":"\([^"]*\)".*/\1/p')
export APP_KEY

echo "setup: $instances instances with one activity token each" >&2
psql -q "$DATABASE_URL" <<SQL
INSERT INTO activity_types (tenant_id, identifier, attributes_type) VALUES ('$tenant', 'com.example.delivery', 'DeliveryAttributes');
INSERT INTO people (tenant_id, id) SELECT '$tenant', 'p' || i FROM generate_series(0, $instances - 1) i;
INSERT INTO devices (tenant_id, token, person_id, platform)
  SELECT '$tenant', repeat(lpad(to_hex(i), 8, '0'), 8), 'p' || i, 'ios' FROM generate_series(0, $instances - 1) i;
INSERT INTO instances (tenant_id, id, activity_type, person_id, state, attributes, content_state, content_timestamp, expires_at)
  SELECT '$tenant', 'bench-' || i, 'com.example.delivery', 'p' || i, 'active', '{"order":"x"}', '{"status":"new"}',
         extract(epoch from now())::bigint, now() + interval '8 hours'
  FROM generate_series(0, $instances - 1) i;
INSERT INTO activity_tokens (tenant_id, instance_id, device_token, token)
  SELECT '$tenant', 'bench-' || i, repeat(lpad(to_hex(i), 8, '0'), 8), md5(i::text) || md5((i + 1)::text)
  FROM generate_series(0, $instances - 1) i;
VACUUM ANALYZE;
SQL

api_pids=()
for a in $(seq 0 $((apis - 1))); do
  MARQUEE_LISTEN=127.0.0.1:$((port + a)) DATABASE_URL=$APP_DATABASE_URL "$bin/marquee" serve \
    >"$out/api-update-serve-$a.log" 2>&1 &
  api_pids+=($!)
done
pid=${api_pids[0]}
trap 'for p in "${api_pids[@]}"; do kill -TERM $p 2>/dev/null; wait $p 2>/dev/null; done; bench_pg_stop' EXIT
for a in $(seq 0 $((apis - 1))); do
  for _ in $(seq 1 100); do curl -sf "http://127.0.0.1:$((port + a))/healthz" >/dev/null && break; sleep 0.1; done
done

machine
before=$(psql -qtA "$DATABASE_URL" -c "SELECT count(*) FROM deliveries WHERE tenant_id = '$tenant'")
if [ "$apis" = 1 ]; then
  echo "== wrk -t2 -c64 -d10s POST /v1/live_notifications/update (10k instances, 1 token each)"
  wrk -t2 -c64 -d10s -s "$root/bench/api-update/update.lua" "http://$MARQUEE_LISTEN"
else
  echo "== $apis x wrk -t1 -c$((64 / apis)) -d10s POST /v1/live_notifications/update, one per API process"
  wrk_pids=()
  for a in $(seq 0 $((apis - 1))); do
    wrk -t1 -c$((64 / apis)) -d10s -s "$root/bench/api-update/update.lua" "http://127.0.0.1:$((port + a))" \
      >"$out/api-update-wrk-$a.txt" &
    wrk_pids+=($!)
  done
  wait "${wrk_pids[@]}"
  cat "$out"/api-update-wrk-*.txt | grep -E "Requests/sec|^p50"
  echo "sum: $(cat "$out"/api-update-wrk-*.txt | awk '/Requests\/sec/ { s += $2 } END { printf "%.0f", s }') requests/s"
fi
after=$(psql -qtA "$DATABASE_URL" -c "SELECT count(*) FROM deliveries WHERE tenant_id = '$tenant'")
echo "deliveries committed during the run: $((after - before))"
curl -s "http://$MARQUEE_LISTEN/metrics" | grep -E "^marquee_group_commit_(batches|statements)_total" || true
echo "non-2xx in server logs: $(cat "$out"/api-update-serve-*.log | grep -c '"http.status":[45]' || true)"
for p in "${api_pids[@]}"; do echo "server RSS after run: $(ps -o rss= -p "$p") KiB"; done
for p in "${api_pids[@]}"; do kill -TERM "$p"; wait "$p" || true; done

# The endpoint's SQL for one request, one transaction per request as without group commit.
cat >"$out/api-update.sql" <<SQL
\\set i random(0, $((instances - 1)))
SELECT * FROM marquee_change_context('$tenant', 'bench-' || :i, NULL);
BEGIN;
SELECT marquee_enter_tenant('$tenant');
WITH upd AS (
  UPDATE instances SET content_state = jsonb_set(content_state, '{step}', to_jsonb(:i::int)), version = version + 1,
         content_timestamp = content_timestamp + 1, updated_at = now()
  WHERE tenant_id = '$tenant' AND id = 'bench-' || :i RETURNING version
), sup AS (
  UPDATE deliveries SET status = 'superseded', updated_at = now()
  WHERE tenant_id = '$tenant' AND instance_id = 'bench-' || :i AND status = 'queued' AND operation <> 'start'
    AND token = ANY(ARRAY[md5(:i::text) || md5((:i::int + 1)::text)]) AND (locked_until IS NULL OR locked_until < now())
    AND EXISTS (SELECT 1 FROM upd) RETURNING 1
), dels AS (
  INSERT INTO deliveries (tenant_id, id, instance_id, device_token, provider, token_kind, token, operation, instance_version)
  SELECT '$tenant', gen_random_uuid(), 'bench-' || :i, repeat(lpad(to_hex(:i::int), 8, '0'), 8), 'apns', 'activity',
         md5(:i::text) || md5((:i::int + 1)::text), 'update', (SELECT version FROM upd)
  WHERE EXISTS (SELECT 1 FROM upd) RETURNING 1
)
SELECT (SELECT version FROM upd), (SELECT count(*) FROM dels);
SELECT pg_notify('marquee_deliveries', '');
COMMIT;
SQL
echo "== pgbench -M prepared -c 16 -j 2 -T 10 -f api-update.sql (the endpoint's SQL, one transaction per request)"
pgbench -n -M prepared -h 127.0.0.1 -p "$PGPORT" -U postgres -c 16 -j 2 -T 10 -f "$out/api-update.sql" marquee 2>&1 \
  | grep -E "^(tps|latency average|number of failed)"

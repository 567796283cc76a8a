#!/usr/bin/env bash
# api-update: committed updates/s and latency for POST /v1/live_notifications/update with wrk at 64 connections
# against INSTANCES (10,000) instances, fsync on. Everything is built through the API, as users drive it: one
# activity type, the people (POST /v1/people/import: each with an iPhone and a push-to-start token), one start per
# person and one activity token per started instance (`marquee-bench requests`, 32 connections). Then, side by
# side on the same cluster:
#   - pgbench of the SQL the endpoint runs for one request (the context read, then the write statement and a NOTIFY
#     in one transaction), which is what PostgreSQL allows without group commit;
#   - pgbench of a naive transaction (one UPDATE and one INSERT), 64 clients: the yardstick of issue 11.
# HOT=1 adds the hot-instance variant: HOT_REQUESTS (20,000) updates over the first 10 instances from 64
# connections, each with its own step; p50/p99, and whether every instance ended with the state of its
# highest-versioned accepted update (nothing lost). PERF=1 samples the API process with linux perf during wrk; PGSS=1
# (with PG_OPTIONS="-c shared_preload_libraries=pg_stat_statements") lists PostgreSQL's time by statement during it.
# APIS=N (default 1) runs N `marquee serve` processes on consecutive ports, with one wrk per process sharing the 64
# connections, and reports the sum (scale-out: bench/scaleout).
source "$(dirname "$0")/../lib.sh"
MARQUEE_EXTRA_PACKAGES="wrk$([ "${PERF:-0}" = 1 ] && echo " linux-perf")" "$root/Deploy/local/deps.sh"
bench_build
bench_pg
port=${PORT:-18083}
apis=${APIS:-1}
instances=${INSTANCES:-10000}
work="$out/api-update"
mkdir -p "$work"
export INSTANCES=$instances
export MARQUEE_LISTEN=127.0.0.1:$port
MARQUEE_MASTER_KEY=$(head -c 32 /dev/urandom | base64)
export MARQUEE_MASTER_KEY MARQUEE_MIGRATIONS_DIR="$root/Migrations" MARQUEE_LOG_LEVEL=${MARQUEE_LOG_LEVEL:-warning}
export MARQUEE_DB_POOL_SIZE=${MARQUEE_DB_POOL_SIZE:-16}
"$bin/marquee" migrate >/dev/null 2>&1
created=$("$bin/marquee" tenant create --name "bench-$(date +%s)" --json)
APP_KEY=$(echo "$created" | sed -n 's/.*"app":"\([^"]*\)".*/\1/p')
SDK_KEY=$(echo "$created" | sed -n 's/.*"sdk":"\([^"]*\)".*/\1/p')
tenant=$(echo "$created" | sed -n 's/^{"created_at":"[^"]*","id":"\([^"]*\)".*/\1/p')
export APP_KEY SDK_KEY

api_pids=()
for a in $(seq 0 $((apis - 1))); do
  MARQUEE_LISTEN=127.0.0.1:$((port + a)) DATABASE_URL=$APP_DATABASE_URL "$bin/marquee" serve \
    >"$out/api-update-serve-$a.log" 2>&1 &
  api_pids+=($!)
done
pid=${api_pids[0]}
trap 'for p in "${api_pids[@]}"; do kill -TERM $p 2>/dev/null || true; wait $p 2>/dev/null || true; done; bench_pg_stop' EXIT
for a in $(seq 0 $((apis - 1))); do
  for _ in $(seq 1 100); do curl -sf "http://127.0.0.1:$((port + a))/healthz" >/dev/null && break; sleep 0.1; done
done

bench_scenario_through_api "$instances" "$work" "$port"
psql -q "$DATABASE_URL" -c "VACUUM ANALYZE"

machine
api_cpu0=0
for p in "${api_pids[@]}"; do api_cpu0=$((api_cpu0 + $(bench_ticks "$p"))); done
busy0=$(bench_busy_ticks)
before=$(psql -qtA "$DATABASE_URL" -c "SELECT count(*) FROM deliveries WHERE tenant_id = '$tenant'")
bench_pgss_reset
if [ "$apis" = 1 ]; then
  echo "== wrk -t2 -c64 -d10s POST /v1/live_notifications/update (10k instances, 1 token each)"
  # PERF=1: where the API's CPU goes, sampled for 8 s of the run (call graphs; report below).
  perf_pid=
  if [ "${PERF:-0}" = 1 ]; then
    perf record -q -F 999 -g -p "$pid" -o "$work/perf.data" -- sleep 8 >/dev/null 2>&1 &
    perf_pid=$!
  fi
  wrk -t2 -c64 -d10s -s "$root/bench/api-update/update.lua" "http://$MARQUEE_LISTEN"
  if [ -n "$perf_pid" ]; then
    wait "$perf_pid" || true
    echo "== perf: the API's CPU by thread, then its hottest symbols (self time)"
    bench_perf_report "$work/perf.data"
  fi
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
busy1=$(bench_busy_ticks)
api_cpu1=0
for p in "${api_pids[@]}"; do api_cpu1=$((api_cpu1 + $(bench_ticks "$p"))); done
after=$(psql -qtA "$DATABASE_URL" -c "SELECT count(*) FROM deliveries WHERE tenant_id = '$tenant'")
hz=$(getconf CLK_TCK)
echo "CPU seconds during the run: API $(awk -v t=$((api_cpu1 - api_cpu0)) -v h="$hz" 'BEGIN { printf "%.1f", t / h }'), everything else (PostgreSQL, wrk, the OS) $(awk -v t=$((busy1 - busy0 - api_cpu1 + api_cpu0)) -v h="$hz" 'BEGIN { printf "%.1f", t / h }') of $(awk -v t=$((busy1 - busy0)) -v h="$hz" 'BEGIN { printf "%.1f", t / h }') busy"
echo "deliveries committed during the run: $((after - before))"
# PGSS=1 (with PG_OPTIONS="-c shared_preload_libraries=pg_stat_statements"): PostgreSQL's time by statement.
bench_pgss_report
curl -s "http://$MARQUEE_LISTEN/metrics" | grep -E "^marquee_group_commit_(batches|statements)_total" || true
echo "non-2xx in server logs: $(cat "$out"/api-update-serve-*.log | grep -c '"http.status":[45]' || true)"
for p in "${api_pids[@]}"; do echo "server RSS after run: $(ps -o rss= -p "$p") KiB"; done

if [ "${HOT:-0}" = 1 ]; then
  hot_n=${HOT_REQUESTS:-20000}
  python3 - "$hot_n" "$work/hot.txt" <<'PY'
import sys
n, path = int(sys.argv[1]), sys.argv[2]
with open(path, "w") as f:
    for k in range(n):
        f.write(f'POST /v1/live_notifications/update APP_KEY {{"instance_id":"bench-{k % 10}","content_state_patch":{{"step":{k}}}}}\n')
PY
  echo "== hot instances: $hot_n updates over 10 instances, 64 connections (marquee-bench requests)"
  "$bin/marquee-bench" requests --port "$port" --connections 64 --timeout 30 --input "$work/hot.txt" \
    --output "$work/hot.tsv"
  # The accepted update with the highest version of each instance, and the state each instance shows now.
  for k in $(seq 0 9); do
    curl -sf "http://$MARQUEE_LISTEN/v1/live_notifications/bench-$k" -H "Authorization: Bearer $APP_KEY"; echo
  done >"$work/hot-final.ndjson"
  python3 - "$work/hot.tsv" "$work/hot-final.ndjson" <<'PY'
import json, re, sys
latencies, newest, statuses = [], {}, {}
for line in open(sys.argv[1]):
    index, status, sent, done, _, body = line.rstrip("\n").split("\t", 5)
    statuses[status] = statuses.get(status, 0) + 1
    if status != "200":
        continue
    latencies.append((float(done) - float(sent)) * 1000)
    m = re.search(r'"instance_id":"bench-(\d+)"', body)
    v = re.search(r'"version":(\d+)', body)
    k, version = int(m.group(1)), int(v.group(1))
    if version > newest.get(k, (0, -1))[0]:
        newest[k] = (version, int(index))
latencies.sort()
pct = lambda p: latencies[min(len(latencies) - 1, int(len(latencies) * p))]
lost = 0
for line in open(sys.argv[2]):
    shown = json.loads(line)
    k = int(shown["instance_id"].split("-")[1])
    version, index = newest[k]
    if shown["version"] != version or shown["content_state"].get("step") != index:
        lost += 1
        print(f"bench-{k}: shows version {shown['version']} step {shown['content_state'].get('step')}, "
              f"highest accepted version {version} was step {index}")
print(f"hot: statuses {statuses}; p50 {pct(0.5):.1f} ms, p99 {pct(0.99):.1f} ms; "
      f"instances not showing their newest accepted update: {lost} of {len(newest)}")
PY
fi
for p in "${api_pids[@]}"; do kill -TERM "$p"; wait "$p" || true; done

# The endpoint's SQL for one request, one transaction per request as without group commit.
cat >"$out/api-update.sql" <<SQL
\\set i random(0, $((instances - 1)))
BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY;
SELECT marquee_enter_tenant('$tenant');
SELECT i.*, t.*, ch.status FROM instances i
  JOIN activity_types t ON t.tenant_id = i.tenant_id AND t.identifier = i.activity_type
  LEFT JOIN channels ch ON ch.tenant_id = i.tenant_id AND ch.id = i.channel_id
  WHERE i.tenant_id = '$tenant' AND i.id = 'bench-' || :i;
SELECT device_token, platform, token FROM marquee_instance_targets('$tenant', ARRAY['bench-' || :i]) ORDER BY 1;
SELECT status, response, request_hash FROM idempotency_keys WHERE tenant_id = '$tenant' AND key = NULL;
COMMIT;
BEGIN;
SELECT marquee_enter_tenant('$tenant');
WITH upd AS (
  UPDATE instances SET content_state = jsonb_set(content_state, '{step}', to_jsonb(:i::int)), version = version + 1,
         content_timestamp = content_timestamp + 1, updated_at = now()
  WHERE tenant_id = '$tenant' AND id = 'bench-' || :i RETURNING version
), free AS (
  SELECT id FROM delivery_queue
  WHERE tenant_id = '$tenant' AND instance_id = 'bench-' || :i AND operation <> 'start'
    AND token = ANY(ARRAY[md5(:i::text) || md5((:i::int + 1)::text)])
  FOR UPDATE SKIP LOCKED
), gone AS (
  DELETE FROM delivery_queue d
  WHERE d.tenant_id = '$tenant' AND d.id IN (SELECT id FROM free) AND EXISTS (SELECT 1 FROM upd) RETURNING d
), sup AS (
  INSERT INTO delivery_history SELECT h.* FROM gone, marquee_history_row(gone.d, 'superseded') h RETURNING 1
), dels AS (
  INSERT INTO delivery_queue (tenant_id, id, instance_id, device_token, provider, token_kind, token, operation, instance_version)
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

# Issue 11's yardstick: a naive transaction, one UPDATE and one INSERT, 64 clients.
bench_naive_pgbench "$instances"

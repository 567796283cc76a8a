#!/usr/bin/env bash
# latency: API accept -> simulator receipt at a steady RATE of updates/s. A private PostgreSQL (fsync on),
# `marquee serve`, the APNs simulator (records every accepted push to a JSONL file), WORKERS `marquee worker`s, and
# INSTANCES iOS instances built through the API as users build them (people imported with an iPhone each, a start by
# push-to-start each, its activity token registered with the SDK key; the starts' pushes go out before the run).
# `marquee-bench latency` paces POST /v1/live_notifications/update at RATE/s for DURATION s (open loop, keep-alive
# HTTP/1.1, CONNECTIONS=64; wrk2 is not in Debian 12), update i patching {"seq": i} into instance
# bench-<i mod INSTANCES>; the simulator's record of the push carrying that seq gives its receipt time. Reports p50/p99/max of receipt - accept (the API's
# 200 arriving), receipt - send, the API latency and the pacer's lateness.
# With BACKLOG=N (issue 10's fairness figure), another tenant gets N queued pushes (one SQL transaction, on the
# same simulator) just before the paced run starts, so the measured tenant's updates compete with that backlog
# draining; the script reports how much of the backlog was still queued when the paced run ended.
# Env: RATE (1000), DURATION (10), INSTANCES (10000), WORKERS (2), BATCH (256), LOOPS (2), CONNECTIONS (64), PORT,
#      SIM_PORT, BACKLOG (0); PGSS=1 (with PG_OPTIONS="-c shared_preload_libraries=pg_stat_statements"): PostgreSQL's
#      time by statement during the paced run.
source "$(dirname "$0")/../lib.sh"
MARQUEE_EXTRA_PACKAGES="" "$root/Deploy/local/deps.sh"
bench_build
bench_pg
rate=${RATE:-1000}
duration=${DURATION:-10}
instances=${INSTANCES:-10000}
workers=${WORKERS:-2}
port=${PORT:-18086}
sim_port=${SIM_PORT:-12298}
metrics_port=${METRICS_PORT:-19480}
work="$out/latency"
mkdir -p "$work"

export MARQUEE_LISTEN=127.0.0.1:$port
MARQUEE_MASTER_KEY=$(head -c 32 /dev/urandom | base64)
# Credentials point at the simulators on loopback: the operator allowlist must say so (serve and worker).
export MARQUEE_PROVIDER_HOSTS=api.push.apple.com,api.sandbox.push.apple.com,fcm.googleapis.com,oauth2.googleapis.com,127.0.0.1
export MARQUEE_MASTER_KEY MARQUEE_MIGRATIONS_DIR="$root/Migrations" MARQUEE_LOG_LEVEL=${MARQUEE_LOG_LEVEL:-warning}
"$bin/marquee" migrate >/dev/null 2>&1
bench_reset_tenants
created=$("$bin/marquee" tenant create --name "latency-$(date +%s)" --json)
APP_KEY=$(echo "$created" | sed -n 's/.*"app":"\([^"]*\)".*/\1/p')
SDK_KEY=$(echo "$created" | sed -n 's/.*"sdk":"\([^"]*\)".*/\1/p')
tenant=$(echo "$created" | sed -n 's/^{"created_at":"[^"]*","id":"\([^"]*\)".*/\1/p')
export APP_KEY SDK_KEY

pids=()
cleanup() {
  for p in "${pids[@]}"; do kill -TERM "$p" 2>/dev/null || true; done
  for p in "${pids[@]}"; do wait "$p" 2>/dev/null || true; done
  bench_pg_stop
}
trap cleanup EXIT

rm -f "$work/ca.pem" "$work/records.jsonl"
# Two Apple teams: the measured tenant's, and the backlog tenant's (tenants are separate customers; APNs takes one
# team's tokens per connection, so they never share one).
"$bin/marquee-bench" keygen es256 "$work/key.pem" "$work/key.pub"
"$bin/marquee-bench" keygen es256 "$work/key2.pem" "$work/key2.pub"
echo "{\"BENCHKEY01\": {\"team_id\": \"BENCHTEAM1\", \"public_key\": $(json_file "$work/key.pub")},
       \"BENCHKEY02\": {\"team_id\": \"BENCHTEAM2\", \"public_key\": $(json_file "$work/key2.pub")}}" >"$work/keys.json"
MARQUEE_SIM_LISTEN=127.0.0.1:$sim_port MARQUEE_SIM_CA_OUT="$work/ca.pem" MARQUEE_SIM_KEYS="$work/keys.json" \
  MARQUEE_SIM_RECORDS="$work/records.jsonl" "$bin/marquee" simulate apns 2>"$work/sim.log" &
sim=$!
pids+=("$sim")
wait_sim "$sim_port" "$work/ca.pem"

DATABASE_URL=$APP_DATABASE_URL "$bin/marquee" serve >"$work/serve.log" 2>&1 &
api=$!
pids+=("$api")
for _ in $(seq 1 100); do curl -sf "http://$MARQUEE_LISTEN/healthz" >/dev/null && break; sleep 0.1; done
# APNs key $2 (1 or 2) of the bench and the simulator as the endpoint, for the tenant of app key $1.
put_credential() {
  local n=${2:-1}
  local pem="$work/key.pem"
  [ "$n" = 1 ] || pem="$work/key$n.pem"
  curl -sf -o /dev/null -X PUT "http://$MARQUEE_LISTEN/v1/credentials/apns" -H "Authorization: Bearer $1" \
    -H "Content-Type: application/json" \
    -d "{\"team_id\":\"BENCHTEAM$n\",\"key_id\":\"BENCHKEY0$n\",\"private_key\":$(json_file "$pem"),\"bundle_id\":\"com.example.bench\",\"environment\":\"production\",\"endpoint\":\"https://127.0.0.1:$sim_port\"}" \
    || { echo "PUT /v1/credentials/apns failed" >&2; exit 1; }
}
put_credential "$APP_KEY"

bench_scenario_through_api "$instances" "$work" "$port"
psql -q "$DATABASE_URL" -c "VACUUM ANALYZE"

worker_pids=()
for w in $(seq 1 "$workers"); do
  MARQUEE_CA_FILE="$work/ca.pem" MARQUEE_WORKER_BATCH=${BATCH:-256} MARQUEE_WORKER_LOOPS=${LOOPS:-2} \
    MARQUEE_METRICS_LISTEN=127.0.0.1:$((metrics_port + w)) DATABASE_URL=$APP_DATABASE_URL "$bin/marquee" worker >"$work/worker-$w.log" 2>&1 &
  worker_pids+=($!)
  pids+=($!)
done
for w in $(seq 1 "$workers"); do
  for _ in $(seq 1 100); do curl -sf "http://127.0.0.1:$((metrics_port + w))/healthz" >/dev/null && break; sleep 0.1; done
done
# The starts' push-to-start pushes go out first; the paced run starts on an empty queue.
for _ in $(seq 1 600); do
  [ "$(psql -qtA "$DATABASE_URL" -c "SELECT count(*) FROM delivery_queue WHERE tenant_id = '$tenant'")" = 0 ] && break
  sleep 0.2
done
sleep 1

backlog=${BACKLOG:-0}
if [ "$backlog" -gt 0 ]; then
  created_b=$("$bin/marquee" tenant create --name "backlog-$(date +%s)" --json)
  app_b=$(echo "$created_b" | sed -n 's/.*"app":"\([^"]*\)".*/\1/p')
  tenant_b=$(echo "$created_b" | sed -n 's/^{"created_at":"[^"]*","id":"\([^"]*\)".*/\1/p')
  put_credential "$app_b" 2
  psql -q -v ON_ERROR_STOP=1 "$DATABASE_URL" <<SQL
INSERT INTO activity_types (tenant_id, identifier, attributes_type) VALUES ('$tenant_b', 'com.example.delivery', 'DeliveryAttributes');
INSERT INTO instances (tenant_id, id, activity_type, state, attributes, content_state, content_timestamp, expires_at)
  VALUES ('$tenant_b', 'backlog', 'com.example.delivery', 'active', '{"order":"b"}', '{"status":"new"}',
          extract(epoch from now())::bigint, now() + interval '8 hours');
SQL
  echo "== backlog: $backlog pushes queued for another tenant, committed just before the paced run"
  psql -q -v ON_ERROR_STOP=1 "$DATABASE_URL" -c "
    INSERT INTO delivery_queue (tenant_id, id, instance_id, device_token, provider, token_kind, token, operation,
                            instance_version)
    SELECT '$tenant_b', gen_random_uuid(), 'backlog', 'dev' || i, 'apns', 'activity',
           md5('b' || i) || md5('c' || i), 'update', 1
    FROM generate_series(1, $backlog) i" -c "NOTIFY marquee_deliveries"
fi

machine
bench_pgss_reset
echo "== marquee-bench latency: $rate updates/s for $duration s over $instances instances, $workers workers"
"$bin/marquee-bench" latency --host 127.0.0.1 --port "$port" --rate "$rate" --duration "$duration" \
  --instances "$instances" --records "$work/records.jsonl" --connections "${CONNECTIONS:-64}" --wait 30
if [ "$backlog" -gt 0 ]; then
  echo "backlog at the end of the paced run (+ its 30 s wait for receipts): $(psql -qtA -F'=' -R' ' "$DATABASE_URL" -c "SELECT status, count(*) FROM deliveries WHERE tenant_id = '$tenant_b' GROUP BY 1 ORDER BY 1")"
fi
bench_pgss_report
echo "deliveries: $(psql -qtA -F'=' -R' ' "$DATABASE_URL" -c "SELECT status, count(*) FROM deliveries WHERE tenant_id = '$tenant' GROUP BY 1 ORDER BY 1")"
echo "simulator: $(sim_stats "$sim_port" "$work/ca.pem")"
for i in "${!worker_pids[@]}"; do echo "worker $((i + 1)) RSS: $(rss "${worker_pids[$i]}")"; done
echo "API RSS: $(rss "$api")"
echo "non-2xx in server log: $(grep -c '"http.status":[45]' "$work/serve.log" || true)"

#!/usr/bin/env bash
# fanout: end to end delivery throughput. A private PostgreSQL (fsync on), `marquee serve`, the APNs (MODE=apns,
# default) or FCM (MODE=fcm) simulator, and WORKERS `marquee worker` processes. INSTANCES instances each with one
# target (apns: an iOS device with an activity token; fcm: an Android device with an FCM registration token and the
# instance_devices row a start writes), set up with bulk SQL. Then one update for every instance, enqueued by ONE
# SQL transaction (version bump + one queued delivery per target + NOTIFY, what the update endpoint writes, in
# bulk), and the clock runs from just before that COMMIT to the last `sent_at` the workers record.
# Side by side: pgbench running the workers' claim + record SQL (DeliveryQueue.claim / record, same batch size,
# WORKERS*LOOPS clients) over a second such round of updates, no provider in between: the database's ceiling.
# Env: MODE (apns|fcm), INSTANCES (100000), WORKERS (2), BATCH (256), LOOPS (2), APNS_CONNECTIONS (2),
#      TIMEOUT (600 s), PORT, SIM_PORT, METRICS_PORT; PGSS=1 (pg_stat_statements), PERF=1 (perf of worker 1).
source "$(dirname "$0")/../lib.sh"
MARQUEE_EXTRA_PACKAGES="$([ "${PERF:-0}" = 1 ] && echo linux-perf)" "$root/Deploy/local/deps.sh"
bench_build
bench_pg
mode=${MODE:-apns}
instances=${INSTANCES:-100000}
workers=${WORKERS:-2}
batch=${BATCH:-256}
loops=${LOOPS:-2}
timeout=${TIMEOUT:-600}
port=${PORT:-18085}
sim_port=${SIM_PORT:-12297}
metrics_port=${METRICS_PORT:-19470}
work="$out/fanout-$mode"
mkdir -p "$work"
case "$mode" in apns | fcm) ;; *) echo "MODE must be apns or fcm" >&2; exit 2 ;; esac

export MARQUEE_LISTEN=127.0.0.1:$port
MARQUEE_MASTER_KEY=$(head -c 32 /dev/urandom | base64)
# Credentials point at the simulators on loopback: the operator allowlist must say so (serve and worker).
export MARQUEE_PROVIDER_HOSTS=api.push.apple.com,api.sandbox.push.apple.com,fcm.googleapis.com,oauth2.googleapis.com,127.0.0.1
export MARQUEE_MASTER_KEY MARQUEE_MIGRATIONS_DIR="$root/Migrations" MARQUEE_LOG_LEVEL=${MARQUEE_LOG_LEVEL:-warning}
"$bin/marquee" migrate >/dev/null 2>&1
bench_reset_tenants
created=$("$bin/marquee" tenant create --name "fanout-$(date +%s)" --json)
APP_KEY=$(echo "$created" | sed -n 's/.*"app":"\([^"]*\)".*/\1/p')
tenant=$(echo "$created" | sed -n 's/^{"created_at":"[^"]*","id":"\([^"]*\)".*/\1/p')

pids=()
cleanup() {
  for p in "${pids[@]}"; do kill -TERM "$p" 2>/dev/null || true; done
  for p in "${pids[@]}"; do wait "$p" 2>/dev/null || true; done
  bench_pg_stop
}
trap cleanup EXIT

# Simulator and its keys.
rm -f "$work/ca.pem"
if [ "$mode" = apns ]; then
  "$bin/marquee-bench" keygen es256 "$work/key.pem" "$work/key.pub"
  echo "{\"BENCHKEY01\": {\"team_id\": \"BENCHTEAM1\", \"public_key\": $(json_file "$work/key.pub")}}" >"$work/keys.json"
else
  "$bin/marquee-bench" keygen rs256 "$work/key.pem" "$work/key.pub"
  email=bench@bench-project.iam.gserviceaccount.com
  echo "{\"$email\": {\"project_id\": \"bench-project\", \"public_key\": $(json_file "$work/key.pub")}}" >"$work/keys.json"
fi
MARQUEE_SIM_LISTEN=127.0.0.1:$sim_port MARQUEE_SIM_CA_OUT="$work/ca.pem" MARQUEE_SIM_KEYS="$work/keys.json" \
  "$bin/marquee" simulate "$mode" 2>"$work/sim.log" &
sim=$!
pids+=("$sim")
wait_sim "$sim_port" "$work/ca.pem"

DATABASE_URL=$APP_DATABASE_URL "$bin/marquee" serve >"$work/serve.log" 2>&1 &
api=$!
pids+=("$api")
for _ in $(seq 1 100); do curl -sf "http://$MARQUEE_LISTEN/healthz" >/dev/null && break; sleep 0.1; done

# Credentials pointing at the simulator, through the API.
if [ "$mode" = apns ]; then
  path=/v1/credentials/apns
  body="{\"team_id\":\"BENCHTEAM1\",\"key_id\":\"BENCHKEY01\",\"private_key\":$(json_file "$work/key.pem"),\"bundle_id\":\"com.example.bench\",\"environment\":\"production\",\"endpoint\":\"https://127.0.0.1:$sim_port\"}"
else
  path=/v1/credentials/fcm
  body="{\"service_account\":{\"type\":\"service_account\",\"project_id\":\"bench-project\",\"client_email\":\"$email\",\"private_key\":$(json_file "$work/key.pem"),\"private_key_id\":\"k1\"},\"token_uri\":\"https://127.0.0.1:$sim_port/token\",\"endpoint\":\"https://127.0.0.1:$sim_port\"}"
fi
curl -sf -o /dev/null -X PUT "http://$MARQUEE_LISTEN$path" -H "Authorization: Bearer $APP_KEY" \
  -H "Content-Type: application/json" -d "$body" || { echo "PUT $path failed" >&2; exit 1; }

echo "setup: $instances instances, one $mode target each" >&2
if [ "$mode" = apns ]; then
  targets="INSERT INTO devices (tenant_id, token, person_id, platform)
  SELECT '$tenant', repeat(lpad(to_hex(i), 8, '0'), 8), 'p' || i, 'ios' FROM generate_series(0, $instances - 1) i;"
  after="INSERT INTO activity_tokens (tenant_id, instance_id, device_token, token)
  SELECT '$tenant', 'bench-' || i, repeat(lpad(to_hex(i), 8, '0'), 8), md5(i::text) || md5((i + 1)::text)
  FROM generate_series(0, $instances - 1) i;"
  # What the update endpoint plans for an iOS instance: one delivery per active activity token.
  plan="SELECT a.tenant_id, marquee_new_ulid(), a.instance_id, a.device_token, 'apns', 'activity', a.token, 'update', i.version
  FROM activity_tokens a JOIN instances i ON i.tenant_id = a.tenant_id AND i.id = a.instance_id
  WHERE a.tenant_id = '$tenant' AND a.status = 'active'"
else
  targets="INSERT INTO devices (tenant_id, token, person_id, platform)
  SELECT '$tenant', 'fcm-' || i || ':' || md5(i::text) || md5((i + 7)::text), 'p' || i, 'android'
  FROM generate_series(0, $instances - 1) i;"
  after="INSERT INTO instance_devices (tenant_id, instance_id, device_token, state, state_at)
  SELECT '$tenant', 'bench-' || i, 'fcm-' || i || ':' || md5(i::text) || md5((i + 7)::text), 'started', '-infinity'
  FROM generate_series(0, $instances - 1) i;"
  # For an Android instance: one delivery per started device, to its FCM registration token.
  plan="SELECT s.tenant_id, marquee_new_ulid(), s.instance_id, s.device_token, 'fcm', 'fcm', d.token, 'update', i.version
  FROM instance_devices s JOIN devices d ON d.tenant_id = s.tenant_id AND d.token = s.device_token
  JOIN instances i ON i.tenant_id = s.tenant_id AND i.id = s.instance_id
  WHERE s.tenant_id = '$tenant' AND s.state NOT IN ('ended', 'dismissed')"
fi
psql -q -v ON_ERROR_STOP=1 "$DATABASE_URL" <<SQL
INSERT INTO activity_types (tenant_id, identifier, attributes_type) VALUES ('$tenant', 'com.example.delivery', 'DeliveryAttributes');
INSERT INTO people (tenant_id, id) SELECT '$tenant', 'p' || i FROM generate_series(0, $instances - 1) i;
$targets
INSERT INTO instances (tenant_id, id, activity_type, person_id, state, attributes, content_state, content_timestamp, expires_at)
  SELECT '$tenant', 'bench-' || i, 'com.example.delivery', 'p' || i, 'active', '{"order":"x"}', '{"status":"new"}',
         extract(epoch from now())::bigint, now() + interval '8 hours'
  FROM generate_series(0, $instances - 1) i;
$after
VACUUM ANALYZE;
SQL

# One update for every instance in one transaction; prints clock_timestamp() just before COMMIT.
enqueue() {
  psql -qtA -v ON_ERROR_STOP=1 "$DATABASE_URL" <<SQL | tail -1
BEGIN;
UPDATE instances SET content_state = content_state || jsonb_build_object('step', version), version = version + 1,
       content_timestamp = content_timestamp + 1, updated_at = now()
WHERE tenant_id = '$tenant';
INSERT INTO delivery_queue (tenant_id, id, instance_id, device_token, provider, token_kind, token, operation, instance_version)
$plan;
SELECT pg_notify('marquee_deliveries', '');
SELECT extract(epoch FROM clock_timestamp());
COMMIT;
SQL
}
# sent, queued, other for the round whose deliveries carry instance version $1
round_counts() {
  psql -qtA -F' ' "$DATABASE_URL" -c "SELECT count(*) FILTER (WHERE status = 'sent'), count(*) FILTER (WHERE status = 'queued'),
    count(*) FILTER (WHERE status NOT IN ('sent', 'queued')) FROM deliveries WHERE tenant_id = '$tenant' AND instance_version = $1"
}

worker_pids=()
for w in $(seq 1 "$workers"); do
  MARQUEE_CA_FILE="$work/ca.pem" MARQUEE_WORKER_BATCH=$batch MARQUEE_WORKER_LOOPS=$loops \
    MARQUEE_APNS_CONNECTIONS=${APNS_CONNECTIONS:-2} MARQUEE_METRICS_LISTEN=127.0.0.1:$((metrics_port + w)) \
    DATABASE_URL=$APP_DATABASE_URL "$bin/marquee" worker >"$work/worker-$w.log" 2>&1 &
  worker_pids+=($!)
  pids+=($!)
done
for w in $(seq 1 "$workers"); do
  for _ in $(seq 1 100); do curl -sf "http://127.0.0.1:$((metrics_port + w))/healthz" >/dev/null && break; sleep 0.1; done
done
sleep 1  # LISTEN established

machine
echo "== $mode: $instances updates (one SQL transaction), $workers workers x $loops loops, batch $batch"
# Where the CPU goes: each process's user + system ticks, and the whole machine's busy ticks, over the round — from
# the enqueue's COMMIT on (the enqueue's own 100,000-row writes are not the fan-out's).
bench_pgss_reset
perf_pid=
if [ "${PERF:-0}" = 1 ]; then
  # PERF=1: where worker 1's CPU goes during the round (linux perf, call graphs, 6 s).
  perf record -q -F 999 -g -p "${worker_pids[0]}" -o "$work/perf-worker.data" -- sleep 6 >/dev/null 2>&1 &
  perf_pid=$!
fi
t0=$(enqueue)
cpu0=$(bench_cpu_snapshot "$sim" "$api" "${worker_pids[@]}")
deadline=$(($(date +%s) + timeout))
last=-1
stalled=0
# Progress is read from the simulator's counter (a curl: a few ms), not from the database while the round runs:
# counting the round's deliveries scans the queue and the history (~70 ms of PostgreSQL a poll, ~4% of the machine at
# one a second). Once the simulator has them all, the database's counts (their results recorded) close the round.
accepted() { sim_stats "$sim_port" "$work/ca.pem" | sed -n 's/.*"accepted":\([0-9]*\).*/\1/p'; }
while :; do
  got=$(accepted)
  # All accepted, or no progress for a second (some may have failed): the database says whether the round is over.
  if [ "${got:-0}" -ge "$instances" ] || [ "$stalled" -ge 2 ]; then
    read -r sent queued other < <(round_counts 2)
    [ $((sent + other)) -ge "$instances" ] && break
  fi
  if [ "${got:-0}" = "$last" ]; then stalled=$((stalled + 1)); else stalled=0; fi
  last=${got:-0}
  [ "$stalled" -ge 60 ] && { echo "no progress for 30 s" >&2; break; }
  [ "$(date +%s)" -ge "$deadline" ] && { echo "timeout" >&2; break; }
  sleep 0.5
done
cpu1=$(bench_cpu_snapshot "$sim" "$api" "${worker_pids[@]}")
round_end=$(date +%s.%N)
t1=$(psql -qtA "$DATABASE_URL" -c "SELECT extract(epoch FROM max(sent_at)) FROM deliveries WHERE tenant_id = '$tenant' AND instance_version = 2 AND status = 'sent'")
read -r sent queued other < <(round_counts 2)
echo "sent $sent, still queued $queued, other $other (by status: $(psql -qtA -F'=' -R' ' "$DATABASE_URL" -c "SELECT status, count(*) FROM deliveries WHERE tenant_id = '$tenant' AND instance_version = 2 GROUP BY 1 ORDER BY 1"))"
ours=$(awk -v n="$sent" -v a="$t0" -v b="$t1" 'BEGIN { printf "%d", (b > a ? n / (b - a) : 0) }')
echo "marquee: $ours pushes/s ($(awk -v a="$t0" -v b="$t1" 'BEGIN { printf "%.2f", b - a }') s from the commit's start to the last sent_at)"
echo "simulator: $(sim_stats "$sim_port" "$work/ca.pem")"
for i in "${!worker_pids[@]}"; do echo "worker $((i + 1)) RSS: $(rss "${worker_pids[$i]}")"; done
echo "API RSS: $(rss "$api"); simulator RSS: $(rss "$sim")"
bench_cpu_report "$mode round" "$cpu0" "$cpu1" "$(awk -v a="$t0" -v b="$round_end" 'BEGIN { printf "%.3f", b - a }')" \
  "$sent" push
# PGSS=1: where PostgreSQL's time went.
bench_pgss_report
if [ -n "$perf_pid" ]; then
  wait "$perf_pid" || true
  echo "== perf: worker 1's CPU by thread, then its hottest symbols (self time)"
  bench_perf_report "$work/perf-worker.data"
fi
echo "worker warnings/errors: $(cat "$work"/worker-*.log | grep -c '"level":"\(warning\|error\)"' || true)"
for p in "${worker_pids[@]}"; do kill -TERM "$p"; done
for p in "${worker_pids[@]}"; do wait "$p" || true; done

# The database's ceiling: DeliveryQueue.claim + record, as pgbench scripts, on a second round of updates.
clients=$((workers * loops))
cat >"$out/fanout-claim-record.sql" <<SQL
\\set lane random(0, 1023)
BEGIN;
SELECT COALESCE(array_agg(c.tenant_id), '{}') AS tenants, COALESCE(array_agg(c.id), '{}') AS ids
FROM (
  SELECT l.tenant_id, l.id
  FROM generate_series(0, marquee_queue_lanes() - 1) AS g(n)
  CROSS JOIN LATERAL (
    SELECT d.tenant_id, d.id
    FROM delivery_queue d
    WHERE d.tenant_id = '$tenant' AND d.lane = (:lane + g.n) % marquee_queue_lanes() AND d.status = 'queued'
      AND d.next_attempt_at <= now() AND d.next_attempt_at > '-infinity' AND d.provider = ANY('{apns,fcm}'::text[])
      AND (d.instance_version = 1 OR NOT EXISTS (
          SELECT 1 FROM delivery_queue o
          WHERE o.tenant_id = d.tenant_id AND o.instance_id = d.instance_id AND o.token = d.token
            AND o.status = 'queued' AND o.instance_version < d.instance_version OFFSET 0))
    ORDER BY d.next_attempt_at
    LIMIT $batch
    FOR UPDATE OF d SKIP LOCKED
  ) l
  LIMIT $batch
) c \\gset
SELECT c.tenant_id, c.id AS delivery_id, c.instance_id, c.device_token, c.provider, c.token_kind,
       c.token, c.operation, c.attempts + 1, c.created_at AS delivery_created_at, i.*,
       t.identifier, t.attributes_type, t.content_state_schema, t.date_fields, t.payload_profile, t.auto_created,
       t.created_at AS type_created_at, t.updated_at AS type_updated_at
FROM delivery_queue c
JOIN unnest(:tenants::uuid[], :ids::uuid[]) AS k(tenant_id, id) ON c.tenant_id = k.tenant_id AND c.id = k.id
JOIN instances i ON i.tenant_id = c.tenant_id AND i.id = c.instance_id
JOIN activity_types t ON t.tenant_id = i.tenant_id AND t.identifier = i.activity_type;
WITH gone AS (
  DELETE FROM delivery_queue d USING unnest(:tenants::uuid[], :ids::uuid[]) AS v(tenant_id, id)
  WHERE d.tenant_id = v.tenant_id AND d.id = v.id
  RETURNING d, d.id::text AS provider_id
), history AS (
  INSERT INTO delivery_history
  SELECT h.* FROM gone, marquee_history_row(gone.d, 'sent', true, gone.provider_id, 200, NULL, NULL) h
  RETURNING tenant_id, instance_id
)
SELECT COALESCE(array_agg(DISTINCT tenant_id), '{}') AS sent_tenants, COALESCE(array_agg(DISTINCT instance_id), '{}') AS sent_instances
FROM history \\gset
COMMIT;
BEGIN;
UPDATE instances i SET state = 'active', updated_at = now()
FROM (SELECT :sent_tenants::uuid[] AS t, :sent_instances::text[] AS ids) s
WHERE i.tenant_id = ANY(s.t) AND i.id = ANY(s.ids) AND i.state IN ('pending', 'failed');
COMMIT;
SQL
# Slack: a claim can come back short while another client holds 2x batch rows locked; empty claims write nothing.
tx=$(((instances + batch * clients - 1) / (batch * clients) * 5 / 4 + 2))
echo "== pgbench -M prepared -c $clients -j 2 -t $tx -f fanout-claim-record.sql (claim + record, batch $batch, no provider)"
p0=$(enqueue)
# What the workers' statistics refresh (marquee_refresh_queue_statistics, every second) would do after this burst.
psql -q "$DATABASE_URL" -c "ANALYZE delivery_queue"
s0=$(date +%s.%N)
pgbench -n -M prepared -h 127.0.0.1 -p "$PGPORT" -U postgres -c "$clients" -j 2 -t "$tx" \
  -f "$out/fanout-claim-record.sql" marquee 2>&1 | grep -E "^(tps|latency average|number of failed)" || true
s1=$(date +%s.%N)
read -r psent pqueued pother < <(round_counts 3)
ceiling=$(awk -v n="$psent" -v a="$s0" -v b="$s1" 'BEGIN { printf "%d", n / (b - a) }')
echo "pgbench: $psent of $instances recorded sent ($pqueued still queued) in $(awk -v a="$s0" -v b="$s1" 'BEGIN { printf "%.2f", b - a }') s: $ceiling deliveries/s"
# Issue 10's yardstick, same run: a naive transaction (one UPDATE + one INSERT), 64 clients.
naive_out=$(bench_naive_pgbench "$instances" 2>&1)
echo "$naive_out"
naive=$(echo "$naive_out" | sed -n 's/^tps = \([0-9.]*\).*/\1/p')
awk -v o="$ours" -v c="$ceiling" -v n="$naive" 'BEGIN { printf "== %s: marquee %d pushes/s, database ceiling %d/s (ratio %.2f), naive pgbench %d tps (ratio %.2f; target 6x and 25,000 pushes/s)\n", "'"$mode"'", o, c, (c ? o / c : 0), n, (n ? o / n : 0) }'
echo "API RSS at the end: $(rss "$api")"

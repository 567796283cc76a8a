# Helpers for bench/chaos/*.sh: one private PostgreSQL cluster (fsync on), the binaries, the simulator, the API,
# workers, a tenant set up through the API, and the checks every scenario ends with.
source "$(dirname "${BASH_SOURCE[0]}")/../lib.sh"

config=${CONFIG:-debug}
port=${PORT:-18601}
sim_port=${SIM_PORT:-12301}
metrics_port=${METRICS_PORT:-19600}
work="$out/chaos/${CHAOS_NAME:-chaos}"
pgdir="$out/chaos/pg"
mkdir -p "$work"
chmod 755 "$out/chaos"
rm -f "$work"/*.txt "$work"/*.tsv "$work"/*.accepted "$work"/*.summary "$work"/*.log "$work"/records.jsonl

chaos_build() {
  MARQUEE_EXTRA_PACKAGES="" "$root/Deploy/local/deps.sh"
  (cd "$root" && swift build -c "$config" --product marquee >&2 && swift build -c "$config" --product marquee-bench >&2)
  bin="$(cd "$root" && swift build -c "$config" --show-bin-path)"
}

# A fresh `marquee` database in the chaos cluster (started if needed, on CHAOS_PG_PORT or a free port); migrated.
chaos_pg() {
  DATABASE_URL=$("$root/Deploy/local/pg.sh" start "$pgdir" ${CHAOS_PG_PORT:-})
  # `serve` and `worker` log in as marquee_app (made by `marquee migrate`); psql and migrate use the owner.
  APP_DATABASE_URL=${DATABASE_URL/postgres@/marquee_app@}
  export DATABASE_URL APP_DATABASE_URL
  PGPORT=$(sed -n 4p "$pgdir/postmaster.pid")
  export PGPORT
  psql -q -h 127.0.0.1 -p "$PGPORT" -U postgres -d postgres \
    -c "DROP DATABASE IF EXISTS marquee WITH (FORCE)" -c "CREATE DATABASE marquee" >/dev/null
  "$bin/marquee" migrate >/dev/null 2>&1 || { echo "marquee migrate failed" >&2; exit 1; }
}
sql() { PGOPTIONS="-c client_min_messages=warning" psql -qtA -F' ' -v ON_ERROR_STOP=1 "$DATABASE_URL" "$@"; }

export MARQUEE_LISTEN=127.0.0.1:$port
MARQUEE_MASTER_KEY=$(head -c 32 /dev/urandom | base64)
export MARQUEE_MASTER_KEY MARQUEE_MIGRATIONS_DIR="$root/Migrations" MARQUEE_LOG_LEVEL=${MARQUEE_LOG_LEVEL:-warning}
# The simulator is the only provider host (once the allowlist exists; harmless before).
export MARQUEE_PROVIDER_HOSTS="127.0.0.1:$sim_port"

pids=()
chaos_cleanup() {
  for p in "${pids[@]}"; do kill -TERM "$p" 2>/dev/null || true; done
  for p in "${pids[@]}"; do wait "$p" 2>/dev/null || true; done
  "$root/Deploy/local/pg.sh" stop "$pgdir"
}
trap chaos_cleanup EXIT

# The APNs simulator, recording every accepted push to $work/records.jsonl; faults (JSON) in $1. Its key trusts the
# bundle com.example.chaos only: any other bundle gets 400 TopicDisallowed.
start_sim() {
  rm -f "$work/ca.pem" "$work/records.jsonl"
  "$bin/marquee-bench" keygen es256 "$work/key.pem" "$work/key.pub"
  echo "{\"CHAOSKEY01\": {\"team_id\": \"CHAOSTEAM1\", \"public_key\": $(json_file "$work/key.pub"), \"bundle_ids\": [\"com.example.chaos\"]}}" >"$work/keys.json"
  MARQUEE_SIM_LISTEN=127.0.0.1:$sim_port MARQUEE_SIM_CA_OUT="$work/ca.pem" MARQUEE_SIM_KEYS="$work/keys.json" \
    MARQUEE_SIM_RECORDS="$work/records.jsonl" MARQUEE_SIM_FAULTS="${1:-}" MARQUEE_SIM_SEED=${SIM_SEED:-42} \
    "$bin/marquee" simulate apns 2>"$work/sim.log" &
  sim=$!
  pids+=("$sim")
  wait_sim "$sim_port" "$work/ca.pem"
}

start_api() {
  DATABASE_URL=$APP_DATABASE_URL "$bin/marquee" serve >>"$work/serve.log" 2>&1 &
  api=$!
  pids+=("$api")
  for _ in $(seq 1 200); do curl -sf "http://$MARQUEE_LISTEN/healthz" >/dev/null && return 0; sleep 0.1; done
  echo "the API did not come up" >&2
  return 1
}

# start_worker N: worker N (metrics on METRICS_PORT+N); its pid in worker_pid[N].
declare -A worker_pid
start_worker() {
  MARQUEE_CA_FILE="$work/ca.pem" MARQUEE_WORKER_BATCH=${BATCH:-256} MARQUEE_WORKER_LOOPS=${LOOPS:-2} \
    MARQUEE_METRICS_LISTEN=127.0.0.1:$((metrics_port + $1)) DATABASE_URL=$APP_DATABASE_URL "$bin/marquee" worker >>"$work/worker-$1.log" 2>&1 &
  worker_pid[$1]=$!
  pids+=($!)
  for _ in $(seq 1 200); do curl -sf "http://127.0.0.1:$((metrics_port + $1))/healthz" >/dev/null && return 0; sleep 0.1; done
  echo "worker $1 did not come up" >&2
  return 1
}

# stop_pid PID LIMIT: SIGTERM, then wait up to LIMIT seconds; see await_exit.
stop_pid() {
  term_all "$1"
  await_exit "$1" "$2"
}

# new_tenant NAME [BUNDLE]: a tenant (CLI), its APNs credential pointing at the simulator and the activity type
# com.example.delivery (API). Sets TENANT, APP_KEY, SDK_KEY.
new_tenant() {
  local created
  created=$("$bin/marquee" tenant create --name "$1" --json)
  TENANT=$(echo "$created" | sed -n 's/.*"id":"\([0-9a-f-]*\)".*"keys".*/\1/p')
  [ -n "$TENANT" ] || TENANT=$(echo "$created" | grep -o '"id":"[0-9a-f-]\{36\}"' | head -1 | cut -d'"' -f4)
  APP_KEY=$(echo "$created" | sed -n 's/.*"app":"\([^"]*\)".*/\1/p')
  SDK_KEY=$(echo "$created" | sed -n 's/.*"sdk":"\([^"]*\)".*/\1/p')
  export APP_KEY SDK_KEY
  api_call PUT /v1/credentials/apns \
    "{\"team_id\":\"CHAOSTEAM1\",\"key_id\":\"CHAOSKEY01\",\"private_key\":$(json_file "$work/key.pem"),\"bundle_id\":\"${2:-com.example.chaos}\",\"environment\":\"production\",\"endpoint\":\"https://127.0.0.1:$sim_port\"}"
  api_call PUT /v1/activity_types/com.example.delivery '{"attributes_type":"DeliveryAttributes"}'
}

api_call() {
  local status
  status=$(curl -s -o "$work/last-response" -w '%{http_code}' -X "$1" "http://$MARQUEE_LISTEN$2" \
    -H "Authorization: Bearer $APP_KEY" -H "Content-Type: application/json" -d "$3")
  case "$status" in 2*) ;; *) echo "$1 $2: HTTP $status $(cat "$work/last-response")" >&2; exit 1 ;; esac
}

# drive NAME [extra marquee-bench requests options]: sends $work/NAME.txt, results in $work/NAME.tsv.
drive() {
  local name=$1
  shift
  "$bin/marquee-bench" requests --port "$port" --input "$work/$name.txt" --output "$work/$name.tsv" "$@"
}
# all_2xx NAME: every request of $work/NAME.tsv got a 2xx, or the scenario stops.
all_2xx() {
  local bad
  bad=$(awk -F'\t' '$2 < 200 || $2 > 299' "$work/$1.tsv" | wc -l)
  [ "$bad" = 0 ] || { echo "setup step $1: $bad requests not 2xx, e.g. $(awk -F'\t' '$2 < 200 || $2 > 299' "$work/$1.tsv" | head -2)" >&2; exit 1; }
}

# Tokens of instance i: device 0d…, push-to-start 05…, activity 0a… (or dead… when the instance is "dead").
# setup_instances N PREFIX [DEAD_EVERY]: through the API, like an app and its server: for each of N people, the
# device (sdk key), its push-to-start token (sdk key), a start (app key; the workers send it) and the activity token
# the device then reports (sdk key). Every DEAD_EVERY-th instance gets an activity token starting with "dead".
setup_instances() {
  local n=$1 prefix=$2 dead=${3:-0}
  awk -v n="$n" -v p="$prefix" 'BEGIN { for (i = 0; i < n; i++)
    printf "PUT /v1/people/%sp%d/devices/0d%062x SDK_KEY {\"platform\":\"ios\"}\n", p, i, i }' >"$work/$prefix-devices.txt"
  awk -v n="$n" -v p="$prefix" 'BEGIN { for (i = 0; i < n; i++)
    printf "PUT /v1/people/%sp%d/devices/0d%062x/push_to_start/com.example.delivery SDK_KEY {\"token\":\"05%062x\"}\n", p, i, i, i }' >"$work/$prefix-p2s.txt"
  awk -v n="$n" -v p="$prefix" 'BEGIN { for (i = 0; i < n; i++)
    printf "POST /v1/live_notifications/start APP_KEY {\"identifiers\":{\"id\":\"%sp%d\"},\"notification_type\":\"com.example.delivery\",\"instance_id\":\"%s%d\",\"attributes\":{\"order\":\"%d\"},\"content_state\":{\"status\":\"new\"},\"push_payload\":{\"alert\":{\"title\":\"Order\",\"body\":\"on its way\"}}}\n", p, i, p, i, i }' >"$work/$prefix-starts.txt"
  awk -v n="$n" -v p="$prefix" -v dead="$dead" 'BEGIN { for (i = 0; i < n; i++) {
    t = (dead > 0 && i % dead == 0) ? sprintf("dead%060x", i) : sprintf("0a%062x", i)
    printf "PUT /v1/live_notifications/%s%d/tokens/0d%062x SDK_KEY {\"token\":\"%s\"}\n", p, i, i, t } }' >"$work/$prefix-tokens.txt"
  local step
  for step in devices p2s starts tokens; do
    drive "$prefix-$step" --connections 16 >/dev/null
    all_2xx "$prefix-$step"
  done
}

# updates_file NAME PREFIX N: one update for each of the N instances.
updates_file() {
  awk -v n="$3" -v p="$2" 'BEGIN { for (i = 0; i < n; i++)
    printf "POST /v1/live_notifications/update APP_KEY {\"instance_id\":\"%s%d\",\"content_state_patch\":{\"status\":\"moving\",\"step\":%d}}\n", p, i, i }' >"$work/$1.txt"
}

# load_accepted NAME: the 2xx'd updates of $work/NAME.tsv into table chaos_accepted (instance_id, version, done).
load_accepted() {
  awk -F'\t' '$2 >= 200 && $2 <= 299 {
      id = $6; sub(/.*"instance_id":"/, "", id); sub(/".*/, "", id)
      v = $6; sub(/.*"version":/, "", v); sub(/[^0-9].*/, "", v)
      print id "\t" v "\t" $4 }' "$work/$1.tsv" >"$work/$1.accepted"
  sql -c "DROP TABLE IF EXISTS chaos_accepted" -c "CREATE TABLE chaos_accepted (instance_id text, version int, done double precision)" \
    -c "\\copy chaos_accepted FROM '$work/$1.accepted'"
}

# load_received: the simulator's records (apns-id = delivery ID) into table chaos_received (apns_id).
load_received() {
  grep -o '"apns_id":"[0-9a-f-]*"' "$work/records.jsonl" | cut -d'"' -f4 >"$work/received.txt" || true
  sql -c "DROP TABLE IF EXISTS chaos_received" -c "CREATE TABLE chaos_received (apns_id uuid)" \
    -c "\\copy chaos_received FROM '$work/received.txt'"
}

# wait_until SECONDS SQL: polls until the query returns t, or SECONDS pass (returns 1).
wait_until() {
  local deadline=$(($(date +%s) + $1))
  while [ "$(sql -c "$2")" != t ]; do
    [ "$(date +%s)" -ge "$deadline" ] && return 1
    sleep 0.5
  done
}

# The claims: check NAME CONDITION (a shell test) prints PASS/FAIL; finish exits 1 if any failed.
failures=()
check() {
  if eval "$2"; then echo "  PASS  $1"; else echo "  FAIL  $1"; failures+=("$1"); fi
}
finish() {
  if [ "${#failures[@]}" -gt 0 ]; then
    echo "== $1: FAILED (${#failures[@]}): ${failures[*]}"
    exit 1
  fi
  echo "== $1: all claims hold"
}
now() { date +%s.%N; }
elapsed() { awk -v a="$1" -v b="$2" 'BEGIN { printf "%.2f", b - a }'; }

# term_all PID…: SIGTERM to all at once; await_exit PID LIMIT then sets `stopped`/`stopped_code` like stop_pid,
# timed from the term_all.
term_all() {
  term_t0=$(now)
  local p
  for p in "$@"; do kill -TERM "$p" 2>/dev/null || true; done
}
await_exit() {
  local code=timeout
  for _ in $(seq 1 $(($2 * 20))); do
    if ! kill -0 "$1" 2>/dev/null || [ "$(awk '{ print $3 }' "/proc/$1/stat" 2>/dev/null)" = Z ]; then
      code=0
      wait "$1" 2>/dev/null || code=$?
      break
    fi
    sleep 0.05
  done
  if [ "$code" = timeout ]; then kill -9 "$1" 2>/dev/null || true; wait "$1" 2>/dev/null || true; fi
  stopped="exit=$code after $(elapsed "$term_t0" "$(now)") s"
  stopped_code=$code
}

# accepted_sent NAME: loads the 2xx'd updates of NAME and the simulator's records; sets accepted, sent_ok (recorded
# sent and received by the simulator) and lost (the others).
accepted_sent() {
  load_accepted "$1"
  load_received
  read -r accepted sent_ok lost <<<"$(sql -c "
    SELECT count(*),
           count(*) FILTER (WHERE d.id IS NOT NULL AND EXISTS (SELECT 1 FROM chaos_received r WHERE r.apns_id = d.id)),
           count(*) FILTER (WHERE d.id IS NULL OR NOT EXISTS (SELECT 1 FROM chaos_received r WHERE r.apns_id = d.id))
    FROM chaos_accepted a LEFT JOIN deliveries d ON d.instance_id = a.instance_id AND d.instance_version = a.version
         AND d.operation = 'update' AND d.status = 'sent'")"
}

# answers NAME FROM TO: the answers to requests of NAME sent between FROM and TO (epoch seconds), "status:count …".
answers() {
  awk -F'\t' -v a="$2" -v b="$3" '$3 >= a && $3 <= b { n[$2]++ } END { for (s in n) printf "%s:%d ", s, n[s] }' "$work/$1.tsv"
}

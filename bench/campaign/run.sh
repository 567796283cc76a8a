#!/usr/bin/env bash
# campaign: a whole audience through the API. A private PostgreSQL (fsync on), `marquee serve`, the APNs simulator
# and WORKERS `marquee worker`s.
#   1. POST /v1/people/import: PEOPLE people (NDJSON), each with an iPhone and a push-to-start token. Beside it, psql
#      COPY of the same rows into plain tables of the same columns: the database's own bulk-load rate.
#   2. POST /v1/campaigns {"audience": {"all": true}} with a $person attribute: the seconds from the API call to the
#      last push-to-start the simulator accepted (its own clock), and p50/p99 of sent_at − call.
#   3. Every started activity reports its activity token (PUT /v1/live_notifications/{id}/tokens/{device}, with
#      `marquee-bench requests`, 64 connections): the rate.
#   4. POST /v1/campaigns/{id}/update: the seconds from the call to the last update accepted by the simulator.
#   5. POST /v1/campaigns/{id}/end: the same for the ends (every activity has its token by then, so none waits).
# For 2, 4 and 5 also where the CPU went from the call to the last push (workers, simulator, API, the rest, idle).
# Env: PEOPLE (100000), WORKERS (2), PORT, SIM_PORT, METRICS_PORT; WALDUMP=1 (bench/lib.sh: the WAL of each phase).
source "$(dirname "$0")/../lib.sh"
MARQUEE_EXTRA_PACKAGES="" "$root/Deploy/local/deps.sh"
bench_build
bench_pg
people=${PEOPLE:-100000}
workers=${WORKERS:-2}
port=${PORT:-18088}
sim_port=${SIM_PORT:-12300}
metrics_port=${METRICS_PORT:-19500}
work="$out/campaign"
mkdir -p "$work"

export MARQUEE_LISTEN=127.0.0.1:$port
MARQUEE_MASTER_KEY=$(head -c 32 /dev/urandom | base64)
export MARQUEE_PROVIDER_HOSTS=api.push.apple.com,api.sandbox.push.apple.com,fcm.googleapis.com,oauth2.googleapis.com,127.0.0.1
export MARQUEE_MASTER_KEY MARQUEE_MIGRATIONS_DIR="$root/Migrations" MARQUEE_LOG_LEVEL=${MARQUEE_LOG_LEVEL:-warning}
"$bin/marquee" migrate >/dev/null 2>&1
bench_reset_tenants
created=$("$bin/marquee" tenant create --name "campaign-$(date +%s)" --json)
APP_KEY=$(echo "$created" | sed -n 's/.*"app":"\([^"]*\)".*/\1/p')
SDK_KEY=$(echo "$created" | sed -n 's/.*"sdk":"\([^"]*\)".*/\1/p')
export APP_KEY SDK_KEY

pids=()
cleanup() {
  for p in "${pids[@]}"; do kill -TERM "$p" 2>/dev/null || true; done
  for p in "${pids[@]}"; do wait "$p" 2>/dev/null || true; done
  bench_pg_stop
}
trap cleanup EXIT

rm -f "$work/ca.pem"
"$bin/marquee-bench" keygen es256 "$work/key.pem" "$work/key.pub"
echo "{\"BENCHKEY01\": {\"team_id\": \"BENCHTEAM1\", \"public_key\": $(json_file "$work/key.pub")}}" >"$work/keys.json"
MARQUEE_SIM_LISTEN=127.0.0.1:$sim_port MARQUEE_SIM_CA_OUT="$work/ca.pem" MARQUEE_SIM_KEYS="$work/keys.json" \
  "$bin/marquee" simulate apns 2>"$work/sim.log" &
pids+=($!)
wait_sim "$sim_port" "$work/ca.pem"
DATABASE_URL=$APP_DATABASE_URL "$bin/marquee" serve >"$work/serve.log" 2>&1 &
pids+=($!)
for _ in $(seq 1 100); do curl -sf "http://$MARQUEE_LISTEN/healthz" >/dev/null && break; sleep 0.1; done
api() { curl -sf -X "$1" "http://$MARQUEE_LISTEN$2" -H "Authorization: Bearer $APP_KEY" -H "Content-Type: application/json" -d "$3"; }
api PUT /v1/credentials/apns "{\"team_id\":\"BENCHTEAM1\",\"key_id\":\"BENCHKEY01\",\"private_key\":$(json_file "$work/key.pem"),\"bundle_id\":\"com.example.bench\",\"environment\":\"production\",\"endpoint\":\"https://127.0.0.1:$sim_port\"}" >/dev/null \
  || { echo "PUT /v1/credentials/apns failed" >&2; exit 1; }
api PUT /v1/activity_types/com.example.match '{"attributes_type":"MatchAttributes"}' >/dev/null \
  || { echo "PUT /v1/activity_types failed" >&2; exit 1; }
for w in $(seq 1 "$workers"); do
  MARQUEE_CA_FILE="$work/ca.pem" MARQUEE_METRICS_LISTEN=127.0.0.1:$((metrics_port + w)) \
    DATABASE_URL=$APP_DATABASE_URL "$bin/marquee" worker >"$work/worker-$w.log" 2>&1 &
  pids+=($!)
done
for w in $(seq 1 "$workers"); do
  for _ in $(seq 1 100); do curl -sf "http://127.0.0.1:$((metrics_port + w))/healthz" >/dev/null && break; sleep 0.1; done
done

# The same people three ways: the import's NDJSON, CSVs for psql's COPY, and the token registrations' requests.
python3 - "$people" "$work" <<'PY'
import json, os, sys
n, work = int(sys.argv[1]), sys.argv[2]
with open(f"{work}/people.ndjson", "w") as nd, open(f"{work}/people.csv", "w") as pc, \
     open(f"{work}/devices.csv", "w") as dc, open(f"{work}/pts.csv", "w") as tc, \
     open(f"{work}/tokens.txt", "w") as rq:
    for i in range(n):
        r = os.urandom(16).hex()
        person, device, pts = f"p{i}", f"{i:08x}" * 8, r + f"{i:08x}" * 4
        team = f"Team {i % 20}"
        nd.write(json.dumps({"id": person, "attributes": {"team": team}, "devices": [
            {"token": device, "platform": "ios", "push_to_start": {"com.example.match": pts}}]}) + "\n")
        pc.write(f'{person},"{{""team"": ""{team}""}}"\n')
        dc.write(f"{device},{person},ios\n")
        tc.write(f"{device},com.example.match,{pts}\n")
        rq.write(f'PUT /v1/live_notifications/cup.{person}/tokens/{device} SDK_KEY {{"token":"{os.urandom(16).hex()}{i:08x}{i:08x}{i:08x}{i:08x}"}}\n')
PY

machine
echo "== campaign: $people people, $workers workers, fsync on"
t0=$(date +%s.%N)
imported=$(curl -sf -X POST "http://$MARQUEE_LISTEN/v1/people/import" -H "Authorization: Bearer $APP_KEY" \
  -H "Content-Type: application/x-ndjson" --data-binary @"$work/people.ndjson")
t1=$(date +%s.%N)
echo "import: $(echo "$imported" | head -c 200) in $(echo "$t1 - $t0" | bc) s = $(echo "$people / ($t1 - $t0)" | bc) people/s"
psql -q "$DATABASE_URL" <<'SQL'
CREATE TABLE copy_people (id text PRIMARY KEY, attributes jsonb NOT NULL);
CREATE TABLE copy_devices (token text PRIMARY KEY, person_id text NOT NULL, platform text NOT NULL);
CREATE TABLE copy_pts (device_token text NOT NULL, activity_type text NOT NULL, token text NOT NULL,
                       PRIMARY KEY (device_token, activity_type));
SQL
t0=$(date +%s.%N)
psql -q -v ON_ERROR_STOP=1 "$DATABASE_URL" \
  -c "\\copy copy_people FROM '$work/people.csv' WITH (FORMAT csv)" \
  -c "\\copy copy_devices FROM '$work/devices.csv' WITH (FORMAT csv)" \
  -c "\\copy copy_pts FROM '$work/pts.csv' WITH (FORMAT csv)"
t1=$(date +%s.%N)
echo "psql COPY of the same rows (3 tables, primary keys): $(echo "$t1 - $t0" | bc) s = $(echo "$people / ($t1 - $t0)" | bc) people/s"
psql -q "$DATABASE_URL" -c "DROP TABLE copy_people, copy_devices, copy_pts"

# Waits until the simulator accepted $1 pushes; prints the epoch seconds it accepted the last of them at (its own
# `last_accepted_at`). Polls seldom: each poll is a curl with a TLS handshake, ~10 ms of the machine under test (a
# poll every 250 ms was 2% of its CPU during a start, one every 20 ms 7%); after the first, the next comes when the
# rate seen so far says about two thirds of what is left will have arrived (0.1–2 s).
await_sim() {
  python3 - "$sim_port" "$work/ca.pem" "$1" <<'PY'
import json, subprocess, sys, time
port, ca, want = int(sys.argv[1]), sys.argv[2], int(sys.argv[3])
started = time.time()
deadline = started + 600
wait = 0.5
while time.time() < deadline:
    time.sleep(wait)
    # /_sim/stats answers HTTP/2 only: curl it.
    out = subprocess.run(["curl", "-sf", "--http2", "--cacert", ca, f"https://127.0.0.1:{port}/_sim/stats"],
                         capture_output=True, text=True).stdout
    stats = json.loads(out) if out else {}
    accepted = stats.get("accepted", 0)
    if accepted >= want:
        print(f"{stats['last_accepted_at']:.3f}")
        sys.exit(0)
    rate = accepted / (time.time() - started)
    wait = min(2.0, max(0.1, (want - accepted) / rate * 2 / 3)) if rate > 0 else 0.25
print("timeout")
sys.exit(1)
PY
}

# measure OPERATION WHAT METHOD PATH BODY: calls the API once with the simulator's counters reset, then reports the
# answer's time, when the simulator had accepted a push for every person, when the run finished, and sent_at − call;
# and where the machine's CPU went from the call until the simulator was seen to have every push (its poll comes
# every 250 ms): the workers, the simulator, the API, the rest (PostgreSQL, this script's polls, the OS) and idle,
# in seconds and per person.
measure() {
  local operation=$1 what=$2 t0 t1 t2 answer done_at before after wal0 lsn0
  sim_reset "$sim_port" "$work/ca.pem"
  wal0=$(bench_wal_snapshot)
  lsn0=$(bench_wal_lsn)
  before=$(bench_cpu_snapshot "${pids[@]}")
  t0=$(date +%s.%N)
  answer=$(api "$3" "$4" "$5")
  t1=$(date +%s.%N)
  done_at=$(await_sim "$people")
  after=$(bench_cpu_snapshot "${pids[@]}")
  t2=$(date +%s.%N)
  echo "campaign $operation: answered in $(echo "($t1 - $t0) * 1000" | bc) ms ($answer)"
  echo "campaign $operation: last $what accepted by the simulator $(echo "$done_at - $t0" | bc) s after the call (goal ≤ 10 s)"
  bench_cpu_report "campaign $operation" "$before" "$after" "$(echo "$t2 - $t0" | bc)" "$people" person
  bench_wal_report "campaign $operation" "$wal0" "$(bench_wal_snapshot)" "$people" person
  bench_wal_dump "$lsn0" "$(bench_wal_lsn)"
  psql -qtA "$DATABASE_URL" -c "
    SELECT '$operation run: ' || (result ->> 'instances') || ' instances in '
           || round(extract(epoch FROM executed_at - created_at)::numeric, 2) || ' s after the call'
    FROM campaign_schedules WHERE operation = '$operation'" \
    -c "SELECT 'sent_at - call: p50 ' || round(percentile_cont(0.5) WITHIN GROUP (ORDER BY s)::numeric, 2)
           || ' s, p99 ' || round(percentile_cont(0.99) WITHIN GROUP (ORDER BY s)::numeric, 2) || ' s, max '
           || round(max(s)::numeric, 2) || ' s'
        FROM (SELECT extract(epoch FROM sent_at) - $t0 AS s FROM deliveries WHERE operation = '$operation') x"
}

# PGSS=1: where PostgreSQL's time went during the start (its run and its fan-out), then during the update.
bench_pgss_reset
measure start push-to-start POST /v1/campaigns '{"campaign_id":"cup","name":"Cup final","notification_type":"com.example.match","audience":{"all":true},"attributes":{"match":"A-B","team":{"$person":"/team"}},"content_state":{"home":0,"away":0},"push_payload":{"alert":{"title":"Kick-off","body":"A v B"}}}'
bench_pgss_report

"$bin/marquee-bench" requests --port "$port" --input "$work/tokens.txt" --output "$work/tokens.tsv" \
  --connections 64 | sed 's/^/activity tokens (PUT …\/tokens\/…, 64 connections): /'

bench_pgss_reset
measure update update POST /v1/campaigns/cup/update '{"content_state_patch":{"home":1}}'
bench_pgss_report

bench_pgss_reset
measure end end POST /v1/campaigns/cup/end '{"content_state_patch":{"away":1}}'
bench_pgss_report
echo "simulator: $(sim_stats "$sim_port" "$work/ca.pem")"
echo "deliveries: $(psql -qtA -F'=' -R' ' "$DATABASE_URL" -c "SELECT operation || ':' || status, count(*) FROM deliveries GROUP BY 1 ORDER BY 1")"
for w in $(seq 1 "$workers"); do echo "worker $w: $(rss "${pids[$((w + 1))]}")"; done

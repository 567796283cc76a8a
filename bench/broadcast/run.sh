#!/usr/bin/env bash
# broadcast: one update of a channel-backed instance is ONE request to Apple, whatever the audience. A private
# PostgreSQL (fsync on), `marquee serve`, the APNs simulator (records every accepted request to a JSONL file) and
# WORKERS `marquee worker`s; a channel created through the API (the simulator is also Apple's management host) and
# an instance started on it through the API. Then UPDATES sequential updates (POST /v1/live_notifications/update,
# {"seq": i}); each one's broadcast is found in the simulator's records by its seq. Reports p50/p99/max of
# "broadcast recorded − API accepted" (the API's 200 arriving) and "− request sent". Beside it, with FANOUT=1
# (default), the per-token way of reaching the same audience size: `bench/fanout/run.sh` (AUDIENCE instances, one
# update each, WORKERS workers) in the same run, as the time for that one update to reach all of them.
# With CAMPAIGN=1 (default), then: AUDIENCE people imported through the API with an iPhone each, one campaign on the
# channel for all of them (100k push-to-start pushes, each subscribing), and CAMPAIGN_UPDATES campaign-wide updates:
# p50/p99 of "broadcast recorded − API accepted" (goal ≤ 50 ms), of the API's own answer to each change, how long
# writing all instances took, and each broadcast's time by part (the schedule row → the worker's first half → sent).
# SETTLE=1 sends each campaign-wide update only once the previous one is written to every instance; by default they
# are 0.2 s apart, so each broadcast commits while the previous change's 100k-row write is running.
# Env: UPDATES (200), WORKERS (2), AUDIENCE (100000), CAMPAIGN (1), CAMPAIGN_UPDATES (20), SETTLE (0), FANOUT (1),
#      PORT, SIM_PORT.
source "$(dirname "$0")/../lib.sh"
MARQUEE_EXTRA_PACKAGES="" "$root/Deploy/local/deps.sh"
bench_build
bench_pg
updates=${UPDATES:-200}
workers=${WORKERS:-2}
audience=${AUDIENCE:-100000}
campaign_updates=${CAMPAIGN_UPDATES:-20}
port=${PORT:-18087}
sim_port=${SIM_PORT:-12299}
metrics_port=${METRICS_PORT:-19490}
work="$out/broadcast"
mkdir -p "$work"

export MARQUEE_LISTEN=127.0.0.1:$port
MARQUEE_MASTER_KEY=$(head -c 32 /dev/urandom | base64)
export MARQUEE_PROVIDER_HOSTS=api.push.apple.com,api.sandbox.push.apple.com,fcm.googleapis.com,oauth2.googleapis.com,127.0.0.1
export MARQUEE_MASTER_KEY MARQUEE_MIGRATIONS_DIR="$root/Migrations" MARQUEE_LOG_LEVEL=${MARQUEE_LOG_LEVEL:-warning}
"$bin/marquee" migrate >/dev/null 2>&1
bench_reset_tenants
created=$("$bin/marquee" tenant create --name "broadcast-$(date +%s)" --json)
APP_KEY=$(echo "$created" | sed -n 's/.*"app":"\([^"]*\)".*/\1/p')

pids=()
cleanup() {
  for p in "${pids[@]}"; do kill -TERM "$p" 2>/dev/null || true; done
  for p in "${pids[@]}"; do wait "$p" 2>/dev/null || true; done
  bench_pg_stop
}
trap cleanup EXIT

rm -f "$work/ca.pem" "$work/records.jsonl"
"$bin/marquee-bench" keygen es256 "$work/key.pem" "$work/key.pub"
echo "{\"BENCHKEY01\": {\"team_id\": \"BENCHTEAM1\", \"public_key\": $(json_file "$work/key.pub")}}" >"$work/keys.json"
MARQUEE_SIM_LISTEN=127.0.0.1:$sim_port MARQUEE_SIM_CA_OUT="$work/ca.pem" MARQUEE_SIM_KEYS="$work/keys.json" \
  MARQUEE_SIM_RECORDS="$work/records.jsonl" "$bin/marquee" simulate apns 2>"$work/sim.log" &
pids+=($!)
wait_sim "$sim_port" "$work/ca.pem"

# serve creates the channel at the simulator (Apple's management host here), so it trusts the simulator's CA.
MARQUEE_CA_FILE="$work/ca.pem" DATABASE_URL=$APP_DATABASE_URL "$bin/marquee" serve >"$work/serve.log" 2>&1 &
pids+=($!)
for _ in $(seq 1 100); do curl -sf "http://$MARQUEE_LISTEN/healthz" >/dev/null && break; sleep 0.1; done
api() { curl -sf -X "$1" "http://$MARQUEE_LISTEN$2" -H "Authorization: Bearer $APP_KEY" -H "Content-Type: application/json" -d "$3"; }
api PUT /v1/credentials/apns "{\"team_id\":\"BENCHTEAM1\",\"key_id\":\"BENCHKEY01\",\"private_key\":$(json_file "$work/key.pem"),\"bundle_id\":\"com.example.bench\",\"environment\":\"production\",\"endpoint\":\"https://127.0.0.1:$sim_port\",\"management_endpoint\":\"https://127.0.0.1:$sim_port\"}" >/dev/null \
  || { echo "PUT /v1/credentials/apns failed" >&2; exit 1; }
api PUT /v1/activity_types/com.example.match '{"attributes_type":"MatchAttributes"}' >/dev/null \
  || { echo "PUT /v1/activity_types failed" >&2; exit 1; }
channel=$(api POST /v1/channels '{"activity_type":"com.example.match","storage_policy":"none"}') \
  || { echo "POST /v1/channels failed" >&2; exit 1; }
channel_id=$(echo "$channel" | sed -n 's/.*"channel_id":"\([^"]*\)".*/\1/p')
api POST /v1/live_notifications/start "{\"identifiers\":{\"id\":\"fans\"},\"notification_type\":\"com.example.match\",\"instance_id\":\"match-1\",\"channel_id\":\"$channel_id\",\"attributes\":{\"match\":\"A-B\"},\"content_state\":{\"seq\":0},\"push_payload\":{\"alert\":{\"title\":\"Kick-off\",\"body\":\"A v B\"}}}" >/dev/null \
  || { echo "start on the channel failed" >&2; exit 1; }

for w in $(seq 1 "$workers"); do
  MARQUEE_CA_FILE="$work/ca.pem" MARQUEE_METRICS_LISTEN=127.0.0.1:$((metrics_port + w)) \
    DATABASE_URL=$APP_DATABASE_URL "$bin/marquee" worker >"$work/worker-$w.log" 2>&1 &
  pids+=($!)
done
for w in $(seq 1 "$workers"); do
  for _ in $(seq 1 100); do curl -sf "http://127.0.0.1:$((metrics_port + w))/healthz" >/dev/null && break; sleep 0.1; done
done

machine
echo "== broadcast: $updates sequential updates of one channel-backed instance, $workers workers"
python3 - "$MARQUEE_LISTEN" "$APP_KEY" "$updates" "$work/records.jsonl" <<'PY'
import json, sys, time, urllib.request
from datetime import datetime
listen, key, n, records = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4]
def post(i):
    body = json.dumps({"instance_id": "match-1", "content_state_patch": {"seq": i}}).encode()
    req = urllib.request.Request(f"http://{listen}/v1/live_notifications/update", data=body, method="POST",
                                 headers={"Authorization": "Bearer " + key, "Content-Type": "application/json"})
    with urllib.request.urlopen(req) as r:
        answer = json.loads(r.read())
    return answer
seen, offset = {}, 0
def scan():
    global offset
    with open(records, "rb") as f:
        f.seek(offset)
        for line in f:
            if not line.endswith(b"\n"):
                break
            offset += len(line)
            r = json.loads(line)
            if r.get("broadcast"):
                seq = r["payload"]["aps"]["content-state"].get("seq")
                t = datetime.fromisoformat(r["time"].replace("Z", "+00:00")).timestamp()
                seen[seq] = (t, r.get("channel_id"))
accept, sent, channels, missing = [], [], set(), 0
for i in range(1, n + 1):
    t0 = time.time()
    answer = post(i)
    t1 = time.time()
    assert answer.get("targets") == 1, answer
    deadline = t1 + 10
    while i not in seen and time.time() < deadline:
        scan()
        if i not in seen:
            time.sleep(0.0005)
    if i not in seen:
        missing += 1
        continue
    t, ch = seen[i]
    channels.add(ch)
    accept.append((t - t1) * 1000)
    sent.append((t - t0) * 1000)
def pct(xs, p):
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(round(p / 100 * (len(xs) - 1))))] if xs else float("nan")
print(json.dumps({"bench": "broadcast", "updates": n, "recorded": len(accept), "missing": missing,
                  "channels": len(channels),
                  "recorded_minus_accept_ms": {"p50": round(pct(accept, 50), 2), "p99": round(pct(accept, 99), 2),
                                               "max": round(max(accept), 2) if accept else None},
                  "recorded_minus_send_ms": {"p50": round(pct(sent, 50), 2), "p99": round(pct(sent, 99), 2),
                                             "max": round(max(sent), 2) if sent else None}}))
PY
echo "simulator: $(sim_stats "$sim_port" "$work/ca.pem")"
echo "deliveries: $(psql -qtA -F'=' -R' ' "$DATABASE_URL" -c "SELECT token_kind || ':' || status, count(*) FROM deliveries GROUP BY 1 ORDER BY 1")"

if [ "${CAMPAIGN:-1}" = 1 ]; then
  # A campaign on the channel: AUDIENCE people imported with an iPhone each (version unknown: they subscribe), one
  # start for all of them, then CAMPAIGN_UPDATES sequential campaign-wide updates, each ONE broadcast.
  echo "== campaign on the channel: $audience people, $campaign_updates campaign-wide updates"
  python3 - "$audience" >"$work/people.ndjson" <<'PY'
import json, os, sys
for i in range(int(sys.argv[1])):
    print(json.dumps({"id": f"fan{i}", "devices": [{"token": f"{i:08x}" * 8, "platform": "ios",
                      "push_to_start": {"com.example.match": os.urandom(16).hex() + f"{i:08x}" * 4}}]}))
PY
  curl -sf -o /dev/null -X POST "http://$MARQUEE_LISTEN/v1/people/import" -H "Authorization: Bearer $APP_KEY" \
    -H "Content-Type: application/x-ndjson" --data-binary @"$work/people.ndjson" || { echo "import failed" >&2; exit 1; }
  t0=$(date +%s.%N)
  api POST /v1/campaigns "{\"campaign_id\":\"final\",\"name\":\"Final\",\"notification_type\":\"com.example.match\",\"channel_id\":\"$channel_id\",\"audience\":{\"all\":true},\"attributes\":{\"match\":\"A-B\"},\"content_state\":{\"seq\":0},\"push_payload\":{\"alert\":{\"title\":\"Kick-off\",\"body\":\"A v B\"}}}" >/dev/null \
    || { echo "campaign failed" >&2; exit 1; }
  for _ in $(seq 1 1200); do
    sent=$(psql -qtA "$DATABASE_URL" -c "SELECT count(*) FROM deliveries WHERE operation = 'start' AND token_kind = 'push_to_start' AND status = 'sent'")
    [ "$sent" -ge "$audience" ] && break
    sleep 0.5
  done
  echo "campaign start: $sent push-to-start sent, the last $(psql -qtA "$DATABASE_URL" -c "SELECT round((extract(epoch FROM max(sent_at)) - $t0)::numeric, 2) FROM deliveries WHERE operation = 'start'") s after the call"
  python3 - "$MARQUEE_LISTEN" "$APP_KEY" "$campaign_updates" "$work/records.jsonl" "${SETTLE:-0}" <<'PY'
import json, sys, time, urllib.request
from datetime import datetime
listen, key, n, records = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4]
settle = sys.argv[5] == "1"
offset = 0
with open(records, "rb") as f:
    f.seek(0, 2)
    offset = f.tell()
seen = {}
def scan():
    global offset
    with open(records, "rb") as f:
        f.seek(offset)
        for line in f:
            if not line.endswith(b"\n"):
                break
            offset += len(line)
            r = json.loads(line)
            if r.get("broadcast"):
                seq = r["payload"]["aps"]["content-state"].get("seq")
                seen[seq] = datetime.fromisoformat(r["time"].replace("Z", "+00:00")).timestamp()
accept, answer, missing = [], [], 0
for i in range(1000, 1000 + n):
    body = json.dumps({"content_state_patch": {"seq": i}}).encode()
    req = urllib.request.Request(f"http://{listen}/v1/campaigns/final/update", data=body, method="POST",
                                 headers={"Authorization": "Bearer " + key, "Content-Type": "application/json"})
    t0 = time.time()
    with urllib.request.urlopen(req) as r:
        r.read()
    t1 = time.time()
    # The API's own answer: a change must be accepted at once, whatever the previous one is still writing.
    answer.append((t1 - t0) * 1000)
    deadline = t1 + 30
    while i not in seen and time.time() < deadline:
        scan()
        if i not in seen:
            time.sleep(0.0005)
    if i not in seen:
        missing += 1
        continue
    accept.append((seen[i] - t1) * 1000)
    if settle:
        # The next update only once this one is written to every instance (a score every few seconds, not 5/s).
        while True:
            req = urllib.request.Request(f"http://{listen}/v1/campaigns/final",
                                         headers={"Authorization": "Bearer " + key})
            with urllib.request.urlopen(req) as r:
                campaign = json.loads(r.read())
            if all(s["state"] != "pending" for s in campaign["schedules"]):
                break
            time.sleep(0.05)
    else:
        # 0.2 s apart: each next update overlaps the previous one's write to the other instances.
        time.sleep(0.2)
def pct(xs, p):
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(round(p / 100 * (len(xs) - 1))))] if xs else float("nan")
print(json.dumps({"bench": "broadcast-campaign", "settle": settle, "updates": n, "recorded": len(accept), "missing": missing,
                  "recorded_minus_accept_ms": {"p50": round(pct(accept, 50), 2), "p99": round(pct(accept, 99), 2),
                                               "max": round(max(accept), 2) if accept else None},
                  "api_answer_ms": {"p50": round(pct(answer, 50), 2), "p99": round(pct(answer, 99), 2)}}))
PY
  psql -qtA "$DATABASE_URL" -c "
    SELECT 'campaign-wide updates: ' || count(*) || ' done, writing all ' || max((result ->> 'instances')::int)
           || ' instances took p50 ' || round(percentile_cont(0.5) WITHIN GROUP (ORDER BY s)::numeric, 2) || ' s, max '
           || round(max(s)::numeric, 2) || ' s after the call'
    FROM (SELECT result, extract(epoch FROM executed_at - created_at) AS s FROM campaign_schedules
          WHERE operation = 'update' AND state = 'done') x"
  # Where each broadcast's time went, on PostgreSQL's clock: the API's schedule row (its transaction's start) → the
  # worker's first half (the broadcast row's creation, that transaction's start) → the worker's record of the send.
  # The n-th update schedule goes with the n-th broadcast of the campaign's instances.
  psql -qtA "$DATABASE_URL" -c "
    WITH s AS (SELECT row_number() OVER (ORDER BY created_at) AS n, created_at FROM campaign_schedules
               WHERE campaign_id = 'final' AND operation = 'update'),
         b AS (SELECT row_number() OVER (ORDER BY h.created_at) AS n, h.created_at, h.sent_at
               FROM delivery_history h JOIN instances i ON i.tenant_id = h.tenant_id AND i.id = h.instance_id
               WHERE i.campaign_id = 'final' AND h.token_kind = 'channel' AND h.operation = 'update'
                 AND h.status = 'sent'),
         x AS (SELECT extract(epoch FROM b.created_at - s.created_at) * 1000 AS wake,
                      extract(epoch FROM b.sent_at - b.created_at) * 1000 AS send
               FROM s JOIN b USING (n))
    SELECT 'broadcast breakdown (ms): schedule → first half p50 ' || round(percentile_cont(0.5) WITHIN GROUP (ORDER BY wake)::numeric, 1)
           || ' max ' || round(max(wake)::numeric, 1) || '; first half → send recorded p50 '
           || round(percentile_cont(0.5) WITHIN GROUP (ORDER BY send)::numeric, 1) || ' max ' || round(max(send)::numeric, 1)
           || '; per update (wake/send): ' || string_agg(round(wake::numeric) || '/' || round(send::numeric), ' ')
    FROM x"
fi
for p in "${pids[@]}"; do kill -TERM "$p" 2>/dev/null || true; done
for p in "${pids[@]}"; do wait "$p" 2>/dev/null || true; done
pids=()

if [ "${FANOUT:-1}" = 1 ]; then
  echo "== the same audience per token: bench/fanout/run.sh with INSTANCES=$audience WORKERS=$workers"
  INSTANCES=$audience WORKERS=$workers bash "$root/bench/fanout/run.sh" 2>&1 | grep -E "^(marquee:|sent |== apns)"
fi

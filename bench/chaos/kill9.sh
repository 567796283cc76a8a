#!/usr/bin/env bash
# chaos/kill9: `kill -9` of a worker during a fan-out. INSTANCES iOS instances are set up through the API (device,
# push-to-start token, start, activity token per person; the starts are sent by the workers), the workers are
# stopped, one update per instance is accepted by the API (a backlog of INSTANCES queued updates), WORKERS workers
# start on it, and worker 1 is killed with SIGKILL once KILL_AT of the updates are sent. Its claims come back after
# its claims (their row locks end with its session; a slow send's lease ends with MARQUEE_WORKER_HOLD_SECONDS, 15 s
# here) and the other workers send them.
# Claims: 0 lost (every accepted update has a delivery recorded `sent` whose apns-id the simulator received), and
# duplicates (pushes the simulator received more than once, by apns-id = delivery ID) at most what the killed
# worker held: LOOPS claims of BATCH and two express claims of MARQUEE_WORKER_EXPRESS_BATCH.
# Env: INSTANCES (20000), WORKERS (2), BATCH (256), LOOPS (2), KILL_AT (0.3), HOLD (15), WAIT (300 s),
#      CONFIG (debug|release), PORT, SIM_PORT, METRICS_PORT, CHAOS_PG_PORT.
CHAOS_NAME=kill9
source "$(dirname "$0")/lib.sh"
chaos_build
chaos_pg
n=${INSTANCES:-20000}
workers=${WORKERS:-2}
batch=${BATCH:-256}
loops=${LOOPS:-2}
express=$((2 * ${MARQUEE_WORKER_EXPRESS_BATCH:-16}))
export MARQUEE_WORKER_HOLD_SECONDS=${HOLD:-15}
start_sim
start_api
for w in $(seq 1 "$workers"); do start_worker "$w"; done
machine
echo "== chaos/kill9 ($config build): $n instances, one update each; $workers workers x $loops loops, batch $batch, hold ${MARQUEE_WORKER_HOLD_SECONDS} s; worker 1 killed at ${KILL_AT:-0.3} of the updates sent"
new_tenant "chaos-kill9-$(date +%s)"
s0=$(now)
setup_instances "$n" k
wait_until "${WAIT:-300}" "SELECT NOT EXISTS (SELECT 1 FROM deliveries WHERE status = 'queued')" \
  || { echo "the starts were not all sent within ${WAIT:-300} s" >&2; exit 1; }
echo "setup through the API: $(elapsed "$s0" "$(now)") s (devices, push-to-start tokens, starts sent, activity tokens)"
for w in $(seq 1 "$workers"); do
  stop_pid "${worker_pid[$w]}" 30
  echo "worker $w stopped for the backlog: $stopped"
done

updates_file k-updates k "$n"
drive k-updates --connections 16
load_accepted k-updates
accepted=$(sql -c "SELECT count(*) FROM chaos_accepted")

t0=$(now)
for w in $(seq 1 "$workers"); do start_worker "$w"; done
victim=${worker_pid[1]}
target=$(awk -v n="$accepted" -v f="${KILL_AT:-0.3}" 'BEGIN { printf "%d", n * f }')
sent_updates() { sql -c "SELECT count(*) FROM deliveries WHERE operation = 'update' AND status = 'sent'"; }
while [ "$(sent_updates)" -lt "$target" ]; do sleep 0.05; done
# In flight just before the kill, all workers together (a claim's rows are locked while it sends).
held=$(sql -c "SELECT count(*) FROM deliveries WHERE status = 'queued' AND marquee_delivery_in_flight(tenant_id, id)")
disown "$victim"  # no "Killed" job notice
kill -9 "$victim"
tk=$(now)
while kill -0 "$victim" 2>/dev/null && [ "$(awk '{ print $3 }' "/proc/$victim/stat" 2>/dev/null)" != Z ]; do sleep 0.01; done
sent_at_kill=$(sent_updates)
echo "killed worker 1 (pid $victim) after $(elapsed "$t0" "$tk") s with $sent_at_kill updates recorded sent; $held deliveries were in flight (all workers)"

wait_until "${WAIT:-300}" "SELECT NOT EXISTS (SELECT 1 FROM deliveries WHERE status = 'queued')" \
  || echo "still queued after ${WAIT:-300} s: $(sql -c "SELECT count(*) FROM deliveries WHERE status = 'queued'")"
t1=$(now)
load_received
read -r lost sent_ok <<<"$(sql -c "
  SELECT count(*) FILTER (WHERE d.id IS NULL OR NOT EXISTS (SELECT 1 FROM chaos_received r WHERE r.apns_id = d.id)),
         count(*) FILTER (WHERE d.id IS NOT NULL AND EXISTS (SELECT 1 FROM chaos_received r WHERE r.apns_id = d.id))
  FROM chaos_accepted a LEFT JOIN deliveries d ON d.instance_id = a.instance_id AND d.instance_version = a.version
       AND d.operation = 'update' AND d.status = 'sent'")"
read -r dup_ids dup_pushes <<<"$(sql -c "
  SELECT count(*), coalesce(sum(n - 1), 0) FROM (SELECT apns_id, count(*) AS n FROM chaos_received GROUP BY 1 HAVING count(*) > 1) x")"
retaken=$(sql -c "SELECT extract(epoch FROM min(sent_at)) FROM deliveries WHERE operation = 'update' AND status = 'sent' AND attempts > 1")
echo "deliveries by operation, status, attempts: $(sql -R' ' -F':' -c "SELECT operation, status, attempts, count(*) FROM deliveries GROUP BY 1, 2, 3 ORDER BY 1, 2, 3")"
echo "simulator: $(sim_stats "$sim_port" "$work/ca.pem")"
echo "figures: $accepted updates accepted, $sent_ok sent and received, $lost lost; $dup_pushes duplicate pushes over $dup_ids delivery IDs (bound: $loops x $batch + $express = $((loops * batch + express)); in flight at the kill: $held); backlog drained in $(elapsed "$t0" "$t1") s ($(awk -v n="$accepted" -v a="$t0" -v b="$t1" 'BEGIN { printf "%d", n / (b - a) }') updates/s); first re-claimed delivery sent $( [ -n "$retaken" ] && elapsed "$tk" "$retaken" || echo '-') s after the kill"
[ "$held" -gt 0 ] || echo "note: the killed worker held no claims when it died (it was between batches): nothing was at stake; run again or raise INSTANCES"
check "every update request was accepted ($accepted of $n)" "[ '$accepted' = $n ]"
check "0 lost: every accepted update recorded sent and received by the simulator" "[ '$lost' = 0 ] && [ '$sent_ok' = '$accepted' ]"
check "duplicates ($dup_pushes) at most the killed worker's claims ($loops x $batch + $express)" "[ '$dup_pushes' -le $((loops * batch + express)) ]"
finish chaos/kill9

#!/usr/bin/env bash
# chaos/sigterm: SIGTERM of the API and every worker under load. INSTANCES instances are set up through the API; then
# one update per instance is paced at RATE/s (open loop, 32 keep-alive connections). TERM_AT s into the load the
# API and all workers get SIGTERM at once (drain time MARQUEE_DRAIN_TIMEOUT=DRAIN); DOWN s after they have exited
# they are started again, and the load goes on (requests meanwhile are refused: not accepted, not counted).
# Claims: every process exits with code 0 within DRAIN + 5 s; every request sent before the SIGTERM got an answer
# (in-flight requests finish); no delivery is left leased by a stopped worker; every 2xx'd update is eventually
# recorded sent and received by the simulator.
# Env: INSTANCES (3000), RATE (200), TERM_AT (5 s), DOWN (2 s), DRAIN (10 s), WORKERS (2), WAIT (120 s),
#      CONFIG (debug|release), PORT, SIM_PORT, METRICS_PORT, CHAOS_PG_PORT.
CHAOS_NAME=sigterm
source "$(dirname "$0")/lib.sh"
chaos_build
chaos_pg
n=${INSTANCES:-3000}
rate=${RATE:-200}
workers=${WORKERS:-2}
drain=${DRAIN:-10}
export MARQUEE_DRAIN_TIMEOUT=$drain
start_sim
start_api
for w in $(seq 1 "$workers"); do start_worker "$w"; done
machine
echo "== chaos/sigterm ($config build): $n updates at $rate/s; SIGTERM to the API and $workers workers at ${TERM_AT:-5} s, restarted ${DOWN:-2} s after they exit; drain ${drain} s"
new_tenant "chaos-sigterm-$(date +%s)"
setup_instances "$n" s
wait_until 120 "SELECT NOT EXISTS (SELECT 1 FROM deliveries WHERE status = 'queued')" || true

updates_file s-updates s "$n"
drive s-updates --rate "$rate" --connections 32 --timeout 10 >"$work/s-updates.summary" &
driver=$!
sleep "${TERM_AT:-5}"
old_workers=()
for w in $(seq 1 "$workers"); do old_workers+=("${worker_pid[$w]}"); done
term_all "$api" "${old_workers[@]}"
tt=$term_t0
exits_ok=yes
await_exit "$api" $((drain + 5))
echo "API: $stopped"
[ "$stopped_code" = 0 ] || exits_ok=no
for w in $(seq 1 "$workers"); do
  await_exit "${worker_pid[$w]}" $((drain + 5))
  echo "worker $w: $stopped"
  [ "$stopped_code" = 0 ] || exits_ok=no
done
tdown=$(now)
# Left behind by the stopped workers: a claim still open (none can be: their sessions are gone) or a slow send's
# lease never recorded (queued, due in the future, no retry reason).
left=$(sql -c "SELECT count(*) FROM deliveries WHERE status = 'queued'
  AND (marquee_delivery_in_flight(tenant_id, id) OR (next_attempt_at > now() AND reason IS NULL))")
sleep "${DOWN:-2}"
start_api
for w in $(seq 1 "$workers"); do start_worker "$w"; done
tup=$(now)
wait "$driver" || true
cat "$work/s-updates.summary"
wait_until "${WAIT:-120}" "SELECT NOT EXISTS (SELECT 1 FROM deliveries WHERE status = 'queued')" \
  || echo "still queued after ${WAIT:-120} s: $(sql -c "SELECT count(*) FROM deliveries WHERE status = 'queued'")"
accepted_sent s-updates
cut=$(awk -F'\t' -v t="$tt" '$3 < t && $2 <= 0' "$work/s-updates.tsv" | wc -l)
echo "answers to requests sent before the SIGTERM: $(answers s-updates 0 "$tt")"
echo "answers while stopping and down ($(elapsed "$tt" "$tup") s): $(answers s-updates "$tt" "$tup")"
echo "answers after the restart: $(answers s-updates "$tup" 9999999999)"
echo "deliveries by operation, status: $(sql -R' ' -F':' -c "SELECT operation, status, count(*) FROM deliveries GROUP BY 1, 2 ORDER BY 1, 2")"
echo "figures: $accepted updates accepted, $sent_ok sent and received, $lost lost; $cut requests sent before the SIGTERM got no answer; $left deliveries left leased by the stopped workers"
check "API and workers exit 0 within the drain time + 5 s" "[ $exits_ok = yes ]"
check "every request sent before the SIGTERM was answered" "[ '$cut' = 0 ]"
check "no delivery left leased by a stopped worker" "[ '$left' = 0 ]"
check "nothing lost: every 2xx'd update recorded sent and received by the simulator" "[ '$accepted' -gt 0 ] && [ '$lost' = 0 ]"
finish chaos/sigterm

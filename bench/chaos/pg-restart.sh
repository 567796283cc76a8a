#!/usr/bin/env bash
# chaos/pg-restart: PostgreSQL goes away under API load and comes back. INSTANCES instances are set up through the
# API; then one update per instance is paced at RATE/s (open loop, 32 keep-alive connections, 10 s client
# timeout). DOWN_AT s into the load PostgreSQL is stopped (PG_STOP=crash: immediate mode, as a crash; or stop: fast
# shutdown) for OUTAGE s, then started again on the same directory and port; the API and workers keep running.
# Claims: every update answered 200 has its delivery, recorded sent and received by the simulator; during the outage
# the API answers 503 application/problem+json (never another 5xx, never no answer or a hang), except for a write
# whose COMMIT was in flight when PostgreSQL went, answered 500 `write-outcome-unknown` or `write-committed-unanswered`
# as documented (README: marquee_group_commit_in_doubt_total), and only such a write may have committed without a 2xx
# (never one answered 503); workers resume within
# 5 s of PostgreSQL being back (first delivery recorded sent after the restarted server is ready to accept
# connections; crash recovery comes before that and is PostgreSQL's, not the workers').
# Env: INSTANCES (3000), RATE (150), DOWN_AT (5 s), OUTAGE (5 s), PG_STOP (crash|stop), WORKERS (2), WAIT (120 s),
#      CONFIG (debug|release), PORT, SIM_PORT, METRICS_PORT, CHAOS_PG_PORT.
CHAOS_NAME=pg-restart
source "$(dirname "$0")/lib.sh"
chaos_build
chaos_pg
n=${INSTANCES:-3000}
rate=${RATE:-150}
workers=${WORKERS:-2}
mode=${PG_STOP:-crash}
start_sim
start_api
for w in $(seq 1 "$workers"); do start_worker "$w"; done
machine
echo "== chaos/pg-restart ($config build): $n updates at $rate/s; PostgreSQL $mode at ${DOWN_AT:-5} s for ${OUTAGE:-5} s; $workers workers"
new_tenant "chaos-pg-$(date +%s)"
setup_instances "$n" g
wait_until 120 "SELECT NOT EXISTS (SELECT 1 FROM deliveries WHERE status = 'queued')" || true

updates_file g-updates g "$n"
drive g-updates --rate "$rate" --connections 32 --timeout 10 >"$work/g-updates.summary" &
driver=$!
sleep "${DOWN_AT:-5}"
td=$(now)
"$root/Deploy/local/pg.sh" "$mode" "$pgdir"
tdown=$(now)
sleep "${OUTAGE:-5}"
"$root/Deploy/local/pg.sh" start "$pgdir" "$PGPORT" >/dev/null
tup=$(now)
echo "PostgreSQL: $mode took $(elapsed "$td" "$tdown") s; down for $(elapsed "$td" "$tup") s (until pg.sh start returned)"
wait "$driver" || true
cat "$work/g-updates.summary"
wait_until "${WAIT:-120}" "SELECT NOT EXISTS (SELECT 1 FROM deliveries WHERE status = 'queued')" \
  || echo "still queued after ${WAIT:-120} s: $(sql -c "SELECT count(*) FROM deliveries WHERE status = 'queued'")"
accepted_sent g-updates

# During the outage: requests sent after PostgreSQL began to stop and answered before it was back.
during=$(answers g-updates "$td" "$tup")
# A write whose COMMIT was in flight when the connection went: the documented in-doubt answers.
in_doubt='$2 == 500 && $5 ~ /application\/problem\+json/ && $6 ~ /write-(outcome-unknown|committed-unanswered)/'
indoubt=$(awk -F'\t' "$in_doubt" "$work/g-updates.tsv" | wc -l)
not503=$(awk -F'\t' -v a="$td" -v b="$tup" "\$3 >= a && \$3 <= b && (\$2 >= 500 && \$2 != 503 || \$2 <= 0) && !($in_doubt)" "$work/g-updates.tsv" | wc -l)
plain503=$(awk -F'\t' '$2 == 503 && $5 !~ /application\/problem\+json/' "$work/g-updates.tsv" | wc -l)
n503=$(awk -F'\t' -v a="$td" -v b="$tup" '$3 >= a && $3 <= b && $2 == 503' "$work/g-updates.tsv" | wc -l)
bad_any=$(awk -F'\t' "((\$2 >= 500 && \$2 != 503) || \$2 <= 0) && !($in_doubt)" "$work/g-updates.tsv" | wc -l)
slowest=$(awk -F'\t' -v a="$td" -v b="$tup" '$3 >= a && $3 <= b { d = $4 - $3; if (d > m) m = d } END { printf "%.2f", m }' "$work/g-updates.tsv")
first_ok=$(awk -F'\t' -v t="$tup" '$3 >= t && $2 == 200 { print $4; exit }' "$work/g-updates.tsv")
# Back = when the restarted PostgreSQL was ready to accept connections (its log says; after crash recovery).
ready=$(grep 'ready to accept connections' "$pgdir/server.log" | tail -1 | awk '{ print $1, $2, $3 }')
back=$(date -d "$ready" +%s.%N 2>/dev/null || echo "$tup")
first_sent=$(sql -c "SELECT extract(epoch FROM min(sent_at)) FROM deliveries WHERE sent_at >= to_timestamp($back)")
resume=$( [ -n "$first_sent" ] && elapsed "$back" "$first_sent" || echo 9999)
echo "answers before the outage: $(answers g-updates 0 "$td")"
echo "answers during the outage: $during(slowest answer $slowest s)"
echo "answers after PostgreSQL is back: $(answers g-updates "$tup" 9999999999)"
echo "a 5xx answer during the outage: $(awk -F'\t' -v a="$td" -v b="$tup" '$3 >= a && $3 <= b && $2 >= 500 { print $2, $5, $6; exit }' "$work/g-updates.tsv")"
echo "deliveries by operation, status: $(sql -R' ' -F':' -c "SELECT operation, status, count(*) FROM deliveries GROUP BY 1, 2 ORDER BY 1, 2")"
extra=$(($(sql -c "SELECT count(*) FROM deliveries WHERE operation = 'update'") - accepted))
echo "figures: $accepted updates accepted, $sent_ok sent and received, $lost lost; during the outage $n503 answers 503, $indoubt in-doubt 500s (a COMMIT in flight), $not503 other 5xx or no answer; first 200 $( [ -n "$first_ok" ] && elapsed "$back" "$first_ok" || echo '-') s and first delivery recorded sent $resume s after the restarted PostgreSQL was ready; $extra updates committed though not answered 2xx"
check "every 200 has its delivery, recorded sent and received by the simulator" "[ '$accepted' -gt 0 ] && [ '$lost' = 0 ]"
check "during the outage the API answers 503 (no other 5xx but the in-doubt 500s, no hang, no dropped connection)" "[ '$n503' -gt 0 ] && [ '$not503' = 0 ] && [ '$bad_any' = 0 ]"
check "updates committed without a 2xx ($extra) are at most the in-doubt answers ($indoubt)" "[ '$extra' -le '$indoubt' ]"
check "every 503 is application/problem+json" "[ '$plain503' = 0 ]"
check "workers resume within 5 s of PostgreSQL being back ($resume s)" "awk -v r='$resume' 'BEGIN { exit !(r <= 5) }'"
finish chaos/pg-restart

#!/usr/bin/env bash
# chaos/faults: a misbehaving provider. The APNs simulator answers 10% of pushes 503, 5% 429 with Retry-After: 1,
# and 410 Unregistered to every activity token starting with "dead" (every 20th instance); a second tenant's
# credential names a bundle the simulator's key may not push to, so its pushes get 400 TopicDisallowed.
# Everything is set up through the API (devices, push-to-start tokens, starts, activity tokens, one update per
# instance), with WORKERS workers and a short retry policy (MARQUEE_RETRY_INITIAL_MS=200).
# Claims: every start and update of the first tenant except those to dead tokens is eventually sent and seen by the
# simulator; 503/429 were retried; 410 and 400 deliveries were tried exactly once (never retried); the dead
# activity tokens are retired.
# Env: INSTANCES (1000), BAD_INSTANCES (50), WORKERS (2), WAIT (180 s), CONFIG (debug|release), PORT, SIM_PORT,
#      METRICS_PORT, CHAOS_PG_PORT.
CHAOS_NAME=faults
source "$(dirname "$0")/lib.sh"
chaos_build
chaos_pg
n=${INSTANCES:-1000}
bad=${BAD_INSTANCES:-50}
workers=${WORKERS:-2}
export MARQUEE_RETRY_INITIAL_MS=${MARQUEE_RETRY_INITIAL_MS:-200} MARQUEE_RETRY_MAX_ATTEMPTS=${MARQUEE_RETRY_MAX_ATTEMPTS:-10}

start_sim '[{"token_prefix":"dead","action":"unregistered"},
  {"rate":0.1,"action":"service_unavailable"},
  {"rate":0.05,"action":"too_many_requests","retry_after":1}]'
start_api
for w in $(seq 1 "$workers"); do start_worker "$w"; done
machine
echo "== chaos/faults ($config build): $n instances (every 20th token dead) + $bad of a tenant whose pushes get 400; 10% 503, 5% 429 Retry-After 1; $workers workers, retry initial ${MARQUEE_RETRY_INITIAL_MS} ms, max ${MARQUEE_RETRY_MAX_ATTEMPTS} attempts"

new_tenant "chaos-bad-$(date +%s)" com.example.forbidden
bad_tenant=$TENANT
setup_instances "$bad" x
updates_file x-updates x "$bad"
drive x-updates --connections 8 >/dev/null
all_2xx x-updates

new_tenant "chaos-faults-$(date +%s)"
t0=$(now)
setup_instances "$n" f 20
updates_file f-updates f "$n"
drive f-updates --connections 16
all_2xx f-updates

if ! wait_until "${WAIT:-180}" "SELECT NOT EXISTS (SELECT 1 FROM deliveries WHERE status = 'queued')"; then
  echo "still queued after ${WAIT:-180} s: $(sql -c "SELECT count(*) FROM deliveries WHERE status = 'queued'")"
fi
t1=$(now)
load_received

good="d.tenant_id = '$TENANT' AND d.token NOT LIKE 'dead%'"
read -r good_total good_sent good_seen good_retried good_max <<<"$(sql -c "
  SELECT count(*), count(*) FILTER (WHERE status = 'sent'),
         count(*) FILTER (WHERE status = 'sent' AND EXISTS (SELECT 1 FROM chaos_received r WHERE r.apns_id = d.id)),
         count(*) FILTER (WHERE attempts > 1), max(attempts)
  FROM deliveries d WHERE $good")"
read -r dead_total dead_undeliverable dead_once <<<"$(sql -c "
  SELECT count(*), count(*) FILTER (WHERE status = 'undeliverable'), count(*) FILTER (WHERE attempts = 1)
  FROM deliveries d WHERE d.tenant_id = '$TENANT' AND d.token LIKE 'dead%'")"
read -r dead_tokens dead_retired <<<"$(sql -c "
  SELECT count(*), count(*) FILTER (WHERE status = 'retired') FROM activity_tokens
  WHERE tenant_id = '$TENANT' AND token LIKE 'dead%'")"
read -r bad_total bad_failed bad_once <<<"$(sql -c "
  SELECT count(*), count(*) FILTER (WHERE status = 'failed'), count(*) FILTER (WHERE attempts = 1)
  FROM deliveries d WHERE d.tenant_id = '$bad_tenant'")"
accepted=$(awk -F'\t' '$2 == 200' "$work/f-updates.tsv" | wc -l)
echo "deliveries by tenant, operation, status, attempts: $(sql -R' ' -F':' -c "SELECT CASE WHEN tenant_id = '$TENANT' THEN 'main' ELSE 'bad' END, operation, status, attempts, count(*)
  FROM deliveries GROUP BY 1, 2, 3, 4 ORDER BY 1, 2, 3, 4")"
echo "reasons: $(sql -R'; ' -F'=' -c "SELECT coalesce(reason, '-'), count(*) FROM deliveries GROUP BY 1 ORDER BY 2 DESC")"
echo "simulator: $(sim_stats "$sim_port" "$work/ca.pem")"
echo "figures: $good_sent of $good_total deliveries sent ($good_seen seen by the simulator), $good_retried retried (max $good_max attempts); dead: $dead_undeliverable of $dead_total undeliverable, $dead_once tried once, $dead_retired of $dead_tokens tokens retired; 400: $bad_failed of $bad_total failed, $bad_once tried once; $(elapsed "$t0" "$t1") s from the first setup request to an empty queue"
echo "not sent (live tokens), by operation, status, reason: $(sql -R'; ' -F' ' -c "SELECT operation, status, coalesce(reason, '-'), count(*) FROM deliveries d
  WHERE $good AND status <> 'sent' GROUP BY 1, 2, 3 ORDER BY 4 DESC")"
check "all $((2 * n - n / 20)) expected deliveries exist (starts + updates to live tokens)" "[ '$good_total' = $((2 * n - (n + 19) / 20)) ]"
check "every update request was accepted ($accepted of $n)" "[ '$accepted' = $n ]"
check "every delivery to a live token was sent and seen by the simulator" "[ '$good_total' -gt 0 ] && [ '$good_sent' = '$good_total' ] && [ '$good_seen' = '$good_total' ]"
check "503/429 were retried" "[ '$good_retried' -gt 0 ]"
check "410: every delivery to a dead token undeliverable, tried once" "[ '$dead_total' -gt 0 ] && [ '$dead_undeliverable' = '$dead_total' ] && [ '$dead_once' = '$dead_total' ]"
check "410: every dead activity token retired" "[ '$dead_tokens' -gt 0 ] && [ '$dead_retired' = '$dead_tokens' ]"
check "400: every delivery of the refused bundle failed, tried once" "[ '$bad_total' -gt 0 ] && [ '$bad_failed' = '$bad_total' ] && [ '$bad_once' = '$bad_total' ]"
finish chaos/faults

# Shared helpers for bench/*/run.sh: a private PostgreSQL with fsync on, and the release binaries.
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
out="$root/bench/out"
# The benches drive one tenant as fast as this machine goes (bench/api-update: 3–4k app-key requests/s;
# bench/registrations: 2.4k sdk-key registrations/s), above the API's default request rate limits (1,000 a second per
# tenant and process, README "Request rate limits"), which would answer them 429. Their servers get limits far above
# that instead: the check still runs (its cost is in the figures) but refuses nothing. Set these to measure others.
export MARQUEE_RATE_LIMIT_APP=${MARQUEE_RATE_LIMIT_APP:-1000000} MARQUEE_RATE_LIMIT_SDK=${MARQUEE_RATE_LIMIT_SDK:-1000000}
mkdir -p "$out"
chmod 755 "$out"

# BENCH_SCRATCH: a SwiftPM scratch path (e.g. /tmp/build-bench) instead of .build.
bench_build() {
  local scratch=()
  [ -n "${BENCH_SCRATCH:-}" ] && scratch=(--scratch-path "$BENCH_SCRATCH")
  (cd "$root" && swift build "${scratch[@]}" -c release --product marquee >&2 \
    && swift build "${scratch[@]}" -c release --product marquee-bench >&2)
  bin="$(cd "$root" && swift build "${scratch[@]}" -c release --show-bin-path)"
}

# Starts (or reuses) the benchmark cluster; sets DATABASE_URL and PGPORT.
# Every run starts from an empty `marquee` database (the cluster itself is kept, so its files stay warm).
bench_pg() {
  DATABASE_URL=$("$root/Deploy/local/pg.sh" start "$out/pg")
  # `serve` and `worker` log in as marquee_app (made by `marquee migrate`); psql and migrate use the owner.
  APP_DATABASE_URL=${DATABASE_URL/postgres@/marquee_app@}
  export DATABASE_URL APP_DATABASE_URL
  PGPORT=$(sed -n 4p "$out/pg/postmaster.pid")
  export PGPORT
  psql -q -h 127.0.0.1 -p "$PGPORT" -U postgres -d postgres \
    -c "DROP DATABASE IF EXISTS marquee WITH (FORCE)" -c "CREATE DATABASE marquee" >/dev/null
}

bench_pg_stop() { "$root/Deploy/local/pg.sh" stop "$out/pg"; }

machine() {
  echo "machine: $(nproc) cores, $(free -g | awk '/Mem:/{print $2}') GiB, $(uname -sr), $(lscpu | sed -n 's/^Model name: *//p' | head -1)"
}

# A PEM file as a JSON string literal (quotes included; PEM has no quotes or backslashes to escape).
json_file() { awk 'BEGIN { printf "\"" } { printf "%s\\n", $0 } END { printf "\"" }' "$1"; }

# Waits until the simulator at 127.0.0.1:$1 answers /_sim/stats over HTTP/2 with the CA in $2.
wait_sim() {
  for _ in $(seq 1 100); do
    [ -s "$2" ] && curl -sf --http2 --cacert "$2" "https://127.0.0.1:$1/_sim/stats" >/dev/null && return 0
    sleep 0.1
  done
  echo "simulator on port $1 did not come up" >&2
  return 1
}

# simulator stats: sim_stats PORT CA
sim_stats() { curl -sf --http2 --cacert "$2" "https://127.0.0.1:$1/_sim/stats"; }
sim_reset() { curl -sf --http2 --cacert "$2" -X POST "https://127.0.0.1:$1/_sim/reset" >/dev/null; }

# Peak and current RSS of a process in MiB: "peak X MiB, now Y MiB".
rss() { awk '/^VmHWM/ { p = $2 } /^VmRSS/ { r = $2 } END { printf "peak %.0f MiB, now %.0f MiB", p / 1024, r / 1024 }' "/proc/$1/status"; }

# Empties every tenant (and, by cascade, their instances, deliveries, devices, …) in the scratch benchmark cluster,
# so that a run starts from the same state and no queued delivery of an earlier run (sealed with another master key)
# is left for this run's workers. instances and campaign_members are named: their references to tenants and campaigns
# are triggers (migration 0066), which TRUNCATE's cascade does not follow.
bench_reset_tenants() { psql -q -v ON_ERROR_STOP=1 "$DATABASE_URL" -c "TRUNCATE tenants, instances, campaign_members CASCADE" 2>&1 | grep -v "^NOTICE" >&2 || true; }

# The yardstick of issues 10 and 11: pgbench of a naive transaction (one UPDATE of a random row of ROWS, one INSERT),
# 64 clients, 10 s, prepared; prints its tps line. Usage: bench_naive_pgbench ROWS
bench_naive_pgbench() {
  local rows=$1
  psql -q "$DATABASE_URL" -c "SET client_min_messages = warning; DROP TABLE IF EXISTS naive, naive_log"
  psql -q "$DATABASE_URL" <<SQL
CREATE TABLE naive (id int PRIMARY KEY, v bigint NOT NULL DEFAULT 0);
INSERT INTO naive (id) SELECT generate_series(0, $((rows - 1)));
CREATE TABLE naive_log (id bigserial PRIMARY KEY, k int NOT NULL, at timestamptz NOT NULL DEFAULT now());
VACUUM ANALYZE naive;
SQL
  cat >"$out/naive.sql" <<SQL
\\set i random(0, $((rows - 1)))
BEGIN;
UPDATE naive SET v = v + 1 WHERE id = :i;
INSERT INTO naive_log (k) VALUES (:i);
COMMIT;
SQL
  echo "== pgbench -M prepared -c 64 -j 2 -T 10 (naive: one UPDATE + one INSERT per transaction)"
  pgbench -n -M prepared -h 127.0.0.1 -p "$PGPORT" -U postgres -c 64 -j 2 -T 10 -f "$out/naive.sql" marquee \
    2>&1 | grep -E "^(tps|latency average|number of failed)"
}

# Where the CPU of a measured part goes, from /proc: a process's user + system ticks (0 once it is gone), and the
# machine's busy ticks (user, nice, system, irq, softirq). /proc/stat counts the whole machine, so on a shared one
# work from outside the bench lands in "the rest".
bench_ticks() { awk '{ print $14 + $15 }' "/proc/$1/stat" 2>/dev/null || echo 0; }
bench_busy_ticks() { awk '/^cpu / { print $2 + $3 + $4 + $7 + $8 }' /proc/stat; }

# bench_cpu_snapshot SIM API WORKER...: the workers' ticks (together), the simulator's, the API's and the machine's
# busy ticks, on one line. Take one before and one after the measured part, for bench_cpu_report.
bench_cpu_snapshot() {
  local sim=$1 api=$2 workers=0 p
  shift 2
  for p in "$@"; do workers=$((workers + $(bench_ticks "$p"))); done
  echo "$workers $(bench_ticks "$sim") $(bench_ticks "$api") $(bench_busy_ticks)"
}

# bench_cpu_report LABEL BEFORE AFTER SECONDS N UNIT: where the CPU went between two snapshots SECONDS apart: the
# workers, the simulator, the API, the rest (PostgreSQL, the bench's polls, the OS) and idle, in seconds, then per UNIT
# (N of them: pushes, people).
# The write-ahead log PostgreSQL wrote between two snapshots (pg_stat_wal: records, full-page images, bytes):
# deterministic where CPU seconds are noisy, and the full-page images show checkpoints landing inside a run.
# Usage: w0=$(bench_wal_snapshot); …; bench_wal_report LABEL "$w0" "$(bench_wal_snapshot)" N UNIT
bench_wal_snapshot() { psql -qtA -F ' ' "$DATABASE_URL" -c "SELECT wal_records, wal_fpi, wal_bytes FROM pg_stat_wal"; }
bench_wal_report() {
  echo "$2 $3" | awk -v n="$4" -v unit="$5" -v label="$1" '{
    printf "%s: WAL %.1f MB, %d records, %d full-page images; per %s: %.0f bytes, %.2f records, %.3f full-page images\n", label,
      ($6 - $3) / 1e6, $4 - $1, $5 - $2, unit, ($6 - $3) / n, ($4 - $1) / n, ($5 - $2) / n }'
}

# WALDUMP=1: what the write-ahead log between two LSNs holds, by record type and by relation (pg_waldump; the
# cluster keeps its WAL until a checkpoint, so run with PG_OPTIONS="-c max_wal_size=8GB" to keep a whole phase).
# Usage: l0=$(bench_wal_lsn); …; bench_wal_dump "$l0" "$(bench_wal_lsn)"
bench_wal_lsn() { psql -qtA "$DATABASE_URL" -c "SELECT pg_current_wal_insert_lsn()"; }
bench_wal_dump() {
  [ "${WALDUMP:-0}" = 1 ] || return 0
  local waldump=("$root/Deploy/local/pg.sh" waldump "$out/pg")
  "${waldump[@]}" -s "$1" -e "$2" --stats=record 2>/dev/null | awk 'NR <= 3 || $2 > 0' | sort -t'(' -k2 -rn | head -25
  echo "WAL records by relation (the 15 with most):"
  "${waldump[@]}" -s "$1" -e "$2" 2>/dev/null | sed -n 's|.*rel [0-9]*/[0-9]*/\([0-9]*\).*|\1|p' | sort | uniq -c \
    | sort -rn | head -15 | while read -r n node; do
      echo "  $n $(psql -qtA "$DATABASE_URL" -c "SELECT coalesce((SELECT relname FROM pg_class WHERE pg_relation_filenode(oid) = $node LIMIT 1), '$node')")"
    done
}

bench_cpu_report() {
  echo "$2 $3" | awk -v hz="$(getconf CLK_TCK)" -v cores="$(nproc)" -v secs="$4" -v n="$5" -v unit="$6" -v label="$1" '{
    w = ($5 - $1) / hz; s = ($6 - $2) / hz; a = ($7 - $3) / hz; busy = ($8 - $4) / hz; rest = busy - w - s - a
    printf "%s: CPU over %.2f s x %d cores: workers %.1f s, simulator %.1f s, API %.1f s, rest (PostgreSQL, polls, OS) %.1f s, idle %.1f s; per %s: workers %.0f, simulator %.0f, API %.0f, rest %.0f µs\n",
      label, secs, cores, w, s, a, rest, secs * cores - busy, unit, w * 1e6 / n, s * 1e6 / n, a * 1e6 / n, rest * 1e6 / n }'
}

# Prints what a `perf record -g` file ($1) saw: CPU by thread, then the hottest symbols (self time).
bench_perf_report() {
  perf report -i "$1" --no-children --sort comm --stdio 2>/dev/null | grep -E "^ +[0-9]" | head -5
  perf report -i "$1" --no-children --sort symbol --stdio 2>/dev/null | grep -E "^ +[0-9]" | cut -c1-150 | head -30
}

# PGSS=1 (with PG_OPTIONS="-c shared_preload_libraries=pg_stat_statements"): where PostgreSQL's time went during a
# measured part. bench_pgss_reset before it, bench_pgss_report after it (the PGSS_TOP (12) statements with the most
# time; plan_ms is planning time, tracked with -c pg_stat_statements.track_planning=on).
bench_pgss_reset() {
  [ -n "${PGSS:-}" ] || return 0
  psql -q "$DATABASE_URL" -c "CREATE EXTENSION IF NOT EXISTS pg_stat_statements" \
    -c "SELECT pg_stat_statements_reset()" >/dev/null
}
bench_pgss_report() {
  [ -n "${PGSS:-}" ] || return 0
  psql -q "$DATABASE_URL" -c "SELECT calls, round(total_exec_time) AS total_ms, round(mean_exec_time::numeric, 3) AS mean_ms,
    round(total_plan_time) AS plan_ms, rows, left(regexp_replace(query, '\s+', ' ', 'g'), 100) AS query
    FROM pg_stat_statements ORDER BY total_exec_time + total_plan_time DESC LIMIT ${PGSS_TOP:-12}"
}

# The scenario as users build it, through the API on 127.0.0.1:PORT (APP_KEY and SDK_KEY exported, $bin set): the
# activity type com.example.delivery, N people imported with an iPhone each (a push-to-start token), a start of
# instance bench-<i> for person p<i> (32 connections), and its activity token registered by the SDK key. Exits if any
# request is not answered 200. Usage: bench_scenario_through_api N WORKDIR PORT
bench_scenario_through_api() {
  local instances=$1 work=$2 port=$3 imported step ok
  echo "setup through the API: $instances people, starts and activity tokens" >&2
  curl -sf -X PUT "http://127.0.0.1:$port/v1/activity_types/com.example.delivery" -H "Authorization: Bearer $APP_KEY" \
    -H "Content-Type: application/json" -d '{"attributes_type":"DeliveryAttributes"}' >/dev/null \
    || { echo "PUT /v1/activity_types failed" >&2; exit 1; }
  python3 - "$instances" "$work" <<'PY'
import hashlib, json, sys
n, work = int(sys.argv[1]), sys.argv[2]
md5 = lambda i: hashlib.md5(str(i).encode()).hexdigest()
with open(f"{work}/people.ndjson", "w") as people, open(f"{work}/starts.txt", "w") as starts, \
     open(f"{work}/tokens.txt", "w") as tokens:
    for i in range(n):
        device = f"{i:08x}" * 8
        people.write(json.dumps({"id": f"p{i}", "devices": [
            {"token": device, "platform": "ios", "push_to_start": {"com.example.delivery": md5(-i) + md5(-i - 1)}}]}) + "\n")
        starts.write("POST /v1/live_notifications/start APP_KEY " + json.dumps({
            "identifiers": {"id": f"p{i}"}, "notification_type": "com.example.delivery", "instance_id": f"bench-{i}",
            "attributes": {"order": str(i)}, "content_state": {"status": "new"},
            "push_payload": {"alert": {"title": "Order", "body": "Started"}}}, separators=(",", ":")) + "\n")
        tokens.write(f"PUT /v1/live_notifications/bench-{i}/tokens/{device} SDK_KEY "
                     + json.dumps({"token": md5(i) + md5(i + 1)}) + "\n")
PY
  imported=$(curl -sf -X POST "http://127.0.0.1:$port/v1/people/import" -H "Authorization: Bearer $APP_KEY" \
    -H "Content-Type: application/x-ndjson" --data-binary "@$work/people.ndjson")
  echo "import: $imported" >&2
  for step in starts tokens; do
    "$bin/marquee-bench" requests --port "$port" --connections 32 --timeout 60 --input "$work/$step.txt" \
      --output "$work/$step.tsv" >"$work/$step.json"
    ok=$(awk -F'\t' '$2 == 200' "$work/$step.tsv" | wc -l)
    echo "$step: $ok of $instances answered 200 ($(cat "$work/$step.json"))" >&2
    [ "$ok" = "$instances" ] || { echo "setup failed: see $work/$step.tsv" >&2; exit 1; }
  done
}

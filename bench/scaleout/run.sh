#!/usr/bin/env bash
# scaleout: the fan-out bench with 1, 2 and 4 worker processes, and the api-update bench with 1 and 2 API
# processes, against one PostgreSQL (fsync on), one after the other in one run, so their ratios compare.
# Prints one summary line per run; full output in bench/out/scaleout-*.txt.
#   WORKER_COUNTS (default "1 2 4"), API_COUNTS (default "1 2"), INSTANCES (fan-out, default 100000)
source "$(dirname "$0")/../lib.sh"
bench_build
machine
for w in ${WORKER_COUNTS:-1 2 4}; do
  WORKERS=$w "$root/bench/fanout/run.sh" >"$out/scaleout-fanout-$w.txt" 2>&1 || true
  echo "fanout, $w worker(s): $(grep -E '^marquee: ' "$out/scaleout-fanout-$w.txt" || echo failed)"
  grep -E "^worker [0-9]+ RSS" "$out/scaleout-fanout-$w.txt" | head -4
done
for a in ${API_COUNTS:-1 2}; do
  APIS=$a "$root/bench/api-update/run.sh" >"$out/scaleout-api-$a.txt" 2>&1 || true
  if [ "$a" = 1 ]; then
    echo "api-update, 1 API: $(grep -E 'Requests/sec' "$out/scaleout-api-$a.txt") $(grep -E '^p50' "$out/scaleout-api-$a.txt")"
  else
    echo "api-update, $a APIs: $(grep -E '^sum:' "$out/scaleout-api-$a.txt") $(grep -E '^p50' "$out/scaleout-api-$a.txt" | tr '\n' ' ')"
  fi
  grep -E "^deliveries committed" "$out/scaleout-api-$a.txt" | sed 's/^/  /'
  grep -E "^tps" "$out/scaleout-api-$a.txt" | sed 's/^/  pgbench (same run): /'
done

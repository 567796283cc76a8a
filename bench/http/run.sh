#!/usr/bin/env bash
# http: wrk -c64 -d10s against /healthz of `marquee serve` (release build, access log on, written to a file).
source "$(dirname "$0")/../lib.sh"
MARQUEE_EXTRA_PACKAGES="wrk" "$root/Deploy/local/deps.sh"
bench_build
bench_pg
port=${PORT:-18080}
export MARQUEE_LISTEN=127.0.0.1:$port
MARQUEE_MASTER_KEY=$(head -c 32 /dev/urandom | base64)
export MARQUEE_MASTER_KEY
export MARQUEE_MIGRATIONS_DIR="$root/Migrations"
"$bin/marquee" migrate >/dev/null 2>&1
trap 'kill -TERM ${pid:-0} 2>/dev/null || true; wait ${pid:-0} 2>/dev/null || true; bench_pg_stop' EXIT
machine
for level in info warning; do
  MARQUEE_LOG_LEVEL=$level DATABASE_URL=$APP_DATABASE_URL "$bin/marquee" serve >"$out/http-serve.log" 2>&1 &
  pid=$!
  for _ in $(seq 1 100); do curl -sf "http://$MARQUEE_LISTEN/healthz" >/dev/null && break; sleep 0.1; done
  echo "== MARQUEE_LOG_LEVEL=$level (access log $([ $level = info ] && echo on || echo off)): wrk -t2 -c64 -d10s /healthz"
  wrk -t2 -c64 -d10s --latency "http://$MARQUEE_LISTEN/healthz"
  echo "server RSS after run: $(ps -o rss= -p $pid) KiB"
  kill -TERM $pid
  wait $pid || true
done

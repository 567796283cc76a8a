#!/usr/bin/env bash
# `make test`: a throwaway PostgreSQL cluster, `swift test` against it, and the cluster stopped even on failure.
set -euo pipefail
cd "$(dirname "$0")/../.."

Deploy/local/deps.sh

work=$(mktemp -d /tmp/marquee-test.XXXXXX)
chmod 755 "$work"
cleanup() {
  # Processes the tests started against this cluster (fixtures shared by a whole suite live until the test
  # process exits, and a crashed test process cannot stop them): stop them before the cluster.
  if [ -n "${DATABASE_URL:-}" ]; then
    # Any role (serve and worker connect as marquee_app), this cluster's host and port.
    hostport="${DATABASE_URL#*@}"
    hostport="${hostport%%/*}"
    for pid in $(pgrep -f 'marquee (serve|worker|simulate)' || true); do
      if { tr '\0' '\n' <"/proc/$pid/environ"; } 2>/dev/null | grep -q "^DATABASE_URL=postgresql://[^@]*@$hostport/"; then
        kill "$pid" 2>/dev/null || true
      fi
    done
  fi
  # The console tests' chromedriver groups and browsers, if a test process died before stopping them: the drivers
  # this run started (TMPDIR in their environment) with their process groups, and browsers with a profile here.
  for pid in $(pgrep -x chromedriver || true); do
    if { tr '\0' '\n' <"/proc/$pid/environ"; } 2>/dev/null | grep -qx "TMPDIR=$work/tmp"; then
      kill -9 -- "-$pid" 2>/dev/null || kill -9 "$pid" 2>/dev/null || true
    fi
  done
  for pid in $(pgrep -f -- "--user-data-dir=$work/tmp/chromium-" || true); do
    kill -9 "$pid" 2>/dev/null || true
  done
  Deploy/local/pg.sh stop "$work/pg" || true
  rm -rf "$work"
}
trap cleanup EXIT

# Durability is not under test here: skip fsync so the suite runs fast. Benchmarks use fsync on.
DATABASE_URL=$(PG_OPTIONS="-c fsync=off -c synchronous_commit=off -c full_page_writes=off" \
  Deploy/local/pg.sh start "$work/pg")
export DATABASE_URL
export MARQUEE_TEST_PGDATA="$work/pg"
echo "test: PostgreSQL at $DATABASE_URL" >&2

# Temporary files of the tests (simulator CAs, records) live in the run's directory and go with it.
mkdir -p "$work/tmp"
export TMPDIR="$work/tmp"

swift build --build-tests "$@"
MARQUEE_BIN="$(swift build --show-bin-path)/marquee"
export MARQUEE_BIN
# A hung test must not hold CI until its own deadline: the run is stopped after MARQUEE_TEST_TIMEOUT seconds (default
# 20 minutes; a whole run takes under 2) and the tests that started but never finished are named.
set +e
timeout --kill-after=10 "${MARQUEE_TEST_TIMEOUT:-1200}" swift test --skip-build "$@" 2>&1 | tee "$work/test.log"
status=${PIPESTATUS[0]}
set -e
if [ "$status" = 124 ] || [ "$status" = 137 ]; then
  echo "test: stopped after ${MARQUEE_TEST_TIMEOUT:-1200} s; started and never finished:" >&2
  comm -23 <(sed -n 's/^◇ Test \("[^"]*"\) started.*/\1/p' "$work/test.log" | sort -u) \
    <(sed -n 's/^[✔✘] Test \("[^"]*"\).*/\1/p' "$work/test.log" | sort -u) >&2
fi
if [ "$status" != 0 ] && [ -f "$work/pg/server.log" ]; then
  # What the cluster said about failing connections (too many clients, a crashed backend, a restart), if anything.
  echo "test: PostgreSQL's log, its FATAL, PANIC and LOG lines about connections and restarts (counted):" >&2
  grep -E "FATAL|PANIC|terminated by signal|all server processes terminated|database system is (ready|shut down)" \
    "$work/pg/server.log" | sed -E 's/^[0-9-]+ [0-9:.]+ [A-Z]+ \[[0-9]+\] //' | sort | uniq -c | sort -rn | head -20 >&2 \
    || true
fi
if [ "$status" != 0 ]; then
  # What the processes the tests spawned (serve, worker, simulators) logged at warning and above: a 503 from a test's
  # server names its cause there (a pool timeout, a lost connection), and the run's directory goes with the cleanup.
  echo "test: warnings and errors the spawned processes logged (counted by message):" >&2
  cat "$work"/tmp/marquee-*.log 2>/dev/null | grep -E '"level":"(warning|error|critical)"' \
    | sed -E 's/^\{"ts":"[^"]*",//; s/"request\.id":"[^"]*",?//g' | sort | uniq -c | sort -rn | head -30 >&2 || true
fi
exit "$status"

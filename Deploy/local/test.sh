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

swift build --build-tests "$@"
MARQUEE_BIN="$(swift build --show-bin-path)/marquee"
export MARQUEE_BIN
swift test --skip-build "$@"

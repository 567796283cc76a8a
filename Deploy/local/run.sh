#!/usr/bin/env bash
# `make run`: builds in release mode and runs Marquee locally with a private PostgreSQL under .data/.
# Ctrl-C stops Marquee (gracefully) and then the cluster.
set -euo pipefail
cd "$(dirname "$0")/../.."

Deploy/local/deps.sh
swift build -c release
bin="$(swift build -c release --show-bin-path)/marquee"

mkdir -p .data
chmod 755 .data
DATABASE_URL=$(Deploy/local/pg.sh start .data/pg)
export DATABASE_URL
cleanup() { Deploy/local/pg.sh stop .data/pg; }
trap cleanup EXIT

# Secrets for this checkout, generated once and kept in .data/.
umask 077
[ -s .data/master.key ] || head -c 32 /dev/urandom | base64 >.data/master.key
[ -s .data/admin.token ] || head -c 24 /dev/urandom | base64 | tr -d '/+=' >.data/admin.token
umask 022
MARQUEE_MASTER_KEY=$(cat .data/master.key)
MARQUEE_ADMIN_TOKEN=$(cat .data/admin.token)
export MARQUEE_MASTER_KEY MARQUEE_ADMIN_TOKEN
export MARQUEE_LISTEN=${MARQUEE_LISTEN:-127.0.0.1:8080}

"$bin" migrate

api="http://${MARQUEE_LISTEN}"
cat <<INFO

  Marquee is starting on $api  (database: $DATABASE_URL)
  Admin token: $MARQUEE_ADMIN_TOKEN   (kept in .data/admin.token)

  Try:
    curl -s $api/readyz
    curl -s $api/metrics | head

  Ctrl-C stops everything.

INFO

"$bin" serve &
pid=$!
trap 'kill -TERM $pid 2>/dev/null || true' INT TERM
# `wait` returns early when a trapped signal arrives; wait again for the drain to finish.
wait $pid || wait $pid || true

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

# A demo tenant, made once and kept in .data/ (its keys are shown only at creation).
if [ ! -s .data/demo-tenant.json ]; then
  "$bin" tenant create --name demo --json >.data/demo-tenant.json.tmp
  mv .data/demo-tenant.json.tmp .data/demo-tenant.json
fi
app_key=$(sed -n 's/.*"app":"\([^"]*\)".*/\1/p' .data/demo-tenant.json)
sdk_key=$(sed -n 's/.*"sdk":"\([^"]*\)".*/\1/p' .data/demo-tenant.json)

api="http://${MARQUEE_LISTEN}"
device=$(printf 'a1%.0s' $(seq 1 32))
p2s=$(printf 'b2%.0s' $(seq 1 32))
cat <<INFO

  Marquee is starting on $api  (database: $DATABASE_URL)

  Demo tenant (kept in .data/demo-tenant.json):
    app key  $app_key
    sdk key  $sdk_key
  Admin token: $MARQUEE_ADMIN_TOKEN   (kept in .data/admin.token)

  Try:
    curl -s $api/readyz
    curl -s -X PUT $api/v1/people/ann -H "Authorization: Bearer $sdk_key" \\
         -H 'Content-Type: application/json' -d '{"email":"ann@example.com"}'
    curl -s -X PUT $api/v1/people/ann/devices/$device -H "Authorization: Bearer $sdk_key" \\
         -H 'Content-Type: application/json' -d '{"platform":"ios","app_version":"1.0"}'
    curl -s -X PUT $api/v1/people/ann/devices/$device/push_to_start/com.example.delivery \\
         -H "Authorization: Bearer $sdk_key" -H 'Content-Type: application/json' \\
         -d '{"token":"$p2s","attributes_type":"DeliveryAttributes"}'
    curl -s $api/v1/people/ann -H "Authorization: Bearer $app_key"

  Ctrl-C stops everything.

INFO

"$bin" serve &
pid=$!
trap 'kill -TERM $pid 2>/dev/null || true' INT TERM
# `wait` returns early when a trapped signal arrives; wait again for the drain to finish.
wait $pid || wait $pid || true

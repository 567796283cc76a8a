#!/usr/bin/env bash
# `make run`: builds in release mode and runs Marquee locally: a private PostgreSQL under .data/, the APNs and FCM
# simulators, the API and a worker pool (`marquee up`). Prints a demo tenant's keys and a curl sequence to try.
# Ctrl-C stops everything (gracefully), then the cluster.
set -euo pipefail
cd "$(dirname "$0")/../.."

Deploy/local/deps.sh
swift build -c release --product marquee
bin="$(swift build -c release --show-bin-path)/marquee"

mkdir -p .data
chmod 755 .data
# Least privilege as in production: the owner (the cluster's superuser here) migrates; the API and the workers log
# in as marquee_app, which `marquee migrate` creates (the local cluster trusts local connections: no password).
MARQUEE_MIGRATE_DATABASE_URL=$(Deploy/local/pg.sh start .data/pg)
DATABASE_URL=${MARQUEE_MIGRATE_DATABASE_URL/postgres@/marquee_app@}
export DATABASE_URL MARQUEE_MIGRATE_DATABASE_URL
cleanup() { Deploy/local/pg.sh stop .data/pg; }
trap cleanup EXIT

# Secrets for this checkout, generated once and kept in .data/.
umask 077
[ -s .data/master.key ] || head -c 32 /dev/urandom | base64 >.data/master.key
[ -s .data/admin.token ] || head -c 24 /dev/urandom | base64 | tr -d '/+=' >.data/admin.token
umask 022
# Demo provider keys: an APNs .p8 and an FCM service-account key, trusted by the local simulators.
Deploy/local/demo-keys.sh .data
json_pem() { awk 'BEGIN { ORS = "" } { gsub(/"/, "\\\""); print $0 "\\n" }' "$1"; }

MARQUEE_MASTER_KEY=$(cat .data/master.key)
MARQUEE_ADMIN_TOKEN=$(cat .data/admin.token)
export MARQUEE_MASTER_KEY MARQUEE_ADMIN_TOKEN
export MARQUEE_LISTEN=${MARQUEE_LISTEN:-127.0.0.1:8080}
export MARQUEE_DATA_DIR=.data

"$bin" migrate

# A demo tenant, made once and kept in .data/ (its keys are shown only at creation).
if [ ! -s .data/demo-tenant.json ]; then
  "$bin" tenant create --name demo --json >.data/demo-tenant.json.tmp
  mv .data/demo-tenant.json.tmp .data/demo-tenant.json
fi
app_key=$(sed -n 's/.*"app":"\([^"]*\)".*/\1/p' .data/demo-tenant.json)
sdk_key=$(sed -n 's/.*"sdk":"\([^"]*\)".*/\1/p' .data/demo-tenant.json)

"$bin" up &
up=$!
trap 'kill -TERM $up 2>/dev/null || true' INT TERM

api="http://${MARQUEE_LISTEN}"
for _ in $(seq 1 100); do curl -sf "$api/readyz" >/dev/null 2>&1 && break; sleep 0.2; done

# The demo tenant's credentials point at the simulators (re-sent on every start: the PUTs are idempotent).
curl -sf -o /dev/null -X PUT "$api/v1/credentials/apns" -H "Authorization: Bearer $app_key" \
  -H 'Content-Type: application/json' \
  -d "{\"team_id\":\"DEMOTEAM01\",\"key_id\":\"DEMOKEY001\",\"bundle_id\":\"com.example.demo\",\"environment\":\"sandbox\",\"endpoint\":\"https://127.0.0.1:2197\",\"private_key\":\"$(json_pem .data/demo-apns.p8)\"}" \
  || echo "warning: could not upload the demo APNs credentials" >&2
curl -sf -o /dev/null -X PUT "$api/v1/credentials/fcm" -H "Authorization: Bearer $app_key" \
  -H 'Content-Type: application/json' \
  -d "{\"endpoint\":\"https://127.0.0.1:2198\",\"service_account\":{\"type\":\"service_account\",\"project_id\":\"demo-project\",\"private_key_id\":\"demo\",\"client_email\":\"marquee-demo@demo-project.iam.gserviceaccount.com\",\"token_uri\":\"https://127.0.0.1:2198/token\",\"private_key\":\"$(json_pem .data/demo-fcm.pem)\"}}" \
  || echo "warning: could not upload the demo FCM credentials" >&2
curl -sf -o /dev/null -X PUT "$api/v1/activity_types/com.example.delivery" -H "Authorization: Bearer $app_key" \
  -H 'Content-Type: application/json' -d '{"attributes_type":"DeliveryAttributes","payload_profile":"marquee"}' || true

iphone=$(printf 'a1%.0s' $(seq 1 32))
p2s=$(printf 'b2%.0s' $(seq 1 32))
activity=$(printf 'c3%.0s' $(seq 1 32))
pixel="demo-fcm-token:APA91b-pixel"
j='Content-Type: application/json'
cat <<INFO

  Marquee is running on $api  (database: $DATABASE_URL)
  Simulators: APNs https://127.0.0.1:2197, FCM https://127.0.0.1:2198 (pushes in .data/apns-pushes.jsonl
  and .data/fcm-messages.jsonl). Workers' metrics on 127.0.0.1:9464 and up.

  Demo tenant (kept in .data/demo-tenant.json):
    app key  $app_key
    sdk key  $sdk_key
  Admin token: $MARQUEE_ADMIN_TOKEN   (kept in .data/admin.token)

  Operator console for the demo tenant (one click on Sign in; the key in the fragment never reaches the server;
  the page removes it from the address bar and keeps it in this tab only):
    $api/console#key=$app_key

  Try (the device SDK registers, your server starts, updates and ends):
    curl -s $api/readyz
    curl -s -X PUT $api/v1/people/ann/devices/$iphone -H "Authorization: Bearer $sdk_key" -H '$j' -d '{"platform":"ios"}'
    curl -s -X PUT $api/v1/people/ann/devices/$iphone/push_to_start/com.example.delivery -H "Authorization: Bearer $sdk_key" -H '$j' -d '{"token":"$p2s"}'
    curl -s -X PUT $api/v1/people/ann/devices/$pixel -H "Authorization: Bearer $sdk_key" -H '$j' -d '{"platform":"android"}'
    curl -s -X POST $api/v1/live_notifications/start -H "Authorization: Bearer $app_key" -H '$j' -d '{"identifiers":{"id":"ann"},"notification_type":"com.example.delivery","instance_id":"order-42","attributes":{"order":"42"},"content_state":{"status":"preparing","eta_minutes":25},"push_payload":{"alert":{"title":"Order 42","body":"Preparing your order"}}}'
    curl -s -X PUT $api/v1/live_notifications/order-42/tokens/$iphone -H "Authorization: Bearer $sdk_key" -H '$j' -d '{"token":"$activity"}'
    curl -s -X POST $api/v1/live_notifications/update -H "Authorization: Bearer $app_key" -H '$j' -d '{"instance_id":"order-42","content_state_patch":{"status":"on_the_way","eta_minutes":10}}'
    curl -s -X POST $api/v1/live_notifications/end -H "Authorization: Bearer $app_key" -H '$j' -d '{"instance_id":"order-42","content_state_patch":{"status":"delivered"},"dismissal_policy":"default"}'
    curl -s $api/v1/live_notifications/order-42/deliveries -H "Authorization: Bearer $app_key"
    tail -n 3 .data/apns-pushes.jsonl .data/fcm-messages.jsonl

  Ctrl-C stops everything.

INFO

# `wait` returns early when a trapped signal arrives; wait again for the drain to finish.
wait $up || wait $up || true

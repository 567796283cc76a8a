#!/usr/bin/env bash
# The compose demo (Deploy/docker/compose.yaml, profile `demo`), run from the repository root on the host:
#   Deploy/docker/demo-keys.sh            demo provider keys in Deploy/docker/demo/ (before the first `up`)
#   Deploy/docker/demo-keys.sh --tenant   once `serve` answers on localhost:8080: a demo tenant whose APNs and FCM
#                                         credentials point at the simulators; prints its keys
set -euo pipefail
cd "$(dirname "$0")/../.."
demo=Deploy/docker/demo
Deploy/local/demo-keys.sh "$demo"
chmod 644 "$demo"/*  # read by the containers' non-root user
[ "${1:-}" = "--tenant" ] || exit 0

api=${MARQUEE_API:-http://localhost:8080}
admin=$(sed -n 's/^MARQUEE_ADMIN_TOKEN=//p' Deploy/docker/marquee.env)
json_pem() { awk 'BEGIN { ORS = "" } { gsub(/"/, "\\\""); print $0 "\\n" }' "$1"; }
tenant=$(curl -sf -X POST "$api/admin/v1/tenants" -H "Authorization: Bearer $admin" -H 'Content-Type: application/json' \
  -d '{"name":"demo"}')
app_key=$(sed -n 's/.*"app":"\([^"]*\)".*/\1/p' <<<"$tenant")
sdk_key=$(sed -n 's/.*"sdk":"\([^"]*\)".*/\1/p' <<<"$tenant")
curl -sf -o /dev/null -X PUT "$api/v1/credentials/apns" -H "Authorization: Bearer $app_key" -H 'Content-Type: application/json' \
  -d "{\"team_id\":\"DEMOTEAM01\",\"key_id\":\"DEMOKEY001\",\"bundle_id\":\"com.example.demo\",\"environment\":\"sandbox\",\"endpoint\":\"https://172.30.0.20:2197\",\"private_key\":\"$(json_pem "$demo/demo-apns.p8")\"}"
curl -sf -o /dev/null -X PUT "$api/v1/credentials/fcm" -H "Authorization: Bearer $app_key" -H 'Content-Type: application/json' \
  -d "{\"endpoint\":\"https://172.30.0.20:2198\",\"service_account\":{\"type\":\"service_account\",\"project_id\":\"demo-project\",\"private_key_id\":\"demo\",\"client_email\":\"marquee-demo@demo-project.iam.gserviceaccount.com\",\"token_uri\":\"https://172.30.0.20:2198/token\",\"private_key\":\"$(json_pem "$demo/demo-fcm.pem")\"}}"
echo "demo tenant: app key $app_key  sdk key $sdk_key"

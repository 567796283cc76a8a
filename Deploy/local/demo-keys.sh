#!/usr/bin/env bash
# Demo provider keys for the local simulators, made once in DIR (default .data): an APNs .p8 (demo-apns.p8) and an
# FCM service-account key (demo-fcm.pem), and the key files the simulators trust (apns-keys.json, fcm-keys.json).
# Used by `make run` and by the compose demo (Deploy/docker/demo-keys.sh).
set -euo pipefail
dir=${1:-.data}
mkdir -p "$dir"
umask 077
[ -s "$dir/demo-apns.p8" ] || openssl ecparam -name prime256v1 -genkey -noout 2>/dev/null | openssl pkcs8 -topk8 -nocrypt >"$dir/demo-apns.p8"
[ -s "$dir/demo-fcm.pem" ] || openssl genpkey -algorithm RSA -pkeyopt rsa_keygen_bits:2048 -out "$dir/demo-fcm.pem" 2>/dev/null
umask 022
json_pem() { awk 'BEGIN { ORS = "" } { gsub(/"/, "\\\""); print $0 "\\n" }' "$1"; }
cat >"$dir/apns-keys.json" <<JSON
{"DEMOKEY001": {"team_id": "DEMOTEAM01", "public_key": "$(openssl pkey -in "$dir/demo-apns.p8" -pubout | json_pem /dev/stdin)"}}
JSON
cat >"$dir/fcm-keys.json" <<JSON
{"marquee-demo@demo-project.iam.gserviceaccount.com": {"project_id": "demo-project", "public_key": "$(openssl pkey -in "$dir/demo-fcm.pem" -pubout | json_pem /dev/stdin)"}}
JSON

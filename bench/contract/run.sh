#!/usr/bin/env bash
# contract: schemathesis (PyPI) generates requests from openapi.yaml against a real `marquee serve` and checks that
# no answer is a 5xx and that every answer's status, content type and body conform to the contract. Four passes:
# app key on everything but PATCH /v1/settings, the sdk key on the device routes, the app key on PATCH /v1/settings
# (which may lower the tenant's request rates), the admin token on /admin. Not part of `make test`
# (it needs PyPI); run it after changing the API or openapi.yaml.
source "$(dirname "$0")/../lib.sh"
"$root/Deploy/local/deps.sh"
bench_build
bench_pg
if [ ! -x "$out/st-venv/bin/schemathesis" ]; then
  python3 -m venv "$out/st-venv"
  "$out/st-venv/bin/pip" install -q schemathesis
fi
port=${PORT:-18096}
export MARQUEE_LISTEN=127.0.0.1:$port MARQUEE_ADMIN_TOKEN=contract-admin-token-0123456789 MARQUEE_LOG_LEVEL=warning
MARQUEE_MASTER_KEY=$(head -c 32 /dev/urandom | base64)
export MARQUEE_MASTER_KEY MARQUEE_MIGRATIONS_DIR="$root/Migrations"
"$bin/marquee" migrate >/dev/null 2>&1
created=$("$bin/marquee" tenant create --name contract --json)
app=$(echo "$created" | sed -n 's/.*"app":"\([^"]*\)".*/\1/p')
sdk=$(echo "$created" | sed -n 's/.*"sdk":"\([^"]*\)".*/\1/p')
DATABASE_URL=$APP_DATABASE_URL "$bin/marquee" serve >"$out/contract-serve.log" 2>&1 &
pid=$!
trap 'kill -TERM $pid 2>/dev/null || true; wait $pid 2>/dev/null || true; bench_pg_stop' EXIT
for _ in $(seq 1 100); do curl -sf "http://$MARQUEE_LISTEN/healthz" >/dev/null && break; sleep 0.1; done

checks=not_a_server_error,response_schema_conformance,status_code_conformance,content_type_conformance
# Hooks: a serializer for the NDJSON import body.
export SCHEMATHESIS_HOOKS=hooks PYTHONPATH="$root/bench/contract${PYTHONPATH:+:$PYTHONPATH}"
st() { "$out/st-venv/bin/schemathesis" run "$root/openapi.yaml" --url "http://$MARQUEE_LISTEN" -c "$checks" \
  --phases=examples,fuzzing -n "${EXAMPLES:-25}" "$@"; }
status=0
# PATCH /v1/settings runs after the other passes with the tenant's keys: it may set the tenant's request rates as low
# as 1 a second (with a burst of 10), after which nearly every answer to those keys would be 429 rate-limited. The
# admin pass takes no tenant key (and may rotate the tenant's keys), so it comes last.
st -H "Authorization: Bearer $app" --exclude-operation-id patchSettings || status=1
st -H "Authorization: Bearer $sdk" \
  --include-path-regex '^/v1/(b|batch|track|identify|people|live_notifications/.*/(tokens|events)|deliveries)' || status=1
st -H "Authorization: Bearer $app" --include-operation-id patchSettings || status=1
st -H "Authorization: Bearer $MARQUEE_ADMIN_TOKEN" --include-path-regex '^/admin' || status=1
echo "5xx answers in the server log: $(grep -c '"http.status":5' "$out/contract-serve.log" || true)"
exit $status

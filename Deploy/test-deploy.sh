#!/usr/bin/env bash
# `make test-deploy`: checks what Deploy/ ships, with the real tools (CI runs it after `make test`).
#   1. the Docker runtime stage installs exactly the runtime halves of deps.sh's C libraries; the build stage's copy of
#      the repository loads as a package; compose.yaml's named volumes are mounted on folders the image's user owns;
#   2. kustomize renders the base and the production overlay, with every object the README promises; every stop
#      window (Compose, Kubernetes, systemd) outlasts the drain timeout and the watchdog after it; each Secret reaches
#      only the containers that need it;
#   3. systemd-analyze verifies the units (with ExecStart pointed at the built binary); the migration is a unit of its
#      own, with no start timeout and the only one to read the owner's login;
#   4. promtool checks the scrape config and the alert rules, and runs the alerts' unit tests;
#   5. a real scrape: Debian's prometheus, with the shipped scrape config, scrapes a running `serve` and `worker`;
#      the key series exist with their documented labels, and every dashboard and alert query parses;
#   6. Deploy/local/pg.sh, as root, says so when the postgres user cannot reach the cluster's folder.
set -euo pipefail
cd "$(dirname "$0")/.."
# promtool and prometheus come with Debian's prometheus package; python3-yaml reads the rendered manifests.
MARQUEE_EXTRA_PACKAGES="prometheus kubectl python3-yaml" Deploy/local/deps.sh

failures=0
fail() { echo "test-deploy: FAIL: $*" >&2; failures=$((failures + 1)); }
pass() { echo "test-deploy: ok: $*" >&2; }

# 1. Runtime packages: every library in the Dockerfile's runtime stage is a dependency of one of deps.sh's -dev
#    packages, and each of those -dev packages has its runtime library there.
runtime=$(sed -n '/^FROM debian:bookworm-slim/,$p' Deploy/docker/Dockerfile | tr -s ' \\\n' '\n' \
  | grep -E '^(lib[a-z0-9.+-]+|ca-certificates)$' | sort -u)
dev=$(sed -n 's/^packages=(\(.*\))$/\1/p' Deploy/local/deps.sh | tr ' ' '\n' | grep -E '^lib.*-dev$' | sort -u)
for d in $dev; do
  depends=$(dpkg-query -W -f='${Depends}' "$d" | tr ',' '\n' | sed 's/^ *//; s/[ (].*//')
  hit=$(comm -12 <(sort -u <<<"$depends") <(sort -u <<<"$runtime") | head -1)
  [ -n "$hit" ] && pass "runtime image has $hit for $d" || fail "Dockerfile runtime stage lacks the library of $d ($depends)"
done
for r in $runtime; do
  [ "$r" = ca-certificates ] && continue
  owner=""
  for d in $dev; do dpkg-query -W -f='${Depends}' "$d" | tr ',' '\n' | sed 's/^ *//; s/[ (].*//' | grep -qx "$r" && owner=$d; done
  [ -n "$owner" ] || fail "Dockerfile runtime package $r is not the runtime half of any -dev package in deps.sh"
done

# 1b. The build stage's copy of the repository: SwiftPM loads every target's folder the manifest declares, even to build
#     one product, so the manifest must load from exactly what the build stage copies into its WORKDIR. No copied
#     path may be one .dockerignore keeps out of the build context.
context=$(mktemp -d /tmp/marquee-docker-context.XXXXXX)
copies=$(sed -n '/^FROM .* AS build$/,/^FROM /p' Deploy/docker/Dockerfile | sed -n 's/^COPY \([^-][^ ]*\) \([^ ]*\)$/\1 \2/p')
while read -r src dest; do
  case $dest in /*) continue ;; esac  # into the runtime image's tree (/out), not the package
  if [ -d "$src" ]; then
    mkdir -p "$context/$dest" && cp -a "$src/." "$context/$dest/"
  elif [[ $dest == */ ]]; then
    mkdir -p "$context/$dest" && cp -a "$src" "$context/$dest"
  else
    mkdir -p "$(dirname "$context/$dest")" && cp -a "$src" "$context/$dest"
  fi
done <<<"$copies"
if out=$(cd "$context" && swift package describe 2>&1 >/dev/null); then
  pass "the Dockerfile's build stage copies a package that loads"
else
  fail "the package does not load from what the Dockerfile's build stage copies: $out"
fi
rm -rf "$context"
if [ -f .dockerignore ]; then
  for src in $(sed -n 's/^COPY \([^-][^ ]*\) [^ ]*$/\1/p' Deploy/docker/Dockerfile); do
    while IFS= read -r pattern; do
      case $pattern in '' | '#'*) continue ;; esac
      pattern=${pattern#/}
      case $src/ in "$pattern"/*) fail ".dockerignore keeps $src (copied by the Dockerfile) out of the build context" ;; esac
    done <.dockerignore
  done
fi

# 1c. compose.yaml's named volumes on Marquee's image (non-root, uid 10001) are mounted on folders the runtime stage
#     makes and gives to that user: Docker gives a new named volume its mount point's owner in the image, root when
#     the image has no such folder, and the user could not write to it.
owned=$(sed -n '/^FROM debian:bookworm-slim/,$p' Deploy/docker/Dockerfile | tr -s ' \\\n' ' ' \
  | { grep -oE 'install -d -o 10001 -g 10001( /[^ ]+)+' || true; } | { grep -oE '( /[^ ]+)+' || true; } | tr ' ' '\n' \
  | sed '/^$/d')
mounts=$(python3 - Deploy/docker/compose.yaml <<'PY'
import sys, yaml
compose = yaml.safe_load(open(sys.argv[1]))
for name, service in compose["services"].items():
    if not str(service.get("image", "")).startswith("marquee"):
        continue
    for volume in service.get("volumes", []):
        source, target = volume.split(":")[:2]
        if source in compose.get("volumes", {}):
            print(name, target)
PY
)
[ -n "$mounts" ] || fail "compose.yaml mounts no named volume on Marquee's image (this check reads none)"
while read -r service target; do
  [ -n "$service" ] || continue
  if grep -qx "$target" <<<"$owned"; then
    pass "compose.yaml $service: $target is the image user's"
  else
    fail "compose.yaml $service mounts a named volume on $target, which the Dockerfile's runtime stage does not make for uid 10001 (install -d -o 10001 -g 10001 $target)"
  fi
done <<<"$mounts"

# 2. Kubernetes.
secrets_check=$(mktemp /tmp/marquee-secrets-check.XXXXXX)
cat >"$secrets_check" <<'PY'
import re, sys, yaml
keys = {}
for line in open(sys.argv[1]):
    m = re.match(r"^#   ([a-z0-9-]+): ((?:[A-Z0-9_]+(?:, )?)+)", line)
    if m:
        keys[m.group(1)] = set(m.group(2).split(", "))
owner = {"MARQUEE_MIGRATE_DATABASE_URL", "MARQUEE_APP_PASSWORD"}
want = {  # (deployment component, init container?): keys it must get, keys it must not
    ("api", False): ({"DATABASE_URL", "MARQUEE_MASTER_KEY", "MARQUEE_ADMIN_TOKEN"}, owner),
    ("worker", False): ({"DATABASE_URL", "MARQUEE_MASTER_KEY"}, owner | {"MARQUEE_ADMIN_TOKEN"}),
    ("api", True): ({"MARQUEE_MIGRATE_DATABASE_URL"}, {"MARQUEE_ADMIN_TOKEN", "MARQUEE_MASTER_KEY"}),
    ("worker", True): ({"MARQUEE_MIGRATE_DATABASE_URL"}, {"MARQUEE_ADMIN_TOKEN", "MARQUEE_MASTER_KEY"}),
}
bad = 0
seen = set()
for doc in yaml.safe_load_all(sys.stdin):
    if not doc or doc.get("kind") != "Deployment":
        continue
    component = doc["metadata"]["labels"]["app.kubernetes.io/component"]
    spec = doc["spec"]["template"]["spec"]
    for init, containers in ((True, spec.get("initContainers", [])), (False, spec.get("containers", []))):
        for c in containers:
            got = set()
            for source in c.get("envFrom", []):
                if "secretRef" in source:
                    name = source["secretRef"]["name"]
                    if name not in keys:
                        print(f"{component}/{c['name']}: Secret {name} is not in kustomization.yaml's list"); bad += 1
                    got |= keys.get(name, set())
            for env in c.get("env", []):
                if "secretKeyRef" in env.get("valueFrom", {}):
                    got.add(env["name"])
            need, never = want[(component, init)]
            seen.add((component, init))
            if need - got:
                print(f"{component}/{c['name']}: lacks {sorted(need - got)}"); bad += 1
            if got & never:
                print(f"{component}/{c['name']}: gets {sorted(got & never)}"); bad += 1
if seen != set(want):
    print(f"containers checked: {sorted(seen)}"); bad += 1
sys.exit(1 if bad else 0)
PY
for k in Deploy/k8s/base Deploy/k8s/overlays/production; do
  if rendered=$(kubectl kustomize "$k" 2>&1); then
    kinds=$(sed -n 's/^kind: //p' <<<"$rendered" | sort | uniq -c | tr -s ' ' | tr '\n' ';')
    for want in "2 Deployment" "2 PodDisruptionBudget" "1 HorizontalPodAutoscaler" "1 ScaledObject" "2 Service" \
      "3 NetworkPolicy" "1 ConfigMap"; do
      grep -q " $want;" <<<"$kinds" || fail "$k renders without $want (has: $kinds)"
    done
    grep -q 'path: /readyz' <<<"$rendered" && grep -q 'path: /healthz' <<<"$rendered" \
      && grep -q 'preStop' <<<"$rendered" || fail "$k: API probes or preStop missing"
    # Secrets: what each container can read, from the Secrets' keys as kustomization.yaml lists them. The tables'
    # owner (the migrate URL, marquee_app's password) reaches the migrate init containers only, the admin token the
    # API only.
    if out=$(python3 "$secrets_check" Deploy/k8s/base/kustomization.yaml <<<"$rendered" 2>&1); then
      pass "$k: each Secret reaches only the containers that need it"
    else
      fail "$k: ${out//$'\n'/; }"
    fi
    pass "kubectl kustomize $k"
  else
    fail "kubectl kustomize $k: $rendered"
  fi
done
rm -f "$secrets_check"

# 2b. Stop windows. serve and worker drain for MARQUEE_DRAIN_TIMEOUT and force themselves out 5 s later; whatever
#     stops them must wait longer, or it kills them mid-drain (Docker's default is 10 s, Kubernetes' 30 s). The API
#     pod's preStop sleep comes first.
drain=$(sed -n 's/^ *MARQUEE_DRAIN_TIMEOUT: "\([0-9]*\)"$/\1/p' Deploy/k8s/base/config.yaml)
need=$((${drain:-30} + 5))
window() {  # what, seconds (may be empty), seconds needed
  if [ -n "$2" ] && [ "$2" -gt "$3" ]; then pass "$1: ${2}s"; else fail "$1: '${2:-unset}' must exceed ${3}s"; fi
}
for svc in serve worker; do
  grace=$(awk -v svc="$svc" '
    /^services:/ { in_services = 1; next }
    in_services && /^[^ #]/ { in_services = 0 }
    in_services && /^  [a-z]/ { current = $1; sub(":", "", current) }
    in_services && current == svc && /^    stop_grace_period:/ { print $2 }' Deploy/docker/compose.yaml)
  [[ "$grace" =~ ^[0-9]+s$ ]] || grace=""
  window "compose.yaml $svc stop_grace_period" "${grace%s}" "$need"
done
prestop=$(grep -A1 'preStop:' Deploy/k8s/base/api.yaml | sed -n 's/.*sleep", *"\([0-9]*\)".*/\1/p')
window "api.yaml terminationGracePeriodSeconds" \
  "$(sed -n 's/^ *terminationGracePeriodSeconds: \([0-9]*\)$/\1/p' Deploy/k8s/base/api.yaml)" $((need + ${prestop:-0}))
window "worker.yaml terminationGracePeriodSeconds" \
  "$(sed -n 's/^ *terminationGracePeriodSeconds: \([0-9]*\)$/\1/p' Deploy/k8s/base/worker.yaml)" "$need"
for u in marquee-api.service marquee-worker@.service; do
  window "$u TimeoutStopSec" "$(sed -n 's/^TimeoutStopSec=\([0-9]*\)$/\1/p' "Deploy/systemd/$u")" "$need"
done

# 3. systemd units, verified against the built binary.
swift build --product marquee >/dev/null
bin="$(swift build --show-bin-path)/marquee"
work=$(mktemp -d /tmp/marquee-deploy.XXXXXX)
chmod 755 "$work"
pids=()
cleanup() {
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
  wait 2>/dev/null || true
  Deploy/local/pg.sh stop "$work/pg" >/dev/null 2>&1 || true
  rm -rf "$work"
}
trap cleanup EXIT
if command -v systemd-analyze >/dev/null; then
  mkdir "$work/units"
  for u in Deploy/systemd/*.service; do sed "s#/usr/local/bin/marquee#$bin#g" "$u" >"$work/units/$(basename "$u")"; done
  cp "$work/units/marquee-worker@.service" "$work/units/marquee-worker@1.service"
  if out=$(cd "$work/units" && systemd-analyze verify marquee-migrate.service marquee-api.service marquee-worker@1.service 2>&1); then
    pass "systemd-analyze verify"
  else
    fail "systemd-analyze verify: $out"
  fi
else
  echo "test-deploy: systemd-analyze not available: units not verified" >&2
fi
# The migration runs in a unit of its own, which the API and the workers require and follow; it alone reads the
# owner's login (migrate.env), the API alone the admin token (api.env). It has no start timeout: the migrator's own
# lock waits (Migrator: 24 × 5 s, and pauses) and an index build outlast systemd's default 90 s, which would kill it.
units=Deploy/systemd
grep -qx 'TimeoutStartSec=infinity' "$units/marquee-migrate.service" && grep -qx 'Type=oneshot' "$units/marquee-migrate.service" \
  && pass "marquee-migrate.service: oneshot, no start timeout" || fail "marquee-migrate.service must be Type=oneshot with TimeoutStartSec=infinity"
for u in marquee-api.service marquee-worker@.service; do
  grep -qx 'Requires=marquee-migrate.service' "$units/$u" && grep -Eq '^After=.* marquee-migrate\.service( |$)' "$units/$u" \
    || fail "$u must require marquee-migrate.service and start after it"
  ! grep -Eq '^ExecStart[A-Za-z]*=.* migrate' "$units/$u" || fail "$u runs the migration itself (its environment would hold the owner's login)"
done
for u in "$units"/*.service; do
  files=$(sed -n 's/^EnvironmentFile=-\{0,1\}//p' "$u" | sort | tr '\n' ' ')
  files=${files% }
  case $(basename "$u") in
    marquee-migrate.service) want="/etc/marquee/migrate.env" ;;
    marquee-api.service) want="/etc/marquee/api.env /etc/marquee/marquee.env" ;;
    *) want="/etc/marquee/marquee.env" ;;
  esac
  [ "$files" = "$want" ] && pass "$(basename "$u") reads $files" || fail "$(basename "$u") reads '$files', not '$want'"
done

# 4. promtool.
promtool check config --syntax-only Deploy/prometheus/prometheus.yml >/dev/null && pass "promtool check config" \
  || fail "promtool check config"
promtool check rules Deploy/prometheus/alerts.yml >/dev/null && pass "promtool check rules" || fail "promtool check rules"
promtool test rules Deploy/prometheus/alerts_test.yml >/dev/null && pass "promtool test rules" || fail "promtool test rules"

# 5. A real scrape.
free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }
owner_url=$(PG_OPTIONS="-c fsync=off" Deploy/local/pg.sh start "$work/pg")
app_url=${owner_url/postgres@/marquee_app@}
api_port=$(free_port)
metrics_port=$(free_port)
prom_port=$(free_port)
export MARQUEE_MASTER_KEY
MARQUEE_MASTER_KEY=$(head -c 32 /dev/urandom | base64)
DATABASE_URL=$owner_url "$bin" migrate >"$work/migrate.log" 2>&1
sim_port=$(free_port)
Deploy/local/demo-keys.sh "$work/keys" >/dev/null
MARQUEE_SIM_LISTEN=127.0.0.1:$sim_port MARQUEE_SIM_CA_OUT="$work/sim-ca.pem" MARQUEE_SIM_KEYS="$work/keys/apns-keys.json" \
  "$bin" simulate apns >"$work/sim.log" 2>&1 &
pids+=($!)
export MARQUEE_PROVIDER_HOSTS="127.0.0.1:$sim_port" MARQUEE_ADMIN_TOKEN
MARQUEE_ADMIN_TOKEN=$(head -c 24 /dev/urandom | base64 | tr -d '/+=')
DATABASE_URL=$app_url MARQUEE_LISTEN=127.0.0.1:$api_port "$bin" serve >"$work/serve.log" 2>&1 &
pids+=($!)
deadline=$((SECONDS + 30))
until [ -s "$work/sim-ca.pem" ]; do
  [ $SECONDS -lt $deadline ] || { fail "the APNs simulator did not start"; exit 1; }
  sleep 0.1
done
DATABASE_URL=$app_url MARQUEE_METRICS_LISTEN=127.0.0.1:$metrics_port MARQUEE_CA_FILE="$work/sim-ca.pem" \
  "$bin" worker >"$work/worker.log" 2>&1 &
pids+=($!)
# The shipped config, its discovery swapped for these two processes and a 1 s interval.
sed -e "s#dns_sd_configs: \[{names: \[serve\].*#static_configs: [{targets: ['127.0.0.1:$api_port']}]#" \
  -e "s#dns_sd_configs: \[{names: \[worker\].*#static_configs: [{targets: ['127.0.0.1:$metrics_port']}]#" \
  -e 's#scrape_interval: 15s#scrape_interval: 1s#; s#evaluation_interval: 15s#evaluation_interval: 1s#' \
  Deploy/prometheus/prometheus.yml >"$work/prometheus.yml"
grep -q "127.0.0.1:$api_port" "$work/prometheus.yml" && grep -q "127.0.0.1:$metrics_port" "$work/prometheus.yml" \
  || fail "the shipped prometheus.yml no longer has the discovery lines this test replaces"
cp Deploy/prometheus/alerts.yml "$work/"
prometheus --config.file="$work/prometheus.yml" --storage.tsdb.path="$work/tsdb" \
  --web.listen-address="127.0.0.1:$prom_port" >"$work/prometheus.log" 2>&1 &
pids+=($!)

deadline=$((SECONDS + 60))
until curl -sf "http://127.0.0.1:$api_port/readyz" >/dev/null && curl -sf "http://127.0.0.1:$metrics_port/healthz" >/dev/null; do
  [ $SECONDS -lt $deadline ] || { fail "serve or worker did not start"; tail -5 "$work"/*.log >&2; exit 1; }
  sleep 0.2
done
# Some API traffic, so the request families have series (a 401 too), and one activity started on an iPhone
# through the simulator, so the delivery families have series.
api="http://127.0.0.1:$api_port"
curl -s -o /dev/null "$api/v1/live_notifications/x" -H 'Authorization: Bearer nope' || true
json_pem() { awk 'BEGIN { ORS = "" } { gsub(/"/, "\\\""); print $0 "\\n" }' "$1"; }
j='Content-Type: application/json'
call() {  # what, then curl arguments: fails the test with the answer's body unless it is 2xx
  local what=$1 out
  shift
  out=$(curl -s -w '\n%{http_code}' "$@") || true
  [[ "${out##*$'\n'}" == 2?? ]] || fail "$what: ${out//$'\n'/ }"
}
app_key=$(curl -sf -X POST "$api/admin/v1/tenants" -H "Authorization: Bearer $MARQUEE_ADMIN_TOKEN" -H "$j" \
  -d '{"name":"scrape"}' | sed -n 's/.*"app":"\([^"]*\)".*/\1/p')
call "APNs credential upload" -X PUT "$api/v1/credentials/apns" -H "Authorization: Bearer $app_key" -H "$j" -d "{\"team_id\":\"DEMOTEAM01\",\"key_id\":\"DEMOKEY001\",\"bundle_id\":\"com.example.demo\",\"environment\":\"sandbox\",\"endpoint\":\"https://127.0.0.1:$sim_port\",\"private_key\":\"$(json_pem "$work/keys/demo-apns.p8")\"}"
call "activity type" -X PUT "$api/v1/activity_types/com.example.delivery" -H "Authorization: Bearer $app_key" -H "$j" \
  -d '{"attributes_type":"DeliveryAttributes","payload_profile":"marquee"}'
iphone=$(printf 'a1%.0s' $(seq 1 32))
call "device" -X PUT "$api/v1/people/ann/devices/$iphone" -H "Authorization: Bearer $app_key" -H "$j" \
  -d '{"platform":"ios"}'
call "push-to-start" -X PUT "$api/v1/people/ann/devices/$iphone/push_to_start/com.example.delivery" \
  -H "Authorization: Bearer $app_key" -H "$j" -d "{\"token\":\"$(printf 'b2%.0s' $(seq 1 32))\"}"
call "start" -X POST "$api/v1/live_notifications/start" -H "Authorization: Bearer $app_key" -H "$j" \
  -d '{"identifiers":{"id":"ann"},"notification_type":"com.example.delivery","instance_id":"order-1","attributes":{"order":"1"},"content_state":{"status":"preparing"},"push_payload":{"alert":{"title":"Order","body":"Preparing"}}}'

prom="http://127.0.0.1:$prom_port"
query() { curl -sf --get "$prom/api/v1/query" --data-urlencode "query=$1"; }
results() { python3 -c 'import json,sys; d=json.load(sys.stdin); print(len(d["data"]["result"]))'; }
deadline=$((SECONDS + 90))
until [ "$(query 'sum(up{job=~"marquee-api|marquee-worker"})' 2>/dev/null | python3 -c 'import json,sys; r=json.load(sys.stdin)["data"]["result"]; print(r[0]["value"][1] if r else 0)' 2>/dev/null)" = 2 ] \
  && [ "$(query 'marquee_http_requests_total{status="401"}' 2>/dev/null | results 2>/dev/null)" -ge 1 ] 2>/dev/null \
  && [ "$(query 'marquee_deliveries_total{status="sent"}' 2>/dev/null | results 2>/dev/null)" -ge 1 ] 2>/dev/null; do
  [ $SECONDS -lt $deadline ] || { fail "Prometheus never scraped both processes with a sent delivery"; tail -5 "$work/prometheus.log" >&2; break; }
  sleep 0.5
done

# Key series, each with the labels the README documents.
cat >"$work/check.py" <<'PY'
import json, sys
expr, labels = sys.argv[1], sys.argv[2:]
result = json.load(sys.stdin)["data"]["result"]
if not result:
    print(f"test-deploy: FAIL: no series for {expr}", file=sys.stderr); sys.exit(1)
for series in result:
    missing = [l for l in labels if l not in series["metric"]]
    if missing:
        print(f"test-deploy: FAIL: {expr}: series {series['metric']} lacks {missing}", file=sys.stderr); sys.exit(1)
print(f"test-deploy: ok: {expr} ({len(result)} series)", file=sys.stderr)
PY
check_series() {  # a query, then the label names each of its series must carry
  local expr=$1
  shift
  local out
  if out=$(query "$expr"); then python3 "$work/check.py" "$expr" "$@" <<<"$out" || failures=$((failures + 1)); else fail "query $expr"; fi
}
check_series 'up{job="marquee-api"} == 1' instance
check_series 'up{job="marquee-worker"} == 1' instance
check_series 'marquee_http_requests_total' method route status job instance
check_series 'marquee_http_request_duration_seconds_bucket' method route status le
check_series 'marquee_http_rate_limited_total' kind job instance
check_series 'marquee_ready == 1' job
check_series 'marquee_queue_due' provider job instance
check_series 'marquee_queue_oldest_due_seconds' provider job instance
check_series 'marquee_queue_in_flight' provider job instance
check_series 'marquee_queue_sample_age_seconds' job instance
check_series 'marquee_delivery_latency_seconds_bucket{provider="apns"}' le job
check_series 'marquee_deliveries_claimed_total' lane job
check_series 'marquee_deliveries_total{provider="apns",operation="start",status="sent"}' job instance
check_series 'marquee_send_duration_seconds_bucket{provider="apns"}' le
check_series 'marquee_open_connections' provider
check_series 'marquee_inflight_streams' provider
check_series 'marquee_group_commit_batches_total' job
check_series 'marquee_group_commit_batch_size_bucket' le job
check_series 'marquee_db_pool_connections' state job instance
check_series 'marquee_db_pool_waiters' job
check_series 'marquee_credentials{status="ok"}' provider job instance
check_series 'marquee_retention_runs_total' outcome job
check_series 'process_cpu_seconds_total{job="marquee-worker"}' instance
check_series 'process_resident_memory_bytes{job="marquee-api"}' instance
check_series 'process_open_fds' job
check_series 'process_start_time_seconds' job

# Every dashboard and alert query parses in this Prometheus (an unknown metric is fine; a syntax error is not).
python3 - Deploy/grafana/marquee.json >"$work/queries" <<'PY'
import json, sys
def walk(panels):
    for p in panels:
        yield from walk(p.get("panels", []))
        for t in p.get("targets", []):
            if t.get("expr"): print(t["expr"].replace("$__rate_interval", "1m").replace("\n", " "))
list(walk(json.load(open(sys.argv[1]))["panels"]))
PY
sed -n 's/^ *expr: \(.*\)$/\1/p' Deploy/prometheus/alerts.yml | grep -v '^|$' >>"$work/queries"
count=0
while IFS= read -r q; do
  [ -n "$q" ] || continue
  count=$((count + 1))
  status=$(curl -s --get "$prom/api/v1/query" --data-urlencode "query=$q" | python3 -c 'import json,sys; d=json.load(sys.stdin); print(d["status"], d.get("error",""))')
  [ "${status%% *}" = success ] || fail "query does not parse: $q: $status"
done <"$work/queries"
[ "$count" -ge 25 ] && pass "$count dashboard and alert queries parse" || fail "only $count queries found"

# 6. As root, pg.sh runs the cluster as the postgres user, who must reach its folder: a checkout under /root (mode 0700)
#    cannot hold it. pg.sh says so (initdb's own complaint went to a log file and `make run` just stopped).
if [ "$(id -u)" = 0 ]; then
  mkdir -m 700 "$work/private"
  if out=$(Deploy/local/pg.sh start "$work/private/pg" 2>&1); then
    fail "pg.sh started a cluster the postgres user cannot reach"
    Deploy/local/pg.sh stop "$work/private/pg" >/dev/null 2>&1 || true
  elif grep -q "cannot reach" <<<"$out" && grep -q "$work/private" <<<"$out"; then
    pass "pg.sh: a folder the postgres user cannot reach is named"
  else
    fail "pg.sh, in a folder the postgres user cannot reach, did not say so: '$out'"
  fi
fi

if [ "$failures" -gt 0 ]; then
  echo "test-deploy: $failures failure(s)" >&2
  exit 1
fi
echo "test-deploy: all checks passed" >&2

#!/usr/bin/env bash
# transport: the APNs client alone (no database). One `marquee simulate apns` (release, 1 I/O thread, records in
# memory only), and side by side against it, each sending the same N valid live-activity pushes (same payload,
# same headers, device tokens cycling over TOKENS distinct ones) over C connections with K in flight:
#   1. marquee-bench transport: APNsProvider.send (pooled HTTP2Client, provider-token cache, decision per response)
#   2. h2load -c C -m K/C: the same POST with a fixed bearer JWT, the ceiling for this simulator on this machine
#   3. aioapns (PyPI, in a venv under bench/out/venv): APNs(key=…).send_notification, AIOAPNS_N pushes
# Each run's count of accepted pushes is checked against the simulator's /_sim/stats.
# Then, with NGHTTPD=1 (default), the same two HTTP/2 clients against a fast peer that is not ours: nghttpd (one
# thread, TLS, a self-signed certificate) answering 200 to every POST /3/device/<token> (an empty file per token in
# its document root), so the client's own ceiling shows without our simulator's cost. aioapns is compared against
# the simulator only: against nghttpd it gives up with MaxAttemptsExceeded (not investigated).
# Against nghttpd it also prints each client's CPU time per request (user + system, from the shell's `time`) and
# nghttpd's over the same request (from /proc/<pid>/stat): on a busy machine the rates move with the load, the CPU
# per request much less.
# Env: N (200000), CONNECTIONS (2), CONCURRENCY (CONNECTIONS*100), AIOAPNS_N (20000), TOKENS (10000), SIM_PORT,
#      NGHTTPD (1), NGHTTPD_PORT, MARQUEE_BIN (a prebuilt `marquee` whose directory also has `marquee-bench`, e.g.
#      another commit's build, instead of building this tree).
source "$(dirname "$0")/../lib.sh"
MARQUEE_EXTRA_PACKAGES="nghttp2-client nghttp2-server" "$root/Deploy/local/deps.sh"
if [ -n "${MARQUEE_BIN:-}" ]; then bin=$(dirname "$MARQUEE_BIN"); else bench_build; fi
n=${N:-200000}
c=${CONNECTIONS:-2}
k=${CONCURRENCY:-$((c * 100))}
an=${AIOAPNS_N:-20000}
tokens=${TOKENS:-10000}
port=${SIM_PORT:-12197}
work="$out/transport"
mkdir -p "$work"
kid=BENCHKEY01
team=BENCHTEAM1
topic=com.example.bench.push-type.liveactivity

if [ ! -x "$out/venv/bin/python" ] || ! "$out/venv/bin/python" -c "import aioapns" 2>/dev/null; then
  echo "setup: python venv with aioapns ${AIOAPNS_VERSION:-4.0} in $out/venv" >&2
  python3 -m venv "$out/venv"
  "$out/venv/bin/pip" install -q "aioapns==${AIOAPNS_VERSION:-4.0}" >&2
fi

"$bin/marquee-bench" keygen es256 "$work/key.p8" "$work/key.pub"
cat >"$work/keys.json" <<JSON
{"$kid": {"team_id": "$team", "public_key": $(json_file "$work/key.pub"), "bundle_ids": ["com.example.bench"]}}
JSON
# The shape Marquee composes for an update (aps event/timestamp/content-state, plus attribution).
cat >"$work/payload.json" <<'JSON'
{"aps":{"event":"update","timestamp":1764680000,"content-state":{"status":"out_for_delivery","eta_minutes":12,"driver":"Sam","stops_away":3},"stale-date":1764683600},"marquee":{"delivery_id":"01JDZ3Q6T8M4V9W2X5Y7Z0A1B2","delivery_token":"0123456789abcdef0123456789abcdef"}}
JSON
awk -v port="$port" -v n="$tokens" 'BEGIN { for (i = 0; i < n; i++) { t = sprintf("%08x", i);
  printf "https://127.0.0.1:%d/3/device/%s%s%s%s%s%s%s%s\n", port, t, t, t, t, t, t, t, t } }' >"$work/uris.txt"

rm -f "$work/ca.pem"
MARQUEE_SIM_LISTEN=127.0.0.1:$port MARQUEE_SIM_CA_OUT="$work/ca.pem" MARQUEE_SIM_KEYS="$work/keys.json" \
  MARQUEE_SIM_IO_THREADS=${SIM_IO_THREADS:-1} MARQUEE_LOG_LEVEL=warning "$bin/marquee" simulate apns 2>"$work/sim.log" &
sim=$!
trap 'kill -TERM $sim 2>/dev/null || true; wait $sim 2>/dev/null || true' EXIT
wait_sim "$port" "$work/ca.pem"

accepted() { sim_stats "$port" "$work/ca.pem" | sed -n 's/.*"accepted":\([0-9]*\).*/\1/p'; }
check() { # check NAME EXPECTED
  local got
  got=$(accepted)
  [ "$got" = "$2" ] || echo "WARNING: $1: the simulator accepted $got pushes, expected $2: $(sim_stats "$port" "$work/ca.pem")"
}
rate() { sed -n 's/.*"pushes_per_second": *\([0-9]*\).*/\1/p'; }

machine
echo "pushes: $n (aioapns: $an), $c connections, $k in flight, $tokens distinct device tokens, payload $(wc -c <"$work/payload.json") bytes"

echo "== marquee-bench transport (APNsProvider)"
sim_reset "$port" "$work/ca.pem"
ours=$("$bin/marquee-bench" transport --host 127.0.0.1 --port "$port" --ca "$work/ca.pem" --key "$work/key.p8" \
  --kid "$kid" --team "$team" --topic "$topic" --payload "$work/payload.json" --n "$n" --connections "$c" \
  --concurrency "$k" --tokens "$tokens" --warmup 1000)
echo "$ours"
check "APNsProvider" $((n + 1000))

echo "== h2load -n $n -c $c -m $((k / c)) -t 1 (same POST, same headers, fixed provider token)"
sim_reset "$port" "$work/ca.pem"
jwt=$("$bin/marquee-bench" jwt --key "$work/key.p8" --kid "$kid" --team "$team")
rm -f "$work/h2load.log"
h2load -n "$n" -c "$c" -m $((k / c)) -t 1 -i "$work/uris.txt" -d "$work/payload.json" --log-file="$work/h2load.log" \
  -H "authorization: bearer $jwt" -H "apns-push-type: liveactivity" -H "apns-topic: $topic" \
  -H "apns-priority: 10" -H "apns-expiration: $(($(date +%s) + 3600))" -H "content-type: application/json" \
  >"$work/h2load.out" 2>&1 || true
grep -E "^finished in|^requests:|^status codes:" "$work/h2load.out"
h2=$(sed -n 's/^finished in [^,]*, \([0-9.]*\) req\/s.*/\1/p' "$work/h2load.out" | cut -d. -f1)
# --log-file: start time (µs), status, request time (µs), tab separated
sort -t$'\t' -k3,3n "$work/h2load.log" | awk -F'\t' '{ t[NR] = $3 } END {
  if (NR) printf "h2load p50 %.2f ms, p99 %.2f ms, max %.2f ms\n", t[int(NR * 0.50 + 0.999)] / 1000, t[int(NR * 0.99 + 0.999)] / 1000, t[NR] / 1000 }'
check "h2load" "$n"

echo "== aioapns $("$out/venv/bin/python" -c 'import importlib.metadata as m; print(m.version("aioapns"))') (N=$an)"
sim_reset "$port" "$work/ca.pem"
aio=$(SIM_HOST=127.0.0.1 SIM_PORT=$port N=$an CONNECTIONS=$c CONCURRENCY=$k TOKENS=$tokens WARMUP=200 \
  KEY_FILE="$work/key.p8" KEY_ID=$kid TEAM_ID=$team TOPIC=$topic PAYLOAD_FILE="$work/payload.json" \
  SSL_CERT_FILE="$work/ca.pem" "$out/venv/bin/python" "$root/bench/transport/aioapns_bench.py")
echo "$aio"
check "aioapns" $((an + 200))

r_ours=$(echo "$ours" | rate)
r_aio=$(echo "$aio" | rate)
echo "== pushes/s: APNsProvider $r_ours, h2load ${h2:-?}, aioapns $r_aio"
awk -v o="$r_ours" -v h="${h2:-0}" -v a="$r_aio" 'BEGIN {
  printf "ours/h2load = %.2fx (target >= 0.5x), ours/aioapns = %.1fx (target >= 10x)\n", (h ? o / h : 0), (a ? o / a : 0) }'
echo "simulator RSS: $(rss $sim)"

if [ "${NGHTTPD:-1}" = 1 ]; then
  ng_port=${NGHTTPD_PORT:-12198}
  rm -rf "$work/nghttpd" && mkdir -p "$work/nghttpd/root/3/device"
  openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes -days 2 -subj "/CN=127.0.0.1" \
    -addext "subjectAltName=IP:127.0.0.1" -keyout "$work/nghttpd/key.pem" -out "$work/nghttpd/cert.pem" 2>/dev/null
  sed 's#.*/3/device/##' "$work/uris.txt" | (cd "$work/nghttpd/root/3/device" && xargs touch)
  nghttpd -d "$work/nghttpd/root" "$ng_port" "$work/nghttpd/key.pem" "$work/nghttpd/cert.pem" >/dev/null 2>&1 &
  ng=$!
  trap 'kill -TERM $sim $ng 2>/dev/null || true; wait $sim $ng 2>/dev/null || true' EXIT
  for _ in $(seq 1 100); do
    curl -sf -o /dev/null --http2 --cacert "$work/nghttpd/cert.pem" -X POST -d '{}' \
      "https://127.0.0.1:$ng_port/3/device/$(head -1 "$work/uris.txt" | sed 's#.*/3/device/##')" && break
    sleep 0.1
  done
  TIMEFORMAT='cpu %U %S'
  # cpu_per_request CPU_FILE NGHTTPD_TICKS_BEFORE REQUESTS: "client X µs, nghttpd Y µs"
  cpu_per_request() {
    awk -v hz="$(getconf CLK_TCK)" -v t0="$2" -v t1="$(bench_ticks "$ng")" -v n="$3" '/^cpu / { c = $2 + $3 } END {
      printf "client %.1f µs, nghttpd %.1f µs", c * 1e6 / n, (t1 - t0) / hz * 1e6 / n }' "$1"
  }
  echo "== against nghttpd (one thread, TLS): marquee-bench transport (APNsProvider)"
  t0=$(bench_ticks "$ng")
  ours_ng=$( { time "$bin/marquee-bench" transport --host 127.0.0.1 --port "$ng_port" --ca "$work/nghttpd/cert.pem" \
    --key "$work/key.p8" --kid "$kid" --team "$team" --topic "$topic" --payload "$work/payload.json" --n "$n" \
    --connections "$c" --concurrency "$k" --tokens "$tokens" --warmup 1000; } 2>"$work/ours-nghttpd.cpu")
  echo "$ours_ng"
  cpu_ours=$(cpu_per_request "$work/ours-nghttpd.cpu" "$t0" $((n + 1000)))
  echo "CPU per request (process total, setup and warm-up included): $cpu_ours"
  echo "== against nghttpd: h2load -n $n -c $c -m $((k / c)) -t 1 (same requests)"
  sed "s#:$port/#:$ng_port/#" "$work/uris.txt" >"$work/uris-nghttpd.txt"
  t0=$(bench_ticks "$ng")
  { time h2load -n "$n" -c "$c" -m $((k / c)) -t 1 -i "$work/uris-nghttpd.txt" -d "$work/payload.json" \
    -H "authorization: bearer $jwt" -H "apns-push-type: liveactivity" -H "apns-topic: $topic" \
    -H "apns-priority: 10" -H "apns-expiration: $(($(date +%s) + 3600))" -H "content-type: application/json" \
    >"$work/h2load-nghttpd.out" 2>&1 || true; } 2>"$work/h2load-nghttpd.cpu"
  grep -E "^finished in|^requests:|^status codes:" "$work/h2load-nghttpd.out"
  echo "CPU per request: $(cpu_per_request "$work/h2load-nghttpd.cpu" "$t0" "$n")"
  h2_ng=$(sed -n 's/^finished in [^,]*, \([0-9.]*\) req\/s.*/\1/p' "$work/h2load-nghttpd.out" | cut -d. -f1)
  r_ours_ng=$(echo "$ours_ng" | rate)
  echo "== against nghttpd, pushes/s: APNsProvider $r_ours_ng, h2load ${h2_ng:-?}; aioapns (against the simulator) $r_aio"
  awk -v o="$r_ours_ng" -v h="${h2_ng:-0}" -v a="$r_aio" 'BEGIN {
    printf "ours/h2load = %.2fx (target >= 0.5x), ours/aioapns = %.1fx (target >= 10x)\n", (h ? o / h : 0), (a ? o / a : 0) }'
fi

#!/usr/bin/env bash
# simulator: the APNs simulator's own ceiling. h2load (TLS, HTTP/2) sends N pushes with a fixed provider token
# against `marquee simulate apns`; reports requests/s and the simulator's CPU time per request (from
# /proc/<pid>/stat), for SIM_IO_THREADS I/O threads each (default "1 2"). Side by side, the same h2load against
# nghttpd (one thread, TLS, answering 200 from a file) shows what the peer alone costs on this machine.
#   N (200000), CONNECTIONS (4), STREAMS (100 per connection), SIM_IO_THREADS ("1 2"), MARQUEE_BIN (a prebuilt
#   binary to measure instead of building)
source "$(dirname "$0")/../lib.sh"
MARQUEE_EXTRA_PACKAGES="nghttp2-client nghttp2-server" "$root/Deploy/local/deps.sh"
if [ -n "${MARQUEE_BIN:-}" ]; then bin=$(dirname "$MARQUEE_BIN"); else bench_build; fi
n=${N:-200000}
c=${CONNECTIONS:-4}
m=${STREAMS:-100}
port=${SIM_PORT:-12199}
work="$out/simulator"
mkdir -p "$work"
kid=BENCHKEY01
team=BENCHTEAM1
topic=com.example.bench.push-type.liveactivity
"$bin/marquee-bench" keygen es256 "$work/key.p8" "$work/key.pub"
cat >"$work/keys.json" <<JSON
{"$kid": {"team_id": "$team", "public_key": $(json_file "$work/key.pub")}}
JSON
cat >"$work/payload.json" <<'JSON'
{"aps":{"event":"update","timestamp":1764680000,"content-state":{"status":"out_for_delivery","eta_minutes":12,"driver":"Sam","stops_away":3},"stale-date":1764683600},"marquee":{"delivery_id":"01JDZ3Q6T8M4V9W2X5Y7Z0A1B2","delivery_token":"0123456789abcdef0123456789abcdef"}}
JSON
awk -v port="$port" 'BEGIN { for (i = 0; i < 10000; i++) { t = sprintf("%08x", i);
  printf "https://127.0.0.1:%d/3/device/%s%s%s%s%s%s%s%s\n", port, t, t, t, t, t, t, t, t } }' >"$work/uris.txt"
jwt=$("$bin/marquee-bench" jwt --key "$work/key.p8" --kid "$kid" --team "$team")
hz=$(getconf CLK_TCK)

machine
echo "h2load -n $n -c $c -m $m -t 2, payload $(wc -c <"$work/payload.json") bytes, 10,000 device tokens"
for threads in ${SIM_IO_THREADS:-1 2}; do
  rm -f "$work/ca.pem"
  MARQUEE_SIM_LISTEN=127.0.0.1:$port MARQUEE_SIM_CA_OUT="$work/ca.pem" MARQUEE_SIM_KEYS="$work/keys.json" \
    MARQUEE_SIM_IO_THREADS=$threads MARQUEE_LOG_LEVEL=warning "$bin/marquee" simulate apns 2>"$work/sim.log" &
  sim=$!
  wait_sim "$port" "$work/ca.pem"
  before=$(bench_ticks $sim)
  h2load -n "$n" -c "$c" -m "$m" -t 2 -i "$work/uris.txt" -d "$work/payload.json" \
    -H "authorization: bearer $jwt" -H "apns-push-type: liveactivity" -H "apns-topic: $topic" \
    -H "apns-priority: 10" -H "content-type: application/json" >"$work/h2load-$threads.out" 2>&1 || true
  after=$(bench_ticks $sim)
  accepted=$(sim_stats "$port" "$work/ca.pem" | sed -n 's/.*"accepted":\([0-9]*\).*/\1/p')
  echo "simulator, $threads I/O thread(s): $(sed -n 's/^finished in \([^,]*\), \([0-9.]*\) req\/s.*/\2 req\/s (\1)/p' "$work/h2load-$threads.out"), accepted $accepted, $(awk -v t=$((after - before)) -v hz="$hz" -v n="$n" 'BEGIN { printf "%.1f", t / hz * 1e6 / n }') µs CPU per request, RSS $(rss $sim)"
  kill -TERM $sim; wait $sim 2>/dev/null || true
done

# The same load against nghttpd, which answers every POST with a small file.
if command -v nghttpd >/dev/null; then
  mkdir -p "$work/docroot/3/device"
  "$bin/marquee-bench" keygen es256 "$work/ng.key" "$work/ng.pub" >/dev/null 2>&1 || true
  openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -keyout "$work/ng.key" -out "$work/ng.crt" \
    -days 1 -subj "/CN=127.0.0.1" >/dev/null 2>&1
  awk '{ sub(/.*\/3\/device\//, ""); print }' "$work/uris.txt" | while read -r t; do : >"$work/docroot/3/device/$t"; done
  nghttpd -d "$work/docroot" $((port + 1)) "$work/ng.key" "$work/ng.crt" >/dev/null 2>&1 &
  ng=$!
  sleep 0.5
  sed "s/:$port\//:$((port + 1))\//" "$work/uris.txt" >"$work/uris-ng.txt"
  before=$(bench_ticks $ng)
  h2load -n "$n" -c "$c" -m "$m" -t 2 -i "$work/uris-ng.txt" -d "$work/payload.json" \
    -H "authorization: bearer $jwt" -H "apns-push-type: liveactivity" -H "apns-topic: $topic" \
    -H "content-type: application/json" >"$work/h2load-ng.out" 2>&1 || true
  after=$(bench_ticks $ng)
  echo "nghttpd (1 thread): $(sed -n 's/^finished in \([^,]*\), \([0-9.]*\) req\/s.*/\2 req\/s (\1)/p' "$work/h2load-ng.out"), $(grep -E '^status codes' "$work/h2load-ng.out"), $(awk -v t=$((after - before)) -v hz="$hz" -v n="$n" 'BEGIN { printf "%.1f", t / hz * 1e6 / n }') µs CPU per request"
  kill $ng; wait $ng 2>/dev/null || true
fi

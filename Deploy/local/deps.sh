#!/usr/bin/env bash
# Installs the Debian packages Marquee needs to build, test and run locally, when they are missing.
# Uses sudo when not root. The Swift toolchain itself is not a Debian package: it must already be on PATH.
set -euo pipefail

# nghttp2-client: h2load and nghttp, spawned by Tests/HTTP2Tests; python3 with cryptography and jwt: the crypto
# tests cross-check signatures and sealing with them (they are skipped without those modules); chromium and
# chromium-driver: the console's browser tests (Tests/IntegrationTests/ConsoleBrowserTests) drive headless Chromium
# through chromedriver's WebDriver protocol; postgresql-client and postgresql-client-common (/usr/bin/psql): psql, which tests spawn to hold a lock from another session.
packages=(postgresql postgresql-client postgresql-client-common libpq-dev libssl-dev openssl libnghttp2-dev libmicrohttpd-dev nghttp2-client python3 python3-cryptography python3-jwt pkg-config make curl ca-certificates chromium chromium-driver)
[ -n "${MARQUEE_EXTRA_PACKAGES:-}" ] && read -r -a extra <<<"$MARQUEE_EXTRA_PACKAGES" && packages+=("${extra[@]}")

missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done

if [ ${#missing[@]} -gt 0 ]; then
  echo "deps: installing ${missing[*]}" >&2
  sudo=""
  [ "$(id -u)" = 0 ] || sudo="sudo"
  $sudo env DEBIAN_FRONTEND=noninteractive apt-get update -qq
  $sudo env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
  # Debian starts a default cluster on install; Marquee uses its own private clusters instead.
fi

if ! command -v swift >/dev/null 2>&1; then
  echo "deps: the Swift 6 toolchain is not on PATH (expected e.g. /opt/swift/usr/bin)" >&2
  exit 1
fi

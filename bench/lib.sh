# Shared helpers for bench/*/run.sh: a private PostgreSQL with fsync on, and the release binaries.
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
out="$root/bench/out"
mkdir -p "$out"
chmod 755 "$out"

bench_build() {
  (cd "$root" && swift build -c release --product marquee >&2 && swift build -c release --product marquee-bench >&2)
  bin="$(cd "$root" && swift build -c release --show-bin-path)"
}

# Starts (or reuses) the benchmark cluster; sets DATABASE_URL and PGPORT.
bench_pg() {
  DATABASE_URL=$("$root/Deploy/local/pg.sh" start "$out/pg")
  export DATABASE_URL
  PGPORT=$(sed -n 4p "$out/pg/postmaster.pid")
  export PGPORT
}

bench_pg_stop() { "$root/Deploy/local/pg.sh" stop "$out/pg"; }

machine() {
  echo "machine: $(nproc) cores, $(free -g | awk '/Mem:/{print $2}') GiB, $(uname -sr), $(lscpu | sed -n 's/^Model name: *//p' | head -1)"
}

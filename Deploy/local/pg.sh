#!/usr/bin/env bash
# A private PostgreSQL cluster for local runs, tests and benchmarks.
#
#   pg.sh start DIR [PORT]   create (if needed) and start a cluster in DIR; prints its DATABASE_URL
#   pg.sh stop DIR           stop it (fast shutdown)
#   pg.sh url DIR            print the DATABASE_URL of a running cluster
#   pg.sh crash DIR          stop it the hard way (immediate mode), as a crash would
#   pg.sh waldump DIR ARGS…  pg_waldump over the cluster's WAL (bench/lib.sh's WALDUMP=1)
#
# initdb refuses to run as root, so as root the cluster belongs to the `postgres` system user.
# Extra server settings can be passed in PG_OPTIONS (e.g. "-c fsync=off" for throwaway clusters).
set -euo pipefail

bindir() {
  local d
  if command -v pg_config >/dev/null 2>&1; then
    d=$(pg_config --bindir)
    [ -x "$d/initdb" ] && { echo "$d"; return; }
  fi
  for d in $(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V -r); do
    [ -x "$d/initdb" ] && { echo "$d"; return; }
  done
  echo "pg.sh: no PostgreSQL server binaries found (install postgresql)" >&2
  exit 1
}

as_owner() {
  if [ "$(id -u)" = 0 ]; then
    runuser -u postgres -- "$@"
  else
    "$@"
  fi
}

free_port() {
  local p
  for p in $(seq "${1:-55432}" 65000); do
    if ! (exec 3<>/dev/tcp/127.0.0.1/"$p") 2>/dev/null; then
      echo "$p"
      return
    fi
  done
  echo "pg.sh: no free port" >&2
  exit 1
}

cmd=${1:-}
dir=${2:-}
[ -n "$cmd" ] && [ -n "$dir" ] || { sed -n '2,11p' "$0"; exit 2; }
mkdir -p "$dir"
dir=$(cd "$dir" && pwd)
bin=$(bindir)

case "$cmd" in
  start)
    if [ "$(id -u)" = 0 ]; then
      chown postgres: "$dir"
      # The postgres user must reach the folder: not, say, under /root (mode 0700), where `make run` in a checkout
      # there would put it. initdb's complaint goes to a log file; say which folder is closed, and stop.
      if ! runuser -u postgres -- test -x "$dir"; then
        closed=""
        IFS=/ read -r -a parts <<<"${dir#/}"
        for part in "${parts[@]}"; do
          closed=$closed/$part
          runuser -u postgres -- test -x "$closed" || break
        done
        echo "pg.sh: the cluster runs as the postgres user when started as root, and it cannot reach $dir:" \
          "$closed (mode $(stat -c %a "$closed")) is closed to it. Use a folder outside it (a checkout under /srv or" \
          "/home, say), or run as another user." >&2
        exit 1
      fi
    fi
    if [ ! -f "$dir/PG_VERSION" ]; then
      # Text compares byte by byte (LC_COLLATE C): Marquee's keys are text (instance, person, token IDs), and under a
      # locale every index comparison goes through strcoll (README, "The database's collation"). Character classes stay UTF-8.
      as_owner "$bin/initdb" -D "$dir" -U postgres --auth=trust -E UTF8 --locale=C.UTF-8 --lc-collate=C >"$dir/../$(basename "$dir").initdb.log" 2>&1 \
        || as_owner "$bin/initdb" -D "$dir" -U postgres --auth=trust -E UTF8 --locale=C >"$dir/../$(basename "$dir").initdb.log" 2>&1
    fi
    if as_owner "$bin/pg_ctl" -D "$dir" status >/dev/null 2>&1; then
      port=$(sed -n 4p "$dir/postmaster.pid")
    else
      port=${3:-$(free_port)}
      # Another cluster starting at the same moment may take the port that looked free: without an explicit port,
      # try the next free ones.
      for attempt in 1 2 3 4 5; do
        # shellcheck disable=SC2086
        if as_owner "$bin/pg_ctl" -D "$dir" -w -t 60 -l "$dir/server.log" \
          -o "-p $port -k $dir -c listen_addresses=127.0.0.1 -c max_connections=300 ${PG_OPTIONS:-}" start >/dev/null; then
          break
        fi
        if [ -n "${3:-}" ] || [ "$attempt" = 5 ]; then
          tail -n 5 "$dir/server.log" >&2
          exit 1
        fi
        port=$(free_port $((port + 1 + RANDOM % 50)))
      done
    fi
    as_owner "$bin/psql" -h "$dir" -p "$port" -U postgres -d postgres -tAq \
      -c "SELECT 1 FROM pg_database WHERE datname = 'marquee'" | grep -q 1 \
      || as_owner "$bin/createdb" -h "$dir" -p "$port" -U postgres marquee
    echo "postgresql://postgres@127.0.0.1:$port/marquee"
    ;;
  stop)
    if [ -f "$dir/PG_VERSION" ]; then
      as_owner "$bin/pg_ctl" -D "$dir" -m fast -w stop >/dev/null 2>&1 || true
    fi
    ;;
  crash)
    as_owner "$bin/pg_ctl" -D "$dir" -m immediate -w stop >/dev/null
    ;;
  waldump)
    shift 2
    as_owner "$bin/pg_waldump" -p "$dir/pg_wal" "$@"
    ;;
  url)
    port=$(sed -n 4p "$dir/postmaster.pid")
    echo "postgresql://postgres@127.0.0.1:$port/marquee"
    ;;
  *)
    sed -n '2,11p' "$0"
    exit 2
    ;;
esac

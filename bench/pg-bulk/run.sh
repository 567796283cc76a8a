#!/usr/bin/env bash
# pg-bulk: rows/s writing 100k delivery-like rows through PostgresClient's COPY path, side by side with pgbench
# running the equivalent SQL (multi-row INSERTs of the same rows) against the same server, fsync on.
source "$(dirname "$0")/../lib.sh"
MARQUEE_EXTRA_PACKAGES="" "$root/Deploy/local/deps.sh"
bench_build
bench_pg
trap bench_pg_stop EXIT

rows=${ROWS:-100000}
psql -q "$DATABASE_URL" <<'SQL'
DROP TABLE IF EXISTS bench_deliveries;
CREATE TABLE bench_deliveries (
    id uuid PRIMARY KEY,
    tenant_id uuid NOT NULL,
    instance_id text NOT NULL,
    device_token text NOT NULL,
    provider text NOT NULL,
    status text NOT NULL,
    attempts integer NOT NULL,
    payload jsonb NOT NULL,
    created_at timestamptz NOT NULL DEFAULT now()
);
SQL

machine
echo "== PostgresClient COPY, 1 connection, batches of 10000"
"$bin/marquee-bench" pg-bulk --rows "$rows" --batch 10000 --connections 1
echo "== PostgresClient COPY, 2 connections, batches of 10000"
"$bin/marquee-bench" pg-bulk --rows "$rows" --batch 10000 --connections 2

# pgbench: the same rows as multi-row INSERT statements of 1000 rows, one statement per transaction.
per=1000
script="$out/pg-bulk-insert.sql"
{
  echo "INSERT INTO bench_deliveries (id, tenant_id, instance_id, device_token, provider, status, attempts, payload) VALUES"
  for i in $(seq 1 $per); do
    sep=","; [ "$i" = "$per" ] && sep=";"
    tok=$(printf '%08x' $(( (i * 2654435761) & 0xffffffff )))
    tok="$tok$tok$tok$tok$tok$tok$tok$tok"
    echo "(gen_random_uuid(), '6b1f8f4e-1111-4222-8333-944455556666', 'inst-$i', '$tok', 'apns', 'queued', 0, '{\"event\":\"update\",\"version\":$((i % 100)),\"note\":\"bench\"}')$sep"
  done
} >"$script"
for clients in 1 2; do
  psql -q "$DATABASE_URL" -c "TRUNCATE bench_deliveries"
  echo "== pgbench -f multi-row INSERT ($per rows per transaction), $clients client(s)"
  tx=$((rows / per / clients))
  pgbench -n -h 127.0.0.1 -p "$PGPORT" -U postgres -c "$clients" -j "$clients" -t "$tx" -f "$script" marquee 2>&1 \
    | grep -E "^(tps|latency average|number of transactions actually)" \
    | awk -v per="$per" '/^tps/ { printf "tps = %s  => rows/s = %d\n", $3, $3 * per; next } { print }'
done

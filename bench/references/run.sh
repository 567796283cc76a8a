#!/usr/bin/env bash
# references: a campaign start's bulk writes — its audience's 100,000 members, then 10,000 instances and their 10,000
# queue rows, twice — timed in one transaction (rolled back) under a step's settings, on two databases of one cluster
# (fsync on): migrated up to UPTO (default 0066: the per-statement reference checks; 0069: the queue rows' checks)
# and migrated without it and later ones (the foreign keys). ROUNDS (default 3) alternate the two. Prints ms per
# statement.
source "$(dirname "$0")/../lib.sh"
MARQUEE_EXTRA_PACKAGES="" "$root/Deploy/local/deps.sh"
bench_build
bench_pg
trap bench_pg_stop EXIT
machine

upto=${UPTO:-0066}
rounds=${ROUNDS:-3}
older="$out/references-migrations"
rm -rf "$older" && mkdir -p "$older"
for f in "$root"/Migrations/*.sql; do
  [[ "$(basename "$f")" < "$upto" ]] && cp "$f" "$older/"
done
base=${DATABASE_URL%/*}
PGOPTIONS="-c client_min_messages=warning" psql -q "$base/postgres" -c "DROP DATABASE IF EXISTS refs_before WITH (FORCE)" -c "CREATE DATABASE refs_before" \
  -c "DROP DATABASE IF EXISTS refs_after WITH (FORCE)" -c "CREATE DATABASE refs_after"
MARQUEE_MIGRATIONS_DIR="$older" DATABASE_URL="$base/refs_before" "$bin/marquee" migrate >/dev/null 2>&1
MARQUEE_MIGRATIONS_DIR="$root/Migrations" DATABASE_URL="$base/refs_after" "$bin/marquee" migrate >/dev/null 2>&1

cat >"$out/references.sql" <<'SQL'
\set t '00000000-0000-0000-0000-000000000001'
INSERT INTO tenants (id, name, sealed_delivery_secret) VALUES (:'t', 'refs', '\x00') ON CONFLICT DO NOTHING;
INSERT INTO activity_types (tenant_id, identifier, attributes_type) VALUES (:'t', 'a', 'A') ON CONFLICT DO NOTHING;
INSERT INTO campaigns (tenant_id, id, name, activity_type, audience, attributes, content_state, state, start_at)
VALUES (:'t', 'c', 'c', 'a', '{"all": true}', '{}', '{}', 'scheduled', now()) ON CONFLICT DO NOTHING;
\timing on
BEGIN;
SET LOCAL enable_nestloop = off;
INSERT INTO campaign_members (tenant_id, campaign_id, person_id, instance_id)
SELECT :'t', 'c', 'p' || i, 'c.p' || i FROM generate_series(1, 100000) i;
INSERT INTO instances (tenant_id, id, activity_type, state, attributes, content_state, content_timestamp, expires_at,
                       campaign_id)
SELECT :'t', 'c.p' || i, 'a', 'pending', '{}', '{}', 1, now() + interval '1 hour', 'c' FROM generate_series(1, 10000) i;
INSERT INTO delivery_queue (tenant_id, id, instance_id, device_token, provider, token_kind, token, operation,
                            instance_version)
SELECT :'t', gen_random_uuid(), 'c.p' || i, 'd' || i, 'apns', 'push_to_start', 'tok' || i, 'start', 1
FROM generate_series(1, 10000) i;
INSERT INTO instances (tenant_id, id, activity_type, state, attributes, content_state, content_timestamp, expires_at,
                       campaign_id)
SELECT :'t', 'c.p' || i, 'a', 'pending', '{}', '{}', 1, now() + interval '1 hour', 'c'
FROM generate_series(10001, 20000) i;
INSERT INTO delivery_queue (tenant_id, id, instance_id, device_token, provider, token_kind, token, operation,
                            instance_version)
SELECT :'t', gen_random_uuid(), 'c.p' || i, 'd' || i, 'apns', 'push_to_start', 'tok' || i, 'start', 1
FROM generate_series(10001, 20000) i;
ROLLBACK;
SQL

echo "== ms: members (100,000), instances, queue rows, instances, queue rows (10,000 each); migrations up to $upto"
for round in $(seq 1 "$rounds"); do
  for db in refs_before refs_after; do
    times=$(psql -q -X "$base/$db" -f "$out/references.sql" | sed -n 's/^Time: \([0-9.]*\) ms.*/\1/p' | sed -n '3,7p' \
      | tr '\n' ' ')
    label=$([ "$db" = refs_before ] && echo "without $upto" || echo "with $upto   ")
    echo "round $round, $label: $times"
  done
done

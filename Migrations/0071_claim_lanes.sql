-- Claims that start apart: every queued row gets a lane, and a claim takes a tenant's due rows lane by lane, starting
-- at a lane of its own choosing, instead of all claims starting at the head of one order.
--
-- A claim locks each tenant's oldest due rows with SKIP LOCKED. Several workers, each with several claims open, all
-- started at the same head: a claim walked past the rows every other open claim held, and each row walked past got the
-- version check (an index probe, `NOT EXISTS` older version) before its lock was even tried. `auto_explain` of every
-- claim during bench/campaign (bench/RESULTS.md, 2026-12-06): 745,556 rows walked and probed for 223,622 locked, the
-- other 70% held by other claims (2 workers × 2 claim loops: three batches held at the head of the queue).
--
-- Each row is given one of marquee_queue_lanes() lanes at random when it is queued (a column default: no writer names
-- it), and the due index is ordered by (tenant, lane, due time). A claim picks a random lane to start at and walks the
-- lanes from there, each in due order, until it has its share; concurrent claims mostly start in different lanes and
-- walk none of each other's rows. Within a lane rows go oldest first; across lanes, order is interleaved (each lane
-- holds a random eighth of the queue, so a backlog drains in nearly its order). A claim that finds its first lane
-- short goes on to the next ones, so a due row waits at most until a claim starts at its lane or runs short before
-- it (every claim starts at a random lane). A claim still locks only rows it sends: each lane's scan is read lazily,
-- and the claim stops as soon as it has its share.
CREATE FUNCTION marquee_queue_lanes() RETURNS int LANGUAGE sql IMMUTABLE PARALLEL SAFE AS 'SELECT 8';
GRANT EXECUTE ON FUNCTION marquee_queue_lanes() TO marquee_api, marquee_system;

-- Rows queued before this migration are all in lane 0 (a constant default adds the column without rewriting the
-- table); rows queued from now on are spread.
ALTER TABLE delivery_queue ADD COLUMN lane smallint NOT NULL DEFAULT 0;
ALTER TABLE delivery_queue ALTER COLUMN lane SET DEFAULT floor(random() * marquee_queue_lanes())::smallint;
ALTER TABLE delivery_queue ADD CONSTRAINT delivery_queue_lane_check CHECK (lane >= 0 AND lane < marquee_queue_lanes());

-- The due index, per lane. It still leads with the tenant, so the skip scan over tenants with due rows reads it as
-- before.
CREATE INDEX deliveries_due_by_lane ON delivery_queue (tenant_id, lane, next_attempt_at)
    WHERE status = 'queued' AND next_attempt_at > '-infinity';
DROP INDEX deliveries_due_by_tenant;

-- A claim's version check (no older version of the row's instance queued for its token) cannot find anything for a
-- first version: instances start at version 1 (a start's insert) and versions only grow. The claim skips the probe
-- for those rows, which is every push of a start; this makes that reasoning a rule of the table.
ALTER TABLE delivery_queue ADD CONSTRAINT delivery_queue_instance_version_check CHECK (instance_version >= 1);

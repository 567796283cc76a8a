-- Retention without freezing the writers.
--
-- The daily pass (marquee_apply_retention, 0020) ran as one transaction. For each day-partitioned table, the busiest
-- one included (delivery_history: every worker's record and the API's superseded rows insert into it), it ran
-- `CREATE TABLE … PARTITION OF` and `DROP TABLE` of day partitions, then in the same transaction deleted the DEFAULT
-- partitions' old rows and purged finished instances 5000 at a time until done. Measured on PostgreSQL 15:
--
-- * `CREATE TABLE … PARTITION OF` takes ACCESS EXCLUSIVE on the parent and on its DEFAULT partition (which it scans)
--   and, for activity_events and delivery_metrics, SHARE ROW EXCLUSIVE on `tenants` (the foreign key is cloned);
-- * `DROP TABLE` of a partition takes ACCESS EXCLUSIVE on the parent and on the DEFAULT partition.
--
-- Those locks were held until the end of the pass, through the whole purge. Nothing set lock_timeout: a session
-- holding ACCESS SHARE on delivery_history (pg_dump, an analyst, a console read) made the pass queue for ACCESS
-- EXCLUSIVE, and every later lock request on the table (every worker's record, the API's supersedes, reads of the
-- `deliveries` view) queued behind it: deliveries stopped for as long as that reader ran, plus the purge, every day.
-- Tenant creation and resealing (writes to `tenants`) waited for the whole pass too.
--
-- Now the pass is a procedure, marquee_retention_pass, that commits step by step:
--
-- * Each partition is created or dropped in a transaction of its own, under `SET LOCAL lock_timeout` (2 s unless
--   the caller says otherwise), so it never stands in front of the workers for longer than that. On a lock timeout
--   (or a deadlock) the step is tried again after a pause (lock_timeout × attempt), a few times in all; after the
--   last attempt the table's remaining partition work is left for later (the same reader would block it) and
--   counted in the summary as `partitions_skipped`, with the table in `skipped_tables`. A pass that skipped
--   something does not count as the day's pass: the next hourly tick runs it again, until one completes.
-- * Partitions are created as a plain table (`CREATE TABLE … (LIKE parent …)`) and then attached (`ALTER TABLE …
--   ATTACH PARTITION`), which takes SHARE UPDATE EXCLUSIVE on the parent instead of ACCESS EXCLUSIVE: writers of the
--   parent never wait for it, nor do reads that prune to day partitions. It still takes ACCESS EXCLUSIVE on the
--   DEFAULT partition, which it scans, so reads of the whole table may wait for it, up to lock_timeout. The result is
--   the same table as `PARTITION OF` makes (columns, constraints and indexes inherited, none local; checked with
--   psql).
-- * Dropping keeps `DROP TABLE` under lock_timeout. `ALTER TABLE … DETACH PARTITION … CONCURRENTLY` (SHARE UPDATE
--   EXCLUSIVE on the parent) would be better, but PostgreSQL refuses it while the table has a DEFAULT partition
--   ("cannot detach partitions concurrently when a default partition exists"), and every table here has one: it
--   catches rows when the workers were down for longer than the days created ahead, and removing it would make
--   those inserts fail. It cannot run inside a transaction block either, nor from a function or procedure. A plain
--   DETACH takes the same ACCESS EXCLUSIVE as DROP.
-- * The DEFAULT partitions' old rows and the finished instances are deleted 5000 rows at a time, each slice committed
--   on its own, with no partition lock held: row locks only, and only for one slice.
-- * Once a day and one worker at a time, as before: a session-level advisory lock (the same key the old function
--   took per transaction) for the whole pass, and the `retention` row of maintenance_runs, written at the end with
--   the summary. A session lock outlives an error, so the pass releases it on every way out, and the caller
--   (RetentionStore) calls marquee_retention_release() after the call whatever happened.
--
-- A procedure that commits must be called with CALL outside any transaction block, as its caller's own role: it
-- cannot be SECURITY DEFINER. It runs as marquee_system, and the DDL goes through the SECURITY DEFINER functions of
-- 0020 and below, which accept only marquee_day_partitioned_tables().

-- The functions that make and drop day partitions run as the schema's owner (SECURITY DEFINER: DDL needs ownership),
-- and the workers' and the API's login role reach them through marquee_system. They took any table: a mistake or an
-- injection in either could have made partitions of, or dropped the day partitions of, any partitioned table, past
-- every privilege and row-level security. Each now refuses a table retention does not keep, here.
CREATE FUNCTION marquee_require_day_partitioned(p_parent regclass) RETURNS void
LANGUAGE plpgsql STABLE SET search_path = public, pg_temp AS $$
BEGIN
    IF NOT p_parent = ANY (marquee_day_partitioned_tables()) THEN
        RAISE EXCEPTION 'marquee: % is not a table kept by day partitions', p_parent
            USING ERRCODE = 'insufficient_privilege';
    END IF;
END;
$$;

-- The day partition of p_parent that holds p_day, created if missing, protected like its parent. Created and then
-- attached (see above); otherwise as in 0020, for its tables only.
CREATE OR REPLACE FUNCTION marquee_ensure_day_partition(p_parent regclass, p_day date) RETURNS boolean
LANGUAGE plpgsql VOLATILE SECURITY DEFINER SET search_path = public, pg_temp AS $$
DECLARE
    v_name text := format('%s_%s', p_parent::text, to_char(p_day, 'YYYYMMDD'));
BEGIN
    PERFORM marquee_require_day_partitioned(p_parent);
    IF to_regclass(v_name) IS NOT NULL THEN
        RETURN false;
    END IF;
    BEGIN
        EXECUTE format('CREATE TABLE %I (LIKE %s INCLUDING DEFAULTS INCLUDING CONSTRAINTS)', v_name, p_parent);
        EXECUTE format('ALTER TABLE %s ATTACH PARTITION %I FOR VALUES FROM (%L) TO (%L)',
                       p_parent, v_name, p_day::timestamptz, (p_day + 1)::timestamptz);
    EXCEPTION
        -- The DEFAULT partition already holds rows of that day (the workers were down): they stay there, and
        -- retention deletes them when their day is old enough. Two workers racing is harmless too. Either way the
        -- plain table goes with the rolled-back block. A lock timeout is the caller's to handle.
        WHEN check_violation OR duplicate_table OR unique_violation THEN
            RETURN false;
    END;
    PERFORM marquee_protect_tenant_table(v_name::regclass);
    RETURN true;
END;
$$;

-- The days of p_parent's day partitions whose whole day is before p_cutoff, oldest first.
CREATE FUNCTION marquee_day_partitions_before(p_parent regclass, p_cutoff date) RETURNS SETOF date
LANGUAGE sql STABLE AS $$
    SELECT to_date(right(c.relname, 8), 'YYYYMMDD') AS day
    FROM pg_inherits i
    JOIN pg_class c ON c.oid = i.inhrelid
    WHERE i.inhparent = p_parent
      AND c.relname ~ '_[0-9]{8}$'
      AND to_date(right(c.relname, 8), 'YYYYMMDD') + 1 <= p_cutoff
    ORDER BY 1
$$;
REVOKE ALL ON FUNCTION marquee_day_partitions_before(regclass, date) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION marquee_day_partitions_before(regclass, date) TO marquee_system;

-- Drops p_parent's day partition of p_day, if there is one; whether it did. One partition, so that the caller can
-- give each its own short transaction. Runs as the owner, for its tables only.
CREATE FUNCTION marquee_drop_day_partition(p_parent regclass, p_day date) RETURNS boolean
LANGUAGE plpgsql VOLATILE SECURITY DEFINER SET search_path = public, pg_temp AS $$
DECLARE
    v_partition regclass;
BEGIN
    PERFORM marquee_require_day_partitioned(p_parent);
    SELECT i.inhrelid::regclass INTO v_partition
    FROM pg_inherits i
    JOIN pg_class c ON c.oid = i.inhrelid
    WHERE i.inhparent = p_parent
      AND c.relname ~ '_[0-9]{8}$'
      AND right(c.relname, 8) = to_char(p_day, 'YYYYMMDD');
    IF v_partition IS NULL THEN
        RETURN false;
    END IF;
    EXECUTE format('DROP TABLE %s', v_partition);
    RETURN true;
END;
$$;
REVOKE ALL ON FUNCTION marquee_drop_day_partition(regclass, date) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION marquee_drop_day_partition(regclass, date) TO marquee_system;

-- Every day partition before p_cutoff at once, in the caller's transaction (kept for callers of 0020's function; the
-- pass drops one partition per transaction instead). One home for the rule: the two functions above.
CREATE OR REPLACE FUNCTION marquee_drop_day_partitions_before(p_parent regclass, p_cutoff date) RETURNS integer
LANGUAGE plpgsql VOLATILE SECURITY DEFINER SET search_path = public, pg_temp AS $$
DECLARE
    v_day date;
    v_dropped integer := 0;
BEGIN
    PERFORM marquee_require_day_partitioned(p_parent);
    FOR v_day IN SELECT marquee_day_partitions_before(p_parent, p_cutoff) LOOP
        IF marquee_drop_day_partition(p_parent, v_day) THEN
            v_dropped := v_dropped + 1;
        END IF;
    END LOOP;
    RETURN v_dropped;
END;
$$;

-- Releases the pass's session-level advisory lock if this session holds it (quietly otherwise: pg_advisory_unlock
-- warns about a lock it does not hold). The pass calls it on its way out; RetentionStore calls it after every call,
-- so that a pass that failed half-way does not keep the lock on a pooled connection.
CREATE FUNCTION marquee_retention_release() RETURNS void
LANGUAGE plpgsql VOLATILE AS $$
BEGIN
    WHILE EXISTS (SELECT 1 FROM pg_locks l
                  WHERE l.locktype = 'advisory' AND l.pid = pg_backend_pid() AND l.granted AND l.objsubid = 1
                    AND ((l.classid::bigint << 32) | l.objid::bigint) = hashtextextended('marquee/retention', 0))
          AND pg_advisory_unlock(hashtextextended('marquee/retention', 0)) LOOP
    END LOOP;
END;
$$;
REVOKE ALL ON FUNCTION marquee_retention_release() FROM PUBLIC;
GRANT EXECUTE ON FUNCTION marquee_retention_release() TO marquee_system;

-- The daily retention pass, as marquee_system, at p_now (a parameter so that tests can move the clock), keeping
-- p_keep_days days (<= 0 keeps everything; partitions are still created ahead). Sets p_summary to what it did, or
-- leaves it NULL when another session runs the pass or a complete pass already ran on p_now's day. Each partition
-- step waits at most p_lock_timeout for its locks, p_attempts times. Call it outside a transaction block:
--     CALL marquee_retention_pass(now(), 30, NULL);
CREATE PROCEDURE marquee_retention_pass(
    p_now timestamptz, p_keep_days integer, INOUT p_summary jsonb DEFAULT NULL,
    p_lock_timeout interval DEFAULT '2 seconds', p_attempts integer DEFAULT 3
)
LANGUAGE plpgsql AS $$
DECLARE
    v_today date := (p_now AT TIME ZONE 'UTC')::date;
    v_cutoff date := v_today - GREATEST(p_keep_days, 0);
    -- lock_timeout 0 would mean no timeout at all.
    v_lock_timeout text := GREATEST(ceil(extract(epoch FROM p_lock_timeout) * 1000), 1)::bigint || 'ms';
    v_attempts integer := GREATEST(p_attempts, 1);
    v_table regclass;
    v_days date[];
    v_drop boolean[];
    v_step integer;
    v_day date;
    v_attempt integer;
    v_done boolean;
    v_column name;
    v_created integer := 0;
    v_dropped integer := 0;
    v_skipped integer := 0;
    v_skipped_tables text[] := '{}';
    v_default_rows bigint := 0;
    v_rows bigint;
    v_instances bigint := 0;
BEGIN
    p_summary := NULL;
    IF NOT pg_try_advisory_lock(hashtextextended('marquee/retention', 0)) THEN
        RETURN;
    END IF;
    IF EXISTS (SELECT 1 FROM maintenance_runs
               WHERE job = 'retention' AND (ran_at AT TIME ZONE 'UTC')::date = v_today
                 AND COALESCE((summary ->> 'partitions_skipped')::integer, 0) = 0) THEN
        PERFORM marquee_retention_release();
        RETURN;
    END IF;
    COMMIT;

    -- Partitions, one table after the other, each step (one partition) in a transaction of its own.
    FOREACH v_table IN ARRAY marquee_day_partitioned_tables() LOOP
        -- The old ones (when keeping days), oldest first, then the missing ones ahead.
        SELECT COALESCE(array_agg(day ORDER BY n, day), '{}'), COALESCE(array_agg(to_drop ORDER BY n, day), '{}')
        INTO v_days, v_drop
        FROM (SELECT 1 AS n, d AS day, true AS to_drop FROM marquee_day_partitions_before(v_table, v_cutoff) AS d
              WHERE p_keep_days > 0
              UNION ALL
              SELECT 2, v_today + g, false FROM generate_series(-1, 7) AS g
              WHERE to_regclass(format('%s_%s', v_table::text, to_char(v_today + g, 'YYYYMMDD'))) IS NULL) AS s;
        FOR v_step IN 1..cardinality(v_days) LOOP
            v_day := v_days[v_step];
            v_done := false;
            FOR v_attempt IN 1..v_attempts LOOP
                IF v_attempt > 1 THEN
                    -- Nothing held meanwhile but the advisory lock.
                    PERFORM pg_sleep(extract(epoch FROM p_lock_timeout * (v_attempt - 1)));
                    COMMIT;
                END IF;
                BEGIN
                    PERFORM set_config('lock_timeout', v_lock_timeout, true);
                    IF v_drop[v_step] THEN
                        IF marquee_drop_day_partition(v_table, v_day) THEN
                            v_dropped := v_dropped + 1;
                        END IF;
                    ELSIF marquee_ensure_day_partition(v_table, v_day) THEN
                        v_created := v_created + 1;
                    END IF;
                    v_done := true;
                EXCEPTION
                    WHEN lock_not_available OR deadlock_detected THEN
                        NULL;
                END;
                -- Ends the step's transaction, its locks and its lock_timeout.
                COMMIT;
                EXIT WHEN v_done;
            END LOOP;
            IF NOT v_done THEN
                -- This step and the table's others: the same reader would block them.
                v_skipped := v_skipped + cardinality(v_days) - v_step + 1;
                v_skipped_tables := v_skipped_tables || v_table::text;
                EXIT;
            END IF;
        END LOOP;
    END LOOP;

    IF p_keep_days > 0 THEN
        -- The DEFAULT partitions' old rows, a slice per transaction.
        FOREACH v_table IN ARRAY marquee_day_partitioned_tables() LOOP
            SELECT a.attname INTO v_column
            FROM pg_partitioned_table p
            JOIN pg_attribute a ON a.attrelid = p.partrelid AND a.attnum = p.partattrs[0]
            WHERE p.partrelid = v_table;
            LOOP
                EXECUTE format('DELETE FROM %1$s WHERE ctid = ANY (ARRAY(SELECT ctid FROM %1$s WHERE %2$I < %3$L '
                               'LIMIT 5000))', v_table::text || '_default', v_column, v_cutoff::timestamptz);
                GET DIAGNOSTICS v_rows = ROW_COUNT;
                v_default_rows := v_default_rows + v_rows;
                COMMIT;
                EXIT WHEN v_rows < 5000;
            END LOOP;
        END LOOP;
        -- Finished instances, a slice per transaction: no statement and no transaction holds many row locks.
        LOOP
            DELETE FROM instances
            WHERE (tenant_id, id) IN (SELECT tenant_id, id FROM instances
                                      WHERE LEAST(expires_at, ended_at) < v_cutoff::timestamptz LIMIT 5000);
            GET DIAGNOSTICS v_rows = ROW_COUNT;
            v_instances := v_instances + v_rows;
            COMMIT;
            EXIT WHEN v_rows < 5000;
        END LOOP;
    END IF;

    p_summary := jsonb_build_object('cutoff', v_cutoff, 'partitions_created', v_created,
                                    'partitions_dropped', v_dropped, 'partitions_skipped', v_skipped,
                                    'skipped_tables', to_jsonb(v_skipped_tables),
                                    'default_rows_deleted', v_default_rows, 'instances_purged', v_instances);
    INSERT INTO maintenance_runs (job, ran_at, summary) VALUES ('retention', p_now, p_summary)
    ON CONFLICT (job) DO UPDATE SET ran_at = EXCLUDED.ran_at, summary = EXCLUDED.summary;
    COMMIT;
    PERFORM marquee_retention_release();
END;
$$;
REVOKE ALL ON PROCEDURE marquee_retention_pass(timestamptz, integer, jsonb, interval, integer) FROM PUBLIC;
GRANT EXECUTE ON PROCEDURE marquee_retention_pass(timestamptz, integer, jsonb, interval, integer) TO marquee_system;

-- The old one-transaction pass is retired: a worker of an older release calling it during a rolling deploy is told
-- "skipped" (as when another worker runs it), and the new workers run the pass.
CREATE OR REPLACE FUNCTION marquee_apply_retention(p_now timestamptz, p_keep_days integer) RETURNS jsonb
LANGUAGE sql VOLATILE SECURITY INVOKER AS $$
    SELECT NULL::jsonb;
$$;

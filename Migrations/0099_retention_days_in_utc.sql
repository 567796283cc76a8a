-- Retention's days are UTC days whatever the session's TimeZone, and its clock is the database's.
--
-- A day partition is named by its day (to_char of a date), and the pass's "today" was the UTC day of its time
-- ((p_now AT TIME ZONE 'UTC')::date, 0020), but marquee_ensure_day_partition (0096, from 0020) bounded the partition
-- with p_day::timestamptz, the day's midnight in the session's TimeZone, and the pass (0082) cut off old rows that way
-- too. Marquee's own connections are UTC (PostgresConfiguration); an operator's psql session is in its own TimeZone,
-- and 0080 tells operators to run the pass by hand. Run from a session in America/New_York, the pass attached
-- partitions [05:00 UTC, 05:00 UTC the next day); a worker's next pass (UTC) could not attach the day after the last
-- of them ("would overlap partition", 42P17, which the pass does not catch), and every pass failed from then on.
-- Now one rule turns a day into its first instant, marquee_day_start (midnight UTC), for the bounds and for the
-- cutoffs, and marquee_day_of turns an instant into its UTC day, for "today" and the once-a-day check.
--
-- The pass also took "now" from its caller, and the worker passed its own clock: a worker whose clock ran ahead
-- dropped partitions and purged rows early. A NULL p_now now means the database's now(), which the worker passes
-- (RetentionStore); tests still pass a time of their choosing. By hand, in any TimeZone:
--     CALL marquee_retention_pass(NULL, 30, NULL);
--
-- marquee_ensure_day_partition and marquee_retention_pass are 0096's and 0082's with those changes.

-- The first instant of p_day: midnight UTC. A day partition of p_day holds [marquee_day_start(p_day),
-- marquee_day_start(p_day + 1)).
CREATE FUNCTION marquee_day_start(p_day date) RETURNS timestamptz
LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
    SELECT p_day::timestamp AT TIME ZONE 'UTC';
$$;

-- The day (UTC) p_at falls in: the day partition that holds it.
CREATE FUNCTION marquee_day_of(p_at timestamptz) RETURNS date
LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
    SELECT (p_at AT TIME ZONE 'UTC')::date;
$$;

-- The day partition of p_parent that holds p_day (UTC), created if missing; otherwise as in 0096.
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
                       p_parent, v_name, marquee_day_start(p_day), marquee_day_start(p_day + 1));
    EXCEPTION
        -- The DEFAULT partition already holds rows of that day (the workers were down): they stay there, and
        -- retention deletes them when their day is old enough. Two workers racing is harmless too. Either way the
        -- plain table goes with the rolled-back block. A lock timeout is the caller's to handle.
        WHEN check_violation OR duplicate_table OR unique_violation THEN
            RETURN false;
    END;
    PERFORM marquee_protect_tenant_table(v_name::regclass);
    PERFORM marquee_withhold_parent_privileges(v_name::regclass, p_parent);
    RETURN true;
END;
$$;

-- The daily retention pass at p_now, or at the database's now() when p_now is NULL; otherwise as in 0082 (and 0080).
CREATE OR REPLACE PROCEDURE marquee_retention_pass(
    p_now timestamptz, p_keep_days integer, INOUT p_summary jsonb DEFAULT NULL,
    p_lock_timeout interval DEFAULT '2 seconds', p_attempts integer DEFAULT 3
)
LANGUAGE plpgsql AS $$
DECLARE
    v_now timestamptz := COALESCE(p_now, now());
    v_today date := marquee_day_of(v_now);
    v_cutoff date := v_today - GREATEST(p_keep_days, 0);
    v_cutoff_at timestamptz := marquee_day_start(v_cutoff);
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
    v_tokens bigint := 0;
BEGIN
    p_summary := NULL;
    IF NOT pg_try_advisory_lock(hashtextextended('marquee/retention', 0)) THEN
        RETURN;
    END IF;
    IF EXISTS (SELECT 1 FROM maintenance_runs
               WHERE job = 'retention' AND marquee_day_of(ran_at) = v_today
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
                               'LIMIT 5000))', v_table::text || '_default', v_column, v_cutoff_at);
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
                                      WHERE LEAST(expires_at, ended_at) < v_cutoff_at LIMIT 5000);
            GET DIAGNOSTICS v_rows = ROW_COUNT;
            v_instances := v_instances + v_rows;
            COMMIT;
            EXIT WHEN v_rows < 5000;
        END LOOP;
        -- Retired push-to-start tokens, a slice per transaction (found by push_to_start_retired). Those APNs refused
        -- while the tenant's current credential has been in place (BadDeviceToken, DeviceTokenNotForTopic: a wrong
        -- environment or bundle ID) are kept, however old: correcting the credential brings them back (0077).
        LOOP
            DELETE FROM push_to_start_tokens
            WHERE (tenant_id, device_token, activity_type, token) IN (
                SELECT t.tenant_id, t.device_token, t.activity_type, t.token FROM push_to_start_tokens t
                WHERE t.status = 'retired' AND t.retired_at < v_cutoff_at
                  AND (t.retired_reason IS NULL
                       OR t.retired_reason NOT IN ('BadDeviceToken', 'DeviceTokenNotForTopic')
                       OR t.retired_at < (SELECT c.configured_at FROM apns_credentials c
                                          WHERE c.tenant_id = t.tenant_id))
                LIMIT 5000);
            GET DIAGNOSTICS v_rows = ROW_COUNT;
            v_tokens := v_tokens + v_rows;
            COMMIT;
            EXIT WHEN v_rows < 5000;
        END LOOP;
    END IF;

    p_summary := jsonb_build_object('cutoff', v_cutoff, 'partitions_created', v_created,
                                    'partitions_dropped', v_dropped, 'partitions_skipped', v_skipped,
                                    'skipped_tables', to_jsonb(v_skipped_tables),
                                    'default_rows_deleted', v_default_rows, 'instances_purged', v_instances,
                                    'retired_tokens_purged', v_tokens);
    INSERT INTO maintenance_runs (job, ran_at, summary) VALUES ('retention', v_now, p_summary)
    ON CONFLICT (job) DO UPDATE SET ran_at = EXCLUDED.ran_at, summary = EXCLUDED.summary;
    COMMIT;
    PERFORM marquee_retention_release();
END;
$$;

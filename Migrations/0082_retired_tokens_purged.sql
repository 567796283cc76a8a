-- Retention purges retired push-to-start tokens.
--
-- A push-to-start token that rotates is retired, not deleted (migrations 0003, 0065: the old row is kept, marked
-- `retired` with its reason and time), and nothing ever deleted it: retention purged events, metrics, the delivery
-- history and finished instances, but a device's retired tokens stayed as long as the device, one more row with every
-- rotation (iOS hands the app a new push-to-start token from time to time, and on every reinstall). Now the daily
-- pass also deletes the tokens retired before its cutoff (the retention window), as it purges finished instances:
-- 5000 rows a transaction, each slice committed on its own, so no transaction holds many row locks. A retired token
-- is never sent to (claims and plans read active tokens only); it was kept as a record, and the window bounds it.
-- Retired activity tokens need nothing: they go with their instance (0078), which retention purges.
--
-- The procedure is 0080's with that step and its count (`retired_tokens_purged`) added.

CREATE INDEX push_to_start_retired ON push_to_start_tokens (retired_at) WHERE status = 'retired';

CREATE OR REPLACE PROCEDURE marquee_retention_pass(
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
    v_tokens bigint := 0;
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
        -- Retired push-to-start tokens, a slice per transaction (found by push_to_start_retired). Those APNs refused
        -- while the tenant's current credential has been in place (BadDeviceToken, DeviceTokenNotForTopic: a wrong
        -- environment or bundle ID) are kept, however old: correcting the credential brings them back (0077).
        LOOP
            DELETE FROM push_to_start_tokens
            WHERE (tenant_id, device_token, activity_type, token) IN (
                SELECT t.tenant_id, t.device_token, t.activity_type, t.token FROM push_to_start_tokens t
                WHERE t.status = 'retired' AND t.retired_at < v_cutoff::timestamptz
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
    INSERT INTO maintenance_runs (job, ran_at, summary) VALUES ('retention', p_now, p_summary)
    ON CONFLICT (job) DO UPDATE SET ran_at = EXCLUDED.ran_at, summary = EXCLUDED.summary;
    COMMIT;
    PERFORM marquee_retention_release();
END;
$$;

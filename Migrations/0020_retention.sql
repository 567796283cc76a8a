-- Retention (issue 14): lifecycle events and delivery metrics are kept MARQUEE_RETENTION_DAYS, then dropped a whole
-- day partition at a time (never a mass DELETE); instances are purged once expired or ended past the same
-- retention. The worker pool calls marquee_apply_retention once an hour; the function itself makes it once a day and
-- one worker at a time.
--
-- Partitioning by day uses the server's receive time (received_at / recorded_at), never a time a client reported:
-- a client's clock picks no partition. Day partitions are named <table>_YYYYMMDD and created ahead; a DEFAULT
-- partition catches a row whose day has no partition yet (the workers were down for longer than the days created
-- ahead), and retention deletes its old rows, which are few by construction.

-- The day partition of p_parent that holds p_day, created if missing, protected like its parent (row-level
-- security forced, the same policies and grants). Runs as the owner (SECURITY DEFINER) because DDL needs
-- ownership: the worker's marquee_system may call it, with nothing else than the name of a table it already may use.
CREATE FUNCTION marquee_ensure_day_partition(p_parent regclass, p_day date) RETURNS boolean
LANGUAGE plpgsql VOLATILE SECURITY DEFINER SET search_path = public, pg_temp AS $$
DECLARE
    v_name text := format('%s_%s', p_parent::text, to_char(p_day, 'YYYYMMDD'));
BEGIN
    IF to_regclass(v_name) IS NOT NULL THEN
        RETURN false;
    END IF;
    BEGIN
        EXECUTE format('CREATE TABLE %I PARTITION OF %s FOR VALUES FROM (%L) TO (%L)',
                       v_name, p_parent, p_day::timestamptz, (p_day + 1)::timestamptz);
    EXCEPTION
        -- The DEFAULT partition already holds rows of that day (the workers were down): they stay there, and
        -- retention deletes them when their day is old enough. Two workers racing is harmless too.
        WHEN check_violation OR duplicate_table OR unique_violation THEN
            RETURN false;
    END;
    PERFORM marquee_protect_tenant_table(v_name::regclass);
    RETURN true;
END;
$$;
REVOKE ALL ON FUNCTION marquee_ensure_day_partition(regclass, date) FROM PUBLIC;

-- Drops every day partition of p_parent whose whole day is before p_cutoff. Returns how many it dropped.
CREATE FUNCTION marquee_drop_day_partitions_before(p_parent regclass, p_cutoff date) RETURNS integer
LANGUAGE plpgsql VOLATILE SECURITY DEFINER SET search_path = public, pg_temp AS $$
DECLARE
    v_partition regclass;
    v_dropped integer := 0;
BEGIN
    FOR v_partition IN
        SELECT i.inhrelid::regclass FROM pg_inherits i
        JOIN pg_class c ON c.oid = i.inhrelid
        WHERE i.inhparent = p_parent
          AND c.relname ~ '_[0-9]{8}$'
          AND to_date(right(c.relname, 8), 'YYYYMMDD') + 1 <= p_cutoff
        ORDER BY c.relname
    LOOP
        EXECUTE format('DROP TABLE %s', v_partition);
        v_dropped := v_dropped + 1;
    END LOOP;
    -- The DEFAULT partition's old rows are deleted by the caller (marquee_apply_retention, as marquee_system): the
    -- owner sees no tenant row under FORCE row-level security.
    RETURN v_dropped;
END;
$$;
REVOKE ALL ON FUNCTION marquee_drop_day_partitions_before(regclass, date) FROM PUBLIC;

-- Lifecycle events, partitioned by the day they were received.
ALTER TABLE activity_events RENAME TO activity_events_unpartitioned;
ALTER INDEX activity_events_instance RENAME TO activity_events_unpartitioned_instance;
ALTER TABLE activity_events_unpartitioned RENAME CONSTRAINT activity_events_pkey TO activity_events_unpartitioned_pkey;
CREATE TABLE activity_events (
    tenant_id uuid NOT NULL REFERENCES tenants (id) ON DELETE CASCADE,
    id uuid NOT NULL,
    instance_id text NOT NULL,
    device_token text,
    event text NOT NULL,
    at timestamptz NOT NULL,
    content_state jsonb,
    received_at timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (tenant_id, id, received_at)
) PARTITION BY RANGE (received_at);
CREATE INDEX activity_events_instance ON activity_events (tenant_id, instance_id, at);
CREATE TABLE activity_events_default PARTITION OF activity_events DEFAULT;

-- Delivered / opened reports, partitioned by the day they were recorded. `delivered` is kept once per (delivery,
-- recipient): a unique index of a partitioned table must hold the partition key, so the rule lives in
-- marquee_record_delivery_metric below instead.
ALTER TABLE delivery_metrics RENAME TO delivery_metrics_unpartitioned;
ALTER INDEX delivery_metrics_delivered_once RENAME TO delivery_metrics_unpartitioned_delivered_once;
ALTER INDEX delivery_metrics_delivery RENAME TO delivery_metrics_unpartitioned_delivery;
ALTER TABLE delivery_metrics_unpartitioned RENAME CONSTRAINT delivery_metrics_pkey
    TO delivery_metrics_unpartitioned_pkey;
CREATE TABLE delivery_metrics (
    tenant_id uuid NOT NULL REFERENCES tenants (id) ON DELETE CASCADE,
    id uuid NOT NULL,
    delivery_id text NOT NULL,
    metric text NOT NULL CHECK (metric IN ('delivered', 'opened')),
    recipient text NOT NULL DEFAULT '',
    at timestamptz NOT NULL DEFAULT now(),
    recorded_at timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (tenant_id, id, recorded_at)
) PARTITION BY RANGE (recorded_at);
CREATE INDEX delivery_metrics_delivery ON delivery_metrics (tenant_id, delivery_id, recipient, metric);
CREATE TABLE delivery_metrics_default PARTITION OF delivery_metrics DEFAULT;

SELECT marquee_protect_tenant_table('activity_events');
SELECT marquee_protect_tenant_table('activity_events_default');
SELECT marquee_protect_tenant_table('delivery_metrics');
SELECT marquee_protect_tenant_table('delivery_metrics_default');

-- Yesterday to a week ahead; the workers keep it so.
SELECT marquee_ensure_day_partition(t, current_date + d)
FROM unnest(ARRAY['activity_events', 'delivery_metrics']::regclass[]) AS t, generate_series(-1, 7) AS d;

-- The rows so far move over (older days land in the DEFAULT partition). The owner sees no tenant row under FORCE
-- row-level security: marquee_system moves them.
SET LOCAL ROLE marquee_system;
INSERT INTO activity_events (tenant_id, id, instance_id, device_token, event, at, content_state, received_at)
SELECT tenant_id, id, instance_id, device_token, event, at, content_state, received_at
FROM activity_events_unpartitioned;
INSERT INTO delivery_metrics (tenant_id, id, delivery_id, metric, recipient, at, recorded_at)
SELECT tenant_id, id, delivery_id, metric, recipient, at, at FROM delivery_metrics_unpartitioned;
RESET ROLE;
DROP TABLE activity_events_unpartitioned;
DROP TABLE delivery_metrics_unpartitioned;

-- Records a delivered/opened report; `delivered` once per (delivery, recipient), whichever partition holds the first
-- one. Returns whether a row was written. Two reports of one delivery meet at a transaction-scoped advisory lock; the
-- check after it sees the other's committed row (each statement of a VOLATILE plpgsql function takes a new
-- snapshot).
CREATE FUNCTION marquee_record_delivery_metric(
    p_tenant uuid, p_delivery text, p_metric text, p_recipient text, p_at timestamptz
) RETURNS boolean
LANGUAGE plpgsql VOLATILE SECURITY INVOKER AS $$
BEGIN
    IF p_metric = 'delivered' THEN
        PERFORM pg_advisory_xact_lock(hashtextextended(format('delivered/%s/%s/%s', p_tenant, p_delivery,
                                                              p_recipient), 0));
        IF EXISTS (SELECT 1 FROM delivery_metrics
                   WHERE tenant_id = p_tenant AND delivery_id = p_delivery AND recipient = p_recipient
                     AND metric = 'delivered') THEN
            RETURN false;
        END IF;
    END IF;
    INSERT INTO delivery_metrics (tenant_id, id, delivery_id, metric, recipient, at)
    VALUES (p_tenant, gen_random_uuid(), p_delivery, p_metric, p_recipient, COALESCE(p_at, now()));
    RETURN true;
END;
$$;
GRANT EXECUTE ON FUNCTION marquee_record_delivery_metric(uuid, text, text, text, timestamptz)
    TO marquee_api, marquee_system;

-- Instances leave once expired or ended past the retention (their deliveries and device states go with them).
CREATE INDEX instances_retention ON instances (LEAST(expires_at, ended_at));

-- When each maintenance job last ran (not tenant data).
CREATE TABLE maintenance_runs (
    job text PRIMARY KEY,
    ran_at timestamptz NOT NULL,
    summary jsonb NOT NULL
);
GRANT SELECT, INSERT, UPDATE ON maintenance_runs TO marquee_system;

-- Tables kept by day partitions. A later migration that partitions another table by day adds it here.
CREATE FUNCTION marquee_day_partitioned_tables() RETURNS regclass[]
LANGUAGE sql IMMUTABLE AS $$
    SELECT ARRAY['activity_events', 'delivery_metrics']::regclass[];
$$;

-- The daily retention pass, as marquee_system (the worker's role), at p_now (a parameter so that tests can move the
-- clock). Returns its summary, or NULL when another worker holds the job or it already ran on p_now's day.
-- p_keep_days <= 0 keeps everything (partitions are still created ahead).
CREATE FUNCTION marquee_apply_retention(p_now timestamptz, p_keep_days integer) RETURNS jsonb
LANGUAGE plpgsql VOLATILE SECURITY INVOKER AS $$
DECLARE
    v_today date := (p_now AT TIME ZONE 'UTC')::date;
    v_cutoff date := v_today - GREATEST(p_keep_days, 0);
    v_table regclass;
    v_created integer := 0;
    v_dropped integer := 0;
    v_default_rows bigint := 0;
    v_rows bigint;
    v_instances bigint := 0;
    v_summary jsonb;
BEGIN
    IF NOT pg_try_advisory_xact_lock(hashtextextended('marquee/retention', 0)) THEN
        RETURN NULL;
    END IF;
    IF EXISTS (SELECT 1 FROM maintenance_runs
               WHERE job = 'retention' AND (ran_at AT TIME ZONE 'UTC')::date = v_today) THEN
        RETURN NULL;
    END IF;
    FOREACH v_table IN ARRAY marquee_day_partitioned_tables() LOOP
        SELECT v_created + count(*) FILTER (WHERE marquee_ensure_day_partition(v_table, v_today + d))
        INTO v_created FROM generate_series(-1, 7) AS d;
        IF p_keep_days > 0 THEN
            v_dropped := v_dropped + marquee_drop_day_partitions_before(v_table, v_cutoff);
            EXECUTE format('DELETE FROM %s WHERE %I < %L',
                           v_table::text || '_default',
                           (SELECT a.attname FROM pg_partitioned_table p
                            JOIN pg_attribute a ON a.attrelid = p.partrelid AND a.attnum = p.partattrs[0]
                            WHERE p.partrelid = v_table),
                           v_cutoff::timestamptz);
            GET DIAGNOSTICS v_rows = ROW_COUNT;
            v_default_rows := v_default_rows + v_rows;
        END IF;
    END LOOP;
    IF p_keep_days > 0 THEN
        -- In slices, so that no single statement holds many row locks.
        LOOP
            DELETE FROM instances
            WHERE (tenant_id, id) IN (SELECT tenant_id, id FROM instances
                                      WHERE LEAST(expires_at, ended_at) < v_cutoff::timestamptz LIMIT 5000);
            GET DIAGNOSTICS v_rows = ROW_COUNT;
            v_instances := v_instances + v_rows;
            EXIT WHEN v_rows < 5000;
        END LOOP;
    END IF;
    v_summary := jsonb_build_object('cutoff', v_cutoff, 'partitions_created', v_created,
                                    'partitions_dropped', v_dropped, 'default_rows_deleted', v_default_rows,
                                    'instances_purged', v_instances);
    INSERT INTO maintenance_runs (job, ran_at, summary) VALUES ('retention', p_now, v_summary)
    ON CONFLICT (job) DO UPDATE SET ran_at = EXCLUDED.ran_at, summary = EXCLUDED.summary;
    RETURN v_summary;
END;
$$;
GRANT EXECUTE ON FUNCTION marquee_apply_retention(timestamptz, integer) TO marquee_system;
GRANT EXECUTE ON FUNCTION marquee_ensure_day_partition(regclass, date) TO marquee_system;
GRANT EXECUTE ON FUNCTION marquee_drop_day_partitions_before(regclass, date) TO marquee_system;

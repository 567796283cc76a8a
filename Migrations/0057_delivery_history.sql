-- The queue and the history part (issue 10). Until now one wide `deliveries` row carried a delivery from queued to
-- its outcome: the result rewrote it (never a HOT update: its status is in the queue indexes' predicates), left a
-- dead version in every index, and the queue's indexes grew with every push ever sent. Now:
--
-- * `delivery_queue` holds what is waiting to go out or going out now (status queued or parked), and nothing else.
--   The API and campaign runs insert into it; workers claim from it (row locks, 0055).
-- * `delivery_history` holds outcomes (sent, failed, undeliverable, superseded). It is append-only: a row is written
--   once, when its delivery leaves the queue, in the same statement that deletes it there (one multi-row statement
--   per claimed batch), and only retention (whole day partitions, by the day the outcome was recorded) or a person's
--   erasure removes it. No foreign key: nothing is checked per inserted row, and an instance's purge leaves its
--   history to the day partitions' retention.
-- * `deliveries` is a view of both, for the reads that ask about a delivery whatever its state (an instance's
--   deliveries, the console, funnels). It runs with the caller's rights (security_invoker), so row-level security
--   of both tables applies. Writers never name it.
--
-- The one home of "a delivery leaves the queue with this outcome" is marquee_history_row below: every statement that
-- retires deliveries deletes them from the queue and inserts marquee_history_row(...) of each deleted row.

ALTER TABLE deliveries RENAME TO delivery_queue;
ALTER TABLE delivery_queue RENAME CONSTRAINT deliveries_pkey TO delivery_queue_pkey;
-- Outcome-only indexes move to the history.
DROP INDEX deliveries_failures;
DROP INDEX deliveries_high_priority;

CREATE TABLE delivery_history (
    tenant_id uuid NOT NULL,
    id uuid NOT NULL,
    instance_id text NOT NULL,
    device_token text NOT NULL,
    provider text NOT NULL CHECK (provider IN ('apns', 'fcm')),
    token_kind text NOT NULL,
    token text NOT NULL,
    operation text NOT NULL CHECK (operation IN ('start', 'update', 'end')),
    instance_version integer NOT NULL,
    status text NOT NULL CHECK (status IN ('sent', 'failed', 'undeliverable', 'superseded')),
    attempts integer NOT NULL,
    provider_id text,
    http_status integer,
    reason text,
    created_at timestamptz NOT NULL,
    recorded_at timestamptz NOT NULL DEFAULT now(),
    sent_at timestamptz,
    content_timestamp bigint,
    apns_priority smallint,
    PRIMARY KEY (tenant_id, id, recorded_at)
) PARTITION BY RANGE (recorded_at);
-- An instance's deliveries (listings sort them by id), and the worker's "a newer version went to this token" check.
CREATE INDEX delivery_history_instance ON delivery_history (tenant_id, instance_id, token, id);
-- Apple's budget: high-priority pushes sent per instance in the last hour (0041).
CREATE INDEX delivery_history_high_priority ON delivery_history (tenant_id, instance_id, sent_at)
    WHERE apns_priority = 10;
-- The console's Failures screen (0051).
CREATE INDEX delivery_history_failures ON delivery_history (tenant_id, recorded_at DESC)
    WHERE status IN ('failed', 'undeliverable');
CREATE TABLE delivery_history_default PARTITION OF delivery_history DEFAULT;
SELECT marquee_protect_tenant_table('delivery_history');
SELECT marquee_protect_tenant_table('delivery_history_default');
-- Rows are written once and never changed: no role updates them.
REVOKE UPDATE ON delivery_history FROM marquee_api, marquee_system;

CREATE OR REPLACE FUNCTION marquee_day_partitioned_tables() RETURNS regclass[]
LANGUAGE sql IMMUTABLE AS $$
    SELECT ARRAY['activity_events', 'delivery_metrics', 'delivery_history']::regclass[];
$$;
SELECT marquee_ensure_day_partition('delivery_history', current_date + d) FROM generate_series(-1, 7) AS d;

-- The history row of queued delivery `q` leaving the queue with `p_status`. An attempt's result (p_attempted) counts
-- the attempt and takes its provider ID, HTTP status and reason; any other outcome (superseded, failed without an
-- attempt) keeps what the last attempt recorded, with p_reason when given.
CREATE FUNCTION marquee_history_row(
    q delivery_queue, p_status text, p_attempted boolean DEFAULT false, p_provider_id text DEFAULT NULL,
    p_http_status integer DEFAULT NULL, p_reason text DEFAULT NULL, p_apns_priority smallint DEFAULT NULL
) RETURNS delivery_history
LANGUAGE sql STABLE AS $$
    SELECT q.tenant_id, q.id, q.instance_id, q.device_token, q.provider, q.token_kind, q.token, q.operation,
           q.instance_version, p_status,
           q.attempts + CASE WHEN p_attempted THEN 1 ELSE 0 END,
           COALESCE(p_provider_id, q.provider_id),
           CASE WHEN p_attempted THEN p_http_status ELSE q.http_status END,
           CASE WHEN p_attempted THEN p_reason ELSE COALESCE(p_reason, q.reason) END,
           q.created_at, now(),
           CASE WHEN p_status = 'sent' THEN now() END,
           q.content_timestamp, COALESCE(p_apns_priority, q.apns_priority)
$$;
GRANT EXECUTE ON FUNCTION marquee_history_row(delivery_queue, text, boolean, text, integer, text, smallint)
    TO marquee_api, marquee_system;

-- The outcomes recorded so far move over (older days land in the DEFAULT partition). The owner sees no tenant row
-- under FORCE row-level security: marquee_system moves them.
SET LOCAL ROLE marquee_system;
WITH gone AS (
    DELETE FROM delivery_queue q WHERE q.status NOT IN ('queued', 'parked') RETURNING q
)
INSERT INTO delivery_history
SELECT (g.q).tenant_id, (g.q).id, (g.q).instance_id, (g.q).device_token, (g.q).provider, (g.q).token_kind,
       (g.q).token, (g.q).operation, (g.q).instance_version, (g.q).status, (g.q).attempts, (g.q).provider_id,
       (g.q).http_status, (g.q).reason, (g.q).created_at, (g.q).updated_at, (g.q).sent_at, (g.q).content_timestamp,
       (g.q).apns_priority
FROM gone g;
RESET ROLE;
ALTER TABLE delivery_queue DROP CONSTRAINT deliveries_status_check;
ALTER TABLE delivery_queue ADD CONSTRAINT delivery_queue_status_check CHECK (status IN ('queued', 'parked'));

CREATE VIEW deliveries WITH (security_invoker = true) AS
    SELECT tenant_id, id, instance_id, device_token, provider, token_kind, token, operation, instance_version,
           status, attempts, next_attempt_at, provider_id, http_status, reason, created_at, updated_at, sent_at,
           attributes, content_state, options, content_timestamp, apns_priority
    FROM delivery_queue
    UNION ALL
    SELECT tenant_id, id, instance_id, device_token, provider, token_kind, token, operation, instance_version,
           status, attempts, recorded_at, provider_id, http_status, reason, created_at, recorded_at, sent_at,
           NULL::jsonb, NULL::jsonb, NULL::jsonb, content_timestamp, apns_priority
    FROM delivery_history;
GRANT SELECT ON deliveries TO marquee_api, marquee_system;

-- Functions that wrote `deliveries` write the queue now.
CREATE OR REPLACE FUNCTION marquee_delivery_in_flight(p_tenant uuid, p_id uuid) RETURNS boolean
LANGUAGE sql VOLATILE AS $$
    SELECT NOT EXISTS (
        SELECT 1 FROM delivery_queue d WHERE d.tenant_id = p_tenant AND d.id = p_id
        FOR KEY SHARE SKIP LOCKED)
$$;

CREATE OR REPLACE FUNCTION marquee_credential_status_changed() RETURNS trigger
LANGUAGE plpgsql AS $$
DECLARE
    v_provider text := CASE TG_TABLE_NAME WHEN 'apns_credentials' THEN 'apns' ELSE 'fcm' END;
    v_unparked integer;
BEGIN
    IF NEW.status = 'broken' THEN
        UPDATE delivery_queue d SET status = 'parked', updated_at = now()
        WHERE d.tenant_id = NEW.tenant_id AND d.id IN (
            SELECT q.id FROM delivery_queue q
            WHERE q.tenant_id = NEW.tenant_id AND q.provider = v_provider AND q.status = 'queued'
            FOR NO KEY UPDATE SKIP LOCKED);
    ELSE
        WITH gone AS (
            DELETE FROM delivery_queue d USING instances i
            WHERE d.tenant_id = NEW.tenant_id AND d.provider = v_provider AND d.status = 'parked'
              AND i.tenant_id = d.tenant_id AND i.id = d.instance_id AND i.expires_at <= now()
            RETURNING d
        )
        INSERT INTO delivery_history SELECT h.* FROM gone, marquee_history_row(gone.d, 'failed',
                                                                                p_reason => 'instance_expired') h;
        UPDATE delivery_queue d SET status = 'queued', next_attempt_at = now(), updated_at = now()
        WHERE d.tenant_id = NEW.tenant_id AND d.provider = v_provider AND d.status = 'parked';
        GET DIAGNOSTICS v_unparked = ROW_COUNT;
        IF v_unparked > 0 THEN
            PERFORM pg_notify('marquee_deliveries', '');
        END IF;
    END IF;
    RETURN NULL;
END;
$$;

CREATE OR REPLACE FUNCTION marquee_refresh_queue_statistics() RETURNS boolean
LANGUAGE plpgsql SECURITY DEFINER SET search_path = public, pg_temp AS $$
DECLARE
    v_changed bigint;
    v_live bigint;
BEGIN
    SELECT n_mod_since_analyze, n_live_tup INTO v_changed, v_live
    FROM pg_stat_user_tables WHERE relid = 'delivery_queue'::regclass;
    IF v_changed IS NULL OR v_changed < GREATEST(1000, v_live / 5) THEN
        RETURN false;
    END IF;
    -- Another worker is already at it.
    IF NOT pg_try_advisory_xact_lock(hashtextextended('marquee_refresh_queue_statistics', 0)) THEN
        RETURN false;
    END IF;
    ANALYZE delivery_queue;
    RETURN true;
END;
$$;

-- Queues the end an instance kept for its activity token (0049) into the queue.
CREATE OR REPLACE FUNCTION marquee_register_activity_token(p_tenant uuid, p_instance text, p_device text, p_token text)
RETURNS TABLE(outcome text, rotated boolean, inserted boolean)
LANGUAGE plpgsql SET enable_seqscan = off AS $$
DECLARE
    v_retired integer;
    v_inserted boolean;
    v_queued integer;
BEGIN
    PERFORM marquee_enter_tenant(p_tenant);
    PERFORM 1 FROM devices d WHERE d.tenant_id = p_tenant AND d.token = p_device FOR UPDATE;
    IF NOT FOUND THEN
        RETURN QUERY SELECT 'no_device'::text, false, false;
        RETURN;
    END IF;
    UPDATE activity_tokens t
    SET status = 'retired', retired_reason = 'rotated', retired_at = now()
    WHERE t.tenant_id = p_tenant AND t.instance_id = p_instance AND t.device_token = p_device
      AND t.status = 'active' AND t.token <> p_token;
    GET DIAGNOSTICS v_retired = ROW_COUNT;
    INSERT INTO activity_tokens AS t (tenant_id, instance_id, device_token, token)
    VALUES (p_tenant, p_instance, p_device, p_token)
    ON CONFLICT (tenant_id, instance_id, device_token, token) DO UPDATE SET
        status = 'active', retired_reason = NULL, retired_at = NULL
    RETURNING (t.xmax = 0) INTO v_inserted;
    INSERT INTO delivery_queue (tenant_id, id, instance_id, device_token, provider, token_kind, token, operation,
                            instance_version, attributes, content_state, options, content_timestamp)
    SELECT i.tenant_id, marquee_ulid_uuid(), i.id, p_device, 'apns', 'activity', p_token, 'end', i.version,
           i.attributes, i.content_state, i.options, i.content_timestamp
    FROM instances i
    WHERE i.tenant_id = p_tenant AND i.id = p_instance AND i.state = 'ended' AND i.pending_end
      AND i.expires_at > now()
      AND NOT EXISTS (
          SELECT 1 FROM deliveries o
          WHERE o.tenant_id = i.tenant_id AND o.instance_id = i.id AND o.token = p_token AND o.operation = 'end');
    GET DIAGNOSTICS v_queued = ROW_COUNT;
    IF v_queued > 0 THEN
        PERFORM pg_notify('marquee_deliveries', '');
    END IF;
    RETURN QUERY SELECT 'ok'::text, v_retired > 0, v_inserted;
END;
$$;


-- Two fixes to the queue of 0057, found with pg_stat_statements and EXPLAIN in bench/fanout.
--
-- 1. The queue's statistics refresh (0047, 0057) analyses the queue when it has grown well past what the planner last
-- saw, not whenever a fifth of it changed. A draining queue changes by a fifth of itself every few batches (results
-- rewrote rows before 0057, delete them since): a 100,000-push fan-out ran ANALYZE 25 times in 9 s (100-116 ms
-- each, a fifth of the database's CPU in bench/fanout). What the refresh is for is a burst that the planner believes is an empty or small
-- queue; a shrinking queue planned as a bigger one costs nothing (claims are index scans either way). So: at least
-- 1,000 rows changed, and at least 1,000 live rows and twice the row count of the last analysis (pg_class.reltuples,
-- -1 before the first).
CREATE OR REPLACE FUNCTION marquee_refresh_queue_statistics() RETURNS boolean
LANGUAGE plpgsql VOLATILE SECURITY DEFINER SET search_path = public, pg_temp AS $$
DECLARE
    v_changed bigint;
    v_live bigint;
    v_planned real;
BEGIN
    SELECT s.n_mod_since_analyze, s.n_live_tup, c.reltuples INTO v_changed, v_live, v_planned
    FROM pg_stat_user_tables s JOIN pg_class c ON c.oid = s.relid
    WHERE s.relid = 'delivery_queue'::regclass;
    IF v_changed IS NULL OR v_changed < 1000 OR v_live < GREATEST(1000, 2 * v_planned) THEN
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

-- 2. marquee_history_row returns SETOF: a set-returning SQL function in FROM is inlined into the statement that calls
-- it (one row per deleted queue row, no function call per row: 7 us a row as a plain composite-returning function).
DROP FUNCTION marquee_history_row(delivery_queue, text, boolean, text, integer, text, smallint);
CREATE FUNCTION marquee_history_row(
    q delivery_queue, p_status text, p_attempted boolean DEFAULT false, p_provider_id text DEFAULT NULL,
    p_http_status integer DEFAULT NULL, p_reason text DEFAULT NULL, p_apns_priority smallint DEFAULT NULL
) RETURNS SETOF delivery_history
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

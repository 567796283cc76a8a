-- Fresh statistics for the queue (issue 10). A burst of enqueued deliveries (a fan-out, a campaign, a backlog after
-- an outage) leaves the planner believing a tenant or an instance has a handful of queued rows until autovacuum
-- analyses the table, up to a minute later (autovacuum_naptime) and only after 10% of it changed. Meanwhile the
-- claim's ordering check can be planned on an index that matches only the tenant or the instance, and scans every
-- row of it per claimed delivery (a backlog of 20,000 on one instance: 3.6 s per claim of 256). The workers call
-- this every second: it analyses `deliveries` once a fifth of it (at least 1,000 rows) changed since the last
-- analysis, one worker at a time. ANALYZE needs the owner, hence SECURITY DEFINER; it takes no lock that blocks
-- reads or writes.
CREATE FUNCTION marquee_refresh_queue_statistics() RETURNS boolean
LANGUAGE plpgsql VOLATILE SECURITY DEFINER SET search_path = public, pg_temp AS $$
DECLARE
    v_changed bigint;
    v_live bigint;
BEGIN
    SELECT n_mod_since_analyze, n_live_tup INTO v_changed, v_live
    FROM pg_stat_user_tables WHERE relid = 'deliveries'::regclass;
    IF v_changed IS NULL OR v_changed < GREATEST(1000, v_live / 5) THEN
        RETURN false;
    END IF;
    -- Another worker is already at it.
    IF NOT pg_try_advisory_xact_lock(hashtextextended('marquee_refresh_queue_statistics', 0)) THEN
        RETURN false;
    END IF;
    ANALYZE deliveries;
    RETURN true;
END;
$$;
REVOKE ALL ON FUNCTION marquee_refresh_queue_statistics() FROM PUBLIC;
GRANT EXECUTE ON FUNCTION marquee_refresh_queue_statistics() TO marquee_system;


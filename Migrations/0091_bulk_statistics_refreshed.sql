-- Fresh statistics for a campaign's steps, by the queue's rule (0058), which now has one home for every table.
--
-- A campaign-wide change reads the tables the minutes before it filled: 100,000 activity tokens registered by the
-- apps after a start, 100,000 start pushes recorded in today's history partition. Autovacuum analyses a table up to a
-- minute later (autovacuum_naptime), so a change called soon after ran on statistics taken while those tables were
-- nearly empty, and the planner read "a handful of rows": a step's targets (marquee_instance_targets) scanned the
-- tenant's tokens by `tenant_id` alone and tested each against the step's 10,000 instance IDs (`= ANY`, a linear
-- search), 10^9 comparisons; an end's token check (marquee_ends_waiting_for_token) did the same on the history
-- partition. bench/campaign's update took 20-22 s instead of 9 (one step 13.2 s, auto_explain) in three runs of four
-- when the tokens' autoanalyze came after the call, and 5.6 s instead of 1.6 s for 20,000 people with autovacuum off.
--
-- marquee_refresh_statistics analyses each of the given tables (a partitioned one: its partitions) that has grown to
-- at least twice what the planner believes (and by at least 1,000 rows) since it was last analysed, one caller at a
-- time per table; it returns how many it analysed. The check is a read of pg_stat_user_tables; ANALYZE needs the
-- owner, hence SECURITY DEFINER, and takes no lock that blocks reads or writes. marquee_refresh_queue_statistics
-- (the claims') is now this rule applied to the queue.
CREATE FUNCTION marquee_refresh_statistics(p_tables regclass[]) RETURNS integer
LANGUAGE plpgsql VOLATILE SECURITY DEFINER SET search_path = public, pg_temp AS $$
DECLARE
    t regclass;
    v_analysed integer := 0;
BEGIN
    FOR t IN
        SELECT s.relid::regclass
        FROM pg_stat_user_tables s JOIN pg_class c ON c.oid = s.relid
        -- The tables, and the partitions of those that are partitioned (pg_partition_tree lists none for a plain one).
        WHERE s.relid IN (SELECT x.rel FROM unnest(p_tables) AS x(rel)
                          UNION ALL
                          SELECT p.relid FROM unnest(p_tables) AS x(rel), pg_partition_tree(x.rel) p WHERE p.isleaf)
          AND s.n_mod_since_analyze >= 1000 AND s.n_live_tup >= GREATEST(1000, 2 * c.reltuples)
    LOOP
        -- Another caller is already at it.
        CONTINUE WHEN NOT pg_try_advisory_xact_lock(hashtextextended('marquee_refresh_statistics', t::oid::bigint));
        EXECUTE format('ANALYZE %s', t);
        v_analysed := v_analysed + 1;
    END LOOP;
    RETURN v_analysed;
END;
$$;
REVOKE ALL ON FUNCTION marquee_refresh_statistics(regclass[]) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION marquee_refresh_statistics(regclass[]) TO marquee_system;

CREATE OR REPLACE FUNCTION marquee_refresh_queue_statistics() RETURNS boolean
LANGUAGE sql VOLATILE SECURITY DEFINER SET search_path = public, pg_temp AS $$
    SELECT marquee_refresh_statistics(ARRAY['delivery_queue'::regclass]) > 0
$$;

-- Statistics for the API's reads after a burst, refreshed by the workers' tick.
--
-- The API's group commit reads each group's instances and their targets by `= ANY` over the group's IDs (up to 64).
-- Planned on statistics taken while a table was (nearly) empty, with no statistics on its columns, the planner
-- guesses a column's selectivity from defaults and may walk the whole tenant per statement: here, after 100,000
-- activity tokens registered behind an ANALYZE of an empty table, one group's marquee_instance_targets took 419 ms
-- (1.5 ms once analysed), and a read of 64 instances among 100,000 started the same way 61–94 ms. Autovacuum's
-- analysis comes up to a minute later (autovacuum_naptime): a product team starting 100,000 activities, or its apps
-- registering their tokens, then updating them would have waited that minute at a few groups a second. Migration 0091
-- covered campaign-wide changes (their steps refresh the tables they read); the workers' once-a-second tick now
-- covers the API too.
--
-- The tick asks a tenth of the growth a change's step asks (the ten-fold, not the two-fold, of what the planner
-- believes, and at least 1,000 rows): once a table has statistics from a thousand rows, its columns' estimates scale
-- with its size (a unique column stays unique, a tenant's share stays its share), and what goes wrong is a table
-- analysed near empty. A start of 100,000 then analyses its instances twice (at ~10,000 and ~100,000), not at every
-- doubling (an analysis of 100,000 instances: ~210 ms here).
-- Dropped, not replaced: a second signature beside the old one would make one-argument calls ambiguous.
DROP FUNCTION marquee_refresh_statistics(regclass[]);
CREATE FUNCTION marquee_refresh_statistics(p_tables regclass[], p_growth real DEFAULT 2) RETURNS integer
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
          AND s.n_mod_since_analyze >= 1000 AND s.n_live_tup >= GREATEST(1000, p_growth * c.reltuples)
    LOOP
        -- Another caller is already at it.
        CONTINUE WHEN NOT pg_try_advisory_xact_lock(hashtextextended('marquee_refresh_statistics', t::oid::bigint));
        EXECUTE format('ANALYZE %s', t);
        v_analysed := v_analysed + 1;
    END LOOP;
    RETURN v_analysed;
END;
$$;
REVOKE ALL ON FUNCTION marquee_refresh_statistics(regclass[], real) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION marquee_refresh_statistics(regclass[], real) TO marquee_system;

-- marquee_refresh_queue_statistics (0091) is unchanged: its SQL body names the function by its name, resolved when it
-- runs, and the growth's default keeps its rule.

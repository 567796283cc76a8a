-- The two functions that make and drop day partitions run as the schema's owner (SECURITY DEFINER, migration 0020):
-- DDL needs ownership. They took any table, and the workers' and the API's login role may call them through
-- marquee_system: a mistake or an injection in either could have created partitions of, or dropped the day
-- partitions of, any partitioned table, past every privilege and row-level security. Now they refuse a table that is
-- not one of marquee_day_partitioned_tables(), the list retention keeps. Bodies otherwise as in 0020.
CREATE OR REPLACE FUNCTION marquee_ensure_day_partition(p_parent regclass, p_day date) RETURNS boolean
LANGUAGE plpgsql VOLATILE SECURITY DEFINER SET search_path = public, pg_temp AS $$
DECLARE
    v_name text := format('%s_%s', p_parent::text, to_char(p_day, 'YYYYMMDD'));
BEGIN
    IF NOT p_parent = ANY (marquee_day_partitioned_tables()) THEN
        RAISE EXCEPTION 'marquee: % is not a table kept by day partitions', p_parent
            USING ERRCODE = 'insufficient_privilege';
    END IF;
    IF to_regclass(v_name) IS NOT NULL THEN
        RETURN false;
    END IF;
    BEGIN
        EXECUTE format('CREATE TABLE %I PARTITION OF %s FOR VALUES FROM (%L) TO (%L)',
                       v_name, p_parent, p_day::timestamptz, (p_day + 1)::timestamptz);
    EXCEPTION
        WHEN check_violation OR duplicate_table OR unique_violation THEN
            RETURN false;
    END;
    PERFORM marquee_protect_tenant_table(v_name::regclass);
    RETURN true;
END;
$$;

CREATE OR REPLACE FUNCTION marquee_drop_day_partitions_before(p_parent regclass, p_cutoff date) RETURNS integer
LANGUAGE plpgsql VOLATILE SECURITY DEFINER SET search_path = public, pg_temp AS $$
DECLARE
    v_partition regclass;
    v_dropped integer := 0;
BEGIN
    IF NOT p_parent = ANY (marquee_day_partitioned_tables()) THEN
        RAISE EXCEPTION 'marquee: % is not a table kept by day partitions', p_parent
            USING ERRCODE = 'insufficient_privilege';
    END IF;
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
    RETURN v_dropped;
END;
$$;

-- Delivery history's partitions take no UPDATE either: history is never changed, through any name.
--
-- 0057 revoked UPDATE on delivery_history (rows are written once and never changed), on the parent only, while
-- marquee_protect_tenant_table (0010) grants SELECT, INSERT, UPDATE and DELETE on every table it protects:
-- delivery_history_default and each day partition made by marquee_ensure_day_partition (0080) let marquee_api and
-- marquee_system update history rows by the partition's own name. The rule stays where 0057 put it, on the parent: a
-- day-partitioned table's partition holds no privilege its parent withholds from those roles, for the partitions
-- already there (below) and for those made from now on (marquee_ensure_day_partition, replaced whole from 0080 with
-- the one call added).

-- Revokes from marquee_api and marquee_system on p_partition each table privilege they do not have on p_parent.
-- Called as the owner (the migration, or marquee_ensure_day_partition), who owns both.
CREATE FUNCTION marquee_withhold_parent_privileges(p_partition regclass, p_parent regclass) RETURNS void
LANGUAGE plpgsql VOLATILE SET search_path = public, pg_temp AS $$
DECLARE
    v_role text;
    v_privilege text;
BEGIN
    FOREACH v_role IN ARRAY ARRAY['marquee_api', 'marquee_system'] LOOP
        FOREACH v_privilege IN ARRAY ARRAY['SELECT', 'INSERT', 'UPDATE', 'DELETE'] LOOP
            IF NOT has_table_privilege(v_role, p_parent, v_privilege)
               AND has_table_privilege(v_role, p_partition, v_privilege) THEN
                EXECUTE format('REVOKE %s ON %s FROM %I', v_privilege, p_partition, v_role);
            END IF;
        END LOOP;
    END LOOP;
END;
$$;
REVOKE ALL ON FUNCTION marquee_withhold_parent_privileges(regclass, regclass) FROM PUBLIC;

-- The day partition of p_parent that holds p_day, created if missing, protected like its parent and given no more
-- than its parent gives. Created and then attached (0080); otherwise as in 0020, for its tables only.
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
    PERFORM marquee_withhold_parent_privileges(v_name::regclass, p_parent);
    RETURN true;
END;
$$;

SELECT marquee_withhold_parent_privileges(i.inhrelid::regclass, i.inhparent::regclass)
FROM pg_inherits i
WHERE i.inhparent = ANY (marquee_day_partitioned_tables());

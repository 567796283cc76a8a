-- A queued delivery's credential check, once per (tenant, provider) of a statement as migration 0069 meant it.
--
-- 0069's statement trigger asks whether a credential is broken over the DISTINCT (tenant, provider) pairs of the new
-- rows. The planner may push a condition on a DISTINCT subquery's columns down into it, and did: `auto_explain` of a
-- campaign start's step (bench/campaign, 10,000 queue rows) showed marquee_credential_broken as a filter on the scan
-- of the transition table, called for each of the 10,000 rows, 385 ms of the step, before the DISTINCT. OFFSET 0 makes
-- the pairs a row set of their own; the park's UPDATE, which asked again for every new row, joins the broken pairs,
-- asked once each. Same rule, same answers.
CREATE OR REPLACE FUNCTION marquee_queue_rows_added() RETURNS trigger
LANGUAGE plpgsql VOLATILE SECURITY INVOKER SET enable_nestloop = on SET enable_seqscan = off AS $$
DECLARE
    v_me xid := pg_current_xact_id()::xid;
    v_wanted bigint;
    v_found bigint;
    v_others bigint;
    v_locked bigint := 0;
    v_missing record;
BEGIN
    SELECT count(*), count(i.id), count(*) FILTER (WHERE i.xmin <> v_me)
    INTO v_wanted, v_found, v_others
    FROM (SELECT DISTINCT tenant_id, instance_id FROM new_rows) n
    LEFT JOIN instances i ON i.tenant_id = n.tenant_id AND i.id = n.instance_id;
    IF v_others > 0 THEN
        SELECT count(*) INTO v_locked FROM (
            SELECT 1 FROM instances i
            WHERE (i.tenant_id, i.id) IN (SELECT tenant_id, instance_id FROM new_rows) AND i.xmin <> v_me
            FOR KEY SHARE OF i) l;
    END IF;
    IF v_found < v_wanted OR v_locked < v_others THEN
        SELECT n.tenant_id, n.instance_id INTO v_missing FROM new_rows n
        WHERE NOT EXISTS (SELECT 1 FROM instances i WHERE i.tenant_id = n.tenant_id AND i.id = n.instance_id)
        LIMIT 1;
        PERFORM marquee_missing_parent('deliveries_tenant_id_instance_id_fkey', TG_TABLE_NAME, 'instances',
                                       format('(tenant_id, instance_id)=(%s, %s)', v_missing.tenant_id,
                                              v_missing.instance_id));
    END IF;
    -- OFFSET 0 keeps each (tenant, provider) pair a row of its own, asked once: without it the planner pushed the
    -- question below the DISTINCT, into the scan of the new rows.
    IF EXISTS (SELECT 1 FROM (SELECT DISTINCT tenant_id, provider FROM new_rows WHERE status = 'queued' OFFSET 0) n
               WHERE marquee_credential_broken(n.tenant_id, n.provider)) THEN
        UPDATE delivery_queue d SET status = 'parked'
        FROM new_rows n
        JOIN (SELECT b.tenant_id, b.provider
              FROM (SELECT DISTINCT tenant_id, provider FROM new_rows WHERE status = 'queued' OFFSET 0) b
              WHERE marquee_credential_broken(b.tenant_id, b.provider)) broken
          ON broken.tenant_id = n.tenant_id AND broken.provider = n.provider
        WHERE d.tenant_id = n.tenant_id AND d.id = n.id AND d.status = 'queued';
    END IF;
    RETURN NULL;
END;
$$;

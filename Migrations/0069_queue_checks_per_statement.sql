-- The two checks every queued delivery paid for on its own, made once per statement.
--
-- Each row inserted into delivery_queue ran two triggers: deliveries_park_when_broken (PL/pgSQL, BEFORE INSERT: is
-- the tenant's credential for this provider broken?) and the foreign key to instances (a query per row that looks the
-- instance up and locks it KEY SHARE). Measured on bench/campaign's database (100,000 instances, psql, EXPLAIN
-- ANALYZE of 10,000 queue rows inserted for instances the same transaction had updated, as a campaign-wide change
-- and the API's writes do): the park trigger 98–154 ms, the foreign key 78–122 ms, the statement 338–569 ms in all;
-- with the statement-level trigger below instead, 220–342 ms. pg_stat_statements over a bench/campaign start counted
-- the two per-row queries 100,000 times each.
--
-- One AFTER INSERT trigger per statement now does both, over the statement's new rows (a transition table):
--   * Each distinct instance is looked up once. A missing one fails the statement with the foreign key's SQLSTATE
--     (23503) and constraint name, as before.
--   * An instance this transaction inserted or updated itself (its row's xmin is this transaction's ID) is not
--     locked: a concurrent delete of it already waits for this transaction, whose queued rows it then sees and
--     deletes (below). Every other instance is locked KEY SHARE, as the foreign key locked it, so that its delete
--     waits for the writer; one deleted meanwhile fails the statement. Marquee queues a delivery while it writes its
--     instance (a start inserts it, a change updates it), so the locks are mostly not needed. A row written in a
--     subtransaction carries the subtransaction's ID and is simply locked. (A row frozen long ago keeps its raw xmin,
--     which can equal a transaction ID again after 2^32 transactions: such an instance, unwritten that long, would go
--     unlocked, and only a delete of it at that very moment could leave a queued row behind.)
--   * Rows queued for a provider whose credential is broken are parked. That is one look per distinct (tenant,
--     provider), and an UPDATE only when one is broken. The rows are now written as queued and changed to parked
--     before the statement ends, so nothing outside the statement sees the difference. The statement's own RETURNING
--     still shows `queued` (none of Marquee's inserts returns the status).
-- The foreign key's parent side stays, in a trigger: an instance's delete deletes its queued deliveries (the history
-- is kept, as before). The keys on both sides are never updated by Marquee. An update that would change one fails
-- (marquee_keys_unchanged, migration 0066), so nothing needs to check it.
--
-- SECURITY INVOKER, as 0066's checks: they see what the writer sees. The API's role writes and deletes only its own
-- tenant's rows; the system role sees every tenant.

ALTER TABLE delivery_queue DROP CONSTRAINT deliveries_tenant_id_instance_id_fkey;
DROP TRIGGER deliveries_park_when_broken ON delivery_queue;
DROP FUNCTION marquee_park_new_delivery();

CREATE FUNCTION marquee_queue_rows_added() RETURNS trigger
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
    IF EXISTS (SELECT 1 FROM (SELECT DISTINCT tenant_id, provider FROM new_rows WHERE status = 'queued') n
               WHERE marquee_credential_broken(n.tenant_id, n.provider)) THEN
        UPDATE delivery_queue d SET status = 'parked'
        FROM new_rows n
        WHERE d.tenant_id = n.tenant_id AND d.id = n.id AND d.status = 'queued'
          AND marquee_credential_broken(n.tenant_id, n.provider);
    END IF;
    RETURN NULL;
END;
$$;
CREATE TRIGGER delivery_queue_added AFTER INSERT ON delivery_queue REFERENCING NEW TABLE AS new_rows
    FOR EACH STATEMENT EXECUTE FUNCTION marquee_queue_rows_added();

-- An instance's delete, after its rows are gone: a writer that held one of them (locked KEY SHARE above, or written
-- by the writer) has committed by now, and its queued rows are seen here (each statement of a function takes a new
-- snapshot).
CREATE FUNCTION marquee_instances_deleted() RETURNS trigger
LANGUAGE plpgsql VOLATILE SECURITY INVOKER SET enable_nestloop = on SET enable_seqscan = off AS $$
BEGIN
    DELETE FROM delivery_queue d
    WHERE (d.tenant_id, d.instance_id) IN (SELECT tenant_id, id FROM old_rows);
    RETURN NULL;
END;
$$;
CREATE TRIGGER instances_deleted AFTER DELETE ON instances REFERENCING OLD TABLE AS old_rows
    FOR EACH STATEMENT EXECUTE FUNCTION marquee_instances_deleted();

DROP TRIGGER keys_unchanged ON instances;
CREATE TRIGGER keys_unchanged BEFORE UPDATE OF tenant_id, id, campaign_id ON instances
    FOR EACH ROW EXECUTE FUNCTION marquee_keys_unchanged('tenant_id', 'id', 'campaign_id');
CREATE TRIGGER keys_unchanged BEFORE UPDATE OF tenant_id, instance_id ON delivery_queue
    FOR EACH ROW EXECUTE FUNCTION marquee_keys_unchanged('tenant_id', 'instance_id');

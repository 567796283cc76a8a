-- A device's queued pushes go with it.
--
-- Removing a device (DELETE /v1/people/{id}/devices/{token} with the app or the sdk key and the Customer.io "Device
-- Deleted" event, all RegistryTransaction.deleteDevice; its eviction past the person's cap, marquee_keep_recent_devices
-- of 0081, for registrations and imports; the worker's delete of an Android device FCM calls unregistered) deleted
-- its row, and its tokens and per-instance states went with it by cascade, but the pushes already queued to it stayed
-- in delivery_queue and the workers sent them: the start to its push-to-start token, updates and ends to its activity
-- tokens, everything to an Android device's FCM token. A user who had logged out, or sold the phone, still got them.
-- So did the next owner of a token registered again under another person (a device has one owner; it moves): the
-- previous owner's queued pushes reached the phone that now belongs to someone else.
--
-- Now two triggers on `devices` drop those pushes in the statement that removes or moves the device, whichever
-- statement that is (no path to a removal can forget it, and there is no second copy of the rule in Swift):
-- devices_removed after a DELETE (once per statement, over its deleted rows: an eviction of many devices is one set),
-- devices_moved after an UPDATE that changes a device's person (a row trigger whose WHEN is checked without calling
-- anything, so the usual re-registration by the same person costs nothing).
--
-- Which rows. The queue has no index by device: one on (tenant_id, device_token) would cost every enqueue an entry
-- (dropping one of the queue's indexes, migration 0064, took a 100,000-row insert from 1.2-1.3 s to 1.0-1.1 s) for a
-- lookup made only when a device goes. Every queued push belongs to an instance whose person_id is the person the device belonged to when it
-- was queued (a start plans only its person's devices, device_id included; an activity token is taken only from the
-- instance's person's devices or its target device, itself one of them), so the device's rows are found through that
-- person's instances (instances_person), and each instance's queued rows through deliveries_instance, whose key
-- starts with the instance: lookups on existing indexes, in proportion to that one person's instances. Of those rows,
-- the ones marquee_device_departed names go: after a delete, all of them; after a move, all but those of an instance
-- whose start named this very device (device_id: its target device, which the ownership rule lets keep the instance).
--
-- Held rows. A row a worker holds (claimed: locked; or still being sent past its claim: marquee_being_sent) is
-- skipped, never waited on, as the lifecycle writes, campaign changes and credential changes skip them (0055, 0074):
-- a removal does not wait for a send in flight, and that send's result is recorded by its worker as usual (once).
-- Should that result be a retry or a park, the record asks the same rule and supersedes the row instead
-- (DeliveryQueue.recordQuery), so nothing goes to the device later; only the attempt in flight at the removal may
-- still reach it (and, as with any at-least-once send, once more if its worker dies before recording it).
--
-- What is recorded. The rows leave the queue for the history as `superseded` with reason `device_removed` (through
-- marquee_history_row, as every outcome does), rather than being deleted as an erasure deletes them: the person and
-- their other devices stay, and what was queued for this device still happened. A campaign's funnel counts the
-- device as targeted and the push as superseded (deleted, it would vanish from `targeted` and `queued` alike), an
-- instance's deliveries list shows why the device got nothing, and the console's failures are not touched (a removal
-- is not a failure). An erasure still deletes everything itself (RegistryStore.deletePerson), first: the person's
-- instances are gone when its devices go, so these triggers find nothing left to record.

-- Why a queued push for p_instance to p_device (a delivery of kind p_token_kind) must not go out because of its
-- device: 'device_removed' when the device is gone or is no longer one the instance's pushes may reach
-- (marquee_device_belongs_to_instance, the one home of who may speak for an instance); NULL otherwise. A broadcast
-- goes to a channel, not to a device. The one home of the rule: the removal's triggers and the worker's record of a
-- retry or a park ask it.
CREATE FUNCTION marquee_device_departed(p_tenant uuid, p_instance text, p_device text, p_token_kind text)
RETURNS text
LANGUAGE sql STABLE SECURITY INVOKER AS $$
    SELECT CASE WHEN p_token_kind <> 'channel'
                     AND NOT marquee_device_belongs_to_instance(p_tenant, p_instance, p_device)
                THEN 'device_removed' END
$$;
GRANT EXECUTE ON FUNCTION marquee_device_departed(uuid, text, text, text) TO marquee_api, marquee_system;
GRANT EXECUTE ON FUNCTION marquee_device_belongs_to_instance(uuid, text, text) TO marquee_system;

-- Moves the queued pushes to p_devices[k], which belonged to p_people[k] (of tenant p_tenants[k]) until now, from the
-- queue to the history (`superseded`, marquee_device_departed's reason), except those a worker holds. Returns how many.
-- Per person, a probe of their instances and, per instance, of its queued rows (LATERAL ... OFFSET 0: lookups whatever
-- the estimates of the arrays, as in 0081), each row locked as it is found (a held one skipped). The rows are then
-- deleted where they were found (ctid: stable, as this transaction holds their locks), as the worker's record does.
CREATE FUNCTION marquee_drop_departed_pushes(p_tenants uuid[], p_devices text[], p_people text[]) RETURNS integer
LANGUAGE plpgsql VOLATILE SECURITY INVOKER SET enable_seqscan = off AS $$
DECLARE
    v_dropped integer;
BEGIN
    WITH departed AS (
        SELECT v.tenant_id, v.person_id, array_agg(DISTINCT v.device_token) AS devices
        FROM unnest(p_tenants, p_devices, p_people) AS v(tenant_id, device_token, person_id)
        GROUP BY v.tenant_id, v.person_id
    ), free AS (
        SELECT q.row_ctid, q.reason
        FROM departed p
        CROSS JOIN LATERAL (
            SELECT i.id FROM instances i WHERE i.person_id = p.person_id AND i.tenant_id = p.tenant_id OFFSET 0
        ) i
        CROSS JOIN LATERAL (
            SELECT q.ctid AS row_ctid, r.reason FROM delivery_queue q
            CROSS JOIN LATERAL (
                SELECT marquee_device_departed(q.tenant_id, q.instance_id, q.device_token, q.token_kind) AS reason
            ) r
            WHERE q.tenant_id = p.tenant_id AND q.instance_id = i.id AND q.device_token = ANY(p.devices)
              AND NOT marquee_being_sent(q.sending_until) AND r.reason IS NOT NULL
            FOR UPDATE OF q SKIP LOCKED
        ) q
    ), gone AS (
        DELETE FROM delivery_queue d USING free f
        WHERE d.ctid = ANY(ARRAY(SELECT row_ctid FROM free)) AND d.ctid = f.row_ctid
        RETURNING d, f.reason
    )
    INSERT INTO delivery_history
    SELECT h.* FROM gone, marquee_history_row(gone.d, 'superseded', p_reason => gone.reason) h;
    GET DIAGNOSTICS v_dropped = ROW_COUNT;
    RETURN v_dropped;
END;
$$;
GRANT EXECUTE ON FUNCTION marquee_drop_departed_pushes(uuid[], text[], text[]) TO marquee_api, marquee_system;

-- After a DELETE of devices (any: a device's removal, an eviction, the worker's, a person's erasure by cascade), over
-- the statement's deleted rows. After the foreign keys' cascades, in statements of its own: a start that held a
-- device (FOR KEY SHARE, until its commit) made the delete wait for it, and its queued rows are seen here.
CREATE FUNCTION marquee_devices_removed() RETURNS trigger
LANGUAGE plpgsql VOLATILE SECURITY INVOKER AS $$
BEGIN
    PERFORM marquee_drop_departed_pushes(array_agg(o.tenant_id), array_agg(o.token), array_agg(o.person_id))
    FROM old_rows o
    HAVING count(*) > 0;
    RETURN NULL;
END;
$$;
CREATE TRIGGER devices_removed AFTER DELETE ON devices REFERENCING OLD TABLE AS old_rows
    FOR EACH STATEMENT EXECUTE FUNCTION marquee_devices_removed();

-- After a device moved to another person (a registration or an import naming someone else): its previous person's
-- queued pushes to it.
CREATE FUNCTION marquee_device_moved() RETURNS trigger
LANGUAGE plpgsql VOLATILE SECURITY INVOKER AS $$
BEGIN
    PERFORM marquee_drop_departed_pushes(ARRAY[OLD.tenant_id], ARRAY[OLD.token], ARRAY[OLD.person_id]);
    RETURN NULL;
END;
$$;
CREATE TRIGGER devices_moved AFTER UPDATE OF person_id ON devices
    FOR EACH ROW WHEN (OLD.person_id IS DISTINCT FROM NEW.person_id) EXECUTE FUNCTION marquee_device_moved();

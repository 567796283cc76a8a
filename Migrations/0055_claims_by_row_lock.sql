-- Claims by row lock (issue 10). A worker's claim no longer writes a lease into the row (locked_until, locked_by,
-- next_attempt_at moved to the lease's end): it locks the rows it claims (`FOR UPDATE SKIP LOCKED`) in a transaction
-- it keeps open while it sends, records the results in the same transaction and commits. One write per delivery
-- fewer (the claim UPDATE rewrote the wide row and moved it in the due index, leaving dead index entries at the
-- front of the queue for every later claim to walk), and a worker that dies releases its claims at once instead of
-- after the lease (its session ends; a stuck one is ended by idle_in_transaction_session_timeout, set by the worker).
--
-- "In flight" is now "queued and locked by a worker". Other writers never wait on such a row: they lock what they
-- change with SKIP LOCKED (a worker's FOR UPDATE conflicts with every row lock), and the one question "is it going
-- out right now" is asked with FOR KEY SHARE SKIP LOCKED, which conflicts with the worker's FOR UPDATE only (not
-- with another writer's FOR NO KEY UPDATE).
ALTER TABLE deliveries DROP COLUMN locked_until, DROP COLUMN locked_by;

-- Whether a queued delivery is held by a worker right now (it may be reaching the device as this runs).
CREATE FUNCTION marquee_delivery_in_flight(p_tenant uuid, p_id uuid) RETURNS boolean
LANGUAGE sql VOLATILE AS $$
    SELECT NOT EXISTS (
        SELECT 1 FROM deliveries d WHERE d.tenant_id = p_tenant AND d.id = p_id
        FOR KEY SHARE SKIP LOCKED)
$$;
GRANT EXECUTE ON FUNCTION marquee_delivery_in_flight(uuid, uuid) TO marquee_api, marquee_system;

CREATE OR REPLACE FUNCTION marquee_end_waits_for_token(p_tenant uuid, p_instance text) RETURNS boolean
LANGUAGE sql VOLATILE AS $$
    SELECT EXISTS (
        SELECT 1 FROM deliveries s
        WHERE s.tenant_id = p_tenant AND s.instance_id = p_instance
          AND s.operation = 'start' AND s.token_kind = 'push_to_start'
          AND (s.status = 'sent' OR (s.status = 'queued' AND marquee_delivery_in_flight(s.tenant_id, s.id)))
          AND NOT EXISTS (
              SELECT 1 FROM activity_tokens a
              WHERE a.tenant_id = s.tenant_id AND a.instance_id = s.instance_id
                AND a.device_token = s.device_token AND a.status = 'active'))
$$;

-- A credential turning broken parks the tenant's queued deliveries for that provider, skipping those a worker holds
-- (it records them, as parked); a credential no longer broken (replaced) queues them again, or fails those whose
-- instance has expired.
CREATE OR REPLACE FUNCTION marquee_credential_status_changed() RETURNS trigger
LANGUAGE plpgsql AS $$
DECLARE
    v_provider text := CASE TG_TABLE_NAME WHEN 'apns_credentials' THEN 'apns' ELSE 'fcm' END;
    v_unparked integer;
BEGIN
    IF NEW.status = 'broken' THEN
        UPDATE deliveries d SET status = 'parked', updated_at = now()
        WHERE d.tenant_id = NEW.tenant_id AND d.id IN (
            SELECT q.id FROM deliveries q
            WHERE q.tenant_id = NEW.tenant_id AND q.provider = v_provider AND q.status = 'queued'
            FOR NO KEY UPDATE SKIP LOCKED);
    ELSE
        UPDATE deliveries d SET
            status = CASE WHEN i.expires_at <= now() THEN 'failed' ELSE 'queued' END,
            reason = CASE WHEN i.expires_at <= now() THEN 'instance_expired' ELSE d.reason END,
            next_attempt_at = now(), updated_at = now()
        FROM instances i
        WHERE d.tenant_id = NEW.tenant_id AND d.provider = v_provider AND d.status = 'parked'
          AND i.tenant_id = d.tenant_id AND i.id = d.instance_id;
        GET DIAGNOSTICS v_unparked = ROW_COUNT;
        IF v_unparked > 0 THEN
            PERFORM pg_notify('marquee_deliveries', '');
        END IF;
    END IF;
    RETURN NULL;
END;
$$;

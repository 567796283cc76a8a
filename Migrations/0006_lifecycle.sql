-- Lifecycle guarantees (issue 9, section 3) and parked deliveries of broken credentials (section 2).
--
-- * A delivery carries a snapshot of what it sends (attributes, content state, options, push timestamp of its
--   version): a start queued before an update keeps its own alert, and a retried delivery keeps its own timestamp.
--   NULL on rows written before this migration; the worker then falls back to the instance row.
-- * `parked`: a delivery whose tenant's credential for its provider is broken. Parked rows are outside the due
--   index (status <> 'queued'), so claims never walk past them; replacing the credential queues them again in the
--   same transaction, and those of instances past their expiration fail instead.
-- * `instances.pending_end`: an end that found no activity token while a push-to-start start had reached (or may
--   reach) a device. The end is sent to each activity token that registers before the instance expires.
-- * `ended` is final: no write moves an instance out of it.

ALTER TABLE instances ADD COLUMN pending_end boolean NOT NULL DEFAULT false;

ALTER TABLE deliveries
    ADD COLUMN attributes jsonb,
    ADD COLUMN content_state jsonb,
    ADD COLUMN options jsonb,
    ADD COLUMN content_timestamp bigint;
ALTER TABLE deliveries DROP CONSTRAINT deliveries_status_check;
ALTER TABLE deliveries ADD CONSTRAINT deliveries_status_check
    CHECK (status IN ('queued', 'sent', 'failed', 'undeliverable', 'superseded', 'parked'));

-- `ended` is final, whatever statement tries to move it (a late result, a retried write).
CREATE FUNCTION marquee_keep_ended() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    NEW.state := OLD.state;
    NEW.failure_reason := OLD.failure_reason;
    RETURN NEW;
END;
$$;
CREATE TRIGGER instances_ended_is_final BEFORE UPDATE OF state ON instances
    FOR EACH ROW WHEN (OLD.state = 'ended' AND NEW.state IS DISTINCT FROM 'ended')
    EXECUTE FUNCTION marquee_keep_ended();

-- Whether the tenant's credential for a provider is marked broken.
CREATE FUNCTION marquee_credential_broken(p_tenant uuid, p_provider text) RETURNS boolean
LANGUAGE sql STABLE AS $$
    SELECT CASE p_provider
        WHEN 'apns' THEN EXISTS (SELECT 1 FROM apns_credentials WHERE tenant_id = p_tenant AND status = 'broken')
        ELSE EXISTS (SELECT 1 FROM fcm_credentials WHERE tenant_id = p_tenant AND status = 'broken')
    END;
$$;
GRANT EXECUTE ON FUNCTION marquee_credential_broken(uuid, text) TO marquee_api;

-- A delivery queued while its credential is broken is parked at once (one primary-key lookup per row).
CREATE FUNCTION marquee_park_new_delivery() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    IF marquee_credential_broken(NEW.tenant_id, NEW.provider) THEN
        NEW.status := 'parked';
    END IF;
    RETURN NEW;
END;
$$;
CREATE TRIGGER deliveries_park_when_broken BEFORE INSERT ON deliveries
    FOR EACH ROW WHEN (NEW.status = 'queued')
    EXECUTE FUNCTION marquee_park_new_delivery();

-- A credential turning broken parks the tenant's queued deliveries for that provider (those a worker holds are
-- recorded by it, as parked); a credential no longer broken (replaced) queues them again, or fails those whose
-- instance has expired.
CREATE FUNCTION marquee_credential_status_changed() RETURNS trigger
LANGUAGE plpgsql AS $$
DECLARE
    v_provider text := CASE TG_TABLE_NAME WHEN 'apns_credentials' THEN 'apns' ELSE 'fcm' END;
    v_unparked integer;
BEGIN
    IF NEW.status = 'broken' THEN
        UPDATE deliveries d SET status = 'parked', updated_at = now()
        WHERE d.tenant_id = NEW.tenant_id AND d.provider = v_provider AND d.status = 'queued'
          AND (d.locked_until IS NULL OR d.locked_until < now());
    ELSE
        UPDATE deliveries d SET
            status = CASE WHEN i.expires_at <= now() THEN 'failed' ELSE 'queued' END,
            reason = CASE WHEN i.expires_at <= now() THEN 'instance_expired' ELSE d.reason END,
            next_attempt_at = now(), locked_until = NULL, updated_at = now()
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
CREATE TRIGGER apns_credentials_status AFTER UPDATE OF status ON apns_credentials
    FOR EACH ROW WHEN (OLD.status IS DISTINCT FROM NEW.status)
    EXECUTE FUNCTION marquee_credential_status_changed();
CREATE TRIGGER fcm_credentials_status AFTER UPDATE OF status ON fcm_credentials
    FOR EACH ROW WHEN (OLD.status IS DISTINCT FROM NEW.status)
    EXECUTE FUNCTION marquee_credential_status_changed();

-- A time-ordered UUID (ULID layout: 48-bit milliseconds, then random), like the IDs the API gives deliveries.
CREATE FUNCTION marquee_ulid_uuid() RETURNS uuid
LANGUAGE sql VOLATILE AS $$
    SELECT encode(overlay(uuid_send(gen_random_uuid())
                          PLACING substring(int8send((extract(epoch FROM clock_timestamp()) * 1000)::bigint) FROM 3)
                          FROM 1 FOR 6), 'hex')::uuid;
$$;
GRANT EXECUTE ON FUNCTION marquee_ulid_uuid() TO marquee_api;

-- As in 0003, and: an activity token registering for an ended instance with a pending end gets that end queued
-- (once per token), while the instance has not expired.
CREATE OR REPLACE FUNCTION marquee_register_activity_token(p_tenant uuid, p_instance text, p_device text, p_token text)
RETURNS TABLE (outcome text, rotated boolean, inserted boolean)
LANGUAGE plpgsql VOLATILE SECURITY INVOKER AS $$
DECLARE
    v_retired integer;
    v_inserted boolean;
    v_queued integer;
BEGIN
    PERFORM marquee_enter_tenant(p_tenant);
    PERFORM 1 FROM devices d WHERE d.tenant_id = p_tenant AND d.token = p_device FOR UPDATE;
    IF NOT FOUND THEN
        RETURN QUERY SELECT 'no_device'::text, false, false;
        RETURN;
    END IF;
    UPDATE activity_tokens t
    SET status = 'retired', retired_reason = 'rotated', retired_at = now()
    WHERE t.tenant_id = p_tenant AND t.instance_id = p_instance AND t.device_token = p_device
      AND t.status = 'active' AND t.token <> p_token;
    GET DIAGNOSTICS v_retired = ROW_COUNT;
    INSERT INTO activity_tokens AS t (tenant_id, instance_id, device_token, token)
    VALUES (p_tenant, p_instance, p_device, p_token)
    ON CONFLICT (tenant_id, instance_id, device_token, token) DO UPDATE SET
        status = 'active', retired_reason = NULL, retired_at = NULL
    RETURNING (t.xmax = 0) INTO v_inserted;
    INSERT INTO deliveries (tenant_id, id, instance_id, device_token, provider, token_kind, token, operation,
                            instance_version, attributes, content_state, options, content_timestamp)
    SELECT i.tenant_id, marquee_ulid_uuid(), i.id, p_device, 'apns', 'activity', p_token, 'end', i.version,
           i.attributes, i.content_state, i.options, i.content_timestamp
    FROM instances i
    WHERE i.tenant_id = p_tenant AND i.id = p_instance AND i.state = 'ended' AND i.pending_end
      AND i.expires_at > now()
      AND NOT EXISTS (
          SELECT 1 FROM deliveries o
          WHERE o.tenant_id = i.tenant_id AND o.instance_id = i.id AND o.token = p_token AND o.operation = 'end');
    GET DIAGNOSTICS v_queued = ROW_COUNT;
    IF v_queued > 0 THEN
        PERFORM pg_notify('marquee_deliveries', '');
    END IF;
    RETURN QUERY SELECT 'ok'::text, v_retired > 0, v_inserted;
END;
$$;

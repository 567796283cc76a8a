-- An instance's device states and activity tokens go with it.
--
-- Retention deletes expired and ended instances (0020), and the instance's delete trigger removed its queued
-- deliveries (0069), but neither `instance_devices` nor `activity_tokens` references `instances`: their rows stayed.
-- Instance IDs are the client's, and one may be used again once the old instance is gone; the targets of the new
-- instance (marquee_instance_targets, by instance ID) then included the old one's devices and tokens, so a second
-- person's updates and ends went to the first person's phone (confirmed with psql). Now the delete trigger removes
-- them too, the rows already left behind are removed here, and a token registration that finds its instance deleted
-- meanwhile (it locks the row first, migration 0076) registers nothing.
CREATE OR REPLACE FUNCTION marquee_instances_deleted() RETURNS trigger
LANGUAGE plpgsql VOLATILE SECURITY INVOKER SET enable_nestloop = on SET enable_seqscan = off AS $$
BEGIN
    DELETE FROM delivery_queue d
    WHERE (d.tenant_id, d.instance_id) IN (SELECT tenant_id, id FROM old_rows);
    DELETE FROM instance_devices s
    WHERE (s.tenant_id, s.instance_id) IN (SELECT tenant_id, id FROM old_rows);
    DELETE FROM activity_tokens a
    WHERE (a.tenant_id, a.instance_id) IN (SELECT tenant_id, id FROM old_rows);
    RETURN NULL;
END;
$$;

DELETE FROM instance_devices s
WHERE NOT EXISTS (SELECT 1 FROM instances i WHERE i.tenant_id = s.tenant_id AND i.id = s.instance_id);
DELETE FROM activity_tokens a
WHERE NOT EXISTS (SELECT 1 FROM instances i WHERE i.tenant_id = a.tenant_id AND i.id = a.instance_id);

CREATE OR REPLACE FUNCTION marquee_register_activity_token(p_tenant uuid, p_instance text, p_device text, p_token text)
RETURNS TABLE(outcome text, rotated boolean, inserted boolean)
LANGUAGE plpgsql SET enable_seqscan = off AS $$
DECLARE
    v_retired integer;
    v_inserted boolean;
    v_ended boolean;
BEGIN
    PERFORM marquee_enter_tenant(p_tenant);
    PERFORM 1 FROM devices d WHERE d.tenant_id = p_tenant AND d.token = p_device FOR UPDATE;
    IF NOT FOUND THEN
        RETURN QUERY SELECT 'no_device'::text, false, false;
        RETURN;
    END IF;
    -- The instance's row first: an end being written now is waited for, and then seen (its latest version); an
    -- instance deleted meanwhile gets no token.
    SELECT i.state = 'ended' AND i.expires_at > now() INTO v_ended FROM instances i
    WHERE i.tenant_id = p_tenant AND i.id = p_instance
    FOR NO KEY UPDATE;
    IF NOT FOUND THEN
        RETURN QUERY SELECT 'no_instance'::text, false, false;
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
    -- Only an ended instance has its ends looked up (nearly always it is open: the look is not even set up).
    IF v_ended THEN
        PERFORM marquee_queue_missing_ends(p_tenant, ARRAY[p_instance]);
    END IF;
    RETURN QUERY SELECT 'ok'::text, v_retired > 0, v_inserted;
END;
$$;

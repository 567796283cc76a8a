-- Token registrations in one statement each.
--
-- A registration is a short read-check-write sequence (device owner and platform, activity type, retire the old
-- token, upsert the new one). Run statement by statement it costs eight round trips and as many parses; as one
-- function call it is one round trip, which is what keeps SDK registration traffic cheap for PostgreSQL.
--
-- The functions are SECURITY INVOKER and switch the transaction to marquee_api for the given tenant before they
-- touch a table, so row-level security applies to every statement inside them exactly as for the API's other
-- queries.

CREATE FUNCTION marquee_enter_tenant(p_tenant uuid) RETURNS void
LANGUAGE sql VOLATILE AS $$
    SELECT set_config('role', 'marquee_api', true), set_config('marquee.tenant_id', p_tenant::text, true);
$$;
GRANT EXECUTE ON FUNCTION marquee_enter_tenant(uuid) TO marquee_api;

-- outcome: 'ok', 'no_device' (not registered to this person), 'not_ios'.
CREATE FUNCTION marquee_register_push_to_start(
    p_tenant uuid, p_person text, p_device text, p_type text, p_token text, p_attributes_type text,
    p_profile text, p_default_attributes_type text
) RETURNS TABLE (outcome text, rotated boolean, inserted boolean)
LANGUAGE plpgsql VOLATILE SECURITY INVOKER AS $$
DECLARE
    v_platform text;
    v_retired integer;
    v_inserted boolean;
BEGIN
    PERFORM marquee_enter_tenant(p_tenant);
    -- Locking the device row serialises concurrent registrations for one device: the second sees the first's
    -- token and rotates it, instead of colliding with it on the one-active-token index.
    SELECT d.platform INTO v_platform FROM devices d
    WHERE d.tenant_id = p_tenant AND d.token = p_device AND d.person_id = p_person
    FOR UPDATE;
    IF v_platform IS NULL THEN
        RETURN QUERY SELECT 'no_device'::text, false, false;
        RETURN;
    END IF;
    IF v_platform <> 'ios' THEN
        RETURN QUERY SELECT 'not_ios'::text, false, false;
        RETURN;
    END IF;
    INSERT INTO activity_types (tenant_id, identifier, attributes_type, payload_profile, auto_created)
    VALUES (p_tenant, p_type, COALESCE(p_attributes_type, p_default_attributes_type), p_profile, true)
    ON CONFLICT (tenant_id, identifier) DO NOTHING;
    UPDATE push_to_start_tokens t
    SET status = 'retired', retired_reason = 'rotated', retired_at = now()
    WHERE t.tenant_id = p_tenant AND t.device_token = p_device AND t.activity_type = p_type
      AND t.status = 'active' AND t.token <> p_token;
    GET DIAGNOSTICS v_retired = ROW_COUNT;
    INSERT INTO push_to_start_tokens AS t (tenant_id, device_token, activity_type, token, attributes_type)
    VALUES (p_tenant, p_device, p_type, p_token, p_attributes_type)
    ON CONFLICT (tenant_id, device_token, activity_type, token) DO UPDATE SET
        attributes_type = COALESCE(EXCLUDED.attributes_type, t.attributes_type),
        status = 'active', retired_reason = NULL, retired_at = NULL
    RETURNING (t.xmax = 0) INTO v_inserted;
    RETURN QUERY SELECT 'ok'::text, v_retired > 0, v_inserted;
END;
$$;
GRANT EXECUTE ON FUNCTION marquee_register_push_to_start(uuid, text, text, text, text, text, text, text) TO marquee_api;

-- outcome: 'ok', 'no_device'.
CREATE FUNCTION marquee_register_activity_token(p_tenant uuid, p_instance text, p_device text, p_token text)
RETURNS TABLE (outcome text, rotated boolean, inserted boolean)
LANGUAGE plpgsql VOLATILE SECURITY INVOKER AS $$
DECLARE
    v_retired integer;
    v_inserted boolean;
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
    RETURN QUERY SELECT 'ok'::text, v_retired > 0, v_inserted;
END;
$$;
GRANT EXECUTE ON FUNCTION marquee_register_activity_token(uuid, text, text, text) TO marquee_api;

-- A push-to-start token of an activity type a registration created goes with the payload profile of the route that
-- registered it, as it goes with its attributes type (DeliveryQueue.lockQuery).
--
-- A type a registration creates (auto_created) takes the payload profile of that first registration's route: `marquee`
-- from PUT /v1/people/{id}/devices/{token}/push_to_start/{type}, `customerio` from the Customer.io ingest's
-- `Live Notification Token`. The worker shaped every push of the type with it, and the sdk key is public: anyone
-- registering a made-up token for a new type through the other SDK's route before the app's devices did chose the
-- shape of every device's starts (a Customer.io device got `marqueeInstanceId` instead of `cioInstanceId`, which its
-- SDK looks for). Now each registration records its route's profile on its token (`payload_profile`, replaced by the
-- next registration of the token), and while the type is auto_created a start by push-to-start is shaped by its
-- token's profile. A type defined with the app key (PUT /v1/activity_types) keeps its own for every push, as before;
-- tokens registered before this migration, and those a people import registers (an app-key import says nothing of
-- the SDK on the device: marquee_register_push_to_start_rows is unchanged and leaves the column as it was), go with
-- the type's.

ALTER TABLE push_to_start_tokens
    ADD COLUMN payload_profile text CHECK (payload_profile IN ('marquee', 'customerio', 'capacitor'));

-- The single registration (0088): as before, recording p_profile on the token.
CREATE OR REPLACE FUNCTION marquee_register_push_to_start(
    p_tenant uuid, p_person text, p_device text, p_type text, p_token text, p_attributes_type text,
    p_profile text, p_default_attributes_type text
) RETURNS TABLE (outcome text, rotated boolean, inserted boolean)
LANGUAGE plpgsql VOLATILE SECURITY INVOKER SET enable_seqscan = off AS $$
DECLARE
    v_platform text;
    v_retired integer;
    v_inserted boolean;
    v_new boolean;
BEGIN
    PERFORM marquee_enter_tenant(p_tenant);
    v_new := NOT EXISTS (SELECT 1 FROM activity_types a WHERE a.tenant_id = p_tenant AND a.identifier = p_type);
    IF v_new THEN
        -- Before the device's lock, as the import takes them.
        PERFORM marquee_lock_activity_type_creation(p_tenant);
    END IF;
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
    IF v_new AND cardinality(marquee_create_activity_types(
            p_tenant, p_profile, ARRAY[p_type], ARRAY[COALESCE(p_attributes_type, p_default_attributes_type)])) > 0
    THEN
        RETURN QUERY SELECT 'type_limit'::text, false, false;
        RETURN;
    END IF;
    UPDATE push_to_start_tokens t
    SET status = 'retired', retired_reason = 'rotated', retired_at = now()
    WHERE t.tenant_id = p_tenant AND t.device_token = p_device AND t.activity_type = p_type
      AND t.status = 'active' AND t.token <> p_token;
    GET DIAGNOSTICS v_retired = ROW_COUNT;
    INSERT INTO push_to_start_tokens AS t (tenant_id, device_token, activity_type, token, attributes_type,
                                           payload_profile)
    VALUES (p_tenant, p_device, p_type, p_token, p_attributes_type, p_profile)
    ON CONFLICT (tenant_id, device_token, activity_type, token) DO UPDATE SET
        attributes_type = COALESCE(EXCLUDED.attributes_type, t.attributes_type),
        payload_profile = EXCLUDED.payload_profile,
        status = 'active', retired_reason = NULL, retired_at = NULL
    RETURNING (t.xmax = 0) INTO v_inserted;
    RETURN QUERY SELECT 'ok'::text, v_retired > 0, v_inserted;
END;
$$;

-- Who may speak for an instance (issue 9 §4): the one home of the rule that an activity token or a lifecycle event
-- for an instance is taken only from a device of the person the instance was started for (or the device it
-- targets). sdk keys are public: without it anyone could attach their own token to a guessable instance ID and
-- receive its updates.
--
-- Before, the API checked the rule with a query of its own and then called marquee_register_activity_token: four
-- round trips, and the device could change hands between the check and the registration. Now the registration
-- checks it under the device row's lock, in the same statement.

-- Whether p_device is a device of p_instance's person, or the device the instance targets. STABLE, SECURITY
-- INVOKER: row-level security applies as for the caller's other queries.
CREATE FUNCTION marquee_device_belongs_to_instance(p_tenant uuid, p_instance text, p_device text) RETURNS boolean
LANGUAGE sql STABLE SECURITY INVOKER AS $$
    SELECT EXISTS (
        SELECT 1 FROM instances i
        JOIN devices d ON d.tenant_id = i.tenant_id AND d.token = p_device
        WHERE i.tenant_id = p_tenant AND i.id = p_instance
          AND (d.person_id = i.person_id OR d.token = i.target_device));
$$;
GRANT EXECUTE ON FUNCTION marquee_device_belongs_to_instance(uuid, text, text) TO marquee_api;

-- marquee_register_activity_token (0003, 0006) for a device that must belong to the instance.
-- outcome: 'ok', 'no_device', 'no_instance' (unknown, or not the device's person's: never told apart).
-- The device row is locked first, so its owner cannot change before the token is stored; the registration then
-- takes the same lock again, which the transaction already holds. It is a separate function so that the
-- registration's own rules (rotation, a pending end queued on registration) keep one home.
CREATE FUNCTION marquee_register_instance_token(p_tenant uuid, p_instance text, p_device text, p_token text)
RETURNS TABLE (outcome text, rotated boolean, inserted boolean)
LANGUAGE plpgsql VOLATILE SECURITY INVOKER AS $$
BEGIN
    PERFORM marquee_enter_tenant(p_tenant);
    PERFORM 1 FROM devices d WHERE d.tenant_id = p_tenant AND d.token = p_device FOR UPDATE;
    IF NOT FOUND THEN
        RETURN QUERY SELECT 'no_device'::text, false, false;
        RETURN;
    END IF;
    IF NOT marquee_device_belongs_to_instance(p_tenant, p_instance, p_device) THEN
        RETURN QUERY SELECT 'no_instance'::text, false, false;
        RETURN;
    END IF;
    RETURN QUERY SELECT r.outcome, r.rotated, r.inserted
                 FROM marquee_register_activity_token(p_tenant, p_instance, p_device, p_token) r;
END;
$$;
GRANT EXECUTE ON FUNCTION marquee_register_instance_token(uuid, text, text, text) TO marquee_api;

-- At most so many devices per person (a tenant setting, 20 unless set); a registration beyond it removes the
-- person's least recently registered device.
--
-- Nothing capped a person's devices, and a start goes to every one of them. The sdk key is public: while identity
-- verification is off, anyone could register thousands of made-up tokens under any person ID (the Customer.io batch
-- takes 1,000 devices a request), and every start or campaign for that person then queued one push per token,
-- spending the tenant's send rate on them. A real person has a few devices, and gets a new token each time they
-- reinstall the app: refusing the newest device would cut off the phone in their hand, so the one that goes is the
-- one registered (or re-registered) longest ago.
--
-- The device goes as `DELETE /v1/people/{id}/devices/{token}` removes one (RegistryTransaction.deleteDevice): its
-- row is deleted, and its push-to-start and activity tokens and its per-instance states go with it by cascade.

ALTER TABLE tenant_settings ADD COLUMN max_devices_per_person integer
    CHECK (max_devices_per_person BETWEEN 1 AND 1000);

-- The tenant's cap: its setting, or 20 (the one home of the default).
CREATE FUNCTION marquee_max_devices_per_person(p_tenant uuid) RETURNS integer
LANGUAGE sql STABLE SECURITY INVOKER AS $$
    SELECT COALESCE((SELECT s.max_devices_per_person FROM tenant_settings s WHERE s.tenant_id = p_tenant), 20);
$$;
GRANT EXECUTE ON FUNCTION marquee_max_devices_per_person(uuid) TO marquee_api;

-- Removes the devices of p_people beyond the tenant's cap, least recently registered first (devices.updated_at,
-- which every registration of the token moves): p_keep (the devices just registered) are kept before any other.
-- Returns how many went. The caller holds the people's rows, so that two registrations for one person take turns.
--
-- An import calls it with 100,000 people and their tokens. Nothing here joins the arrays to `devices` in a way the
-- planner may turn around: planned for an array of unknown size (estimated at 10 elements), a join or `IN (SELECT
-- unnest(…))` was sometimes run with the array as the inner side, scanned again for every device (minutes for one
-- import). Each person's devices are counted by a probe of its own (devices_person), only the people over the cap
-- (almost always none) have their devices ranked, and a long list of devices just registered (an import: they are
-- the newest anyway) is not searched per row.
CREATE FUNCTION marquee_keep_recent_devices(p_tenant uuid, p_people text[], p_keep text[]) RETURNS integer
LANGUAGE plpgsql VOLATILE SECURITY INVOKER SET enable_seqscan = off AS $$
DECLARE
    v_cap integer := marquee_max_devices_per_person(p_tenant);
    v_keep text[] := CASE WHEN cardinality(p_keep) <= 100 THEN p_keep ELSE '{}'::text[] END;
    v_over text[];
    v_removed integer;
BEGIN
    SELECT array_agg(p.person_id) INTO v_over
    FROM (SELECT DISTINCT unnest(p_people) AS person_id) p
    WHERE (SELECT count(*) FROM devices x WHERE x.person_id = p.person_id AND x.tenant_id = p_tenant) > v_cap;
    IF v_over IS NULL THEN
        RETURN 0;
    END IF;
    -- person_id is checked again on the row deleted: a device that moved to someone else meanwhile stays.
    DELETE FROM devices d
    USING (SELECT o.person_id, r.token
           FROM unnest(v_over) AS o(person_id)
           CROSS JOIN LATERAL (
               SELECT x.token FROM devices x
               WHERE x.person_id = o.person_id AND x.tenant_id = p_tenant
               ORDER BY x.token = ANY (v_keep) DESC, x.updated_at DESC, x.created_at DESC, x.token
               OFFSET v_cap) r) gone
    WHERE d.tenant_id = p_tenant AND d.token = gone.token AND d.person_id = gone.person_id;
    GET DIAGNOSTICS v_removed = ROW_COUNT;
    RETURN v_removed;
END;
$$;
GRANT EXECUTE ON FUNCTION marquee_keep_recent_devices(uuid, text[], text[]) TO marquee_api;

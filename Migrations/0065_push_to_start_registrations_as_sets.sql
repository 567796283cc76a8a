-- Push-to-start registrations as a set. A bulk import registered its tokens with one call of
-- marquee_register_push_to_start (0003) per row: 100,000 calls, each entering the tenant, locking its device, creating
-- the activity type if new, retiring and upserting, were 7.4 s of a 100,000-person import's 11 s (auto_explain,
-- bench/campaign), where the rest of it is a COPY and one merge per table.
--
-- The same rule, for any number of rows at once. The single registration (the SDK's route) keeps its own function:
-- calling this one with one row made it 0.44 → 0.86 ms a call alone and 5.4k → 1.6k calls/s at 32 clients
-- (pgbench, the bench/registrations statement: its statements planned again at every call). Both are pinned to the
-- same outcomes and stored rows by PeopleImportTests.registrationsAsSet, which runs every case through each.
--
-- One outcome per row, by its position: 'ok', 'no_device' (the device is not this person's), 'not_ios'; `rotated`
-- when a different active token of that (device, activity type) was retired, `inserted` when the token is new.
-- A (device, activity type) may appear once: a batch cannot say which of two tokens is the newer one.
CREATE FUNCTION marquee_register_push_to_start_rows(
    p_tenant uuid, p_profile text, p_person text[], p_device text[], p_type text[], p_token text[],
    p_attributes_type text[], p_default_attributes_type text[]
) RETURNS TABLE (ord bigint, outcome text, rotated boolean, inserted boolean)
LANGUAGE plpgsql VOLATILE SECURITY INVOKER SET enable_seqscan = off AS $$
DECLARE
    v_found bigint[];
    v_ios bigint[];
    v_rotated bigint[];
BEGIN
    PERFORM marquee_enter_tenant(p_tenant);
    IF cardinality(p_device) IS DISTINCT FROM cardinality(p_person)
       OR cardinality(p_type) IS DISTINCT FROM cardinality(p_person)
       OR cardinality(p_token) IS DISTINCT FROM cardinality(p_person)
       OR cardinality(p_attributes_type) IS DISTINCT FROM cardinality(p_person)
       OR cardinality(p_default_attributes_type) IS DISTINCT FROM cardinality(p_person) THEN
        RAISE EXCEPTION 'marquee_register_push_to_start_rows: arrays of different lengths' USING ERRCODE = '22023';
    END IF;
    IF EXISTS (SELECT 1 FROM unnest(p_device, p_type) AS x(device, type) GROUP BY device, type HAVING count(*) > 1)
    THEN
        RAISE EXCEPTION 'marquee_register_push_to_start_rows: a (device, activity type) appears twice'
            USING ERRCODE = '22023';
    END IF;
    -- Locking the device rows serialises concurrent registrations for a device: the later sees the earlier's token
    -- and rotates it, instead of colliding with it on the one-active-token index. In token order, so that two
    -- batches sharing devices cannot deadlock.
    SELECT array_agg(l.ord), COALESCE(array_agg(l.ord) FILTER (WHERE l.platform = 'ios'), '{}')
    INTO v_found, v_ios
    FROM (SELECT r.ord, d.platform
          FROM unnest(p_person, p_device) WITH ORDINALITY AS r(person, device, ord)
          JOIN devices d ON d.tenant_id = p_tenant AND d.token = r.device AND d.person_id = r.person
          ORDER BY d.token
          FOR UPDATE OF d) l;
    v_found := COALESCE(v_found, '{}');

    -- Types not known yet are created with permissive defaults (the first row naming one gives its attributes type).
    INSERT INTO activity_types (tenant_id, identifier, attributes_type, payload_profile, auto_created)
    SELECT DISTINCT ON (x.type) p_tenant, x.type, COALESCE(x.attributes_type, x.default_type), p_profile, true
    FROM unnest(p_type, p_attributes_type, p_default_attributes_type) WITH ORDINALITY
             AS x(type, attributes_type, default_type, ord)
    JOIN unnest(v_ios) AS k(ord) ON k.ord = x.ord
    ORDER BY x.type, x.ord
    ON CONFLICT (tenant_id, identifier) DO NOTHING;

    -- A different active token of the same device and type is retired.
    WITH r AS (
        SELECT x.* FROM unnest(p_device, p_type, p_token) WITH ORDINALITY AS x(device, type, token, ord)
        JOIN unnest(v_ios) AS k(ord) ON k.ord = x.ord
    ), retired AS (
        UPDATE push_to_start_tokens t
        SET status = 'retired', retired_reason = 'rotated', retired_at = now()
        FROM r
        WHERE t.tenant_id = p_tenant AND t.device_token = r.device AND t.activity_type = r.type
          AND t.status = 'active' AND t.token <> r.token
        RETURNING r.ord
    )
    SELECT COALESCE(array_agg(retired.ord), '{}') INTO v_rotated FROM retired;

    RETURN QUERY
    WITH r AS (
        SELECT x.* FROM unnest(p_device, p_type, p_token, p_attributes_type) WITH ORDINALITY
                 AS x(device, type, token, attributes_type, ord)
        JOIN unnest(v_ios) AS k(ord) ON k.ord = x.ord
    ), up AS (
        INSERT INTO push_to_start_tokens AS t (tenant_id, device_token, activity_type, token, attributes_type)
        SELECT p_tenant, r.device, r.type, r.token, r.attributes_type FROM r ORDER BY r.device, r.type
        ON CONFLICT (tenant_id, device_token, activity_type, token) DO UPDATE SET
            attributes_type = COALESCE(EXCLUDED.attributes_type, t.attributes_type),
            status = 'active', retired_reason = NULL, retired_at = NULL
        RETURNING t.device_token, t.activity_type, (t.xmax = 0) AS inserted
    )
    SELECT a.ord,
           CASE WHEN f.ord IS NULL THEN 'no_device' WHEN i.ord IS NULL THEN 'not_ios' ELSE 'ok' END,
           rt.ord IS NOT NULL,
           COALESCE(up.inserted, false)
    FROM unnest(p_device, p_type) WITH ORDINALITY AS a(device, type, ord)
    LEFT JOIN unnest(v_found) AS f(ord) ON f.ord = a.ord
    LEFT JOIN unnest(v_ios) AS i(ord) ON i.ord = a.ord
    LEFT JOIN unnest(v_rotated) AS rt(ord) ON rt.ord = a.ord
    LEFT JOIN up ON i.ord IS NOT NULL AND up.device_token = a.device AND up.activity_type = a.type
    ORDER BY a.ord;
END;
$$;
GRANT EXECUTE ON FUNCTION marquee_register_push_to_start_rows(uuid, text, text[], text[], text[], text[], text[], text[])
    TO marquee_api;

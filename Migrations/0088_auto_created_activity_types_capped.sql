-- At most so many activity types created by registrations (a tenant setting, 100 unless set).
--
-- A push-to-start registration naming an activity type the tenant does not have creates it (`auto_created`, with
-- permissive defaults: 0003, 0065), from the single route, the Customer.io ingest and the people import alike. The
-- sdk key is public, so anyone could create any number of types, each a row that every type listing, the console and
-- every segment on `has_push_to_start` carry. Past the cap a registration naming an unknown type is refused (outcome
-- 'type_limit': 422 `activity-type-limit`, or the import line rejected); types already there still take
-- registrations. Types created or replaced with the app key (`PUT /v1/activity_types/{identifier}`, which sets
-- `auto_created` false) neither count nor are ever refused: that is how a tenant adopts a type and frees its place.
--
-- The rule's one home is marquee_create_activity_types, which both registration functions call.

ALTER TABLE tenant_settings ADD COLUMN max_auto_created_activity_types integer
    CHECK (max_auto_created_activity_types BETWEEN 0 AND 10000);

-- The tenant's cap: its setting, or 100 (the one home of the default).
CREATE FUNCTION marquee_max_auto_created_activity_types(p_tenant uuid) RETURNS integer
LANGUAGE sql STABLE SECURITY INVOKER AS $$
    SELECT COALESCE(
        (SELECT s.max_auto_created_activity_types FROM tenant_settings s WHERE s.tenant_id = p_tenant), 100);
$$;
GRANT EXECUTE ON FUNCTION marquee_max_auto_created_activity_types(uuid) TO marquee_api;

-- Serialises the creation of a tenant's types by registrations until the transaction ends. Taken (by the functions
-- below) before any device row is locked, whenever a registration names a type not known yet, so that an import and
-- single registrations meet the two kinds of lock in one order. Registrations of known types never take it.
CREATE FUNCTION marquee_lock_activity_type_creation(p_tenant uuid) RETURNS void
LANGUAGE sql VOLATILE SECURITY INVOKER AS $$
    SELECT pg_advisory_xact_lock(hashtextextended(format('marquee/auto-created-types/%s', p_tenant), 0));
$$;
GRANT EXECUTE ON FUNCTION marquee_lock_activity_type_creation(uuid) TO marquee_api;

-- Creates the types of p_type the tenant does not have (auto_created, with p_profile and the attributes type of the
-- first row naming each), in the order they are first named, while the tenant has fewer than its cap of
-- auto-created types; returns the ones it could not create (to be refused by the caller). The count is taken under
-- the tenant's creation lock, and each statement after it sees what an earlier holder committed (READ COMMITTED: the
-- registrations run so), so concurrent registrations never create more than the cap between them. The count stops at
-- the cap, so a tenant with many types (made before the cap, or the cap lowered) costs no more than one under it.
CREATE FUNCTION marquee_create_activity_types(
    p_tenant uuid, p_profile text, p_type text[], p_attributes_type text[]
) RETURNS text[]
LANGUAGE plpgsql VOLATILE SECURITY INVOKER SET enable_seqscan = off AS $$
DECLARE
    v_cap integer;
    v_room integer;
BEGIN
    IF NOT EXISTS (SELECT 1 FROM unnest(p_type) AS x(type)
                   WHERE NOT EXISTS (SELECT 1 FROM activity_types a
                                     WHERE a.tenant_id = p_tenant AND a.identifier = x.type)) THEN
        RETURN '{}';
    END IF;
    PERFORM marquee_lock_activity_type_creation(p_tenant);
    v_cap := marquee_max_auto_created_activity_types(p_tenant);
    SELECT v_cap - count(*) INTO v_room
    FROM (SELECT 1 FROM activity_types a WHERE a.tenant_id = p_tenant AND a.auto_created LIMIT v_cap) c;
    -- Types created meanwhile (by the lock's previous holder, or with the app key) are not created again.
    INSERT INTO activity_types (tenant_id, identifier, attributes_type, payload_profile, auto_created)
    SELECT p_tenant, n.type, n.attributes_type, p_profile, true
    FROM (SELECT DISTINCT ON (x.type) x.type, x.attributes_type, x.ord
          FROM unnest(p_type, p_attributes_type) WITH ORDINALITY AS x(type, attributes_type, ord)
          WHERE NOT EXISTS (SELECT 1 FROM activity_types a WHERE a.tenant_id = p_tenant AND a.identifier = x.type)
          ORDER BY x.type, x.ord) n
    ORDER BY n.ord
    LIMIT greatest(v_room, 0)
    ON CONFLICT (tenant_id, identifier) DO NOTHING;
    RETURN ARRAY(SELECT DISTINCT x.type FROM unnest(p_type) AS x(type)
                 WHERE NOT EXISTS (SELECT 1 FROM activity_types a
                                   WHERE a.tenant_id = p_tenant AND a.identifier = x.type));
END;
$$;
GRANT EXECUTE ON FUNCTION marquee_create_activity_types(uuid, text, text[], text[]) TO marquee_api;

-- The single registration (0003, planned as 0048 set it): as before, with an unknown type created through
-- marquee_create_activity_types, and 'type_limit' when it cannot be. Registrations of known types are unchanged.
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
    INSERT INTO push_to_start_tokens AS t (tenant_id, device_token, activity_type, token, attributes_type)
    VALUES (p_tenant, p_device, p_type, p_token, p_attributes_type)
    ON CONFLICT (tenant_id, device_token, activity_type, token) DO UPDATE SET
        attributes_type = COALESCE(EXCLUDED.attributes_type, t.attributes_type),
        status = 'active', retired_reason = NULL, retired_at = NULL
    RETURNING (t.xmax = 0) INTO v_inserted;
    RETURN QUERY SELECT 'ok'::text, v_retired > 0, v_inserted;
END;
$$;

-- The set registration (0065): as before, with its unknown types created through marquee_create_activity_types (the
-- lock taken before the devices' locks, as above) and 'type_limit' for the rows of the types it could not create.
CREATE OR REPLACE FUNCTION marquee_register_push_to_start_rows(
    p_tenant uuid, p_profile text, p_person text[], p_device text[], p_type text[], p_token text[],
    p_attributes_type text[], p_default_attributes_type text[]
) RETURNS TABLE (ord bigint, outcome text, rotated boolean, inserted boolean)
LANGUAGE plpgsql VOLATILE SECURITY INVOKER SET enable_seqscan = off AS $$
DECLARE
    v_found bigint[];
    v_ios bigint[];
    v_refused text[] := '{}';
    v_ok bigint[];
    v_rotated bigint[];
    v_unknown boolean;
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
    -- Asked of the distinct types (an import names one type 100,000 times).
    v_unknown := EXISTS (SELECT 1 FROM (SELECT DISTINCT u.type FROM unnest(p_type) AS u(type)) x
                         WHERE NOT EXISTS (SELECT 1 FROM activity_types a
                                           WHERE a.tenant_id = p_tenant AND a.identifier = x.type));
    IF v_unknown THEN
        -- Before the devices' locks, as a single registration takes them.
        PERFORM marquee_lock_activity_type_creation(p_tenant);
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

    -- Types not known yet are created, up to the tenant's cap (the first row naming one gives its attributes type),
    -- each type passed once, in the order of its first row.
    IF v_unknown THEN
        SELECT marquee_create_activity_types(
                   p_tenant, p_profile, COALESCE(array_agg(f.type ORDER BY f.ord), '{}'),
                   COALESCE(array_agg(f.attributes_type ORDER BY f.ord), '{}'))
        INTO v_refused
        FROM (SELECT DISTINCT ON (x.type) x.type, COALESCE(x.attributes_type, x.default_type) AS attributes_type, x.ord
              FROM unnest(p_type, p_attributes_type, p_default_attributes_type) WITH ORDINALITY
                       AS x(type, attributes_type, default_type, ord)
              JOIN unnest(v_ios) AS k(ord) ON k.ord = x.ord
              ORDER BY x.type, x.ord) f;
    END IF;
    -- (A join on the position, not p_type[k.ord]: subscripting a text[] walks it from its start, so 100,000 rows took
    -- 12 s that way.)
    IF COALESCE(cardinality(v_refused), 0) = 0 THEN
        v_ok := v_ios;
    ELSE
        SELECT COALESCE(array_agg(k.ord), '{}') INTO v_ok
        FROM unnest(v_ios) AS k(ord)
        JOIN unnest(p_type) WITH ORDINALITY AS x(type, ord) ON x.ord = k.ord
        WHERE x.type <> ALL (v_refused);
    END IF;

    -- A different active token of the same device and type is retired.
    WITH r AS (
        SELECT x.* FROM unnest(p_device, p_type, p_token) WITH ORDINALITY AS x(device, type, token, ord)
        JOIN unnest(v_ok) AS k(ord) ON k.ord = x.ord
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
        JOIN unnest(v_ok) AS k(ord) ON k.ord = x.ord
    ), up AS (
        INSERT INTO push_to_start_tokens AS t (tenant_id, device_token, activity_type, token, attributes_type)
        SELECT p_tenant, r.device, r.type, r.token, r.attributes_type FROM r ORDER BY r.device, r.type
        ON CONFLICT (tenant_id, device_token, activity_type, token) DO UPDATE SET
            attributes_type = COALESCE(EXCLUDED.attributes_type, t.attributes_type),
            status = 'active', retired_reason = NULL, retired_at = NULL
        RETURNING t.device_token, t.activity_type, (t.xmax = 0) AS inserted
    )
    SELECT a.ord,
           CASE WHEN f.ord IS NULL THEN 'no_device' WHEN i.ord IS NULL THEN 'not_ios'
                WHEN o.ord IS NULL THEN 'type_limit' ELSE 'ok' END,
           rt.ord IS NOT NULL,
           COALESCE(up.inserted, false)
    FROM unnest(p_device, p_type) WITH ORDINALITY AS a(device, type, ord)
    LEFT JOIN unnest(v_found) AS f(ord) ON f.ord = a.ord
    LEFT JOIN unnest(v_ios) AS i(ord) ON i.ord = a.ord
    LEFT JOIN unnest(v_ok) AS o(ord) ON o.ord = a.ord
    LEFT JOIN unnest(v_rotated) AS rt(ord) ON rt.ord = a.ord
    LEFT JOIN up ON o.ord IS NOT NULL AND up.device_token = a.device AND up.activity_type = a.type
    ORDER BY a.ord;
END;
$$;

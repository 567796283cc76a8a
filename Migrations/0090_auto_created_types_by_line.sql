-- The cap on activity types registrations create (0088) takes the rows of a registration in groups, each created
-- whole or not at all: a people import's line (one person, their devices and push-to-start tokens) is accepted or
-- rejected whole, and a line naming two unknown types where the cap had room for one created the first type (the
-- import passed each type once, in the order first named) although the line was rejected: a rejected line left a
-- type behind, holding a place of the cap, and a later line's type was refused for want of that place.
--
-- marquee_create_activity_types(p_tenant, p_profile, p_type, p_attributes_type, p_group) is now the one home of the
-- cap: the groups (an import passes its lines), in the order of their first rows, each create the unknown types they
-- name when the room left holds them all, else none; the 0088 form (each row its own group, as the single and the set
-- registrations call it) calls it. The answer is as before: the types named that the tenant still does not have; a
-- group naming one of them did not go in (and a group that did not go in names at least one: the types created after
-- it are fewer than it needed).
CREATE FUNCTION marquee_create_activity_types(
    p_tenant uuid, p_profile text, p_type text[], p_attributes_type text[], p_group bigint[]
) RETURNS text[]
LANGUAGE plpgsql VOLATILE SECURITY INVOKER SET enable_seqscan = off AS $$
DECLARE
    v_cap integer;
    v_room integer;
    v_unknown jsonb;
    v_count integer;
    v_create jsonb;
    v_new text[];
    g record;
BEGIN
    IF cardinality(p_group) IS DISTINCT FROM cardinality(p_type)
       OR cardinality(p_attributes_type) IS DISTINCT FROM cardinality(p_type) THEN
        RAISE EXCEPTION 'marquee_create_activity_types: arrays of different lengths' USING ERRCODE = '22023';
    END IF;
    IF NOT EXISTS (SELECT 1 FROM unnest(p_type) AS x(type)
                   WHERE NOT EXISTS (SELECT 1 FROM activity_types a
                                     WHERE a.tenant_id = p_tenant AND a.identifier = x.type)) THEN
        RETURN '{}';
    END IF;
    PERFORM marquee_lock_activity_type_creation(p_tenant);
    v_cap := marquee_max_auto_created_activity_types(p_tenant);
    SELECT v_cap - count(*) INTO v_room
    FROM (SELECT 1 FROM activity_types a WHERE a.tenant_id = p_tenant AND a.auto_created LIMIT v_cap) c;
    -- The types still unknown under the lock (its previous holder, or the app key, may have created some), as a set.
    SELECT jsonb_object_agg(u.type, true), count(*) INTO v_unknown, v_count
    FROM (SELECT DISTINCT x.type FROM unnest(p_type) AS x(type)
          WHERE NOT EXISTS (SELECT 1 FROM activity_types a
                            WHERE a.tenant_id = p_tenant AND a.identifier = x.type)) u;
    IF v_count = 0 THEN
        RETURN '{}';
    END IF;
    IF v_count <= v_room THEN
        -- Room for all (the usual case): no group is refused.
        v_create := v_unknown;
    ELSE
        -- Group by group, in the order of their first rows, while room is left.
        v_create := '{}';
        FOR g IN SELECT x.grp, array_agg(DISTINCT x.type) AS types
                 FROM unnest(p_type, p_group) WITH ORDINALITY AS x(type, grp, ord)
                 WHERE v_unknown ? x.type
                 GROUP BY x.grp ORDER BY min(x.ord)
        LOOP
            EXIT WHEN v_room <= 0;
            v_new := ARRAY(SELECT t.type FROM unnest(g.types) AS t(type) WHERE NOT v_create ? t.type);
            IF cardinality(v_new) BETWEEN 1 AND v_room THEN
                v_create := v_create || (SELECT jsonb_object_agg(t.type, true) FROM unnest(v_new) AS t(type));
                v_room := v_room - cardinality(v_new);
            END IF;
        END LOOP;
    END IF;
    -- Each with the attributes type of its first row, in the order first named; one created meanwhile with the app
    -- key is left as it is.
    INSERT INTO activity_types (tenant_id, identifier, attributes_type, payload_profile, auto_created)
    SELECT p_tenant, n.type, n.attributes_type, p_profile, true
    FROM (SELECT DISTINCT ON (x.type) x.type, x.attributes_type, x.ord
          FROM unnest(p_type, p_attributes_type) WITH ORDINALITY AS x(type, attributes_type, ord)
          WHERE v_create ? x.type
          ORDER BY x.type, x.ord) n
    ORDER BY n.ord
    ON CONFLICT (tenant_id, identifier) DO NOTHING;
    RETURN ARRAY(SELECT DISTINCT x.type FROM unnest(p_type) AS x(type)
                 WHERE NOT EXISTS (SELECT 1 FROM activity_types a
                                   WHERE a.tenant_id = p_tenant AND a.identifier = x.type));
END;
$$;
GRANT EXECUTE ON FUNCTION marquee_create_activity_types(uuid, text, text[], text[], bigint[]) TO marquee_api;

-- The 0088 form: each row its own group (so each type is created, in the order first named, while room is left).
CREATE OR REPLACE FUNCTION marquee_create_activity_types(
    p_tenant uuid, p_profile text, p_type text[], p_attributes_type text[]
) RETURNS text[]
LANGUAGE sql VOLATILE SECURITY INVOKER AS $$
    SELECT marquee_create_activity_types(
        p_tenant, p_profile, p_type, p_attributes_type,
        ARRAY(SELECT generate_series(1, COALESCE(cardinality(p_type), 0))::bigint));
$$;

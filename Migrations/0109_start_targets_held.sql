-- A campaign's start step queued starts to devices removed while it ran.
--
-- A start plans its pushes from devices and push-to-start tokens it read, and writes them later in its statement. A
-- device removed meanwhile (a delete or a logout, the worker's delete of an Android device FCM calls unregistered, an
-- eviction) takes its queued pushes with it (marquee_devices_removed, migration 0083), but only those it can see when
-- its statement runs: a start writing to the device at that moment must hold it first (the removal then waits for the
-- start's commit and finds its pushes), or wait for the removal and leave the device out. The single start did
-- (StartWrite: its planned devices FOR KEY SHARE, its push-to-start tokens FOR SHARE). A campaign's start step held
-- only its Android devices, and only for their instance_devices rows: it queued a start to every device its
-- statement's snapshot saw, so an Android phone deleted while the step ran still got its FCM start, and an iPhone
-- (nothing held) its push-to-start one, after the user had logged out.
--
-- Now both ask this function, the one home of the rule: of a start's planned targets, device p_devices[k] with, for a
-- push-to-start target, token p_tokens[k] of activity type p_activity_types[k] (NULL for a device's own token: FCM),
-- the ones still there, held until the commit. A target is there while its device is (FOR KEY SHARE: a removal waits
-- for the caller's commit, or the caller waits for the removal and finds the device gone) and, with a push-to-start
-- token, while that token is active (FOR SHARE, so that a token retired meanwhile is seen even by a caller that waited
-- for its device: a registration holds the device, then retires its old token; a worker retires one APNs called dead).
-- Devices first, as every writer of tokens takes them. Each target comes back with its device's person now (a device
-- moved to someone else is no longer its planned person's). Looked up by key, one at a time (`= ANY(ARRAY(...))` and
-- LATERAL ... OFFSET 0), whatever the caller's planner settings (a campaign step turns nested loops off) and however
-- stale the statistics. VOLATILE, as it locks: its statement's snapshot is taken when it runs, so a removal that
-- committed after the caller's statement began is seen too. PL/pgSQL, so that its plan is made once per connection
-- (a single start's write asks it in every batch).
CREATE FUNCTION marquee_held_start_targets(
    p_tenant uuid, p_devices text[], p_tokens text[], p_activity_types text[]
) RETURNS TABLE (device_token text, person_id text, token text)
LANGUAGE plpgsql VOLATILE SECURITY INVOKER AS $$
#variable_conflict use_column
BEGIN
    RETURN QUERY
    WITH planned AS MATERIALIZED (
        SELECT DISTINCT v.device_token, v.token, CASE WHEN v.token IS NOT NULL THEN v.activity_type END AS activity_type
        FROM unnest(p_devices, p_tokens, p_activity_types) AS v(device_token, token, activity_type)
    ), live AS MATERIALIZED (
        SELECT dv.token, dv.person_id FROM devices dv
        WHERE dv.tenant_id = p_tenant AND dv.token = ANY(ARRAY(SELECT DISTINCT device_token FROM planned))
        FOR KEY SHARE
    ), tokens AS MATERIALIZED (
        -- After the devices (the condition is a one-time filter).
        SELECT s.device_token, s.token, s.activity_type
        FROM (SELECT * FROM planned WHERE token IS NOT NULL) p
        CROSS JOIN LATERAL (
            SELECT s.device_token, s.token, s.activity_type FROM push_to_start_tokens s
            WHERE s.tenant_id = p_tenant AND s.device_token = p.device_token AND s.activity_type = p.activity_type
              AND s.token = p.token AND s.status = 'active'
            OFFSET 0 FOR SHARE
        ) s
        WHERE (SELECT count(*) FROM live) >= 0
    )
    SELECT p.device_token, l.person_id, p.token
    FROM planned p
    JOIN live l ON l.token = p.device_token
    LEFT JOIN tokens t
      ON t.device_token = p.device_token AND t.token = p.token AND t.activity_type = p.activity_type
    WHERE p.token IS NULL OR t.token IS NOT NULL;
END;
$$;
GRANT EXECUTE ON FUNCTION marquee_held_start_targets(uuid, text[], text[], text[]) TO marquee_api, marquee_system;

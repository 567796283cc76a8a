-- An end reaches the activity tokens registered while it was being written.
--
-- An end is planned from the instance's targets as read before its write (the API's change context), and decides in
-- its write whether to wait for an activity token (pending_end, when a push-to-start went out to a device with no
-- token yet); a token registration queues the end for its token when it finds the instance ended with its end
-- pending (migration 0068). The two read different snapshots and neither waited for the other, so a token registered
-- between the end's read and its commit got no end (confirmed with two sessions): registered before the write's
-- snapshot, the write saw the token and did not wait, but its planned deliveries did not include it; registered
-- while the write ran, the registration saw the instance not yet ended. The activity stayed on the lock screen.
--
-- Now the two meet at the instance's row:
--   * a registration locks the instance row first (FOR NO KEY UPDATE, as an end's UPDATE does), so it either runs
--     wholly before an end's write reaches the row, or waits for the end to commit and then sees it ended;
--   * an instance found ended gets an end for every current activity-token target that has none queued or sent
--     (marquee_queue_missing_ends, the one home of the rule), not only when its end was pending;
--   * the API's ends ask marquee_queue_missing_ends again after their write, in the same transaction with a fresh
--     snapshot (LifecycleWrites: ChangeWrite.afterwards): a token registered before the write locked the row is seen.
-- A campaign-wide end needs nothing more: it locks its chunk's instances before it reads their targets.
CREATE FUNCTION marquee_queue_missing_ends(p_tenant uuid, p_instances text[]) RETURNS integer
LANGUAGE plpgsql VOLATILE SET enable_seqscan = off SET enable_nestloop = on AS $$
DECLARE
    v_queued integer;
BEGIN
    INSERT INTO delivery_queue (tenant_id, id, instance_id, device_token, provider, token_kind, token, operation,
                                instance_version, attributes, content_state, options, content_timestamp)
    SELECT p_tenant, marquee_ulid_uuid(), i.id, x.device_token, 'apns', 'activity', x.token, 'end', i.version,
           i.attributes, i.content_state, i.options, i.content_timestamp
    FROM instances i
    JOIN marquee_instance_targets(p_tenant, p_instances) x ON x.instance_id = i.id
    JOIN activity_tokens a ON a.tenant_id = i.tenant_id AND a.instance_id = i.id AND a.device_token = x.device_token
                          AND a.token = x.token AND a.status = 'active'
    WHERE i.tenant_id = p_tenant AND i.id = ANY (p_instances) AND i.state = 'ended' AND i.expires_at > now()
      AND NOT EXISTS (
          SELECT 1 FROM deliveries o
          WHERE o.tenant_id = p_tenant AND o.instance_id = i.id AND o.token = x.token AND o.operation = 'end');
    GET DIAGNOSTICS v_queued = ROW_COUNT;
    IF v_queued > 0 THEN
        PERFORM pg_notify('marquee_deliveries', '');
    END IF;
    RETURN v_queued;
END;
$$;
GRANT EXECUTE ON FUNCTION marquee_queue_missing_ends(uuid, text[]) TO marquee_api, marquee_system;

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

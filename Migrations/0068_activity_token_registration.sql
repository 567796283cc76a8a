-- Activity-token registration made cheaper for PostgreSQL: the ownership check planned once per connection, and the
-- look for an end already queued made only when an end is pending.
--
-- Every started activity reports its token (PUT /v1/live_notifications/{id}/tokens/{device}): a campaign of 100,000
-- people brings 100,000 of them within minutes. bench/campaign registered them at 1,105/s, and during the token step
-- of bench/api-update PostgreSQL used 67% of the machine at 1,124 registrations/s, about 1.2 ms of CPU each. Two
-- causes, found with pgbench calling marquee_register_instance_token in a loop and perf on its backend:
--   - marquee_device_belongs_to_instance was a SQL function that cannot be inlined (its body is an EXISTS
--     subquery), so its body was parsed and planned on every call;
--   - marquee_register_activity_token's pending-end insert looked for an earlier end in `deliveries`, the view over
--     the queue and every day partition of the history. Even when the instance has no end pending (nearly always)
--     the executor set that statement up in full, an index scan per partition: ExecutorStart was a third of the
--     backend's time.
-- Now the ownership check is PL/pgSQL, whose plan is kept for the session, and the registration reads the instance
-- first: only an instance whose end is pending has the earlier ends looked up and its end queued. One client,
-- synchronous_commit off, a database of 10,000 instances: 0.71–0.79 ms a registration before, 0.48–0.55 ms with the
-- ownership check alone in PL/pgSQL (see 0067 for marquee_enter_tenant).
--
-- The rules are unchanged: the device is the instance's person's or the instance's target device; a registration
-- retires the device's other active token for the instance; an end kept for want of a token (pending_end) is queued
-- for this token unless an end was already queued or sent to it.

CREATE OR REPLACE FUNCTION marquee_device_belongs_to_instance(p_tenant uuid, p_instance text, p_device text)
RETURNS boolean
LANGUAGE plpgsql STABLE SECURITY INVOKER AS $$
BEGIN
    RETURN EXISTS (
        SELECT 1 FROM instances i
        JOIN devices d ON d.tenant_id = i.tenant_id AND d.token = p_device
        WHERE i.tenant_id = p_tenant AND i.id = p_instance
          AND (d.person_id = i.person_id OR d.token = i.target_device));
END;
$$;

CREATE OR REPLACE FUNCTION marquee_register_activity_token(p_tenant uuid, p_instance text, p_device text, p_token text)
RETURNS TABLE(outcome text, rotated boolean, inserted boolean)
LANGUAGE plpgsql SET enable_seqscan = off AS $$
DECLARE
    v_retired integer;
    v_inserted boolean;
    v_ended instances%ROWTYPE;
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
    -- An end kept until a token registers (pending_end) goes to this token, unless an end was already queued or
    -- sent to it. Separate statements, so that the earlier ends are looked up only for an instance with an end
    -- pending: a statement is set up in full even when it finds nothing.
    SELECT * INTO v_ended FROM instances i
    WHERE i.tenant_id = p_tenant AND i.id = p_instance AND i.state = 'ended' AND i.pending_end
      AND i.expires_at > now();
    IF FOUND THEN
        IF NOT EXISTS (
            SELECT 1 FROM deliveries o
            WHERE o.tenant_id = p_tenant AND o.instance_id = p_instance AND o.token = p_token AND o.operation = 'end'
        ) THEN
            INSERT INTO delivery_queue (tenant_id, id, instance_id, device_token, provider, token_kind, token,
                                        operation, instance_version, attributes, content_state, options,
                                        content_timestamp)
            VALUES (p_tenant, marquee_ulid_uuid(), p_instance, p_device, 'apns', 'activity', p_token, 'end',
                    v_ended.version, v_ended.attributes, v_ended.content_state, v_ended.options,
                    v_ended.content_timestamp);
            PERFORM pg_notify('marquee_deliveries', '');
        END IF;
    END IF;
    RETURN QUERY SELECT 'ok'::text, v_retired > 0, v_inserted;
END;
$$;

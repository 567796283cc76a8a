-- Catch-up ends (migration 0076) go through the target's own provider, and at most three to a device.
--
-- An instance found ended when an activity token registers (or after an API end's write) gets an end for every
-- current activity-token target that has none queued or sent. Two mistakes:
--   * the end was always queued for APNs, also for an Android device's activity token, which every other writer
--     (the planner, a campaign's steps) sends through FCM: the end went to the wrong provider, and the device's
--     Live Update stayed;
--   * "none queued or sent" was asked per token, so each new token registered for an ended instance queued one
--     more end. The sdk key is public: a client looping on registrations with made-up tokens had Marquee send that
--     many pushes with the tenant's APNs key (each a BadDeviceToken). A device may rotate its token after an end,
--     so a second end to a device is legitimate; three are enough for that and bound the rest.
CREATE OR REPLACE FUNCTION marquee_queue_missing_ends(p_tenant uuid, p_instances text[]) RETURNS integer
LANGUAGE plpgsql VOLATILE SET enable_seqscan = off SET enable_nestloop = on AS $$
DECLARE
    v_queued integer;
BEGIN
    INSERT INTO delivery_queue (tenant_id, id, instance_id, device_token, provider, token_kind, token, operation,
                                instance_version, attributes, content_state, options, content_timestamp)
    SELECT p_tenant, marquee_ulid_uuid(), i.id, x.device_token,
           CASE x.platform WHEN 'ios' THEN 'apns' ELSE 'fcm' END,
           CASE x.platform WHEN 'ios' THEN 'activity' ELSE 'fcm' END,
           x.token, 'end', i.version, i.attributes, i.content_state, i.options, i.content_timestamp
    FROM instances i
    JOIN marquee_instance_targets(p_tenant, p_instances) x ON x.instance_id = i.id
    JOIN activity_tokens a ON a.tenant_id = i.tenant_id AND a.instance_id = i.id AND a.device_token = x.device_token
                          AND a.token = x.token AND a.status = 'active'
    WHERE i.tenant_id = p_tenant AND i.id = ANY (p_instances) AND i.state = 'ended' AND i.expires_at > now()
      AND NOT EXISTS (
          SELECT 1 FROM deliveries o
          WHERE o.tenant_id = p_tenant AND o.instance_id = i.id AND o.token = x.token AND o.operation = 'end')
      AND (SELECT count(*) FROM deliveries o
           WHERE o.tenant_id = p_tenant AND o.instance_id = i.id AND o.device_token = x.device_token
             AND o.operation = 'end') < 3;
    GET DIAGNOSTICS v_queued = ROW_COUNT;
    IF v_queued > 0 THEN
        PERFORM pg_notify('marquee_deliveries', '');
    END IF;
    RETURN v_queued;
END;
$$;

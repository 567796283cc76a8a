-- Broadcast instances (issue 13): an instance started with a channel is channel-backed. Its push-to-start pushes
-- carry the channel (`input-push-channel`), and each update or end goes to Apple as one broadcast on it (a delivery
-- of token_kind `channel` whose token is Apple's channel ID), beside the per-token pushes of devices that registered
-- an activity token (iOS 17, Android). Deleting the channel turns the instance back into a per-token one.

ALTER TABLE instances ADD COLUMN channel_id uuid;
ALTER TABLE instances ADD FOREIGN KEY (tenant_id, channel_id) REFERENCES channels (tenant_id, id)
    ON DELETE SET NULL (channel_id);
CREATE INDEX instances_channel ON instances (tenant_id, channel_id) WHERE channel_id IS NOT NULL;

ALTER TABLE deliveries DROP CONSTRAINT deliveries_token_kind_check;
ALTER TABLE deliveries ADD CONSTRAINT deliveries_token_kind_check
    CHECK (token_kind IN ('push_to_start', 'activity', 'fcm', 'channel'));

-- The change context (0005) also answers with the instance's channel.
DROP FUNCTION marquee_change_context(uuid, text, text);
CREATE FUNCTION marquee_change_context(p_tenant uuid, p_instance text, p_key text)
RETURNS TABLE (
    id text, activity_type text, person_id text, person_email text, state text, failure_reason text,
    attributes jsonb, content_state jsonb, options jsonb, version integer, content_timestamp bigint,
    target_platform text, target_device text, expires_at timestamptz, started_at timestamptz, ended_at timestamptz,
    updated_at timestamptz,
    identifier text, attributes_type text, content_state_schema jsonb, date_fields jsonb, payload_profile text,
    auto_created boolean, type_created_at timestamptz, type_updated_at timestamptz,
    targets jsonb, idem_status integer, idem_response jsonb, idem_hash bytea,
    channel_id uuid, channel_status text, apns_channel_id text, channel_storage_policy text, channel_bundle_id text
)
LANGUAGE plpgsql VOLATILE SECURITY INVOKER AS $$
BEGIN
    PERFORM marquee_enter_tenant(p_tenant);
    RETURN QUERY
    SELECT i.id, i.activity_type, i.person_id, i.person_email, i.state, i.failure_reason, i.attributes,
           i.content_state, i.options, i.version, i.content_timestamp, i.target_platform, i.target_device,
           i.expires_at, i.started_at, i.ended_at, i.updated_at,
           t.identifier, t.attributes_type, t.content_state_schema, t.date_fields, t.payload_profile, t.auto_created,
           t.created_at, t.updated_at,
           COALESCE((
               SELECT jsonb_agg(jsonb_build_object('device_token', x.device_token, 'platform', x.platform,
                                                   'token', x.token) ORDER BY x.device_token)
               FROM (
                   SELECT a.device_token, d.platform, a.token
                   FROM activity_tokens a
                   JOIN devices d ON d.tenant_id = a.tenant_id AND d.token = a.device_token
                   WHERE a.tenant_id = p_tenant AND a.instance_id = p_instance AND a.status = 'active'
                     AND NOT EXISTS (
                         SELECT 1 FROM instance_devices s
                         WHERE s.tenant_id = a.tenant_id AND s.instance_id = a.instance_id
                           AND s.device_token = a.device_token AND s.state IN ('ended', 'dismissed'))
                   UNION ALL
                   SELECT s.device_token, d.platform, d.token
                   FROM instance_devices s
                   JOIN devices d ON d.tenant_id = s.tenant_id AND d.token = s.device_token
                   WHERE s.tenant_id = p_tenant AND s.instance_id = p_instance AND d.platform = 'android'
                     AND s.state NOT IN ('ended', 'dismissed')
                     AND NOT EXISTS (
                         SELECT 1 FROM activity_tokens a
                         WHERE a.tenant_id = s.tenant_id AND a.instance_id = s.instance_id
                           AND a.device_token = s.device_token AND a.status = 'active')
               ) x), '[]'::jsonb),
           k.status, k.response, k.request_hash,
           i.channel_id, ch.status, ch.apns_channel_id, ch.storage_policy, ch.bundle_id
    FROM instances i
    JOIN activity_types t ON t.tenant_id = i.tenant_id AND t.identifier = i.activity_type
    LEFT JOIN channels ch ON ch.tenant_id = i.tenant_id AND ch.id = i.channel_id
    LEFT JOIN idempotency_keys k
      ON p_key IS NOT NULL AND k.tenant_id = i.tenant_id AND k.key = p_key
     AND k.created_at > now() - interval '24 hours'
    WHERE i.tenant_id = p_tenant AND i.id = p_instance;
END;
$$;
GRANT EXECUTE ON FUNCTION marquee_change_context(uuid, text, text) TO marquee_api;

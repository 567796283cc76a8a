-- Tokens APNs refused because of the tenant's credential are given back when the credential is corrected.
--
-- APNs answers BadDeviceToken when a token is not valid for the environment it was pushed to (a development build's
-- token sent to production, or the other way round), and DeviceTokenNotForTopic when it belongs to another app. The
-- worker retires such a token, as Apple asks. But when the cause is the tenant's credential (the wrong environment or
-- bundle ID uploaded), every token tried with it was retired, and correcting the credential brought none back: every
-- open activity lost its token, and every device its push-to-start token until the app registered again.
--
-- When a tenant's APNs credential changes its environment, bundle ID or endpoint, the tokens retired for these two
-- reasons while the previous configuration was in place (since its `configured_at`: a new key for the same
-- configuration does not move it) are active again: for each device (and instance, or activity type) the one retired
-- last, unless the device has registered an active one since (the newer stays).
ALTER TABLE apns_credentials ADD COLUMN configured_at timestamptz NOT NULL DEFAULT now();

CREATE FUNCTION marquee_apns_configuration_changed() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    NEW.configured_at := now();
    UPDATE activity_tokens t SET status = 'active', retired_reason = NULL, retired_at = NULL
    FROM (
        SELECT DISTINCT ON (r.instance_id, r.device_token) r.instance_id, r.device_token, r.token
        FROM activity_tokens r
        WHERE r.tenant_id = NEW.tenant_id AND r.status = 'retired'
          AND r.retired_reason IN ('BadDeviceToken', 'DeviceTokenNotForTopic') AND r.retired_at >= OLD.configured_at
        ORDER BY r.instance_id, r.device_token, r.retired_at DESC
    ) c
    WHERE t.tenant_id = NEW.tenant_id AND t.instance_id = c.instance_id AND t.device_token = c.device_token
      AND t.token = c.token
      AND NOT EXISTS (
          SELECT 1 FROM activity_tokens a
          WHERE a.tenant_id = t.tenant_id AND a.instance_id = t.instance_id AND a.device_token = t.device_token
            AND a.status = 'active');
    UPDATE push_to_start_tokens t SET status = 'active', retired_reason = NULL, retired_at = NULL
    FROM (
        SELECT DISTINCT ON (r.device_token, r.activity_type) r.device_token, r.activity_type, r.token
        FROM push_to_start_tokens r
        WHERE r.tenant_id = NEW.tenant_id AND r.status = 'retired'
          AND r.retired_reason IN ('BadDeviceToken', 'DeviceTokenNotForTopic') AND r.retired_at >= OLD.configured_at
        ORDER BY r.device_token, r.activity_type, r.retired_at DESC
    ) c
    WHERE t.tenant_id = NEW.tenant_id AND t.device_token = c.device_token AND t.activity_type = c.activity_type
      AND t.token = c.token
      AND NOT EXISTS (
          SELECT 1 FROM push_to_start_tokens a
          WHERE a.tenant_id = t.tenant_id AND a.device_token = t.device_token AND a.activity_type = t.activity_type
            AND a.status = 'active');
    RETURN NEW;
END;
$$;

CREATE TRIGGER apns_credentials_configuration BEFORE UPDATE OF environment, bundle_id, endpoint ON apns_credentials
    FOR EACH ROW
    WHEN (OLD.environment IS DISTINCT FROM NEW.environment OR OLD.bundle_id IS DISTINCT FROM NEW.bundle_id
          OR OLD.endpoint IS DISTINCT FROM NEW.endpoint)
    EXECUTE FUNCTION marquee_apns_configuration_changed();

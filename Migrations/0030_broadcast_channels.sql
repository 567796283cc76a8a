-- iOS 18 broadcast channels (issue 13, channel management): a tenant's channels as created at Apple, and the APNs
-- credential's optional management host override.
--
-- A channel is created at Apple first (synchronously, by the API) and recorded here with the opaque ID Apple
-- assigned; deleting it deletes it at Apple, then here. `environment` and `bundle_id` are the credential's at
-- creation: a channel lives in one app and one APNs environment, whatever the credential becomes later.
-- `status` is `active`, or `gone` once Apple no longer knows the channel (ChannelNotRegistered / BadChannelId).

-- `https://host:port`: overrides api-manage-broadcast[.sandbox].push.apple.com for channel management. Checked
-- against MARQUEE_PROVIDER_HOSTS like `endpoint`, at upload and again before each connection.
ALTER TABLE apns_credentials ADD COLUMN management_endpoint text;

CREATE TABLE channels (
    tenant_id uuid NOT NULL REFERENCES tenants (id) ON DELETE CASCADE,
    -- A ULID (shown in its text form).
    id uuid NOT NULL,
    activity_type text NOT NULL,
    storage_policy text NOT NULL CHECK (storage_policy IN ('none', 'most_recent')),
    apns_channel_id text NOT NULL CHECK (length(apns_channel_id) BETWEEN 1 AND 1024),
    bundle_id text NOT NULL,
    environment text NOT NULL CHECK (environment IN ('sandbox', 'production')),
    status text NOT NULL DEFAULT 'active' CHECK (status IN ('active', 'gone')),
    status_reason text,
    created_at timestamptz NOT NULL DEFAULT now(),
    updated_at timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (tenant_id, id),
    UNIQUE (tenant_id, environment, apns_channel_id)
);
CREATE INDEX channels_activity_type ON channels (tenant_id, activity_type, id DESC);
CREATE TRIGGER touch BEFORE UPDATE ON channels FOR EACH ROW EXECUTE FUNCTION marquee_touch_updated_at();

SELECT marquee_protect_tenant_table('channels');

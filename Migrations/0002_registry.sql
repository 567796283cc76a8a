-- Tenants, API keys, credentials, activity types, people, devices and tokens.
--
-- Every tenant-owned table has tenant_id first in its primary key and in every unique index, and row-level
-- security limits the API's role (marquee_api) to the tenant set for the transaction with
--   SET LOCAL ROLE marquee_api; SELECT set_config('marquee.tenant_id', '<uuid>', true);
-- A transaction that sets no tenant sees no rows. The owning role (migrations, admin operations, key lookup)
-- is not subject to these policies; the API's tenant-scoped work always runs as marquee_api.

DO $$
BEGIN
    CREATE ROLE marquee_api NOLOGIN;
EXCEPTION
    -- Roles are cluster-wide: another database of the same cluster may have created it already.
    WHEN duplicate_object OR unique_violation THEN NULL;
END
$$;
GRANT marquee_api TO CURRENT_USER;
GRANT USAGE ON SCHEMA public TO marquee_api;
GRANT EXECUTE ON FUNCTION marquee_current_tenant() TO marquee_api;

CREATE TABLE tenants (
    id uuid PRIMARY KEY,
    name text NOT NULL CHECK (length(name) BETWEEN 1 AND 200),
    -- HMAC key for delivery tokens, sealed under the master key.
    sealed_delivery_secret bytea NOT NULL,
    created_at timestamptz NOT NULL DEFAULT now()
);

-- Keys are looked up by (tenant, hash): the tenant ID is part of the key text, so no global index is needed.
CREATE TABLE api_keys (
    tenant_id uuid NOT NULL REFERENCES tenants (id) ON DELETE CASCADE,
    id uuid NOT NULL,
    kind text NOT NULL CHECK (kind IN ('app', 'sdk')),
    hash bytea NOT NULL CHECK (length(hash) = 32),
    -- The first characters of the secret part, to tell keys apart in listings.
    hint text NOT NULL,
    created_at timestamptz NOT NULL DEFAULT now(),
    revoked_at timestamptz,
    last_used_at timestamptz,
    PRIMARY KEY (tenant_id, id),
    UNIQUE (tenant_id, hash)
);

CREATE TABLE apns_credentials (
    tenant_id uuid PRIMARY KEY REFERENCES tenants (id) ON DELETE CASCADE,
    team_id text NOT NULL,
    key_id text NOT NULL,
    bundle_id text NOT NULL,
    environment text NOT NULL CHECK (environment IN ('sandbox', 'production')),
    endpoint text,
    sealed_private_key bytea NOT NULL,
    status text NOT NULL DEFAULT 'ok' CHECK (status IN ('ok', 'broken')),
    status_reason text,
    created_at timestamptz NOT NULL DEFAULT now(),
    updated_at timestamptz NOT NULL DEFAULT now()
);

CREATE TABLE fcm_credentials (
    tenant_id uuid PRIMARY KEY REFERENCES tenants (id) ON DELETE CASCADE,
    project_id text NOT NULL,
    client_email text NOT NULL,
    private_key_id text,
    token_uri text NOT NULL,
    endpoint text,
    sealed_service_account bytea NOT NULL,
    status text NOT NULL DEFAULT 'ok' CHECK (status IN ('ok', 'broken')),
    status_reason text,
    created_at timestamptz NOT NULL DEFAULT now(),
    updated_at timestamptz NOT NULL DEFAULT now()
);

CREATE TABLE activity_types (
    tenant_id uuid NOT NULL REFERENCES tenants (id) ON DELETE CASCADE,
    identifier text NOT NULL,
    attributes_type text NOT NULL,
    content_state_schema jsonb,
    date_fields jsonb NOT NULL DEFAULT '{}',
    payload_profile text NOT NULL DEFAULT 'marquee' CHECK (payload_profile IN ('marquee', 'customerio', 'capacitor')),
    auto_created boolean NOT NULL DEFAULT false,
    created_at timestamptz NOT NULL DEFAULT now(),
    updated_at timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (tenant_id, identifier)
);

CREATE TABLE people (
    tenant_id uuid NOT NULL REFERENCES tenants (id) ON DELETE CASCADE,
    id text NOT NULL,
    email text,
    attributes jsonb NOT NULL DEFAULT '{}',
    created_at timestamptz NOT NULL DEFAULT now(),
    updated_at timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (tenant_id, id)
);
CREATE UNIQUE INDEX people_email ON people (tenant_id, lower(email)) WHERE email IS NOT NULL;

-- A device has one owner; re-registering its token under another person moves it.
CREATE TABLE devices (
    tenant_id uuid NOT NULL,
    token text NOT NULL,
    person_id text NOT NULL,
    platform text NOT NULL CHECK (platform IN ('ios', 'android')),
    app_id text,
    os_version text,
    app_version text,
    attributes jsonb NOT NULL DEFAULT '{}',
    created_at timestamptz NOT NULL DEFAULT now(),
    updated_at timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (tenant_id, token),
    FOREIGN KEY (tenant_id, person_id) REFERENCES people (tenant_id, id) ON DELETE CASCADE
);
CREATE INDEX devices_person ON devices (tenant_id, person_id);

-- Push-to-start tokens, per (device, activity type). Rotation retires the old row and inserts the new one.
CREATE TABLE push_to_start_tokens (
    tenant_id uuid NOT NULL,
    device_token text NOT NULL,
    activity_type text NOT NULL,
    token text NOT NULL,
    attributes_type text,
    status text NOT NULL DEFAULT 'active' CHECK (status IN ('active', 'retired')),
    retired_reason text,
    created_at timestamptz NOT NULL DEFAULT now(),
    updated_at timestamptz NOT NULL DEFAULT now(),
    retired_at timestamptz,
    PRIMARY KEY (tenant_id, device_token, activity_type, token),
    FOREIGN KEY (tenant_id, device_token) REFERENCES devices (tenant_id, token) ON DELETE CASCADE
);
CREATE UNIQUE INDEX push_to_start_active ON push_to_start_tokens (tenant_id, device_token, activity_type)
    WHERE status = 'active';

-- Per-activity (update) tokens, per (instance, device).
CREATE TABLE activity_tokens (
    tenant_id uuid NOT NULL,
    instance_id text NOT NULL,
    device_token text NOT NULL,
    token text NOT NULL,
    status text NOT NULL DEFAULT 'active' CHECK (status IN ('active', 'retired')),
    retired_reason text,
    created_at timestamptz NOT NULL DEFAULT now(),
    updated_at timestamptz NOT NULL DEFAULT now(),
    retired_at timestamptz,
    PRIMARY KEY (tenant_id, instance_id, device_token, token),
    FOREIGN KEY (tenant_id, device_token) REFERENCES devices (tenant_id, token) ON DELETE CASCADE
);
CREATE UNIQUE INDEX activity_tokens_active ON activity_tokens (tenant_id, instance_id, device_token)
    WHERE status = 'active';

-- The last lifecycle state each device reported for an instance; `ended` and `dismissed` stop sends.
CREATE TABLE instance_devices (
    tenant_id uuid NOT NULL,
    instance_id text NOT NULL,
    device_token text NOT NULL,
    state text NOT NULL CHECK (state IN ('started', 'updated', 'ended', 'dismissed', 'stale')),
    state_at timestamptz NOT NULL,
    content_state jsonb,
    updated_at timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (tenant_id, instance_id, device_token),
    FOREIGN KEY (tenant_id, device_token) REFERENCES devices (tenant_id, token) ON DELETE CASCADE
);

-- Every lifecycle event as reported.
CREATE TABLE activity_events (
    tenant_id uuid NOT NULL REFERENCES tenants (id) ON DELETE CASCADE,
    id uuid NOT NULL,
    instance_id text NOT NULL,
    device_token text,
    event text NOT NULL,
    at timestamptz NOT NULL,
    content_state jsonb,
    received_at timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (tenant_id, id)
);
CREATE INDEX activity_events_instance ON activity_events (tenant_id, instance_id, at);

-- Delivered / opened reports. `delivered` is kept once per (delivery, recipient); `opened` every time.
CREATE TABLE delivery_metrics (
    tenant_id uuid NOT NULL REFERENCES tenants (id) ON DELETE CASCADE,
    id uuid NOT NULL,
    delivery_id text NOT NULL,
    metric text NOT NULL CHECK (metric IN ('delivered', 'opened')),
    recipient text NOT NULL DEFAULT '',
    at timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (tenant_id, id)
);
CREATE UNIQUE INDEX delivery_metrics_delivered_once ON delivery_metrics (tenant_id, delivery_id, recipient)
    WHERE metric = 'delivered';
CREATE INDEX delivery_metrics_delivery ON delivery_metrics (tenant_id, delivery_id);

-- Row-level security: marquee_api sees only the transaction's tenant.
DO $$
DECLARE
    t text;
BEGIN
    FOREACH t IN ARRAY ARRAY['api_keys', 'apns_credentials', 'fcm_credentials', 'activity_types', 'people',
                             'devices', 'push_to_start_tokens', 'activity_tokens', 'instance_devices',
                             'activity_events', 'delivery_metrics']
    LOOP
        EXECUTE format('ALTER TABLE %I ENABLE ROW LEVEL SECURITY', t);
        EXECUTE format('CREATE POLICY tenant_isolation ON %I TO marquee_api
                            USING (tenant_id = marquee_current_tenant())
                            WITH CHECK (tenant_id = marquee_current_tenant())', t);
        EXECUTE format('GRANT SELECT, INSERT, UPDATE, DELETE ON %I TO marquee_api', t);
    END LOOP;
END
$$;

-- tenants: the API role may read its own tenant row only.
ALTER TABLE tenants ENABLE ROW LEVEL SECURITY;
CREATE POLICY tenant_isolation ON tenants TO marquee_api USING (id = marquee_current_tenant());
GRANT SELECT ON tenants TO marquee_api;

CREATE TRIGGER touch BEFORE UPDATE ON apns_credentials FOR EACH ROW EXECUTE FUNCTION marquee_touch_updated_at();
CREATE TRIGGER touch BEFORE UPDATE ON fcm_credentials FOR EACH ROW EXECUTE FUNCTION marquee_touch_updated_at();
CREATE TRIGGER touch BEFORE UPDATE ON activity_types FOR EACH ROW EXECUTE FUNCTION marquee_touch_updated_at();
CREATE TRIGGER touch BEFORE UPDATE ON people FOR EACH ROW EXECUTE FUNCTION marquee_touch_updated_at();
CREATE TRIGGER touch BEFORE UPDATE ON devices FOR EACH ROW EXECUTE FUNCTION marquee_touch_updated_at();
CREATE TRIGGER touch BEFORE UPDATE ON push_to_start_tokens FOR EACH ROW EXECUTE FUNCTION marquee_touch_updated_at();
CREATE TRIGGER touch BEFORE UPDATE ON activity_tokens FOR EACH ROW EXECUTE FUNCTION marquee_touch_updated_at();
CREATE TRIGGER touch BEFORE UPDATE ON instance_devices FOR EACH ROW EXECUTE FUNCTION marquee_touch_updated_at();

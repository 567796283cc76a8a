-- Live activity instances and their deliveries (the transactional outbox and the delivery queue).

CREATE TABLE instances (
    tenant_id uuid NOT NULL REFERENCES tenants (id) ON DELETE CASCADE,
    id text NOT NULL,
    activity_type text NOT NULL,
    person_id text,
    person_email text,
    state text NOT NULL CHECK (state IN ('pending', 'active', 'ended', 'expired', 'failed')),
    failure_reason text,
    attributes jsonb NOT NULL,
    content_state jsonb NOT NULL,
    -- The options of the latest change: alert, deep_link, stale_date, relevance_score, priority, dismissal_date,
    -- dismissal_policy. The worker composes each push from this row as it is when the push is sent.
    options jsonb NOT NULL DEFAULT '{}',
    -- Incremented by every accepted start/update/end; deliveries record the version they were queued for.
    version integer NOT NULL DEFAULT 1,
    -- The APNs `timestamp` of the current version: epoch seconds, strictly increasing per instance.
    content_timestamp bigint NOT NULL,
    target_platform text CHECK (target_platform IN ('ios', 'android')),
    target_device text,
    -- The start response, replayed for a repeated client-chosen instance ID.
    start_response jsonb,
    expires_at timestamptz NOT NULL,
    started_at timestamptz NOT NULL DEFAULT now(),
    ended_at timestamptz,
    updated_at timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (tenant_id, id)
);
CREATE INDEX instances_recent ON instances (tenant_id, started_at DESC, id DESC);
CREATE INDEX instances_person ON instances (tenant_id, person_id, started_at DESC);

CREATE TABLE deliveries (
    tenant_id uuid NOT NULL,
    id uuid NOT NULL,
    instance_id text NOT NULL,
    device_token text NOT NULL,
    provider text NOT NULL CHECK (provider IN ('apns', 'fcm')),
    token_kind text NOT NULL CHECK (token_kind IN ('push_to_start', 'activity', 'fcm')),
    token text NOT NULL,
    operation text NOT NULL CHECK (operation IN ('start', 'update', 'end')),
    instance_version integer NOT NULL,
    status text NOT NULL DEFAULT 'queued'
        CHECK (status IN ('queued', 'sent', 'failed', 'undeliverable', 'superseded')),
    attempts integer NOT NULL DEFAULT 0,
    next_attempt_at timestamptz NOT NULL DEFAULT now(),
    locked_until timestamptz,
    locked_by text,
    provider_id text,
    http_status integer,
    reason text,
    created_at timestamptz NOT NULL DEFAULT now(),
    updated_at timestamptz NOT NULL DEFAULT now(),
    sent_at timestamptz,
    PRIMARY KEY (tenant_id, id),
    FOREIGN KEY (tenant_id, instance_id) REFERENCES instances (tenant_id, id) ON DELETE CASCADE
);
-- The queue: what workers claim, oldest due first.
CREATE INDEX deliveries_due ON deliveries (next_attempt_at) WHERE status = 'queued';
CREATE INDEX deliveries_instance ON deliveries (tenant_id, instance_id, id DESC);
CREATE INDEX deliveries_queued_token ON deliveries (tenant_id, instance_id, token) WHERE status = 'queued';

-- Responses of requests that carried an Idempotency-Key, replayed on repeats.
CREATE TABLE idempotency_keys (
    tenant_id uuid NOT NULL REFERENCES tenants (id) ON DELETE CASCADE,
    key text NOT NULL,
    request_hash bytea NOT NULL,
    status integer NOT NULL,
    response jsonb NOT NULL,
    created_at timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (tenant_id, key)
);

DO $$
DECLARE
    t text;
BEGIN
    FOREACH t IN ARRAY ARRAY['instances', 'deliveries', 'idempotency_keys']
    LOOP
        EXECUTE format('ALTER TABLE %I ENABLE ROW LEVEL SECURITY', t);
        EXECUTE format('CREATE POLICY tenant_isolation ON %I TO marquee_api
                            USING (tenant_id = marquee_current_tenant())
                            WITH CHECK (tenant_id = marquee_current_tenant())', t);
        EXECUTE format('GRANT SELECT, INSERT, UPDATE, DELETE ON %I TO marquee_api', t);
    END LOOP;
END
$$;

-- Campaigns (issue 12): one start for a whole audience, campaign-wide updates and ends, schedules run exactly once by
-- the worker pool, and funnels. Everything is set-based: a campaign of 100,000 people is a few statements.

CREATE TABLE campaigns (
    tenant_id uuid NOT NULL REFERENCES tenants (id) ON DELETE CASCADE,
    -- Short enough that `<campaign_id>.<person_id>` is a usable instance ID for most person IDs.
    id text NOT NULL CHECK (id ~ '^[A-Za-z0-9._:-]{1,64}$'),
    name text NOT NULL CHECK (length(name) BETWEEN 1 AND 200),
    activity_type text NOT NULL,
    -- {"segment": id} | {"people": [ids]} | {"all": true}, as the client sent it (validated).
    audience jsonb NOT NULL,
    -- The attributes of every instance; `{"$person": "/pointer"}` nodes are filled from each person's attributes at
    -- start (marquee_fill_person below).
    attributes jsonb NOT NULL,
    -- The initial content state, in device encoding, checked against the activity type's schema.
    content_state jsonb NOT NULL,
    -- The start's options (alert, deep link, stale date, relevance, priority), as StoredOptions writes them.
    options jsonb NOT NULL DEFAULT '{}',
    platform text CHECK (platform IN ('ios', 'android')),
    expires_at timestamptz,
    rate_limit_per_second integer CHECK (rate_limit_per_second BETWEEN 1 AND 1000000),
    -- A broadcast channel (issue 13): its instances subscribe to it at start, and each campaign-wide change is one
    -- broadcast on it beside per-token pushes (activity tokens of iPhones that could not subscribe, Android).
    channel_id uuid,
    -- Stored states; `ending` and `ended` are derived from the instances when read.
    state text NOT NULL CHECK (state IN ('scheduled', 'active', 'failed', 'cancelled')),
    failure_reason text,
    start_at timestamptz NOT NULL,
    audience_size integer,
    started_at timestamptz,
    ended_at timestamptz,
    cancelled_at timestamptz,
    created_at timestamptz NOT NULL DEFAULT now(),
    updated_at timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (tenant_id, id),
    FOREIGN KEY (tenant_id, channel_id) REFERENCES channels (tenant_id, id) ON DELETE SET NULL (channel_id)
);
CREATE INDEX campaigns_recent ON campaigns (tenant_id, created_at DESC, id DESC);
CREATE TRIGGER touch BEFORE UPDATE ON campaigns FOR EACH ROW EXECUTE FUNCTION marquee_touch_updated_at();

-- The audience as resolved at start: who the campaign addressed, and why someone got no instance.
CREATE TABLE campaign_members (
    tenant_id uuid NOT NULL,
    campaign_id text NOT NULL,
    person_id text NOT NULL,
    instance_id text NOT NULL,
    -- NULL: an instance was started. `missing_attribute`: a `$person` pointer without a value and no default;
    -- `instance_id_taken`: an instance with that ID existed already.
    skipped_reason text,
    PRIMARY KEY (tenant_id, campaign_id, person_id),
    FOREIGN KEY (tenant_id, campaign_id) REFERENCES campaigns (tenant_id, id) ON DELETE CASCADE
);

-- A campaign-wide change supersedes the campaign's queued broadcast (latest wins) without walking its instances.
CREATE INDEX deliveries_queued_channel ON deliveries (tenant_id, token)
    WHERE token_kind = 'channel' AND status IN ('queued', 'parked');

ALTER TABLE instances ADD COLUMN campaign_id text;
ALTER TABLE instances ADD FOREIGN KEY (tenant_id, campaign_id) REFERENCES campaigns (tenant_id, id);
CREATE INDEX instances_campaign ON instances (tenant_id, campaign_id) WHERE campaign_id IS NOT NULL;

-- A campaign's start and its scheduled campaign-wide changes. A worker runs a due row in the transaction that marks
-- it done (FOR UPDATE SKIP LOCKED), so each runs exactly once whatever the number of workers; a crash rolls it back
-- for another worker to run.
CREATE TABLE campaign_schedules (
    tenant_id uuid NOT NULL,
    campaign_id text NOT NULL,
    id uuid NOT NULL,
    operation text NOT NULL CHECK (operation IN ('start', 'update', 'end')),
    -- The change as the API validated it (update/end): content_state | content_state_patch, options.
    change jsonb NOT NULL DEFAULT '{}',
    due_at timestamptz NOT NULL,
    state text NOT NULL DEFAULT 'pending' CHECK (state IN ('pending', 'done', 'failed', 'cancelled')),
    -- What the run did: instances written, deliveries queued, skipped counts; or why it failed.
    result jsonb,
    created_at timestamptz NOT NULL DEFAULT now(),
    executed_at timestamptz,
    PRIMARY KEY (tenant_id, id),
    FOREIGN KEY (tenant_id, campaign_id) REFERENCES campaigns (tenant_id, id) ON DELETE CASCADE
);
CREATE INDEX campaign_schedules_due ON campaign_schedules (due_at) WHERE state = 'pending';
CREATE INDEX campaign_schedules_campaign ON campaign_schedules (tenant_id, campaign_id, due_at);

SELECT marquee_protect_tenant_table('campaigns');
SELECT marquee_protect_tenant_table('campaign_members');
SELECT marquee_protect_tenant_table('campaign_schedules');

-- A campaign's attributes for one person: each `fills` entry {"at": [path in template], "pointer": [path in the
-- person's attributes], "default": value?} sets the value found at `pointer`, else `default`; NULL when a value is
-- missing and there is no default (the person is skipped with `missing_attribute`).
CREATE FUNCTION marquee_fill_person(p_template jsonb, p_fills jsonb, p_person jsonb) RETURNS jsonb
LANGUAGE plpgsql IMMUTABLE PARALLEL SAFE AS $$
DECLARE
    f jsonb;
    v jsonb;
    result jsonb := p_template;
BEGIN
    FOR f IN SELECT * FROM jsonb_array_elements(p_fills) LOOP
        v := p_person #> ARRAY(SELECT jsonb_array_elements_text(f -> 'pointer'));
        IF v IS NULL OR v = 'null'::jsonb THEN
            v := f -> 'default';
            IF v IS NULL THEN
                RETURN NULL;
            END IF;
        END IF;
        result := jsonb_set(result, ARRAY(SELECT jsonb_array_elements_text(f -> 'at')), v, false);
    END LOOP;
    RETURN result;
END
$$;

-- A new ULID as a uuid (48-bit milliseconds, then random bits), for rows written in SQL beside ones from Swift's
-- ULIDGenerator: delivery IDs sort by time either way.
CREATE FUNCTION marquee_new_ulid() RETURNS uuid
LANGUAGE sql VOLATILE PARALLEL SAFE AS $$
    SELECT encode(substring(int8send((extract(epoch FROM clock_timestamp()) * 1000)::bigint) FROM 3)
                  || substring(uuid_send(gen_random_uuid()) FROM 7 FOR 10), 'hex')::uuid
$$;

-- Delivered / opened reports also keep the delivery they name as a uuid (the API decodes the ULID an SDK reports;
-- NULL when it is not one), so a funnel joins them to a campaign's deliveries by key. Reports recorded before this
-- migration have none; no campaign existed then.
ALTER TABLE delivery_metrics ADD COLUMN delivery_uuid uuid;
CREATE INDEX delivery_metrics_delivery_uuid ON delivery_metrics (tenant_id, delivery_uuid)
    WHERE delivery_uuid IS NOT NULL;

DROP FUNCTION marquee_record_delivery_metric(uuid, text, text, text, timestamptz);
-- As in migration 0020, plus the delivery's uuid.
CREATE FUNCTION marquee_record_delivery_metric(
    p_tenant uuid, p_delivery text, p_metric text, p_recipient text, p_at timestamptz, p_delivery_uuid uuid
) RETURNS boolean
LANGUAGE plpgsql VOLATILE SECURITY INVOKER AS $$
BEGIN
    IF p_metric = 'delivered' THEN
        PERFORM pg_advisory_xact_lock(hashtextextended(format('delivered/%s/%s/%s', p_tenant, p_delivery,
                                                              p_recipient), 0));
        IF EXISTS (SELECT 1 FROM delivery_metrics
                   WHERE tenant_id = p_tenant AND delivery_id = p_delivery AND recipient = p_recipient
                     AND metric = 'delivered') THEN
            RETURN false;
        END IF;
    END IF;
    INSERT INTO delivery_metrics (tenant_id, id, delivery_id, metric, recipient, at, delivery_uuid)
    VALUES (p_tenant, gen_random_uuid(), p_delivery, p_metric, p_recipient, COALESCE(p_at, now()), p_delivery_uuid);
    RETURN true;
END;
$$;
GRANT EXECUTE ON FUNCTION marquee_record_delivery_metric(uuid, text, text, text, timestamptz, uuid)
    TO marquee_api, marquee_system;

-- The active targets of instances: their per-activity tokens (iOS) and the FCM tokens of their Android devices,
-- minus devices that reported the activity ended or dismissed. The one home of the rule, for one instance (the API's
-- reads and single changes: ARRAY[id]) or a whole campaign's in one scan (campaign-wide changes).
CREATE FUNCTION marquee_instance_targets(p_tenant uuid, p_instances text[])
RETURNS TABLE (instance_id text, device_token text, platform text, token text)
LANGUAGE sql STABLE AS $$
    SELECT a.instance_id, a.device_token, d.platform, a.token
    FROM activity_tokens a
    JOIN devices d ON d.tenant_id = a.tenant_id AND d.token = a.device_token
    WHERE a.tenant_id = p_tenant AND a.instance_id = ANY(p_instances) AND a.status = 'active'
      AND NOT EXISTS (
          SELECT 1 FROM instance_devices s
          WHERE s.tenant_id = a.tenant_id AND s.instance_id = a.instance_id AND s.device_token = a.device_token
            AND s.state IN ('ended', 'dismissed'))
    UNION ALL
    SELECT s.instance_id, s.device_token, d.platform, d.token
    FROM instance_devices s
    JOIN devices d ON d.tenant_id = s.tenant_id AND d.token = s.device_token
    WHERE s.tenant_id = p_tenant AND s.instance_id = ANY(p_instances) AND d.platform = 'android'
      AND s.state NOT IN ('ended', 'dismissed')
      AND NOT EXISTS (
          SELECT 1 FROM activity_tokens a
          WHERE a.tenant_id = s.tenant_id AND a.instance_id = s.instance_id AND a.device_token = s.device_token
            AND a.status = 'active')
$$;

-- Whether an end of the instance must wait for an activity token: a start went (or may be going) out by
-- push-to-start to a device that has not registered the started activity's token yet. The end is then kept
-- (`pending_end`) and queued when the token registers (marquee_register_activity_token).
CREATE FUNCTION marquee_end_waits_for_token(p_tenant uuid, p_instance text) RETURNS boolean
LANGUAGE sql STABLE AS $$
    SELECT EXISTS (
        SELECT 1 FROM deliveries s
        WHERE s.tenant_id = p_tenant AND s.instance_id = p_instance
          AND s.operation = 'start' AND s.token_kind = 'push_to_start'
          AND (s.status = 'sent' OR (s.status = 'queued' AND s.locked_until >= now()))
          AND NOT EXISTS (
              SELECT 1 FROM activity_tokens a
              WHERE a.tenant_id = s.tenant_id AND a.instance_id = s.instance_id
                AND a.device_token = s.device_token AND a.status = 'active'))
$$;

-- The change context (migration 0045) also names the instance's campaign, and takes its targets from
-- marquee_instance_targets: one home for the rule.
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
    channel_id uuid, channel_status text, apns_channel_id text, channel_storage_policy text, channel_bundle_id text,
    campaign_id text
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
               FROM marquee_instance_targets(p_tenant, ARRAY[p_instance]) x), '[]'::jsonb),
           k.status, k.response, k.request_hash,
           i.channel_id, ch.status, ch.apns_channel_id, ch.storage_policy, ch.bundle_id,
           i.campaign_id
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

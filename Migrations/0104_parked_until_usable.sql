-- Parked deliveries go out again whenever their credential is usable, however it became so.
--
-- A broken credential parks its tenant's deliveries for that provider; the trigger of migration 0006 (last defined in
-- 0074) queued them again when the credential's status changed from broken. Three ways left them parked for good, with
-- nothing to queue them again (marquee_queue_missing_ends queues no second end beside a parked one):
--   * the tenant deleted the broken credential and uploaded a good one: the upload is a plain INSERT, and the trigger
--     fired on UPDATE OF status only;
--   * a worker recorded a delivery `parked` (its provider had just refused the credential) while the tenant's upload
--     committed: the record asked "is the credential broken" on a snapshot from before the upload, and the upload's
--     trigger skipped the row, still `queued` in its own snapshot;
--   * likewise a change queuing new deliveries (parked at once, migration 0069) while the upload committed.
-- Likewise 0077's give-back of the tokens APNs refused under a wrong environment or bundle ID fired on UPDATE only: a
-- credential deleted and uploaded again corrected brought none back.
--
-- Now:
--   * marquee_unpark is the one home of "the credential is usable: its parked deliveries are queued again (or fail,
--     their instance expired)"; the credentials' trigger asks it after every INSERT or UPDATE that leaves the
--     credential not broken (a good upload after a DELETE included; an upload that leaves it `ok` is a no-op unless
--     something was left parked).
--   * A DELETE leaves the parked deliveries parked: they wait for the next upload, as they wait for a replacement
--     (queued while no credential exists, new deliveries fail `no_apns_credentials` / `no_fcm_credentials`).
--   * marquee_credential_broken locks the broken credential's row (FOR SHARE) when it answers yes, until the asking
--     transaction ends: an upload under way makes it wait and then answer with the upload's status (no), and an upload
--     after it waits until the parked rows are committed, and then sees them.
--   * A deleted APNs credential's configuration is kept (apns_credentials_removed) until the next upload, which gives
--     the tokens back if it differs (marquee_give_back_tokens, 0077's rule, now asked by both) and otherwise keeps
--     its configured_at (as an upload over it would).

-- The one home of "the credential is usable again".
CREATE FUNCTION marquee_unpark(p_tenant uuid, p_provider text) RETURNS void
LANGUAGE plpgsql VOLATILE AS $$
DECLARE
    v_unparked integer;
BEGIN
    WITH gone AS (
        DELETE FROM delivery_queue d USING instances i
        WHERE d.tenant_id = p_tenant AND d.provider = p_provider AND d.status = 'parked'
          AND i.tenant_id = d.tenant_id AND i.id = d.instance_id AND i.expires_at <= now()
        RETURNING d
    )
    INSERT INTO delivery_history SELECT h.* FROM gone, marquee_history_row(gone.d, 'failed',
                                                                            p_reason => 'instance_expired') h;
    UPDATE delivery_queue d SET status = 'queued', next_attempt_at = now(), updated_at = now()
    WHERE d.tenant_id = p_tenant AND d.provider = p_provider AND d.status = 'parked';
    GET DIAGNOSTICS v_unparked = ROW_COUNT;
    IF v_unparked > 0 THEN
        PERFORM pg_notify('marquee_deliveries', '');
    END IF;
END;
$$;
GRANT EXECUTE ON FUNCTION marquee_unpark(uuid, text) TO marquee_api, marquee_system;

-- As in migration 0074, for inserts too, and whatever the previous status: broken parks the queued deliveries (those a
-- worker holds or sends are recorded by it, as parked), anything else gives the parked ones back.
CREATE OR REPLACE FUNCTION marquee_credential_status_changed() RETURNS trigger
LANGUAGE plpgsql AS $$
DECLARE
    v_provider text := CASE TG_TABLE_NAME WHEN 'apns_credentials' THEN 'apns' ELSE 'fcm' END;
BEGIN
    IF NEW.status = 'broken' THEN
        UPDATE delivery_queue d SET status = 'parked', updated_at = now()
        WHERE d.tenant_id = NEW.tenant_id AND d.id IN (
            SELECT q.id FROM delivery_queue q
            WHERE q.tenant_id = NEW.tenant_id AND q.provider = v_provider AND q.status = 'queued'
              AND NOT marquee_being_sent(q.sending_until)
            FOR NO KEY UPDATE SKIP LOCKED);
    ELSE
        PERFORM marquee_unpark(NEW.tenant_id, v_provider);
    END IF;
    RETURN NULL;
END;
$$;
DROP TRIGGER apns_credentials_status ON apns_credentials;
CREATE TRIGGER apns_credentials_status AFTER INSERT OR UPDATE ON apns_credentials
    FOR EACH ROW EXECUTE FUNCTION marquee_credential_status_changed();
DROP TRIGGER fcm_credentials_status ON fcm_credentials;
CREATE TRIGGER fcm_credentials_status AFTER INSERT OR UPDATE ON fcm_credentials
    FOR EACH ROW EXECUTE FUNCTION marquee_credential_status_changed();

-- As in migration 0059, and a yes holds the credential's row (FOR SHARE) until the transaction ends: a parked row
-- written after this answer is committed before the credential can change, so the change's trigger sees it. Only a
-- broken row is locked (a usable credential is not held by every change that queues deliveries). Volatile, as a
-- locking function must be.
CREATE OR REPLACE FUNCTION marquee_credential_broken(p_tenant uuid, p_provider text) RETURNS boolean
LANGUAGE plpgsql VOLATILE AS $$
BEGIN
    IF p_provider = 'apns' THEN
        PERFORM 1 FROM apns_credentials WHERE tenant_id = p_tenant AND status = 'broken' FOR SHARE;
    ELSE
        PERFORM 1 FROM fcm_credentials WHERE tenant_id = p_tenant AND status = 'broken' FOR SHARE;
    END IF;
    RETURN FOUND;
END;
$$;

-- 0077's rule: the tokens retired because of the credential's configuration (BadDeviceToken, DeviceTokenNotForTopic)
-- since `p_since` are active again, for each device (and instance, or activity type) the one retired last, unless the
-- device has registered an active one since (the newer stays).
CREATE FUNCTION marquee_give_back_tokens(p_tenant uuid, p_since timestamptz) RETURNS void
LANGUAGE plpgsql VOLATILE AS $$
BEGIN
    UPDATE activity_tokens t SET status = 'active', retired_reason = NULL, retired_at = NULL
    FROM (
        SELECT DISTINCT ON (r.instance_id, r.device_token) r.instance_id, r.device_token, r.token
        FROM activity_tokens r
        WHERE r.tenant_id = p_tenant AND r.status = 'retired'
          AND r.retired_reason IN ('BadDeviceToken', 'DeviceTokenNotForTopic') AND r.retired_at >= p_since
        ORDER BY r.instance_id, r.device_token, r.retired_at DESC
    ) c
    WHERE t.tenant_id = p_tenant AND t.instance_id = c.instance_id AND t.device_token = c.device_token
      AND t.token = c.token
      AND NOT EXISTS (
          SELECT 1 FROM activity_tokens a
          WHERE a.tenant_id = t.tenant_id AND a.instance_id = t.instance_id AND a.device_token = t.device_token
            AND a.status = 'active');
    UPDATE push_to_start_tokens t SET status = 'active', retired_reason = NULL, retired_at = NULL
    FROM (
        SELECT DISTINCT ON (r.device_token, r.activity_type) r.device_token, r.activity_type, r.token
        FROM push_to_start_tokens r
        WHERE r.tenant_id = p_tenant AND r.status = 'retired'
          AND r.retired_reason IN ('BadDeviceToken', 'DeviceTokenNotForTopic') AND r.retired_at >= p_since
        ORDER BY r.device_token, r.activity_type, r.retired_at DESC
    ) c
    WHERE t.tenant_id = p_tenant AND t.device_token = c.device_token AND t.activity_type = c.activity_type
      AND t.token = c.token
      AND NOT EXISTS (
          SELECT 1 FROM push_to_start_tokens a
          WHERE a.tenant_id = t.tenant_id AND a.device_token = t.device_token AND a.activity_type = t.activity_type
            AND a.status = 'active');
END;
$$;
GRANT EXECUTE ON FUNCTION marquee_give_back_tokens(uuid, timestamptz) TO marquee_api, marquee_system;

CREATE OR REPLACE FUNCTION marquee_apns_configuration_changed() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    NEW.configured_at := now();
    PERFORM marquee_give_back_tokens(NEW.tenant_id, OLD.configured_at);
    RETURN NEW;
END;
$$;

-- A deleted APNs credential's configuration, until the tenant uploads one again.
CREATE TABLE apns_credentials_removed (
    tenant_id uuid PRIMARY KEY REFERENCES tenants (id) ON DELETE CASCADE,
    environment text NOT NULL,
    bundle_id text NOT NULL,
    endpoint text,
    configured_at timestamptz NOT NULL,
    removed_at timestamptz NOT NULL DEFAULT now()
);
SELECT marquee_protect_tenant_table('apns_credentials_removed');

CREATE FUNCTION marquee_apns_credential_removed() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    -- Not when the tenant goes (this is its cascade): nothing is uploaded again.
    IF EXISTS (SELECT 1 FROM tenants WHERE id = OLD.tenant_id) THEN
        INSERT INTO apns_credentials_removed (tenant_id, environment, bundle_id, endpoint, configured_at)
        VALUES (OLD.tenant_id, OLD.environment, OLD.bundle_id, OLD.endpoint, OLD.configured_at)
        ON CONFLICT (tenant_id) DO UPDATE SET
            environment = EXCLUDED.environment, bundle_id = EXCLUDED.bundle_id, endpoint = EXCLUDED.endpoint,
            configured_at = EXCLUDED.configured_at, removed_at = now();
    END IF;
    RETURN NULL;
END;
$$;
CREATE TRIGGER apns_credentials_removed AFTER DELETE ON apns_credentials
    FOR EACH ROW EXECUTE FUNCTION marquee_apns_credential_removed();

-- An upload after a DELETE: the same configuration keeps the deleted one's configured_at (as a new key for it would),
-- another gives back what the deleted one caused to be retired. (Before the insert, to set configured_at; an upsert
-- that meets a row instead finds nothing here, as a stored credential has no removed configuration.)
CREATE FUNCTION marquee_apns_credential_added() RETURNS trigger
LANGUAGE plpgsql AS $$
DECLARE
    v_removed apns_credentials_removed;
BEGIN
    DELETE FROM apns_credentials_removed r WHERE r.tenant_id = NEW.tenant_id RETURNING r.* INTO v_removed;
    IF NOT FOUND THEN
        RETURN NEW;
    END IF;
    IF v_removed.environment IS DISTINCT FROM NEW.environment OR v_removed.bundle_id IS DISTINCT FROM NEW.bundle_id
       OR v_removed.endpoint IS DISTINCT FROM NEW.endpoint THEN
        PERFORM marquee_give_back_tokens(NEW.tenant_id, v_removed.configured_at);
    ELSE
        NEW.configured_at := v_removed.configured_at;
    END IF;
    RETURN NEW;
END;
$$;
CREATE TRIGGER apns_credentials_added BEFORE INSERT ON apns_credentials
    FOR EACH ROW EXECUTE FUNCTION marquee_apns_credential_added();

-- What the gaps left parked while the credential is usable goes out now.
SET LOCAL ROLE marquee_system;
SELECT marquee_unpark(c.tenant_id, 'apns') FROM apns_credentials c
WHERE c.status <> 'broken'
  AND EXISTS (SELECT 1 FROM delivery_queue d
              WHERE d.tenant_id = c.tenant_id AND d.provider = 'apns' AND d.status = 'parked');
SELECT marquee_unpark(c.tenant_id, 'fcm') FROM fcm_credentials c
WHERE c.status <> 'broken'
  AND EXISTS (SELECT 1 FROM delivery_queue d
              WHERE d.tenant_id = c.tenant_id AND d.provider = 'fcm' AND d.status = 'parked');
RESET ROLE;

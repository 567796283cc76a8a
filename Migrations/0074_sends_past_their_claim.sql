-- Deliveries still being sent when their claim committed are in flight, as much as the rows a claim holds locked.
--
-- A claim holds its rows locked while it sends them; a send still running after DeliveryWorker.straggleAfter is
-- committed out of the claim, its row left queued and due again when the claim's hold ends (its lease, written into
-- next_attempt_at; DeliveryQueue.recordLate records the result later if the row is still under that lease). Such a
-- row was no longer locked, and every rule that asks "is this push going out now" asked the lock only:
--   * an end arriving then cancelled the push-to-start being sent (recorded `superseded` though it reached the
--     device), and marquee_ends_waiting_for_token said the end need not wait for the started activity's token: the
--     end was never sent, and the activity stayed on the lock screen;
--   * an update superseded the older one being sent, so the token could get N+1 before N landed;
--   * pacing (marquee_paced_due) did not count it as going out;
--   * a credential turning broken parked it, dropping its result (sent again after the credential was replaced).
--
-- The lease is now marked: `sending_until` (the lease's end; NULL for a row no worker is sending past its claim).
-- marquee_being_sent is the one home of the rule; writers that cancel, supersede or park queued rows skip such rows as
-- they skip locked ones, and marquee_delivery_in_flight counts them. A lease that ran out is not honoured: the row is
-- due again and may be sent again (at-least-once), as before.
ALTER TABLE delivery_queue ADD COLUMN sending_until timestamptz;
COMMENT ON COLUMN delivery_queue.sending_until IS
    'A worker is still sending this delivery after its claim committed, until this time (marquee_being_sent).';

CREATE FUNCTION marquee_being_sent(p_sending_until timestamptz) RETURNS boolean
LANGUAGE sql STABLE AS $$
    SELECT COALESCE(p_sending_until > now(), false)
$$;
GRANT EXECUTE ON FUNCTION marquee_being_sent(timestamptz) TO marquee_api, marquee_system;

-- In flight: held by a claim (locked), sent past its claim (leased), or no longer queued.
CREATE OR REPLACE FUNCTION marquee_delivery_in_flight(p_tenant uuid, p_id uuid) RETURNS boolean
LANGUAGE sql VOLATILE AS $$
    SELECT NOT EXISTS (
        SELECT 1 FROM delivery_queue d
        WHERE d.tenant_id = p_tenant AND d.id = p_id AND NOT marquee_being_sent(d.sending_until)
        FOR KEY SHARE SKIP LOCKED)
$$;

-- As in migration 0057, with leased rows left to their worker (as locked ones are).
CREATE OR REPLACE FUNCTION marquee_credential_status_changed() RETURNS trigger
LANGUAGE plpgsql AS $$
DECLARE
    v_provider text := CASE TG_TABLE_NAME WHEN 'apns_credentials' THEN 'apns' ELSE 'fcm' END;
    v_unparked integer;
BEGIN
    IF NEW.status = 'broken' THEN
        UPDATE delivery_queue d SET status = 'parked', updated_at = now()
        WHERE d.tenant_id = NEW.tenant_id AND d.id IN (
            SELECT q.id FROM delivery_queue q
            WHERE q.tenant_id = NEW.tenant_id AND q.provider = v_provider AND q.status = 'queued'
              AND NOT marquee_being_sent(q.sending_until)
            FOR NO KEY UPDATE SKIP LOCKED);
    ELSE
        WITH gone AS (
            DELETE FROM delivery_queue d USING instances i
            WHERE d.tenant_id = NEW.tenant_id AND d.provider = v_provider AND d.status = 'parked'
              AND i.tenant_id = d.tenant_id AND i.id = d.instance_id AND i.expires_at <= now()
            RETURNING d
        )
        INSERT INTO delivery_history SELECT h.* FROM gone, marquee_history_row(gone.d, 'failed',
                                                                                p_reason => 'instance_expired') h;
        UPDATE delivery_queue d SET status = 'queued', next_attempt_at = now(), updated_at = now()
        WHERE d.tenant_id = NEW.tenant_id AND d.provider = v_provider AND d.status = 'parked';
        GET DIAGNOSTICS v_unparked = ROW_COUNT;
        IF v_unparked > 0 THEN
            PERFORM pg_notify('marquee_deliveries', '');
        END IF;
    END IF;
    RETURN NULL;
END;
$$;

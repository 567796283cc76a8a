-- Parked deliveries queued again keep a due time still to come.
--
-- A credential made usable again queued its parked deliveries due at once (marquee_unpark, migration 0104, as 0006
-- did): a delivery parked while it waited out a provider's Retry-After (up to an hour) or its pacing (a frequent
-- updater's due times, marquee_paced_due) lost that wait, and went out early to a provider that had asked for less.
-- Now each is due at the later of its own due time and now.
CREATE OR REPLACE FUNCTION marquee_unpark(p_tenant uuid, p_provider text) RETURNS void
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
    UPDATE delivery_queue d
    SET status = 'queued', next_attempt_at = GREATEST(d.next_attempt_at, now()), updated_at = now()
    WHERE d.tenant_id = p_tenant AND d.provider = p_provider AND d.status = 'parked';
    GET DIAGNOSTICS v_unparked = ROW_COUNT;
    IF v_unparked > 0 THEN
        PERFORM pg_notify('marquee_deliveries', '');
    END IF;
END;
$$;

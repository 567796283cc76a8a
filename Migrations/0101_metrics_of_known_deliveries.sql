-- A delivered or opened report is kept only for a delivery that is there (queued, being sent, or recorded), and it
-- meets a person's erasure at the tenant's erasure lock.
--
-- marquee_record_delivery_metric (0049) stored any report whose delivery token checked out. The token outlives the
-- delivery: a report sent after DELETE /v1/people/{id} erased the person's deliveries and their metrics was stored
-- (202, recorded: true), with the person's device token as its recipient, and nothing would erase it again. Now:
--   * the delivery must be in the queue or the history (by its ID, the ULID the push carried); otherwise nothing is
--     written and the function answers NULL (the API: 404 for the report, ignored in a Customer.io batch). A report
--     of a delivery gone with retention is not kept either: nothing could join it to a delivery any more;
--   * the report holds the tenant's erasure lock (shared) first, as a campaign's start step and a people import do:
--     an erasure holds it (exclusive) for its whole transaction, so a report either commits before the erasure
--     starts (whose delete then sees it) or waits for it and then finds the delivery gone. A row lock on the
--     delivery would do the same for one in the history, but one still in the queue is held by the worker sending
--     it, and a report arrives while its claim sends the rest of its batch.
-- The lock's key has one home, marquee_erasure_lock, which the erasure and the other writers call too.

CREATE FUNCTION marquee_erasure_lock(p_tenant uuid, p_exclusive boolean) RETURNS void
LANGUAGE plpgsql VOLATILE AS $$
BEGIN
    IF p_exclusive THEN
        PERFORM pg_advisory_xact_lock(hashtextextended('marquee/erasure/' || p_tenant::text, 0));
    ELSE
        PERFORM pg_advisory_xact_lock_shared(hashtextextended('marquee/erasure/' || p_tenant::text, 0));
    END IF;
END;
$$;
GRANT EXECUTE ON FUNCTION marquee_erasure_lock(uuid, boolean) TO marquee_api, marquee_system;

-- As in migration 0049, after the erasure lock and only for a delivery that is there: NULL when it is not.
CREATE OR REPLACE FUNCTION marquee_record_delivery_metric(
    p_tenant uuid, p_delivery text, p_metric text, p_recipient text, p_at timestamptz, p_delivery_uuid uuid
) RETURNS boolean
LANGUAGE plpgsql VOLATILE SECURITY INVOKER AS $$
BEGIN
    PERFORM marquee_erasure_lock(p_tenant, false);
    -- A statement after the lock: its snapshot sees what an erasure that held it committed.
    IF p_delivery_uuid IS NULL OR NOT EXISTS (
        SELECT 1 FROM deliveries d WHERE d.tenant_id = p_tenant AND d.id = p_delivery_uuid) THEN
        RETURN NULL;
    END IF;
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

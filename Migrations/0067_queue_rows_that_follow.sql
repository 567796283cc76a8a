-- A claim takes a queued row only when no older version for its instance and token is queued: a token never gets
-- version N+1 while N is in flight or waiting for its retry (DeliveryQueue.lockQuery). That look cost ~6 µs for every
-- row a claim took and for every row it walked past (rows other claims hold): 8.3 ms of a 256-row claim's locking
-- with 768 rows held by others, 3.1 ms without the look. It is now made once, when the row is queued: `follows` is
-- true when an older version for the same instance and token was in the queue then, and a claim looks again only
-- for those rows. An instance's versions are written in order (under its row lock, one version per statement), so a
-- row queued after this one is never older: a row queued with `follows` false never needs the look. True is always
-- safe (the claim looks).
ALTER TABLE delivery_queue ADD COLUMN follows boolean NOT NULL DEFAULT false;

-- Whether a row queued now follows an older version of its instance for its token. Planned once per session and kept:
-- planned on the statistics of an empty queue, the look was a sequential scan, and a burst queued in one statement
-- read every row queued before it, once per row (bench/fanout's 100,000 rows did not finish in five minutes). Without
-- sequential scans it is an index lookup (deliveries_instance), whatever the statistics. Its own function, so that
-- the setting is paid only by rows that look (~1.5 µs a call).
CREATE FUNCTION marquee_queue_row_follows(p_tenant uuid, p_instance text, p_token text, p_version integer)
RETURNS boolean
LANGUAGE plpgsql STABLE SET enable_seqscan = off AS $$
BEGIN
    RETURN EXISTS (
        SELECT 1 FROM delivery_queue o
        WHERE o.tenant_id = p_tenant AND o.instance_id = p_instance AND o.token = p_token
          AND o.instance_version < p_version);
END;
$$;
GRANT EXECUTE ON FUNCTION marquee_queue_row_follows(uuid, text, text, integer) TO marquee_api, marquee_system;

-- One trigger for a new row (one call a row): it parks a queued row whose credential is broken (as
-- marquee_park_new_delivery did, migration 0006) and sets `follows`, whatever the row's status (a parked row is
-- queued again later).
CREATE FUNCTION marquee_new_queue_row() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    IF NEW.status = 'queued' AND marquee_credential_broken(NEW.tenant_id, NEW.provider) THEN
        NEW.status := 'parked';
    END IF;
    -- Version 1 (a start) has no older version: no look (~6 µs a row, as much as the rest of this trigger).
    IF NEW.instance_version > 1 THEN
        NEW.follows := marquee_queue_row_follows(NEW.tenant_id, NEW.instance_id, NEW.token, NEW.instance_version);
    END IF;
    RETURN NEW;
END;
$$;

DROP TRIGGER deliveries_park_when_broken ON delivery_queue;
DROP FUNCTION marquee_park_new_delivery();
CREATE TRIGGER delivery_queue_new_row BEFORE INSERT ON delivery_queue
    FOR EACH ROW EXECUTE FUNCTION marquee_new_queue_row();

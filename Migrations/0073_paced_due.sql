-- An update's due time under pacing, asked only for updates that are paced.
--
-- The API's change write (`ChangeWrite.statement`) held the pacing rule as a scalar subquery over the `deliveries`
-- view (the queue and every history partition) inside a CASE that runs it only for an update of a paced activity
-- type. PostgreSQL sets up a subquery's plan when the statement starts, whether or not it runs: with generic plans the
-- history partitions cannot be pruned, so every change write of every batch built eleven scans it almost never used
-- (`perf` of bench/api-update: `standard_ExecutorStart` was a fifth of PostgreSQL's CPU). A PL/pgSQL function is set
-- up only when called, and keeps its plan per connection. The rule is unchanged, and this is its one home: an update
-- of an instance whose activity type has min_update_interval_ms is due that long after the instance's last update
-- that went out (sent, or held by a worker now), and never before now.
CREATE FUNCTION marquee_paced_due(p_tenant uuid, p_instance text, p_interval_ms integer) RETURNS timestamptz
LANGUAGE plpgsql VOLATILE AS $$
BEGIN
    RETURN GREATEST(now(), COALESCE((
        SELECT max(CASE WHEN p.status = 'sent' THEN p.sent_at ELSE now() END)
        FROM deliveries p
        WHERE p.tenant_id = p_tenant AND p.instance_id = p_instance AND p.operation = 'update'
          AND (p.status = 'sent' OR (p.status = 'queued' AND marquee_delivery_in_flight(p.tenant_id, p.id)))
    ), '-infinity') + make_interval(secs => p_interval_ms / 1000.0));
END;
$$;
GRANT EXECUTE ON FUNCTION marquee_paced_due(uuid, text, integer) TO marquee_api, marquee_system;

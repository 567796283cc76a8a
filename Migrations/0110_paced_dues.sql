-- Campaign-wide updates are paced as single ones are.
--
-- An activity type's min_update_interval_ms paces the updates of each of its instances: one is due that long after
-- the instance's last update that went out (sent, or held by a worker now), and a newer one replaces it meanwhile.
-- The rule was marquee_paced_due (migration 0073), one instance at a time, asked by the API's change write alone. A
-- campaign's change queued its updates due at once (or at the campaign's own rate), whatever the type said: an
-- instance updated a moment ago, by a single update or the campaign's previous change, got the next one right away,
-- and a single update waiting out its interval was replaced by one that did not wait.
--
-- The rule's one home is now marquee_paced_dues, for a set of instances (a campaign's step asks once for its chunk's
-- instances, never once per instance); marquee_paced_due asks it for one instance, for the change write, which keeps
-- calling it only for a paced update (a PL/pgSQL function is set up only when called: migration 0073).
CREATE FUNCTION marquee_paced_dues(p_tenant uuid, p_instances text[], p_interval_ms integer)
RETURNS TABLE (instance_id text, due timestamptz)
LANGUAGE plpgsql VOLATILE AS $$
#variable_conflict use_column
BEGIN
    -- Each instance's deliveries looked up by index (LATERAL ... OFFSET 0), whatever the caller's planner settings.
    RETURN QUERY
    SELECT v.id, GREATEST(now(), COALESCE(l.last, '-infinity') + make_interval(secs => p_interval_ms / 1000.0))
    FROM unnest(p_instances) AS v(id)
    CROSS JOIN LATERAL (
        SELECT max(CASE WHEN p.status = 'sent' THEN p.sent_at ELSE now() END) AS last
        FROM deliveries p
        WHERE p.tenant_id = p_tenant AND p.instance_id = v.id AND p.operation = 'update'
          AND (p.status = 'sent' OR (p.status = 'queued' AND marquee_delivery_in_flight(p.tenant_id, p.id)))
        OFFSET 0
    ) l;
END;
$$;
GRANT EXECUTE ON FUNCTION marquee_paced_dues(uuid, text[], integer) TO marquee_api, marquee_system;

CREATE OR REPLACE FUNCTION marquee_paced_due(p_tenant uuid, p_instance text, p_interval_ms integer) RETURNS timestamptz
LANGUAGE plpgsql VOLATILE AS $$
BEGIN
    RETURN (SELECT d.due FROM marquee_paced_dues(p_tenant, ARRAY[p_instance], p_interval_ms) d);
END;
$$;

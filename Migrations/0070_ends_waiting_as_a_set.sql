-- Which ends must wait for an activity token, asked once for a set of instances instead of once per instance.
--
-- An end that finds no activity token while a start went (or may be going) out by push-to-start is kept: the
-- instance is marked pending_end, and the end is queued when the token registers (migration 0068). The writes asked
-- marquee_end_waits_for_token (a SQL function over the `deliveries` view: the queue and every history partition) for
-- each ended row. Such a function is planned and its scan of every partition set up on every call: on bench/campaign's
-- database (100,000 instances, every token registered), 10,000 calls took 448 ms warm, about 45 µs an instance, so a
-- campaign-wide end of 100,000 people spent ~4.5 s of PostgreSQL on it.
--
-- marquee_ends_waiting_for_token takes the instances as an array and returns those whose end waits: one statement,
-- planned for the call's array, with nested loops allowed (a campaign's step turns them off for its own statements;
-- without them the token check would read every activity token of the tenant). The rule is the same as before, and
-- this is its one home. The single-instance form
-- is dropped: its two callers (a campaign-wide end, and the API's ends) now pass their sets.
CREATE FUNCTION marquee_ends_waiting_for_token(p_tenant uuid, p_instances text[]) RETURNS TABLE (instance_id text)
LANGUAGE sql VOLATILE SET enable_nestloop = on AS $$
    SELECT DISTINCT s.instance_id FROM deliveries s
    WHERE s.tenant_id = p_tenant AND s.instance_id = ANY (p_instances)
      AND s.operation = 'start' AND s.token_kind = 'push_to_start'
      AND (s.status = 'sent' OR (s.status = 'queued' AND marquee_delivery_in_flight(s.tenant_id, s.id)))
      AND NOT EXISTS (
          SELECT 1 FROM activity_tokens a
          WHERE a.tenant_id = s.tenant_id AND a.instance_id = s.instance_id
            AND a.device_token = s.device_token AND a.status = 'active')
$$;
GRANT EXECUTE ON FUNCTION marquee_ends_waiting_for_token(uuid, text[]) TO marquee_api, marquee_system;

DROP FUNCTION marquee_end_waits_for_token(uuid, text);

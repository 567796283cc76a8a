-- Whether a tenant's credential is broken is asked for every delivery the API queues (the park trigger of 0006, one
-- call per inserted row) and by every record of a parked result. As a SQL function with EXISTS sublinks it cannot be
-- inlined, so each call planned its body again: pg_stat_statements (track=all, track_planning) at 1,000 updates/s
-- showed 10,000 calls a second planned at 45 µs each, more than they took to run. In PL/pgSQL its statements are
-- planned once per session and their plans kept. Same rule, same answers.
CREATE OR REPLACE FUNCTION marquee_credential_broken(p_tenant uuid, p_provider text) RETURNS boolean
LANGUAGE plpgsql STABLE AS $$
BEGIN
    IF p_provider = 'apns' THEN
        RETURN EXISTS (SELECT 1 FROM apns_credentials WHERE tenant_id = p_tenant AND status = 'broken');
    END IF;
    RETURN EXISTS (SELECT 1 FROM fcm_credentials WHERE tenant_id = p_tenant AND status = 'broken');
END;
$$;

-- marquee_credential_broken (0104) locked a broken credential's row FOR SHARE until the caller's commit, so that a
-- park recorded while an upload commits waits for it. Its callers include group-commit batches, which carry many
-- tenants' writes: a credential PUT waiting on one such share lock (a batch itself waiting on another tenant's row)
-- queued every later batch touching that credential behind it, and a loaded test run saw the API's pool exhausted
-- for 30 s. A row being updated (an upload under way) is skipped instead: the credential counts as not broken, the
-- delivery is queued, and if the upload rolls back its next send finds the credential broken and parks it then.
CREATE OR REPLACE FUNCTION marquee_credential_broken(p_tenant uuid, p_provider text) RETURNS boolean
LANGUAGE plpgsql VOLATILE AS $$
BEGIN
    IF p_provider = 'apns' THEN
        PERFORM 1 FROM apns_credentials WHERE tenant_id = p_tenant AND status = 'broken' FOR SHARE SKIP LOCKED;
    ELSE
        PERFORM 1 FROM fcm_credentials WHERE tenant_id = p_tenant AND status = 'broken' FOR SHARE SKIP LOCKED;
    END IF;
    RETURN FOUND;
END;
$$;

-- Identity verification (issue 9 §4): per-tenant settings, starting with whether sdk-key writes about a person must
-- carry a user token (an HS256 JWT the tenant's server mints with the identity secret). A tenant without a row has
-- the defaults: verification off, no secret.
--
-- Secrets are sealed with the master key ring (associated data `tenant:<id>:identity-secret`), like the delivery
-- secret. On rotation the current secret moves to `sealed_previous_identity_secret`, still accepted until
-- `previous_secret_valid_until`.
CREATE TABLE tenant_settings (
    tenant_id uuid PRIMARY KEY REFERENCES tenants (id) ON DELETE CASCADE,
    identity_verification text NOT NULL DEFAULT 'off' CHECK (identity_verification IN ('off', 'required')),
    sealed_identity_secret bytea,
    sealed_previous_identity_secret bytea,
    previous_secret_valid_until timestamptz,
    updated_at timestamptz NOT NULL DEFAULT now(),
    CHECK (identity_verification = 'off' OR sealed_identity_secret IS NOT NULL)
);

SELECT marquee_protect_tenant_table('tenant_settings');

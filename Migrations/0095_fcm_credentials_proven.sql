-- A tenant's FCM credential is proven once FCM accepted a push sent with it; SENDER_ID_MISMATCH then blames the token.
--
-- FCM answers SENDER_ID_MISMATCH when a registration token belongs to another Firebase project than the service
-- account's. The worker always blamed the credential: it was marked broken, and every queued FCM delivery of the
-- tenant parked until the credential was uploaded again. The sdk key is public: one Android device registered with a
-- token of another project (any Firebase project hands them out) paused a tenant's whole Android traffic, and did
-- again after each upload. The credential is at fault only while it has not worked: once FCM has accepted a push sent
-- with the credential as it is now, a mismatch retires that token (the device goes, as for UNREGISTERED) and the
-- others go on. A credential not yet proven (just uploaded, or changed since) is still blamed, which keeps the
-- devices of a tenant that uploaded the wrong project's account.
--
-- A row of its own rather than a column of fcm_credentials: any update there moves its updated_at (the touch
-- trigger), which names the credential as loaded by the workers. Credentials stored before this migration start
-- unproven; their first accepted push proves them.
CREATE TABLE fcm_credential_checks (
    tenant_id uuid PRIMARY KEY REFERENCES fcm_credentials (tenant_id) ON DELETE CASCADE,
    -- The credential row's updated_at when FCM accepted a push sent with it: any later change to the row (a new
    -- upload, a status change) leaves the credential unproven again.
    credential_updated_at timestamptz NOT NULL,
    proven_at timestamptz NOT NULL DEFAULT now()
);
SELECT marquee_protect_tenant_table('fcm_credential_checks');

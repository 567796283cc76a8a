-- Per-tenant send rate limit (issue 10): at most `rate_per_second` pushes a second for the tenant, across all workers,
-- in bursts of at most one second's worth. A token bucket: `tokens` as of `refilled_at`, refilled at the rate and
-- capped at one second's worth, spent by the claims. Claims lock the tenant's row while they take its share, so
-- two workers never spend the same tokens. No row: no limit.
CREATE TABLE send_limits (
    tenant_id uuid PRIMARY KEY REFERENCES tenants (id) ON DELETE CASCADE,
    rate_per_second integer NOT NULL CHECK (rate_per_second BETWEEN 1 AND 1000000),
    tokens double precision NOT NULL CHECK (tokens >= 0),
    refilled_at timestamptz NOT NULL DEFAULT clock_timestamp(),
    updated_at timestamptz NOT NULL DEFAULT now()
);

SELECT marquee_protect_tenant_table('send_limits');

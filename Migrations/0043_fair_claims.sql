-- Fair claims (issue 10): claims interleave tenants, so one tenant's backlog does not hold back another tenant's
-- single update. The claim walks the tenants that have due deliveries (a skip scan over this index) and takes the
-- oldest few of each.
CREATE INDEX deliveries_due_by_tenant ON deliveries (tenant_id, next_attempt_at) WHERE status = 'queued';

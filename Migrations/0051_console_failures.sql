-- The operator console's Failures screen (issue 15): a tenant's failed and undeliverable deliveries of the last hours,
-- newest first. Without it the query walks every delivery of the tenant (millions). Partial: only failures are in it,
-- a small fraction of the table, so sends and retries that end `sent` or `superseded` never touch it.
CREATE INDEX deliveries_failures ON deliveries (tenant_id, updated_at DESC)
    WHERE status IN ('failed', 'undeliverable');

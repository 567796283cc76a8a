-- A claim takes each due tenant's share by (tenant_id, next_attempt_at) (deliveries_due_by_tenant, 0043/0046). The
-- planner could also serve it from deliveries_due (next_attempt_at only, every tenant's rows in one order) with the
-- tenant as a filter, and did whenever its statistics said the tenant's rows were a good part of the queue: right
-- after another tenant's burst of 100,000, a small tenant's claim then walked the whole burst (bench/RESULTS.md,
-- fairness: claims stopped at their 2 s statement timeout, the small tenant's updates 2.3 s late). No query needs the
-- global order any more (claims are per tenant since 0043; the workers' statistics count the queue, which the
-- per-tenant index serves as well), so the index goes.
DROP INDEX deliveries_due;

-- The worker's supersede check on a retry (a newer version queued, parked or sent for the same instance and token)
-- and the claim's version check look a token up within an instance. deliveries_queued_token serves only queued rows;
-- the supersede check also asks about sent ones, and found them by (tenant_id, instance_id) alone, reading every
-- delivery of the instance per recorded row (an instance that has carried thousands of updates, or 100,000 queued
-- on one instance in bench/latency's backlog: a 256-row record took seconds). With the token in the key, both are
-- lookups. Listings of an instance's deliveries (newest first, a page at a time) sort the instance's rows instead.
DROP INDEX deliveries_instance;
CREATE INDEX deliveries_instance ON deliveries (tenant_id, instance_id, token, id);

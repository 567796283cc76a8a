-- Secondary indexes that start with tenant_id compete with the primary keys for lookups by (tenant_id, key), and
-- lose when the planner believes a tenant has a row or two. The lookups that matter most are the ones nobody
-- writes: foreign-key checks. An import of 100,000 people registers a push-to-start token per device, and each
-- token's check that its device exists (`WHERE tenant_id = $1 AND token = $2`) was planned, generically and once
-- per session, while the statistics said the devices table held 98 rows: on devices_person (the smaller index), with
-- tenant_id as its only condition and the token as a filter. Each check then read every device of the tenant, as the
-- import grew them to 100,000: the import ran for more than 20 minutes instead of 45 seconds.
--
-- The same held for instances, whose checks (a delivery or a token per instance: a campaign start writes 100,000
-- of each) were planned on instances_recent, walking the tenant's every entry in it with the ID as an index
-- condition.
--
-- The person indexes serve lookups by person, which always name the tenant too; with person_id first they cannot
-- be used for a lookup that does not name the person. instances_recent serves the newest-first list: its predicate
-- is a term that is never false but is stated only by that list's query, so no other query can use it (as 0046
-- did for the fair-claim index). The primary keys are then the only indexes left for the checks.
DROP INDEX devices_person;
CREATE INDEX devices_person ON devices (person_id, tenant_id);
DROP INDEX instances_person;
CREATE INDEX instances_person ON instances (person_id, tenant_id, started_at DESC);
DROP INDEX instances_recent;
CREATE INDEX instances_recent ON instances (tenant_id, started_at DESC, id DESC) WHERE started_at > '-infinity';

-- The fair-claim index (0043) is for the claim's own queries only. Its predicate was `status = 'queued'`, which the
-- claim's ordering check (NOT EXISTS another queued delivery for the same instance and token) also states, so with
-- stale statistics (a table that just grew by 100,000 rows in one transaction) the planner used it for that check
-- with `tenant_id` as its only condition: every claimed row scanned all of its tenant's queued rows (909,584 buffer
-- hits for a claim of 256; the fan-out bench fell from ~8k to ~3.5k pushes/s). The extra term, never false
-- (next_attempt_at is NOT NULL and never -infinity), is stated only by the claim queries, so no other query can
-- prove the predicate and use this index: the ordering check keeps deliveries_queued_token.
DROP INDEX deliveries_due_by_tenant;
CREATE INDEX deliveries_due_by_tenant ON deliveries (tenant_id, next_attempt_at)
    WHERE status = 'queued' AND next_attempt_at > '-infinity';

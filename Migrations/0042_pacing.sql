-- Pacing (issue 13, Apple budgets): updates to one instance arriving faster than its activity type's
-- min_update_interval_ms are queued for when the interval has passed since the last update sent (or in flight), and
-- a newer one supersedes the waiting one (latest wins). 0 turns it off. The rule lives in the change write
-- (LiveActivityStore.change); ends and starts are never delayed.
ALTER TABLE activity_types ADD COLUMN min_update_interval_ms integer NOT NULL DEFAULT 0
    CHECK (min_update_interval_ms BETWEEN 0 AND 3600000);

-- Apple budgets (issue 13): an activity type may declare that its app sets NSSupportsLiveActivitiesFrequentUpdates,
-- which is what allows priority-10 updates without an alert; and each APNs push records the priority it went out
-- with, so that high-priority pushes per instance can be counted (GET /v1/live_notifications/{id}).
ALTER TABLE activity_types ADD COLUMN frequent_updates boolean NOT NULL DEFAULT false;
ALTER TABLE deliveries ADD COLUMN apns_priority smallint CHECK (apns_priority IN (5, 10));
-- The count per instance over the last hour reads this.
CREATE INDEX deliveries_high_priority ON deliveries (tenant_id, instance_id, sent_at) WHERE apns_priority = 10;

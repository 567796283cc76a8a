-- The references to a device are indexed, so removing a device no longer reads all of its tenant's activity tokens
-- and per-instance device states.
--
-- activity_tokens and instance_devices refer to devices by (tenant_id, device_token) ON DELETE CASCADE, and neither
-- had an index starting with those columns (their keys start with the instance). PostgreSQL's cascade for each
-- deleted device therefore scanned the tenant's whole part of both tables: with 200,000 of each, one device's
-- removal took 40 ms (activity_tokens) + 112 ms (instance_devices) in its cascade triggers, growing with the tenant.
-- Devices are removed one at a time (the app and sdk keys, Customer.io's Device Deleted, FCM's unregistered tokens),
-- by the person's device cap (an import can evict thousands in one statement: a scan each), and by erasure.
-- campaigns → channels had the same gap (a channel's deletion scanned the tenant's campaigns; small, indexed anyway).
-- Each index costs the writes of its table one entry (an activity-token registration, a started Android instance).

CREATE INDEX activity_tokens_device ON activity_tokens (tenant_id, device_token);
CREATE INDEX instance_devices_device ON instance_devices (tenant_id, device_token);
CREATE INDEX campaigns_channel ON campaigns (tenant_id, channel_id) WHERE channel_id IS NOT NULL;

-- Campaigns that are over stay over (issue 12): the worker pool stores `ended` once no instance is open, nothing is
-- queued and no change is pending, so reading or listing them no longer walks their instances and deliveries.
ALTER TABLE campaigns DROP CONSTRAINT campaigns_state_check;
ALTER TABLE campaigns ADD CONSTRAINT campaigns_state_check
    CHECK (state IN ('scheduled', 'active', 'ended', 'failed', 'cancelled'));

-- Whether a campaign has an open instance, answered from open instances only.
CREATE INDEX instances_campaign_open ON instances (tenant_id, campaign_id)
    WHERE campaign_id IS NOT NULL AND state IN ('pending', 'active');
CREATE INDEX campaigns_active ON campaigns (tenant_id, id) WHERE state = 'active';

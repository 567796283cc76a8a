-- A campaign-wide change writes its campaign's open instances a chunk at a time, in instance ID order, one transaction
-- each (CampaignRunner.change): each step finds where its chunk ends and locks it through this index. The index of
-- migration 0049 (tenant, campaign) kept a campaign's entries in heap order, so every step would have read and sorted
-- all of the campaign's instances left after the last step. Same entries, one column more.
CREATE INDEX instances_campaign_id ON instances (tenant_id, campaign_id, id) WHERE campaign_id IS NOT NULL;
DROP INDEX instances_campaign;

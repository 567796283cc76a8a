-- A large start is written in lanes: ranges of its audience, by person ID, that several workers write at the same
-- time, a step each (CampaignRunner). A lane's row is its progress; a worker holds the row (FOR UPDATE SKIP LOCKED)
-- while it writes the lane's next step and records how far it got in the same transaction, so each member is written
-- once whatever the number of workers, and a worker that dies leaves its lane to another. The start's schedule stays
-- pending until the last lane is done; that step sums the lanes' counts onto the schedule and removes the rows.
CREATE TABLE campaign_start_lanes (
    tenant_id uuid NOT NULL,
    schedule_id uuid NOT NULL,
    lane int NOT NULL,
    -- The last member written (person ID; '' before the first step): the next step starts after it.
    after text NOT NULL,
    -- The lane's last member (inclusive); NULL for the last lane.
    bound text,
    members int NOT NULL,
    written int NOT NULL DEFAULT 0,
    -- What the lane's steps wrote: audience, instances, deliveries, skipped (as a start's result).
    counts jsonb NOT NULL DEFAULT '{}',
    done boolean NOT NULL DEFAULT false,
    PRIMARY KEY (tenant_id, schedule_id, lane),
    FOREIGN KEY (tenant_id, schedule_id) REFERENCES campaign_schedules (tenant_id, id) ON DELETE CASCADE
);

SELECT marquee_protect_tenant_table('campaign_start_lanes');

-- Segments (issue 12): a tenant's saved audiences. `filter` is the filter language of MarqueeCore's `SegmentFilter`,
-- stored as the client sent it after validation; it is compiled to one parameterised query each time it is used
-- (preview, campaign start), so a segment always means "who matches now".

CREATE TABLE segments (
    tenant_id uuid NOT NULL REFERENCES tenants (id) ON DELETE CASCADE,
    id text NOT NULL CHECK (length(id) BETWEEN 1 AND 128),
    name text NOT NULL CHECK (length(name) BETWEEN 1 AND 200),
    filter jsonb NOT NULL,
    created_at timestamptz NOT NULL DEFAULT now(),
    updated_at timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (tenant_id, id)
);
CREATE TRIGGER touch BEFORE UPDATE ON segments FOR EACH ROW EXECUTE FUNCTION marquee_touch_updated_at();

SELECT marquee_protect_tenant_table('segments');

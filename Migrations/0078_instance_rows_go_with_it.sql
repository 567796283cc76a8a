-- An instance's device states and activity tokens go with it.
--
-- Retention deletes expired and ended instances (0020), and the instance's delete trigger removed its queued
-- deliveries (0069), but neither `instance_devices` nor `activity_tokens` references `instances`: their rows stayed.
-- Instance IDs are the client's, and one may be used again once the old instance is gone; the targets of the new
-- instance (marquee_instance_targets, by instance ID) then included the old one's devices and tokens, so a second
-- person's updates and ends went to the first person's phone (confirmed with psql). Now the delete trigger removes
-- them too, and the rows already left behind are removed here (a token registration that finds its instance deleted
-- meanwhile registers nothing: migration 0076).
CREATE OR REPLACE FUNCTION marquee_instances_deleted() RETURNS trigger
LANGUAGE plpgsql VOLATILE SECURITY INVOKER SET enable_nestloop = on SET enable_seqscan = off AS $$
BEGIN
    DELETE FROM delivery_queue d
    WHERE (d.tenant_id, d.instance_id) IN (SELECT tenant_id, id FROM old_rows);
    DELETE FROM instance_devices s
    WHERE (s.tenant_id, s.instance_id) IN (SELECT tenant_id, id FROM old_rows);
    DELETE FROM activity_tokens a
    WHERE (a.tenant_id, a.instance_id) IN (SELECT tenant_id, id FROM old_rows);
    RETURN NULL;
END;
$$;

DELETE FROM instance_devices s
WHERE NOT EXISTS (SELECT 1 FROM instances i WHERE i.tenant_id = s.tenant_id AND i.id = s.instance_id);
DELETE FROM activity_tokens a
WHERE NOT EXISTS (SELECT 1 FROM instances i WHERE i.tenant_id = a.tenant_id AND i.id = a.instance_id);

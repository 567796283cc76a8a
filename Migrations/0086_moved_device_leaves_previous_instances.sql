-- A device that moves to another person leaves its previous person's activities: their later updates no longer go to it.
--
-- Migration 0083 drops what was queued to a device when it moves (a registration or an import naming another person:
-- the phone changed hands, or another user logged in on it). The previous person's activity tokens on the device
-- stayed active, and the device's per-instance rows (instance_devices, which also make an Android device a target)
-- stayed too, so every later update or end of the previous person's activities was queued to the phone again, now
-- someone else's. A device removed outright loses both by cascade; a moved one now loses them the same way, for every
-- instance it no longer belongs to (marquee_device_belongs_to_instance, the one home of that rule: an instance
-- started for this very device, its target device, keeps it). The tokens are retired with reason `device_moved`
-- (kept as a record, like any retired token), the per-instance rows deleted. Both are found by device through the
-- indexes of migration 0085.

CREATE OR REPLACE FUNCTION marquee_device_moved() RETURNS trigger
LANGUAGE plpgsql VOLATILE SECURITY INVOKER AS $$
BEGIN
    PERFORM marquee_drop_departed_pushes(ARRAY[OLD.tenant_id], ARRAY[OLD.token], ARRAY[OLD.person_id]);
    UPDATE activity_tokens a SET status = 'retired', retired_reason = 'device_moved', retired_at = now()
    WHERE a.tenant_id = OLD.tenant_id AND a.device_token = OLD.token AND a.status = 'active'
      AND NOT marquee_device_belongs_to_instance(a.tenant_id, a.instance_id, a.device_token);
    DELETE FROM instance_devices s
    WHERE s.tenant_id = OLD.tenant_id AND s.device_token = OLD.token
      AND NOT marquee_device_belongs_to_instance(s.tenant_id, s.instance_id, s.device_token);
    RETURN NULL;
END;
$$;

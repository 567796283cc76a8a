-- A start is planned from what its context read saw (the person's devices and tokens), then written. A device removed
-- in between (FCM's unregistered, a delete, an erasure, a move to someone else) was left out of the write, but the
-- start's answer and its instance's state were those of the plan: `targets` counted a device that got nothing, and a
-- start whose every target went stayed `pending` with nothing queued. The start's statement now fails instead
-- (marquee_plan_stale, SQLSTATE MQ002); the group commit writes each of the batch's starts alone, and the one whose
-- targets went is planned again from a fresh read (LifecycleRoutes.start).
CREATE FUNCTION marquee_plan_stale(p_detail text) RETURNS boolean
LANGUAGE plpgsql VOLATILE AS $$
BEGIN
    RAISE EXCEPTION 'marquee: a write''s plan is out of date: %', p_detail USING ERRCODE = 'MQ002';
END;
$$;
GRANT EXECUTE ON FUNCTION marquee_plan_stale(text) TO marquee_api, marquee_system;

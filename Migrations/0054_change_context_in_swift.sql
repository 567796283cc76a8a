-- An update's context (the instance with its type and channel, its targets, its Idempotency-Key's answer) is read
-- by LiveActivityStore.changeContext in one pipelined read-only transaction, as the start's context is: the reads
-- before a write have one home, in Swift, and the targets rule stays marquee_instance_targets (0049).
DROP FUNCTION marquee_change_context(uuid, text, text);

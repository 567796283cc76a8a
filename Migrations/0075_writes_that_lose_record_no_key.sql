-- A start that loses its instance ID to a concurrent start must not keep its Idempotency-Key record.
--
-- A set-based start (StartWrite.statement) writes each start's idempotency record, then its instance with ON CONFLICT
-- DO NOTHING: the parts of one statement cannot see each other's rows, so the record cannot depend on the insert.
-- When the instance ID was taken between the start's context read and its write (a concurrent start of the same ID,
-- or two in one batch), the record was kept with this start's answer although nothing of it was written: a retry
-- with the key was answered 200 from that record, and the start was lost. The statement now fails instead
-- (marquee_write_lost, SQLSTATE MQ001); the group commit then writes each of the batch's starts alone, and the one
-- that lost is answered as "already exists" (LiveActivityStore.start), its key unrecorded.
CREATE FUNCTION marquee_write_lost(p_detail text) RETURNS boolean
LANGUAGE plpgsql VOLATILE AS $$
BEGIN
    RAISE EXCEPTION 'marquee: a write lost its race: %', p_detail USING ERRCODE = 'MQ001';
END;
$$;
GRANT EXECUTE ON FUNCTION marquee_write_lost(text) TO marquee_api, marquee_system;

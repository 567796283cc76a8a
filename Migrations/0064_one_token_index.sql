-- The queue had two indexes on (tenant_id, instance_id, token): deliveries_queued_token (0004, queued rows only) and
-- deliveries_instance (0056, every row, with the ID after the token). Since 0057 the queue holds only queued and
-- parked rows (history is its own table), so the second serves every lookup the first did, one row of an instance's
-- token at a time either way, with the status as a filter (an instance and token has at most a few rows queued:
-- changes coalesce). Each queued push paid for an entry in both: a campaign's start writes 100,000 rows in a few
-- seconds, each of them the write of a queue row, its index entries and, later, their cleanup.
DROP INDEX deliveries_queued_token;

-- The registration functions (0003) are point lookups and writes by key, and `POST /v1/people/import` calls
-- marquee_register_push_to_start once per imported token, up to 100,000 times in one transaction. PL/pgSQL plans
-- each statement once per session and may keep a generic plan: planned while push_to_start_tokens and devices were
-- a page or two (tables analysed when nearly empty; the import's own rows are not visible to autovacuum), it was a
-- sequential scan, repeated for every row as the import grew the tables. 20,000 registrations took 17.6 s instead
-- of 1.2 s, and the 100,000-people import took 316–881 s instead of 13–40 s. Every statement in these functions has
-- a unique index matching its keys, so sequential scans are ruled out for their duration.
ALTER FUNCTION marquee_register_push_to_start(uuid, text, text, text, text, text, text, text)
    SET enable_seqscan = off;
ALTER FUNCTION marquee_register_activity_token(uuid, text, text, text) SET enable_seqscan = off;

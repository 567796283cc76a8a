-- Smaller statistics for the queue: none on its payload columns, a tenth of the default sample on the others.
--
-- The claims' plans depend on fresh statistics of the queue, so the workers analyse it whenever it has doubled since
-- the last time (migration 0058, given one home in 0091). A campaign's steps make it double several times in a run
-- (bench/campaign: four analyses during a start of 100,000, four more during its campaign-wide update, 100–220 ms each
-- on the busy machine). What an analysis costs:
-- - the three JSON columns (a row's attributes, content state and options, carried for the send) were half of it:
--   sorting their samples to build histograms (90 ms against 43 ms without them, for a 20,000-row queue here). No
--   statement filters, joins or groups on them: no plan reads their statistics;
-- - the sample: 300 rows per point of the largest statistics target, 30,000 at the default (100), read from pages
--   full of the rows sent since the last vacuum. The queue's plans need its size, its tenants and lanes, and its due
--   times roughly, not fine histograms: a target of 10 (3,000 rows) estimates them (27 → 11 ms for 8,000 queued
--   behind 100,000 deleted here). A column added to the queue later gets the default target, and with it the larger
--   sample, unless its migration sets one.
DO $$
DECLARE
    c text;
BEGIN
    FOR c IN SELECT attname FROM pg_attribute
             WHERE attrelid = 'delivery_queue'::regclass AND attnum > 0 AND NOT attisdropped
    LOOP
        EXECUTE format('ALTER TABLE delivery_queue ALTER COLUMN %I SET STATISTICS %s', c,
                       CASE WHEN c IN ('attributes', 'content_state', 'options') THEN 0 ELSE 10 END);
    END LOOP;
END;
$$;

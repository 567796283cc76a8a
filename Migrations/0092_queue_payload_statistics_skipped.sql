-- No statistics on the queue's payload columns.
--
-- The claims' plans depend on fresh statistics of the queue, so the workers analyse it whenever it has doubled since
-- the last time (migration 0058, given one home in 0091): twice during bench/campaign's start of 100,000, 258 ms each
-- while the machine was busy with it. Half of an ANALYZE's work was the three JSON columns (a row's attributes,
-- content state and options, copied for the send): sorting 30,000 jsonb samples to build their histograms (90 ms
-- against 43 ms without them, for a 20,000-row queue here). No statement filters, joins or groups on them, so no plan
-- reads their statistics.
ALTER TABLE delivery_queue
    ALTER COLUMN attributes SET STATISTICS 0,
    ALTER COLUMN content_state SET STATISTICS 0,
    ALTER COLUMN options SET STATISTICS 0;

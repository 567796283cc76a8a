-- Instances change in place far more often than they are created: a worker marks each one active once a push reached
-- a device, every update rewrites its content. Measured on a 100,000-instance campaign (bench/campaign), each such
-- UPDATE wrote a new entry into all seven of the table's indexes: its pages were full (fillfactor 100), and one
-- index named `state` in its predicate, which PostgreSQL counts as an indexed column. The workers' "mark active"
-- statement took 12.8 ms per batch of 256 (50 µs an instance, 5 s of the start's database time).
--
-- Room on each page for newer versions, so that an update that changes no indexed column stays on its page and writes
-- no index entry (a HOT update): 256 such updates took 3.2 ms against 11 ms on full pages. Pages written from now on
-- keep it; existing ones get it as they are rewritten.
ALTER TABLE instances SET (fillfactor = 80);

-- The open-instances index of migration 0050 made every state change (pending → active, active → ended) write all
-- seven indexes. Its one reader that mattered, the finalizer's "no open instance" check, also walks every instance of
-- the campaign for queued deliveries in the same statement; campaign-wide changes find their instances through
-- instances_campaign (tenant, campaign) as before it existed.
DROP INDEX instances_campaign_open;

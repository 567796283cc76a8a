-- Migration 0060 left a fifth of each page of `instances` free, so that a rewrite of an instance can stay on its page
-- (a HOT update: no new index entries). A campaign's start showed it is not enough: its instances are written
-- together, filling pages to 80%, and within seconds the workers mark each one active, a new version of every row
-- (~225 bytes): a page had room for a quarter of them, the rest were moved to other pages with new entries in five
-- indexes. Measured on copies of 20,000 instances of bench/campaign, batches of 256 as the workers send: 8.5–10 ms
-- a batch at fillfactor 80 (a quarter HOT), 4.9–5.1 ms at 50 (all HOT), for 1.6× the pages. An instance is rewritten
-- many times in its life (activation, every update, its end), so the room is used. Pages written from now on keep it.
ALTER TABLE instances SET (fillfactor = 50);

-- What a row lock on each person a campaign start step reads would cost (2026-12-06): 50,000 people looked up by
-- primary key as the step does (LATERAL ... OFFSET 0), without and with FOR KEY SHARE, after a CHECKPOINT, with the
-- WAL each writes. Run against a scratch database of a cluster with fsync and full_page_writes on, e.g.
--   Deploy/local/pg.sh start /tmp/pg-locks 56200 && psql -X -q postgresql://postgres@127.0.0.1:56200/postgres -f bench/locks/person-locks.sql
-- Results: bench/RESULTS.md, "erasure against starts".
\timing off
DROP TABLE IF EXISTS pk; CREATE TABLE pk (t uuid, id text, email text, attributes jsonb, PRIMARY KEY (t,id));
INSERT INTO pk SELECT '00000000-0000-0000-0000-000000000001', 'p' || lpad(g::text, 7, '0'), 'p'||g||'@x.com', jsonb_build_object('team','a','n',g,'name','Person number '||g) FROM generate_series(1,100000) g;
VACUUM ANALYZE pk;
CHECKPOINT;
\timing on
SELECT pg_current_wal_lsn() AS a \gset
SELECT count(*) FROM (SELECT m.id FROM generate_series(1,50000) g CROSS JOIN LATERAL (SELECT id, attributes FROM pk WHERE t='00000000-0000-0000-0000-000000000001' AND id = 'p'||lpad(g::text,7,'0') OFFSET 0) m) x;
SELECT pg_size_pretty(pg_wal_lsn_diff(pg_current_wal_lsn(), :'a')) AS wal_plain;
SELECT pg_current_wal_lsn() AS a \gset
SELECT count(*) FROM (SELECT m.id FROM generate_series(50001,100000) g CROSS JOIN LATERAL (SELECT id, attributes FROM pk WHERE t='00000000-0000-0000-0000-000000000001' AND id = 'p'||lpad(g::text,7,'0') OFFSET 0 FOR KEY SHARE) m) x;
SELECT pg_size_pretty(pg_wal_lsn_diff(pg_current_wal_lsn(), :'a')) AS wal_locked;
CHECKPOINT;
SELECT pg_current_wal_lsn() AS a \gset
SELECT count(*) FROM (SELECT m.id FROM generate_series(1,50000) g CROSS JOIN LATERAL (SELECT id, attributes FROM pk WHERE t='00000000-0000-0000-0000-000000000001' AND id = 'p'||lpad(g::text,7,'0') OFFSET 0 FOR KEY SHARE) m) x;
SELECT pg_size_pretty(pg_wal_lsn_diff(pg_current_wal_lsn(), :'a')) AS wal_locked2;
SELECT pg_current_wal_lsn() AS a \gset
SELECT count(*) FROM (SELECT m.id FROM generate_series(50001,100000) g CROSS JOIN LATERAL (SELECT id, attributes FROM pk WHERE t='00000000-0000-0000-0000-000000000001' AND id = 'p'||lpad(g::text,7,'0') OFFSET 0) m) x;
SELECT pg_size_pretty(pg_wal_lsn_diff(pg_current_wal_lsn(), :'a')) AS wal_plain2;
DROP TABLE pk;

-- A claim takes a queued row only when no older version for its instance and token is queued (the per-row look of
-- DeliveryQueue.lockQuery, `o.instance_version < d.instance_version`), and runs that look for every row it takes and
-- every row it walks past (rows other claims hold). With the version in the key, right after the token, the look is a
-- range of the index: when no older version is queued (nearly always) it ends in the index, without reading the row
-- itself from the table. On a copy of bench/fanout's queue (100,000 queued): the look 4 against 6 µs (3 against 4
-- buffers), a 256-row claim's locking 3.6-3.7 against 4.6-6.1 ms. The other lookups this index serves — by instance
-- and token (supersede), by instance and ID (the record) — read the same entries as before.
DROP INDEX deliveries_instance;
CREATE INDEX deliveries_instance ON delivery_queue (tenant_id, instance_id, token, instance_version, id);

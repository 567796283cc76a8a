-- A tenant's own API request rate limits, per kind of key: at most so many requests a second on each `marquee serve`
-- process (NULL: the operator's default, MARQUEE_RATE_LIMIT_APP / MARQUEE_RATE_LIMIT_SDK).
--
-- The limit is applied in memory by each API process, right after the key is checked (RequestLimits in MarqueeAPI,
-- the one home of the rule); these columns are read with the key (TenantStore.authenticate) and cached with it, so
-- a request costs no database round trip for them.

ALTER TABLE tenant_settings
    ADD COLUMN app_requests_per_second integer CHECK (app_requests_per_second BETWEEN 1 AND 1000000),
    ADD COLUMN sdk_requests_per_second integer CHECK (sdk_requests_per_second BETWEEN 1 AND 1000000);

-- Foundation: shared helpers used by later migrations.

-- Keeps an `updated_at` column current on every UPDATE.
CREATE OR REPLACE FUNCTION marquee_touch_updated_at() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    NEW.updated_at := now();
    RETURN NEW;
END;
$$;

-- The tenant of the current transaction, as set by the API with
-- `SELECT set_config('marquee.tenant_id', $1, true)`. NULL when unset, so row-level security
-- policies comparing against it match nothing.
CREATE OR REPLACE FUNCTION marquee_current_tenant() RETURNS uuid
LANGUAGE sql STABLE AS $$
    SELECT NULLIF(current_setting('marquee.tenant_id', true), '')::uuid
$$;

-- Least privilege: the API and workers log in as `marquee_app`, a role that owns nothing, and every tenant table
-- forces row-level security (the owner too).
--
-- Roles (cluster-wide; shared by every Marquee database of one cluster):
--   owner          runs `marquee migrate`; owns every table; subject to row-level security like anyone else
--                  (FORCE), so it sees no tenant rows unless it switches to one of the roles below.
--   marquee_app    LOGIN, NOINHERIT: owns nothing and has no privilege on tenant tables by itself. It may switch
--                  (SET ROLE, transaction-local) to:
--   marquee_api    NOLOGIN (0002): tenant work; the `tenant_isolation` policy confines it to
--                  `marquee.tenant_id`. Without a tenant it sees no row.
--   marquee_system NOLOGIN: cross-tenant system work that names it explicitly (key administration, tenant
--                  creation, the worker's claims and results, idempotency clean-up, resealing). It has the same
--                  table privileges as marquee_api (never TRUNCATE, DDL or ownership) and a `system_access` policy.
-- NOINHERIT matters: otherwise marquee_app would inherit marquee_system's policy and see every tenant's rows
-- without asking for them.
--
-- From now on, a migration that creates a tenant table (tenant_id first) ends with
--     SELECT marquee_protect_tenant_table('the_table');
-- which enables and forces row-level security, creates the `tenant_isolation` (marquee_api) and `system_access`
-- (marquee_system) policies if missing, grants SELECT, INSERT, UPDATE, DELETE to marquee_api if it has nothing
-- yet, and mirrors marquee_api's privileges to marquee_system. It is idempotent. A migration that changes data in a
-- tenant table does so after `SET LOCAL ROLE marquee_system` (the owner sees no rows under FORCE), then `RESET ROLE`.

-- Creating roles needs CREATEROLE; a DBA may make them beforehand instead (then nothing here needs it, as long as
-- marquee_app has the attributes below and the memberships exist).
-- Roles are shared by the cluster's databases, which may be migrated at the same moment: a role or membership that
-- another migration created meanwhile is not an error (each step is its own block for that reason).
DO $$
BEGIN
    BEGIN
        IF NOT EXISTS (SELECT 1 FROM pg_roles WHERE rolname = 'marquee_system') THEN
            CREATE ROLE marquee_system NOLOGIN;
        END IF;
    EXCEPTION WHEN duplicate_object OR unique_violation THEN NULL;
    END;
    BEGIN
        IF NOT EXISTS (SELECT 1 FROM pg_roles WHERE rolname = 'marquee_app') THEN
            CREATE ROLE marquee_app LOGIN NOINHERIT;
        END IF;
    EXCEPTION WHEN duplicate_object OR unique_violation THEN NULL;
    END;
    -- A pre-existing marquee_app is brought to this shape (or the migration fails, rather than run the API as a
    -- role that inherits, bypasses or administers).
    IF EXISTS (SELECT 1 FROM pg_roles WHERE rolname = 'marquee_app'
               AND (NOT rolcanlogin OR rolinherit OR rolsuper OR rolbypassrls OR rolcreaterole OR rolcreatedb)) THEN
        ALTER ROLE marquee_app LOGIN NOINHERIT NOSUPERUSER NOBYPASSRLS NOCREATEROLE NOCREATEDB;
    END IF;
    BEGIN
        IF NOT pg_has_role('marquee_app', 'marquee_api', 'MEMBER') THEN
            GRANT marquee_api TO marquee_app;
        END IF;
    EXCEPTION WHEN duplicate_object OR unique_violation THEN NULL;
    END;
    BEGIN
        IF NOT pg_has_role('marquee_app', 'marquee_system', 'MEMBER') THEN
            GRANT marquee_system TO marquee_app;
        END IF;
    EXCEPTION WHEN duplicate_object OR unique_violation THEN NULL;
    END;
    BEGIN
        IF NOT pg_has_role(current_user, 'marquee_system', 'MEMBER') THEN
            EXECUTE format('GRANT marquee_system TO %I', current_user);
        END IF;
    EXCEPTION WHEN duplicate_object OR unique_violation THEN NULL;
    END;
END
$$;
GRANT USAGE ON SCHEMA public TO marquee_system;
GRANT EXECUTE ON FUNCTION marquee_current_tenant() TO marquee_system;
-- `/readyz` compares the migration files with what is applied, as marquee_app.
GRANT SELECT ON schema_migrations TO marquee_app;

-- Protects one tenant table (see above). SECURITY INVOKER: runs as the migrating owner.
CREATE OR REPLACE FUNCTION marquee_protect_tenant_table(p_table regclass) RETURNS void
LANGUAGE plpgsql VOLATILE AS $$
DECLARE
    v_privilege text;
BEGIN
    EXECUTE format('ALTER TABLE %s ENABLE ROW LEVEL SECURITY', p_table);
    EXECUTE format('ALTER TABLE %s FORCE ROW LEVEL SECURITY', p_table);
    IF NOT EXISTS (SELECT 1 FROM pg_policy WHERE polrelid = p_table AND polname = 'tenant_isolation') THEN
        EXECUTE format('CREATE POLICY tenant_isolation ON %s TO marquee_api
                            USING (tenant_id = marquee_current_tenant())
                            WITH CHECK (tenant_id = marquee_current_tenant())', p_table);
    END IF;
    IF NOT EXISTS (SELECT 1 FROM pg_policy WHERE polrelid = p_table AND polname = 'system_access') THEN
        EXECUTE format('CREATE POLICY system_access ON %s TO marquee_system USING (true) WITH CHECK (true)',
                       p_table);
    END IF;
    IF NOT has_table_privilege('marquee_api', p_table, 'SELECT, INSERT, UPDATE, DELETE') THEN
        EXECUTE format('GRANT SELECT, INSERT, UPDATE, DELETE ON %s TO marquee_api', p_table);
    END IF;
    FOREACH v_privilege IN ARRAY ARRAY['SELECT', 'INSERT', 'UPDATE', 'DELETE'] LOOP
        IF has_table_privilege('marquee_api', p_table, v_privilege) THEN
            EXECUTE format('GRANT %s ON %s TO marquee_system', v_privilege, p_table);
        END IF;
    END LOOP;
END;
$$;

-- Every table of this schema that has a tenant_id column, whichever migration made it (0006-0009 included).
DO $$
DECLARE
    v_table regclass;
BEGIN
    FOR v_table IN
        SELECT c.oid::regclass FROM pg_class c
        JOIN pg_attribute a ON a.attrelid = c.oid AND a.attname = 'tenant_id' AND NOT a.attisdropped
        WHERE c.relnamespace = current_schema()::regnamespace AND c.relkind IN ('r', 'p')
        ORDER BY c.relname
    LOOP
        PERFORM marquee_protect_tenant_table(v_table);
    END LOOP;
END
$$;

-- tenants is keyed by id: marquee_api keeps reading its own row (0002); marquee_system creates tenants, lists them
-- and reseals their secrets.
ALTER TABLE tenants FORCE ROW LEVEL SECURITY;
CREATE POLICY system_access ON tenants TO marquee_system USING (true) WITH CHECK (true);
GRANT SELECT, INSERT, UPDATE ON tenants TO marquee_system;

-- Three foreign keys that a campaign start pays for, checked once per statement instead of once per row.
--
-- A start resolves its audience into campaign_members (100,000 rows in one statement), then writes 10,000 people a
-- statement as instances. A foreign key checks every row on its own: one query per row that looks its parent up and
-- locks it. On a copy of the schema (fsync off, quiet), with the checks below instead of the foreign keys: inserting
-- the 100,000 members (nothing of the start can be sent yet) 335–373 against 663 ms; 10,000 instances 89–101 against
-- 161 ms. bench/campaign (six runs each, alternated): the start's steps done in 8.7–10.0 s against 10.0–11.2 s, its
-- last push-to-start 9.8–11.3 s against 10.5–11.9 s.
--
-- The three become statement-level triggers over the statement's new rows (a transition table): one look per
-- distinct parent, the campaigns locked FOR KEY SHARE as a foreign key locks them (a concurrent delete of the
-- campaign waits for the writer; a writer that finds its campaign deleted fails), the same SQLSTATE (23503) and
-- constraint name. What each did on its parent's side stays, in a trigger there:
--   instances → tenants (ON DELETE CASCADE)            a tenant's delete deletes its instances;
--   instances → campaigns (NO ACTION)                 a campaign that has instances cannot be deleted;
--   campaign_members → campaigns (ON DELETE CASCADE)  a campaign's delete deletes its members.
-- The keys on both sides are never updated by Marquee; a trigger refuses an update that would change one, rather than
-- check it. TRUNCATE … CASCADE (no Marquee role may truncate) no longer follows these three: name the tables.
--
-- Kept as a foreign key: delivery_queue → instances. Its rows each name a different instance, so a statement's check
-- is as many lookups and locks as the rows: 10,000 queue rows 134–157 against 162 ms, for more work on every write.
--
-- Tenants are not locked: no Marquee role may delete one (marquee_api and marquee_system have no DELETE on tenants).
-- SECURITY INVOKER: the checks see what the writer sees. The API's role writes only its own tenant's rows (row-level
-- security) and reads its own tenant's row and campaigns; the system role sees every tenant. The checks plan with
-- index lookups whatever the transaction set (a start's steps turn nested loops off) or the statistics say.

ALTER TABLE instances DROP CONSTRAINT instances_tenant_id_fkey;
ALTER TABLE instances DROP CONSTRAINT instances_tenant_id_campaign_id_fkey;
ALTER TABLE campaign_members DROP CONSTRAINT campaign_members_tenant_id_campaign_id_fkey;

-- A row whose parent is missing, reported as a foreign key reports it.
CREATE FUNCTION marquee_missing_parent(p_constraint text, p_table text, p_parent text, p_key text) RETURNS void
LANGUAGE plpgsql VOLATILE AS $$
BEGIN
    RAISE EXCEPTION 'insert or update on table "%" violates foreign key constraint "%"', p_table, p_constraint
        USING ERRCODE = 'foreign_key_violation', CONSTRAINT = p_constraint, TABLE = p_table,
              DETAIL = format('Key %s is not present in table "%s".', p_key, p_parent);
END;
$$;

-- The parents that a statement's new rows name: for both tables, their campaigns (distinct), each locked KEY SHARE as
-- a foreign key locks its parent, a missing one the violation of the constraint named by the trigger's first argument;
-- with a second argument (instances), their tenants too. One function for both tables (PL/pgSQL compiles a trigger
-- function once per table, so `new_rows` is each table's own).
CREATE FUNCTION marquee_check_parents() RETURNS trigger
LANGUAGE plpgsql VOLATILE SECURITY INVOKER SET enable_nestloop = on SET enable_seqscan = off AS $$
DECLARE
    v_wanted bigint;
    v_locked bigint;
    v_missing record;
BEGIN
    IF TG_NARGS > 1 THEN
        SELECT n.tenant_id INTO v_missing FROM (SELECT DISTINCT tenant_id FROM new_rows) n
        WHERE NOT EXISTS (SELECT 1 FROM tenants t WHERE t.id = n.tenant_id) LIMIT 1;
        IF FOUND THEN
            PERFORM marquee_missing_parent(TG_ARGV[1], TG_TABLE_NAME, 'tenants',
                                           format('(tenant_id)=(%s)', v_missing.tenant_id));
        END IF;
    END IF;
    SELECT count(*) INTO v_wanted
    FROM (SELECT DISTINCT tenant_id, campaign_id FROM new_rows WHERE campaign_id IS NOT NULL) n;
    IF v_wanted = 0 THEN
        RETURN NULL;
    END IF;
    SELECT count(*) INTO v_locked FROM (
        SELECT 1 FROM campaigns c WHERE (c.tenant_id, c.id) IN (SELECT tenant_id, campaign_id FROM new_rows)
        FOR KEY SHARE OF c) l;
    IF v_locked < v_wanted THEN
        SELECT n.tenant_id, n.campaign_id INTO v_missing FROM new_rows n
        WHERE n.campaign_id IS NOT NULL
          AND NOT EXISTS (SELECT 1 FROM campaigns c WHERE c.tenant_id = n.tenant_id AND c.id = n.campaign_id)
        LIMIT 1;
        PERFORM marquee_missing_parent(TG_ARGV[0], TG_TABLE_NAME, 'campaigns',
                                       format('(tenant_id, campaign_id)=(%s, %s)', v_missing.tenant_id,
                                              v_missing.campaign_id));
    END IF;
    RETURN NULL;
END;
$$;
CREATE TRIGGER instances_parents AFTER INSERT ON instances REFERENCING NEW TABLE AS new_rows
    FOR EACH STATEMENT
    EXECUTE FUNCTION marquee_check_parents('instances_tenant_id_campaign_id_fkey', 'instances_tenant_id_fkey');
CREATE TRIGGER campaign_members_parent AFTER INSERT ON campaign_members REFERENCING NEW TABLE AS new_rows
    FOR EACH STATEMENT EXECUTE FUNCTION marquee_check_parents('campaign_members_tenant_id_campaign_id_fkey');

-- A campaign's delete, after its row is gone: the delete waited for any writer holding the campaign KEY SHARE, whose
-- instances are committed by now and seen here (each statement of a function takes a new snapshot).
CREATE FUNCTION marquee_campaign_deleted() RETURNS trigger
LANGUAGE plpgsql VOLATILE SECURITY INVOKER AS $$
BEGIN
    IF EXISTS (SELECT 1 FROM instances i WHERE i.tenant_id = OLD.tenant_id AND i.campaign_id = OLD.id) THEN
        RAISE EXCEPTION 'update or delete on table "campaigns" violates foreign key constraint "%" on table "%"',
                        'instances_tenant_id_campaign_id_fkey', 'instances'
            USING ERRCODE = 'foreign_key_violation', CONSTRAINT = 'instances_tenant_id_campaign_id_fkey',
                  TABLE = 'campaigns', DETAIL = format('Campaign %s still has instances.', OLD.id);
    END IF;
    DELETE FROM campaign_members m WHERE m.tenant_id = OLD.tenant_id AND m.campaign_id = OLD.id;
    RETURN NULL;
END;
$$;
CREATE TRIGGER campaign_deleted AFTER DELETE ON campaigns FOR EACH ROW EXECUTE FUNCTION marquee_campaign_deleted();

-- A tenant's delete takes its instances first (before its campaigns go by their own foreign keys' cascade, which
-- would find instances left).
CREATE FUNCTION marquee_tenant_deleting() RETURNS trigger
LANGUAGE plpgsql VOLATILE SECURITY INVOKER AS $$
BEGIN
    DELETE FROM instances i WHERE i.tenant_id = OLD.id;
    RETURN OLD;
END;
$$;
CREATE TRIGGER tenant_deleting BEFORE DELETE ON tenants FOR EACH ROW EXECUTE FUNCTION marquee_tenant_deleting();

-- The keys on either side of the three references are never updated; an update that changes one fails.
CREATE FUNCTION marquee_keys_unchanged() RETURNS trigger
LANGUAGE plpgsql VOLATILE AS $$
DECLARE
    v_old jsonb := to_jsonb(OLD);
    v_new jsonb := to_jsonb(NEW);
    v_column text;
BEGIN
    FOREACH v_column IN ARRAY TG_ARGV LOOP
        IF v_old -> v_column IS DISTINCT FROM v_new -> v_column THEN
            RAISE EXCEPTION '%.% is a reference key and cannot change', TG_TABLE_NAME, v_column
                USING ERRCODE = 'foreign_key_violation', TABLE = TG_TABLE_NAME, COLUMN = v_column;
        END IF;
    END LOOP;
    RETURN NEW;
END;
$$;
CREATE TRIGGER keys_unchanged BEFORE UPDATE OF tenant_id, campaign_id ON instances
    FOR EACH ROW EXECUTE FUNCTION marquee_keys_unchanged('tenant_id', 'campaign_id');
CREATE TRIGGER keys_unchanged BEFORE UPDATE OF tenant_id, campaign_id ON campaign_members
    FOR EACH ROW EXECUTE FUNCTION marquee_keys_unchanged('tenant_id', 'campaign_id');
CREATE TRIGGER keys_unchanged BEFORE UPDATE OF tenant_id, id ON campaigns
    FOR EACH ROW EXECUTE FUNCTION marquee_keys_unchanged('tenant_id', 'id');
CREATE TRIGGER keys_unchanged BEFORE UPDATE OF id ON tenants
    FOR EACH ROW EXECUTE FUNCTION marquee_keys_unchanged('id');

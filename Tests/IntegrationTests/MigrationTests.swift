import Foundation
import PostgresClient
import Testing

@testable import MarqueeCore
@testable import MarqueeStore

@Suite("Migrations")
struct MigrationTests {
    /// A temporary Migrations directory with the given files.
    func directory(_ files: [String: String]) throws -> String {
        let dir = NSTemporaryDirectory() + "migrations-\(UUID().uuidString)"
        try FileManager.default.createDirectory(atPath: dir, withIntermediateDirectories: true)
        for (name, sql) in files {
            try sql.write(toFile: dir + "/" + name, atomically: true, encoding: .utf8)
        }
        return dir
    }

    @Test("the project's migrations apply to an empty database, once, and the status is then current")
    func applyProjectMigrations() async throws {
        let url = try await TestEnvironment.makeDatabase()
        let pool = PostgresPool(try PostgresConfiguration(url: url), options: .init(maxConnections: 2))
        defer { pool.close() }
        let migrations = try MigrationFiles.load(directory: TestEnvironment.migrationsDirectory)
        #expect(!migrations.isEmpty)
        let migrator = Migrator(pool: pool, migrations: migrations)
        #expect(try await migrator.status().isCurrent == false)
        let applied = try await migrator.migrate()
        #expect(applied.map(\.version) == migrations.map(\.version))
        #expect(try await migrator.status().isCurrent)
        #expect(try await migrator.migrate().isEmpty)
        let rows = try await pool.query("SELECT count(*)::int AS n FROM schema_migrations")
        #expect(try rows.first!.decode(Int.self, "n") == migrations.count)
    }

    @Test("two `marquee migrate` processes started at once both exit 0 and each migration is applied once")
    func concurrentMigrators() async throws {
        let url = try await TestEnvironment.makeDatabase()
        // A slow first migration widens the race window.
        let dir = try directory([
            "0001_slow.sql": "SELECT pg_sleep(0.5); CREATE TABLE a (id int PRIMARY KEY);",
            "0002_more.sql": "CREATE TABLE b (id int PRIMARY KEY); INSERT INTO b VALUES (1);",
        ])
        let env = ["DATABASE_URL": url, "MARQUEE_MIGRATIONS_DIR": dir]
        async let first = runCommand(TestEnvironment.marqueeBinary, ["migrate"], environment: env)
        async let second = runCommand(TestEnvironment.marqueeBinary, ["migrate"], environment: env)
        let results = try await [first, second]
        for result in results {
            #expect(result.status == 0, "\(result.output)")
        }
        let pool = PostgresPool(try PostgresConfiguration(url: url), options: .init(maxConnections: 1))
        defer { pool.close() }
        let rows = try await pool.query("SELECT version FROM schema_migrations ORDER BY version")
        #expect(try rows.map { try $0.decode(Int.self, "version") } == [1, 2])
        let b = try await pool.query("SELECT count(*)::int AS n FROM b")
        #expect(try b.first!.decode(Int.self, "n") == 1)
        let status = try await runCommand(TestEnvironment.marqueeBinary, ["migrate", "--status"], environment: env)
        #expect(status.status == 0)
        #expect(status.output.contains("applied\t0002_more.sql"))
    }

    @Test("a changed applied file is refused before anything else is applied")
    func changedFileRefused() async throws {
        let url = try await TestEnvironment.makeDatabase()
        let pool = PostgresPool(try PostgresConfiguration(url: url), options: .init(maxConnections: 1))
        defer { pool.close() }
        let v1 = Migration(version: 1, name: "one", sql: "CREATE TABLE one (id int);")
        try await Migrator(pool: pool, migrations: [v1]).migrate()

        let edited = Migration(version: 1, name: "one", sql: "CREATE TABLE one (id bigint);")
        let v2 = Migration(version: 2, name: "two", sql: "CREATE TABLE two (id int);")
        let migrator = Migrator(pool: pool, migrations: [edited, v2])
        let status = try await migrator.status()
        #expect(status.changed == [1])
        #expect(!status.isCurrent)
        await #expect(throws: MigrationError.self) { try await migrator.migrate() }
        let two = try await pool.query("SELECT to_regclass('two') IS NULL AS absent")
        #expect(try two.first!.decode(Bool.self, "absent"))

        let dir = try directory(["0001_one.sql": "CREATE TABLE one (id bigint);"])
        let cli = try await runCommand(
            TestEnvironment.marqueeBinary, ["migrate"],
            environment: ["DATABASE_URL": url, "MARQUEE_MIGRATIONS_DIR": dir])
        #expect(cli.status == 1)
        #expect(cli.output.contains("changed after it was applied"))
    }

    @Test("a failing migration rolls back entirely and is not recorded")
    func failingMigrationRollsBack() async throws {
        let url = try await TestEnvironment.makeDatabase()
        let pool = PostgresPool(try PostgresConfiguration(url: url), options: .init(maxConnections: 1))
        defer { pool.close() }
        let bad = Migration(version: 1, name: "bad", sql: "CREATE TABLE half (id int); SELECT no_such_function();")
        await #expect(throws: MigrationError.self) { try await Migrator(pool: pool, migrations: [bad]).migrate() }
        let rows = try await pool.query(
            "SELECT to_regclass('half') IS NULL AS absent, (SELECT count(*)::int FROM schema_migrations) AS n")
        #expect(try rows.first!.decode(Bool.self, "absent"))
        #expect(try rows.first!.decode(Int.self, "n") == 0)
    }

    @Test("a migration waiting for a table lock gives way to the statements queued behind it, then applies")
    func migrationGivesWayOnLocks() async throws {
        let url = try await TestEnvironment.makeDatabase()
        let pool = PostgresPool(try PostgresConfiguration(url: url), options: .init(maxConnections: 2))
        defer { pool.close() }
        let table = Migration(
            version: 1, name: "table", sql: "CREATE TABLE busy (id int); INSERT INTO busy VALUES (1);")
        try await Migrator(pool: pool, migrations: [table]).migrate()
        // A long transaction reads the table (an import, a campaign step): an ALTER must wait for it.
        let reader = try await HeldTransaction.open(url) { c in _ = try c.query("SELECT count(*) FROM busy") }
        let alter = Migration(version: 2, name: "alter", sql: "ALTER TABLE busy ADD COLUMN c int;")
        let migrating = Task {
            try await Migrator(
                pool: pool, migrations: [table, alter], lockTimeout: .milliseconds(100), lockAttempts: 1000
            )
            .migrate()
        }
        try await reader.waitedOn(via: pool, "the migration waits for the reader")
        // Reads of the table are not stuck behind the waiting ALTER for longer than its lock timeout.
        let reads = PostgresPool(try PostgresConfiguration(url: url), options: .init(maxConnections: 1))
        defer { reads.close() }
        for _ in 0..<5 {
            let n = try await reads.transaction { c in
                try c.execute("SET LOCAL statement_timeout = '3s'")
                return try c.query("SELECT count(*)::int AS n FROM busy")[0].decode(Int.self, "n")
            }
            #expect(n == 1)
        }
        try await reader.commit()
        #expect(try await migrating.value.map(\.version) == [2])
        let column = try await pool.query(
            "SELECT count(*)::int AS n FROM information_schema.columns WHERE table_name = 'busy' AND column_name = 'c'")
        #expect(try column[0].decode(Int.self, "n") == 1)
    }

    /// Every pod's init container migrates and sets the password at once in a rollout: each `ALTER ROLE` must commit
    /// before the next begins, or PostgreSQL refuses the later one ("tuple concurrently updated", XX000) and that pod
    /// fails to start. It ran after the migration lock was released: 11 of 40 such runs failed. (One test, not two: the
    /// role is the cluster's, and another test setting its password meanwhile would race this one.)
    @Test(
        "marquee migrate sets marquee_app's password from MARQUEE_APP_PASSWORD as a verifier it computed, in several processes at once"
    )
    func appPasswordAsVerifier() async throws {
        let url = try await TestEnvironment.makeDatabase()
        let password = "pw-" + UUID().uuidString
        let env = [
            "DATABASE_URL": url, "MARQUEE_MIGRATIONS_DIR": TestEnvironment.migrationsDirectory,
            "MARQUEE_APP_PASSWORD": password,
        ]
        let run = try await runCommand(TestEnvironment.marqueeBinary, ["migrate"], environment: env)
        #expect(run.status == 0, "\(run.output)")
        #expect(!run.output.contains(password))
        // The schema is current: the processes meet at the password, twice eight of them.
        for _ in 0..<2 {
            let runs = try await withThrowingTaskGroup(of: CommandResult.self) { group in
                for _ in 0..<8 {
                    group.addTask { try await runCommand(TestEnvironment.marqueeBinary, ["migrate"], environment: env) }
                }
                return try await group.reduce(into: []) { $0.append($1) }
            }
            for run in runs { #expect(run.status == 0, "\(run.output)") }
        }
        let pool = PostgresPool(try PostgresConfiguration(url: url), options: .init(maxConnections: 1))
        defer { pool.close() }
        let stored = try await pool.query("SELECT rolpassword FROM pg_authid WHERE rolname = 'marquee_app'")
        let verifier = try stored[0].decode(String?.self, "rolpassword") ?? ""
        #expect(verifier.hasPrefix("SCRAM-SHA-256$"), "\(verifier)")
    }

    @Test("file names are checked")
    func fileNames() throws {
        let bad = try directory(["1_short.sql": "SELECT 1;"])
        #expect(throws: MigrationError.self) { try MigrationFiles.load(directory: bad) }
        let duplicate = try directory(["0001_a.sql": "SELECT 1;", "0001_b.sql": "SELECT 2;"])
        #expect(throws: MigrationError.self) { try MigrationFiles.load(directory: duplicate) }
        let fine = try directory(["0002_b.sql": "SELECT 2;", "0001_a.sql": "SELECT 1;", "README": "not sql"])
        #expect(try MigrationFiles.load(directory: fine).map(\.fileName) == ["0001_a.sql", "0002_b.sql"])
    }
}

@Suite("Query plans under tenant skew")
struct LookupPlanTests {
    /// A new database with every migration applied, and a one-connection pool on it as its owner.
    static func migratedDatabase() async throws -> PostgresPool {
        let url = try await TestEnvironment.makeDatabase()
        let pool = PostgresPool(try PostgresConfiguration(url: url), options: .init(maxConnections: 1))
        _ = try await Migrator(
            pool: pool, migrations: MigrationFiles.load(directory: TestEnvironment.migrationsDirectory)
        )
        .migrate()
        return pool
    }

    /// The foreign-key checks PostgreSQL runs for every token and delivery row look rows up by (tenant_id, key). Planned
    /// generically (once per session, as PostgreSQL plans them) while the statistics say each tenant has a row or two,
    /// they must still use the primary key: any other index that starts with tenant_id would read a big tenant's
    /// every row per check (an import of 100,000 people took more than 20 minutes that way).
    @Test("lookups by tenant and key use the primary key even when statistics say tenants are tiny")
    func keyLookups() async throws {
        let pool = try await Self.migratedDatabase()
        defer { pool.close() }
        // Many small tenants, each with a person, a device and an instance: statistics of tiny tenants.
        try await pool.execute(
            """
            WITH t AS (
                INSERT INTO tenants (id, name, sealed_delivery_secret)
                SELECT gen_random_uuid(), 'plan-' || i, '\\x00'::bytea FROM generate_series(1, 50) i RETURNING id
            ), p AS (
                INSERT INTO people (tenant_id, id) SELECT id, 'p' FROM t RETURNING tenant_id
            ), d AS (
                INSERT INTO devices (tenant_id, token, person_id, platform)
                SELECT tenant_id, md5(tenant_id::text), 'p', 'ios' FROM p RETURNING tenant_id
            ), i AS (
                INSERT INTO instances (tenant_id, id, activity_type, person_id, state, attributes, content_state,
                                       content_timestamp, expires_at)
                SELECT tenant_id, 'campaign-01JDZ3Q6T8M4V9W2X5Y7Z0A1B2.p', 'match', 'p', 'active', '{}', '{}', 0,
                       now() + interval '1 hour'
                FROM d RETURNING tenant_id
            )
            SELECT count(*) FROM i
            """)
        try await pool.execute("ANALYZE")
        let lookups = [
            (
                "devices", "devices_pkey",
                "SELECT 1 FROM ONLY devices x WHERE tenant_id = $1 AND token = $2 FOR KEY SHARE OF x"
            ),
            (
                "instances", "instances_pkey",
                "SELECT 1 FROM ONLY instances x WHERE tenant_id = $1 AND id = $2 FOR KEY SHARE OF x"
            ),
        ]
        for (table, index, query) in lookups {
            let plan = try await pool.withConnection { c in
                try c.execute("SET plan_cache_mode = force_generic_plan")
                try c.execute("SET enable_seqscan = off")
                try c.execute(PostgresQuery(unsafeSQL: "PREPARE lookup(uuid, text) AS " + query))
                defer { _ = try? c.execute("DEALLOCATE lookup") }
                let rows = try c.query(
                    "EXPLAIN EXECUTE lookup('00000000-0000-0000-0000-000000000000', 'x')")
                return try rows.map { try $0.decode(String.self, "QUERY PLAN") }.joined(separator: "\n")
            }
            #expect(plan.contains(index), "\(table): \(plan)")
        }
    }

    /// A foreign key's check on the referencing side (a cascade's delete, a NO ACTION's look) is a lookup by the key's
    /// columns, once per row deleted or changed on the referenced side. Without an index starting with those columns it
    /// reads the table's whole part of the tenant, per row: one device's removal took 150 ms at 200,000 activity
    /// tokens and device states a tenant (migration 0085), an import's eviction of thousands of devices minutes.
    @Test("every foreign key's columns lead an index of the referencing table")
    func foreignKeysIndexed() async throws {
        let pool = try await Self.migratedDatabase()
        defer { pool.close() }
        let unindexed = try await pool.query(
            """
            SELECT c.conrelid::regclass::text || ' ' || c.conname AS name FROM pg_constraint c
            WHERE c.contype = 'f' AND c.conparentid = 0
              AND NOT EXISTS (
                  SELECT 1 FROM pg_index i
                  WHERE i.indrelid = c.conrelid
                    AND (i.indkey::int2[])[0:cardinality(c.conkey) - 1] @> c.conkey
                    AND (i.indkey::int2[])[0:cardinality(c.conkey) - 1] <@ c.conkey)
            ORDER BY 1
            """
        ).map { try $0.decode(String.self, "name") }
        #expect(unindexed == [], "foreign keys without an index on their columns: \(unindexed)")
    }

    /// A claim takes each tenant's share in due order (DeliveryQueue.lock). Planned while one tenant's burst makes up
    /// most of the queue, a small tenant's share must still come from (tenant_id, lane, next_attempt_at): read in the global
    /// due order with the tenant as a filter, it walked the other tenant's whole burst (migration 0056).
    @Test("a tenant's share of a claim is read by tenant and due time, whatever another tenant's burst")
    func claimScan() async throws {
        let pool = try await Self.migratedDatabase()
        defer { pool.close() }
        let (big, small) = (UUID(), UUID())
        try await pool.execute(
            """
            WITH t AS (
                INSERT INTO tenants (id, name, sealed_delivery_secret)
                VALUES (\(big), 'big', '\\x00'::bytea), (\(small), 'small', '\\x00'::bytea) RETURNING id
            ), i AS (
                INSERT INTO instances (tenant_id, id, activity_type, state, attributes, content_state,
                                       content_timestamp, expires_at)
                SELECT id, 'i', 'match', 'active', '{}', '{}', 0, now() + interval '1 hour' FROM t RETURNING tenant_id
            )
            INSERT INTO delivery_queue (tenant_id, id, instance_id, device_token, provider, token_kind, token,
                                    operation, instance_version, next_attempt_at)
            SELECT i.tenant_id, gen_random_uuid(), 'i', 'd' || n, 'apns', 'activity', md5(n::text), 'update', 1,
                   now() - interval '1 hour' + n * interval '1 ms'
            FROM i, generate_series(1, CASE WHEN i.tenant_id = \(big) THEN 20000 ELSE 5 END) n
            """)
        try await pool.execute("ANALYZE")
        // The claim's own statement (DeliveryQueue.lockQuery), planned generically as the worker plans it.
        let claim = DeliveryQueue.lockQuery(tenants: [small], shares: [128], excluding: [], providers: ["apns", "fcm"])
        let plan = try await pool.withConnection { c in
            try c.execute("SET plan_cache_mode = force_generic_plan")
            try c.execute("SET enable_seqscan = off")
            let rows = try c.query(
                PostgresQuery(unsafeSQL: "EXPLAIN (ANALYZE, BUFFERS, COSTS OFF) " + claim.sql, binds: claim.binds))
            return try rows.map { try $0.decode(String.self, "QUERY PLAN") }.joined(separator: "\n")
        }
        #expect(plan.contains("deliveries_due_by_lane"), "\(plan)")
        #expect(!plan.contains("Rows Removed by Filter: 2"), "no other tenant's rows read: \(plan)")
    }
    /// A change write finds the rows its instance has queued (to supersede or cancel them) by index, planned as the
    /// group commit plans it (generic plans, `GroupCommitter.planSettings`) while another tenant's backlog of few
    /// instances and many devices skews the statistics: as a join, it read the whole queue per write (47 ms a write
    /// during a 100,000-push drain).
    @Test("a change write looks its instance's queued rows up by index, whatever another tenant's backlog")
    func changeWriteScan() async throws {
        let pool = try await Self.migratedDatabase()
        defer { pool.close() }
        let (big, small) = (UUID(), UUID())
        try await pool.execute(
            """
            WITH t AS (
                INSERT INTO tenants (id, name, sealed_delivery_secret)
                VALUES (\(big), 'big', '\\x00'::bytea), (\(small), 'small', '\\x00'::bytea) RETURNING id
            ), a AS (
                INSERT INTO activity_types (tenant_id, identifier, attributes_type) SELECT id, 'match', 'M' FROM t
                RETURNING tenant_id
            ), i AS (
                INSERT INTO instances (tenant_id, id, activity_type, state, attributes, content_state,
                                       content_timestamp, expires_at)
                SELECT tenant_id, 'i', 'match', 'active', '{}', '{}', 0, now() + interval '1 hour' FROM a
                RETURNING tenant_id
            )
            INSERT INTO delivery_queue (tenant_id, id, instance_id, device_token, provider, token_kind, token,
                                    operation, instance_version, next_attempt_at)
            SELECT i.tenant_id, gen_random_uuid(), 'i', 'd' || n, 'apns', 'activity', 't' || n, 'update', 1,
                   now() + interval '1 hour'
            FROM i, generate_series(1, CASE WHEN i.tenant_id = \(big) THEN 20000 ELSE 2 END) n
            """)
        // The small tenant's instance has the target the write plans for (a write whose plan names a target the
        // instance no longer has is not written).
        try await pool.execute(
            """
            WITH p AS (
                INSERT INTO people (tenant_id, id) VALUES (\(small), 'p') RETURNING tenant_id
            ), d AS (
                INSERT INTO devices (tenant_id, token, person_id, platform) SELECT tenant_id, 'd1', 'p', 'ios' FROM p
                RETURNING tenant_id
            )
            INSERT INTO activity_tokens (tenant_id, instance_id, device_token, token) SELECT tenant_id, 'i', 'd1', 't1' FROM d
            """)
        try await pool.execute("ANALYZE")
        let plan = LifecyclePlanner.ChangePlan(
            expectedVersion: 1, state: .active, failureReason: nil, attributes: .object([:]),
            contentState: .object(["score": .int(1)]), options: StoredOptions(), contentTimestamp: 1,
            deliveries: [
                PlannedDelivery(
                    id: UUID(), deviceToken: "d1", provider: .apns, tokenKind: .activity, token: "t1")
            ],
            warnings: [], version: 2)
        let write = ChangeWrite.statement(
            tenant: small, [ChangeWrite(instanceID: "i", operation: .update, plan: plan, idempotency: nil)])
        let (scans, written, queued) = try await pool.withConnection { c in
            defer { _ = try? c.execute("ROLLBACK") }
            // The queue's scans by this session before and after the write: counts PostgreSQL has not reported yet
            // (it reports at most once a second, and the migrations scanned the empty queue) show in both.
            let scans: PostgresQuery = """
                SELECT seq_scan::int, seq_tup_read::int FROM pg_stat_xact_user_tables
                WHERE relname = 'delivery_queue'
                """
            let results = try c.pipelined(
                ["BEGIN"] + GroupCommitter.planSettings + [
                    "SELECT marquee_enter_tenant(\(small))", scans, write, scans,
                    "SELECT count(*)::int AS n FROM delivery_queue WHERE tenant_id = \(small)",
                ])
            let before = try #require(results[results.count - 4].first)
            let after = try #require(results[results.count - 2].first)
            return (
                try (
                    after.decode(Int.self, "seq_scan") - before.decode(Int.self, "seq_scan"),
                    after.decode(Int.self, "seq_tup_read") - before.decode(Int.self, "seq_tup_read")
                ),
                try results[results.count - 3].first?.decode(Int?.self, "version"),
                try results[results.count - 1].first?.decode(Int.self, "n")
            )
        }
        #expect(written == 2)
        #expect(queued == 2, "d1's older update superseded, d2's kept, d1's new one queued")
        #expect(scans.0 == 0 && scans.1 == 0, "no sequential scan of the queue (scans, rows read: \(scans))")
    }

    /// The overview counts a tenant's instances of the last day (`OverviewStore.instancesQuery`). Its statement is
    /// prepared, so after a few runs PostgreSQL may plan it generically; the plan must still read the day's instances
    /// through instances_recent, whose predicate (migration 0053) a generic `started_at >= $3` does not imply.
    @Test("the overview's instance count reads the day's instances through instances_recent, planned generically")
    func overviewInstancesScan() async throws {
        let pool = try await Self.migratedDatabase()
        defer { pool.close() }
        let tenant = UUID()
        try await pool.execute(
            """
            WITH t AS (
                INSERT INTO tenants (id, name, sealed_delivery_secret) VALUES (\(tenant), 'big', '\\x00'::bytea)
                RETURNING id
            )
            INSERT INTO instances (tenant_id, id, activity_type, state, attributes, content_state, content_timestamp,
                                   expires_at, started_at)
            SELECT id, 'i' || n, 'match', 'ended', '{}', '{}', 0, now(), now() - n * interval '1 minute'
            FROM t, generate_series(1, 20000) n
            """)
        try await pool.execute("ANALYZE")
        let query = OverviewStore.instancesQuery(tenant: tenant, since: Date(), now: Date())
        let plan = try await pool.withConnection { c in
            try c.execute("SET plan_cache_mode = force_generic_plan")
            try c.execute("SET enable_seqscan = off")
            try c.execute(PostgresQuery(unsafeSQL: "PREPARE overview_instances AS " + query.sql))
            defer { _ = try? c.execute("DEALLOCATE overview_instances") }
            // Its values in their order: now, the tenant, the window's start.
            let rows = try c.query(
                PostgresQuery(
                    unsafeSQL: """
                        EXPLAIN (COSTS OFF)
                        EXECUTE overview_instances(now(), '\(tenant)', now() - interval '\(Int(OverviewStore.instanceWindow)) seconds')
                        """))
            return try rows.map { try $0.decode(String.self, "QUERY PLAN") }.joined(separator: "\n")
        }
        #expect(plan.contains("Index Cond: ((tenant_id = $"), "\(plan)")
        #expect(plan.contains("instances_recent"), "\(plan)")
    }

    /// The worker's supersede check on a retry (a newer version of the same instance and token queued, parked or sent)
    /// must look the token up: by (tenant_id, instance_id) alone it read every delivery the instance ever had per
    /// recorded row (migration 0056).
    @Test("the retry's supersede check looks the token up, not every delivery of the instance")
    func supersedeCheck() async throws {
        let pool = try await Self.migratedDatabase()
        defer { pool.close() }
        let plan = try await pool.withConnection { c in
            try c.execute("SET plan_cache_mode = force_generic_plan")
            try c.execute("SET enable_seqscan = off")
            try c.execute(
                """
                PREPARE newer(uuid, text, text, int) AS
                SELECT 1 FROM deliveries n
                WHERE n.tenant_id = $1 AND n.instance_id = $2 AND n.token = $3 AND n.instance_version > $4
                  AND n.status IN ('queued', 'parked', 'sent')
                """)
            defer { _ = try? c.execute("DEALLOCATE newer") }
            let rows = try c.query("EXPLAIN EXECUTE newer('00000000-0000-0000-0000-000000000000', 'i', 't', 1)")
            return try rows.map { try $0.decode(String.self, "QUERY PLAN") }.joined(separator: "\n")
        }
        let conditions = plan.split(separator: "\n").filter { $0.contains("Index Cond") }
        // In the queue and in every partition of the history (migration 0057).
        #expect(
            !conditions.isEmpty && conditions.allSatisfy { $0.contains("token") },
            "the token is an index condition: \(plan)")
        #expect(plan.contains("delivery_history"), "sent versions are in the history: \(plan)")
    }
}

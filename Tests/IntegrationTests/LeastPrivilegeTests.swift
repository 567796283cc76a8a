import Foundation
import MarqueeStore
import PostgresClient
import Testing

/// The API and workers log in as `marquee_app`, which owns nothing; tenant tables force row-level security.
@Suite("Least privilege")
struct LeastPrivilegeTests {
    /// Every table of the schema with tenant data: a tenant_id column, or `tenants` itself (read from the catalog, so
    /// a table added later is covered).
    static func tenantTables(_ pool: PostgresPool) async throws -> [String] {
        try await pool.query(
            """
            SELECT c.relname::text AS name FROM pg_class c
            WHERE c.relnamespace = current_schema()::regnamespace AND c.relkind IN ('r', 'p')
              AND (c.relname = 'tenants' OR EXISTS (
                  SELECT 1 FROM pg_attribute a WHERE a.attrelid = c.oid AND a.attname = 'tenant_id' AND NOT a.attisdropped))
            ORDER BY 1
            """
        ).map { try $0.decode(String.self, "name") }
    }

    @Test("every tenant table forces row-level security and has both policies")
    func everyTenantTableForcesRowLevelSecurity() async throws {
        let fixture = try await RegistryFixture.get()
        let tables = try await Self.tenantTables(fixture.pool)
        #expect(tables.count >= 15)
        let rows = try await fixture.pool.query(
            """
            SELECT c.relname::text AS name, c.relrowsecurity AS enabled, c.relforcerowsecurity AS forced,
                   ARRAY(SELECT p.polname::text FROM pg_policy p WHERE p.polrelid = c.oid ORDER BY 1) AS policies
            FROM pg_class c WHERE c.relnamespace = current_schema()::regnamespace AND c.relname = ANY(\(tables))
            """)
        for row in rows {
            let name = try row.decode(String.self, "name")
            #expect(try row.decode(Bool.self, "enabled") && row.decode(Bool.self, "forced"), "\(name)")
            #expect(try row.decode([String].self, "policies") == ["system_access", "tenant_isolation"], "\(name)")
        }
    }

    @Test("as marquee_app: no privilege on tenant tables; as marquee_api without a tenant: no rows")
    func appRoleSeesNothingByItself() async throws {
        let fixture = try await RegistryFixture.get()
        _ = try await IsolationTests.seed(fixture)
        let tables = try await Self.tenantTables(fixture.pool)
        let app = PostgresPool(
            try PostgresConfiguration(url: TestEnvironment.appURL(fixture.databaseURL)),
            options: .init(maxConnections: 1))
        defer { app.close() }
        let check = try await DatabaseRoleCheck.inspect(app)
        #expect(check.role == "marquee_app" && check.isLeastPrivilege, "\(check.problems)")
        for table in tables {
            let denied = await #expect(throws: PostgresError.self, "\(table)") {
                try await app.query("SELECT count(*) FROM \(identifier: table)")
            }
            #expect(denied?.sqlState == "42501", "\(table): \(String(describing: denied))")
            let visible = try await app.transaction { connection in
                try connection.execute("SET LOCAL ROLE marquee_api")
                return try connection.query("SELECT count(*)::int AS n FROM \(identifier: table)")[0].decode(
                    Int.self, "n")
            }
            #expect(visible == 0, "\(table): \(visible) rows visible to marquee_api with no tenant")
        }
        // It cannot change the schema or its own rights.
        await #expect(throws: PostgresError.self) {
            try await app.execute("ALTER TABLE people DISABLE ROW LEVEL SECURITY")
        }
        await #expect(throws: PostgresError.self) {
            try await app.transaction { connection in
                try connection.execute("SET LOCAL ROLE marquee_system")
                try connection.execute("TRUNCATE deliveries")
            }
        }
    }

    /// Runs `body` again while it fails on its lock timeout (55P03), for up to two minutes.
    static func retryingLockTimeouts<T>(_ body: () async throws -> T) async throws -> T {
        let deadline = ContinuousClock.now + .seconds(120)
        while true {
            do {
                return try await body()
            } catch let error as PostgresError where error.sqlState == "55P03" && ContinuousClock.now < deadline {
                try await Task.sleep(for: .milliseconds(200))
            }
        }
    }

    @Test("FORCE row-level security: even the tables' owner sees no tenant row without switching role")
    func ownerIsSubjectToRowLevelSecurity() async throws {
        let fixture = try await RegistryFixture.get()
        let seeded = try await IsolationTests.seed(fixture)
        let owner = "marquee_owner_" + Fake.hex(8)
        // In one rolled-back transaction: a non-superuser owner (the tests' owner is a superuser, which bypasses
        // row-level security always), looking at its own tables.
        // The ALTER takes people's ACCESS EXCLUSIVE lock in the shared database: waiting in the lock queue behind a
        // long writer (the 100,000-person import) it held every other test's people reads and writes behind it, and
        // the shared server's pool ran dry for a minute. It waits 100 ms at a time, and tries again.
        let counts = try await Self.retryingLockTimeouts {
            try await fixture.pool.withConnection { connection in
                try connection.execute("BEGIN")
                defer { _ = try? connection.execute("ROLLBACK") }
                try connection.execute("SET LOCAL lock_timeout = '100ms'")
                try connection.execute(PostgresQuery(unsafeSQL: "CREATE ROLE \(owner) NOLOGIN"))
                try connection.execute(PostgresQuery(unsafeSQL: "ALTER TABLE people OWNER TO \(owner)"))
                try connection.execute(PostgresQuery(unsafeSQL: "SET LOCAL ROLE \(owner)"))
                let forced = try connection.query("SELECT count(*)::int AS n FROM people")[0].decode(Int.self, "n")
                try connection.execute("ALTER TABLE people NO FORCE ROW LEVEL SECURITY")
                let unforced = try connection.query(
                    "SELECT count(*)::int AS n FROM people WHERE tenant_id = \(seeded.tenant.uuid)")[0].decode(
                        Int.self, "n")
                return (forced, unforced)
            }
        }
        #expect(counts.0 == 0, "with FORCE the owner sees no rows")
        #expect(counts.1 == 1, "without FORCE the owner would see them (control)")
        #expect(
            try await fixture.pool.count(
                "SELECT count(*)::int AS n FROM pg_class WHERE relname = 'people' AND relforcerowsecurity") == 1)
    }

    @Test("the role check flags superusers, BYPASSRLS roles and table owners")
    func roleCheck() async throws {
        let fixture = try await RegistryFixture.get()
        let owner = try await DatabaseRoleCheck.inspect(fixture.pool)
        #expect(owner.problems.contains("is a superuser"), "\(owner.problems)")
        let suffix = Fake.hex(8)
        let bypass = "marquee_bypass_" + suffix
        let owning = "marquee_owning_" + suffix
        try await fixture.pool.execute(PostgresQuery(unsafeSQL: "CREATE ROLE \(bypass) LOGIN BYPASSRLS"))
        try await fixture.pool.execute(PostgresQuery(unsafeSQL: "CREATE ROLE \(owning) LOGIN"))
        try await fixture.pool.execute(PostgresQuery(unsafeSQL: "CREATE TABLE owned_\(suffix) (x int)"))
        try await fixture.pool.execute(PostgresQuery(unsafeSQL: "ALTER TABLE owned_\(suffix) OWNER TO \(owning)"))
        for (role, problem) in [(bypass, "has BYPASSRLS"), (owning, "owns 1 table(s)")] {
            var components = URLComponents(string: fixture.databaseURL)!
            components.user = role
            let pool = PostgresPool(
                try PostgresConfiguration(url: components.string!), options: .init(maxConnections: 1))
            let check = try await DatabaseRoleCheck.inspect(pool)
            pool.close()
            #expect(check.problems.contains { $0.hasPrefix(problem) }, "\(role): \(check.problems)")
        }
        try await fixture.pool.execute(PostgresQuery(unsafeSQL: "DROP TABLE owned_\(suffix)"))
        try await fixture.pool.execute(PostgresQuery(unsafeSQL: "DROP ROLE \(bypass)"))
        try await fixture.pool.execute(PostgresQuery(unsafeSQL: "DROP ROLE \(owning)"))
    }

    @Test("serve and worker refuse the owner's (superuser) URL, unless MARQUEE_ALLOW_PRIVILEGED_ROLE is set")
    func serveRefusesPrivilegedRole() async throws {
        let fixture = try await RegistryFixture.get()
        for command in ["serve", "worker"] {
            let refused = try MarqueeProcess(
                [command], environment: ["DATABASE_URL": fixture.databaseURL], port: TestEnvironment.freePort(),
                asOwner: true)
            let status = try await refused.waitForExit()
            #expect(status != 0, "\(command) exits non-zero")
            #expect(refused.log.contains("refusing to run \(command)"), "\(refused.log)")
            #expect(refused.log.contains("is a superuser") && refused.log.contains("MARQUEE_ALLOW_PRIVILEGED_ROLE"))
        }
        let allowed = try MarqueeProcess(
            ["serve"], environment: ["DATABASE_URL": fixture.databaseURL, "MARQUEE_ALLOW_PRIVILEGED_ROLE": "true"],
            port: TestEnvironment.freePort(), asOwner: true)
        try await allowed.waitUntilServing()
        #expect(allowed.log.contains("PRIVILEGED DATABASE ROLE"), "\(allowed.log)")
        allowed.signal(SIGTERM)
        _ = try await allowed.waitForExit()
    }

    @Test("serve and worker refuse a master key that does not open the secrets stored, and name no secret or key")
    func serveRefusesWrongMasterKey() async throws {
        let fixture = try await RegistryFixture.get()
        _ = try await fixture.api.createTenant()  // at least one secret sealed under the tests' key
        let wrong = Data((0..<32).map { _ in UInt8.random(in: 0...255) }).base64EncodedString()
        for command in ["serve", "worker"] {
            let refused = try MarqueeProcess(
                [command], environment: ["DATABASE_URL": fixture.databaseURL, "MARQUEE_MASTER_KEY": wrong],
                port: TestEnvironment.freePort())
            let status = try await refused.waitForExit()
            #expect(status != 0, "\(command) exits non-zero")
            #expect(refused.log.contains("MARQUEE_MASTER_KEY does not open the secrets stored"), "\(refused.log)")
            #expect(!refused.log.contains(wrong) && !refused.log.contains(MarqueeProcess.masterKey))
        }
        // A ring that holds the sealing key as a previous one (a rotation) starts.
        let rotated = try MarqueeProcess(
            ["serve"],
            environment: [
                "DATABASE_URL": fixture.databaseURL, "MARQUEE_MASTER_KEY": wrong, "MARQUEE_MASTER_KEY_ID": "k-next",
                "MARQUEE_MASTER_KEYS_PREVIOUS": "k1:\(MarqueeProcess.masterKey)",
            ], port: TestEnvironment.freePort())
        try await rotated.waitUntilServing()
        rotated.signal(SIGTERM)
        #expect(try await rotated.waitForExit() == 0, "\(rotated.log)")
    }

    @Test("0010 protects a tenant table made by an earlier migration the 0004 way; later ones call the helper")
    func migrationProtectsEveryTenantTable() async throws {
        let url = try await TestEnvironment.makeDatabase()
        let dir = NSTemporaryDirectory() + "migrations-" + UUID().uuidString
        try FileManager.default.createDirectory(atPath: dir, withIntermediateDirectories: true)
        defer { try? FileManager.default.removeItem(atPath: dir) }
        for file in try FileManager.default.contentsOfDirectory(atPath: TestEnvironment.migrationsDirectory)
        where file.hasSuffix(".sql") {
            try FileManager.default.copyItem(
                atPath: TestEnvironment.migrationsDirectory + "/" + file, toPath: dir + "/" + file)
        }
        // Like a migration merged before 0010 (a free number below it): RLS and a policy for marquee_api, nothing
        // more.
        let taken = Set(try FileManager.default.contentsOfDirectory(atPath: dir).map { $0.prefix(4) })
        guard let earlier = (6...9).map({ "000\($0)" }).first(where: { !taken.contains(Substring($0)) }) else {
            Issue.record("no free migration number below 0010")
            return
        }
        try """
        CREATE TABLE earlier_notes (tenant_id uuid NOT NULL, id text NOT NULL, body text, PRIMARY KEY (tenant_id, id));
        ALTER TABLE earlier_notes ENABLE ROW LEVEL SECURITY;
        CREATE POLICY tenant_isolation ON earlier_notes TO marquee_api
            USING (tenant_id = marquee_current_tenant()) WITH CHECK (tenant_id = marquee_current_tenant());
        GRANT SELECT, INSERT ON earlier_notes TO marquee_api;
        """.write(toFile: dir + "/\(earlier)_earlier_notes.sql", atomically: true, encoding: .utf8)
        // A migration after 0010, following the documented pattern.
        try """
        CREATE TABLE later_notes (tenant_id uuid NOT NULL, id text NOT NULL, PRIMARY KEY (tenant_id, id));
        SELECT marquee_protect_tenant_table('later_notes');
        """.write(toFile: dir + "/9999_later_notes.sql", atomically: true, encoding: .utf8)
        let migrate = try await runCommand(
            TestEnvironment.marqueeBinary, ["migrate"],
            environment: ["DATABASE_URL": url, "MARQUEE_MIGRATIONS_DIR": dir])
        #expect(migrate.status == 0, "\(migrate.output)")

        let owner = PostgresPool(try PostgresConfiguration(url: url), options: .init(maxConnections: 1))
        defer { owner.close() }
        let a = UUID()
        let b = UUID()
        for table in ["earlier_notes", "later_notes"] {
            let forced = try await owner.count(
                "SELECT count(*)::int AS n FROM pg_class WHERE relname = \(table) AND relrowsecurity AND relforcerowsecurity"
            )
            #expect(forced == 1, "\(table)")
            try await owner.execute(
                "INSERT INTO \(identifier: table) (tenant_id, id) VALUES (\(a), 'x'), (\(b), 'y')")
        }
        // marquee_system gets what marquee_api has (SELECT, INSERT on earlier_notes; no DELETE).
        let app = PostgresPool(
            try PostgresConfiguration(url: TestEnvironment.appURL(url)), options: .init(maxConnections: 1))
        defer { app.close() }
        for table in ["earlier_notes", "later_notes"] {
            let counts = try await app.transaction { connection in
                try connection.execute("SET LOCAL ROLE marquee_system")
                let all = try connection.query("SELECT count(*)::int AS n FROM \(identifier: table)")[0].decode(
                    Int.self, "n")
                try connection.execute("SET LOCAL ROLE marquee_api")
                try connection.query("SELECT set_config('marquee.tenant_id', \(a.uuidString), true)")
                let own = try connection.query("SELECT count(*)::int AS n FROM \(identifier: table)")[0].decode(
                    Int.self, "n")
                return (all, own)
            }
            #expect(counts.0 == 2 && counts.1 == 1, "\(table): system sees \(counts.0), tenant A sees \(counts.1)")
        }
        await #expect(throws: PostgresError.self) {
            try await app.transaction { connection in
                try connection.execute("SET LOCAL ROLE marquee_system")
                try connection.execute("DELETE FROM earlier_notes")
            }
        }
    }
}

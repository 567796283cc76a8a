import Foundation
import PostgresClient
import Testing

/// PostgreSQL's row-level security on its own: what the `marquee_api` role can see and write, whatever the SQL.
@Suite("Row-level security")
struct RowLevelSecurityTests {
    /// Every table the registry migration puts under row-level security.
    static let tenantTables: Set<String> = [
        "tenants", "api_keys", "apns_credentials", "fcm_credentials", "activity_types", "people", "devices",
        "push_to_start_tokens", "activity_tokens", "instance_devices", "activity_events", "delivery_metrics",
    ]

    static func tenantColumn(_ table: String) -> String { table == "tenants" ? "id" : "tenant_id" }

    @Test("every table with tenant data has row-level security")
    func everyTenantTableIsProtected() async throws {
        let fixture = try await RegistryFixture.get()
        let protected = try await fixture.pool.query(
            """
            SELECT c.relname::text AS name FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
            WHERE n.nspname = 'public' AND c.relkind IN ('r', 'p') AND c.relrowsecurity
            """
        ).map { try $0.decode(String.self, "name") }
        let withTenantColumn = try await fixture.pool.query(
            """
            SELECT table_name::text AS name FROM information_schema.columns
            WHERE table_schema = 'public' AND column_name = 'tenant_id'
            """
        ).map { try $0.decode(String.self, "name") }
        // A view of tenant data runs with its caller's rights, so the RLS of the tables under it applies.
        let invokerViews = try await fixture.pool.query(
            """
            SELECT c.relname::text AS name FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
            WHERE n.nspname = 'public' AND c.relkind = 'v' AND 'security_invoker=true' = ANY(c.reloptions)
            """
        ).map { try $0.decode(String.self, "name") }
        #expect(invokerViews.contains("deliveries"))
        #expect(
            Set(withTenantColumn).isSubset(of: Set(protected).union(invokerViews)),
            "tables with tenant_id but no RLS, or views that bypass it")
        #expect(Self.tenantTables.isSubset(of: Set(protected)))
        let policies = try await fixture.pool.query(
            "SELECT tablename::text AS name FROM pg_policies WHERE schemaname = 'public' AND 'marquee_api' = ANY(roles)"
        ).map { try $0.decode(String.self, "name") }
        #expect(Set(policies) == Set(protected), "every protected table has a policy for marquee_api")
    }

    @Test("as marquee_api: no tenant set sees nothing; tenant A sees only A; writes for B are refused")
    func policies() async throws {
        let fixture = try await RegistryFixture.get()
        let a = try await IsolationTests.seed(fixture)
        let b = try await IsolationTests.seed(fixture)
        let pool = fixture.pool
        let tables = Self.tenantTables.sorted()
        let aID = a.tenant.uuid
        let bID = b.tenant.uuid

        // As the owner: A and B have rows in every table.
        let owned = try await pool.transaction { connection in
            try tables.map { table in
                let column = Self.tenantColumn(table)
                let rows = try connection.query(
                    """
                    SELECT count(*) FILTER (WHERE \(identifier: column) = \(aID))::int AS a,
                           count(*) FILTER (WHERE \(identifier: column) = \(bID))::int AS b
                    FROM \(identifier: table)
                    """)
                return (table, try rows[0].decode(Int.self, "a"), try rows[0].decode(Int.self, "b"))
            }
        }
        for (table, aRows, bRows) in owned {
            #expect(aRows > 0 && bRows > 0, "\(table) holds rows of both tenants")
        }

        // marquee_api without marquee.tenant_id: nothing.
        let unset = try await pool.transaction { connection in
            try connection.execute("SET LOCAL ROLE marquee_api")
            return try tables.map { table in
                (
                    table,
                    try connection.query("SELECT count(*)::int AS n FROM \(identifier: table)")[0].decode(Int.self, "n")
                )
            }
        }
        for (table, visible) in unset {
            #expect(visible == 0, "\(table): \(visible) rows visible with no tenant set")
        }

        // marquee_api with tenant A: exactly A's rows.
        let scoped = try await pool.transaction { connection in
            try connection.execute("SET LOCAL ROLE marquee_api")
            try connection.query("SELECT set_config('marquee.tenant_id', \(aID.uuidString), true)")
            return try tables.map { table in
                let column = Self.tenantColumn(table)
                let rows = try connection.query(
                    """
                    SELECT count(*)::int AS total, count(*) FILTER (WHERE \(identifier: column) <> \(aID))::int AS other
                    FROM \(identifier: table)
                    """)
                return (table, try rows[0].decode(Int.self, "total"), try rows[0].decode(Int.self, "other"))
            }
        }
        for ((table, total, other), (_, aRows, _)) in zip(scoped, owned) {
            #expect(other == 0, "\(table): tenant A sees \(other) rows of other tenants")
            #expect(total == aRows, "\(table): tenant A sees \(total) of its \(aRows) rows")
        }

        // Inserting for B while A is set is refused by WITH CHECK.
        let insert = await #expect(throws: PostgresError.self) {
            try await pool.transaction { connection in
                try connection.enterTenantForTest(aID)
                try connection.execute("INSERT INTO people (tenant_id, id) VALUES (\(bID), 'rls-intruder')")
            }
        }
        #expect(insert?.sqlState == "42501", "\(String(describing: insert))")
        await #expect(throws: PostgresError.self) {
            try await pool.transaction { connection in
                try connection.enterTenantForTest(aID)
                try connection.execute(
                    "INSERT INTO activity_events (tenant_id, id, instance_id, event, at) VALUES (\(bID), \(UUID()), 'i', 'started', now())"
                )
            }
        }
        // Moving A's row to B is refused too.
        await #expect(throws: PostgresError.self) {
            try await pool.transaction { connection in
                try connection.enterTenantForTest(aID)
                try connection.execute(
                    "UPDATE activity_types SET tenant_id = \(bID) WHERE tenant_id = \(aID) AND identifier = \(a.activityType)"
                )
            }
        }
        // B's rows cannot be reached for update or delete: zero rows affected.
        let touched = try await pool.transaction { connection in
            try connection.enterTenantForTest(aID)
            let updated = try connection.execute("UPDATE people SET email = NULL WHERE tenant_id = \(bID)")
            let deleted = try connection.execute("DELETE FROM devices WHERE tenant_id = \(bID)")
            let all = try connection.execute("DELETE FROM delivery_metrics WHERE tenant_id <> \(aID)")
            return updated + deleted + all
        }
        #expect(touched == 0)

        let bAfter = try await pool.count(
            "SELECT count(*)::int AS n FROM people WHERE tenant_id = \(bID) AND email IS NOT NULL")
        #expect(bAfter == 1, "B's person keeps its email")
        let intruder = try await pool.count("SELECT count(*)::int AS n FROM people WHERE id = 'rls-intruder'")
        #expect(intruder == 0)
        let aType = try await pool.count(
            "SELECT count(*)::int AS n FROM activity_types WHERE tenant_id = \(aID) AND identifier = \(a.activityType)")
        #expect(aType == 1)
    }
}

extension PostgresConnection {
    /// `SET LOCAL ROLE marquee_api` and `marquee.tenant_id`, spelled out here rather than through the store's helper
    /// so that the test does not depend on the code it checks.
    func enterTenantForTest(_ tenant: UUID) throws {
        try execute("SET LOCAL ROLE marquee_api")
        try query("SELECT set_config('marquee.tenant_id', \(tenant.uuidString), true)")
    }
}

import Foundation
import MarqueeCore
import PostgresClient
import Testing

@testable import MarqueeStore

/// The statistics a campaign's step plans on (migration 0091): the tables it reads are analysed once they have grown
/// to twice what the planner believes, before the step's statements are planned.
extension QueueStatisticsTests {
    @Test(
        "a campaign-wide change's tables are analysed once they doubled since their statistics (a history partition included), as the worker's role; the others are left alone"
    )
    func stepTablesRefreshed() async throws {
        let (url, owner) = try await Self.migratedDatabase()
        defer { owner.close() }
        try await Self.withoutAutovacuum(owner, ["activity_tokens", "instances", "delivery_history_default"])
        let tenant = UUID()
        try await owner.withConnection { connection in
            try Self.seedInstance(connection, tenant: tenant, name: "step")
            try Self.seedDeliveries(connection, tenant: tenant, prefix: "p", count: 10)
            // The statistics of the moment a start committed: its instances, and no activity token yet.
            try connection.execute("ANALYZE activity_tokens")
            try connection.execute("ANALYZE instances")
            try connection.execute("ANALYZE delivery_history_default")
            // Then the apps report their tokens (2,000 of them) and the start's pushes are recorded in the history
            // (in the default partition: a date no daily partition holds).
            try Self.registerTokens(connection, tenant: tenant, count: 2000)
            try connection.execute(
                """
                INSERT INTO delivery_history (tenant_id, id, instance_id, device_token, provider, token_kind, token,
                                              operation, instance_version, status, attempts, created_at, recorded_at)
                SELECT \(tenant), gen_random_uuid(), 'i', 'd' || i, 'apns', 'activity', md5(i::text), 'update', 1,
                       'sent', 1, '1999-01-01', '1999-01-01'
                FROM generate_series(1, 2000) i
                """)
            _ = try connection.query("SELECT pg_stat_force_next_flush()")
        }
        func analyses() async throws -> [String: Int] {
            try await Self.analyses(owner, of: ["activity_tokens", "instances", "delivery_history_default"])
        }
        let before = try await analyses()
        let workerPool = try Self.workerPool(url)
        defer { workerPool.close() }
        try await workerPool.transaction { c in
            try c.enterSystem()
            try CampaignRunner.refreshStatistics(c)
        }
        let after = try await analyses()
        func again(_ table: String) -> Int { after[table, default: 0] - before[table, default: 0] }
        #expect(again("activity_tokens") == 1, "2,000 tokens where the planner believed none: \(before) → \(after)")
        #expect(again("delivery_history_default") == 1, "a history partition that grew: \(before) → \(after)")
        #expect(again("instances") == 0, "no instance added since its statistics: left alone (\(before) → \(after))")
        let believed = try await owner.query(
            "SELECT reltuples::int AS n FROM pg_class WHERE oid = 'activity_tokens'::regclass")[0].decode(Int.self, "n")
        #expect(believed == 2000)
    }

    @Test(
        "the workers' tick analyses a table grown ten-fold since its statistics (the API's reads), and leaves one that only doubled to a change's step"
    )
    func tickRefreshesReadTables() async throws {
        let (url, owner) = try await Self.migratedDatabase()
        defer { owner.close() }
        try await Self.withoutAutovacuum(owner, ["activity_tokens", "instances"])
        let tenant = UUID()
        try await owner.withConnection { connection in
            try Self.seedInstance(connection, tenant: tenant, name: "tick")
            try Self.seedDeliveries(connection, tenant: tenant, prefix: "p", count: 1200)
            // Statistics of the moment: no activity token yet; 1,201 instances; the rest as they are.
            try connection.execute("ANALYZE activity_tokens")
            try connection.execute("ANALYZE instances")
            try connection.execute("ANALYZE devices, instance_devices, push_to_start_tokens, delivery_queue")
            // Then a burst: 2,000 tokens registered (from none), 2,000 more instances started (2.7 times as many).
            try Self.registerTokens(connection, tenant: tenant, count: 2000)
            try connection.execute(
                """
                INSERT INTO instances (tenant_id, id, activity_type, state, attributes, content_state,
                                       content_timestamp, expires_at)
                SELECT \(tenant), 'q' || i, 'a', 'active', '{}', '{}', 1, now() + interval '1 hour'
                FROM generate_series(1, 2000) i
                """)
            _ = try connection.query("SELECT pg_stat_force_next_flush()")
        }
        func analyses() async throws -> [String: Int] {
            try await Self.analyses(owner, of: ["activity_tokens", "instances"])
        }
        let workerPool = try Self.workerPool(url)
        defer { workerPool.close() }
        let before = try await analyses()
        #expect(try await DeliveryQueue(pool: workerPool).refreshTickStatistics().tables == 1)
        let ticked = try await analyses()
        #expect(ticked["activity_tokens", default: 0] - before["activity_tokens", default: 0] == 1, "\(ticked)")
        #expect(ticked["instances"] == before["instances"], "2.7 times its statistics: not the tick's (\(ticked))")
        // A change's step, about to read sets of 10,000, asks for less.
        try await workerPool.transaction { c in
            try c.enterSystem()
            try CampaignRunner.refreshStatistics(c)
        }
        let stepped = try await analyses()
        #expect(stepped["instances", default: 0] - before["instances", default: 0] == 1, "\(stepped)")
    }

    /// Autovacuum must not analyse `tables` behind the test's back: their statistics are the test's to set.
    static func withoutAutovacuum(_ owner: PostgresPool, _ tables: [String]) async throws {
        for table in tables {
            try await owner.execute("ALTER TABLE \(unsafeRaw: table) SET (autovacuum_enabled = false)")
        }
    }

    /// How many times each of `tables` has been analysed.
    static func analyses(_ owner: PostgresPool, of tables: [String]) async throws -> [String: Int] {
        let rows = try await owner.query(
            "SELECT relname::text AS relname, analyze_count::int AS n FROM pg_stat_user_tables WHERE relname = ANY(\(tables))"
        )
        return try Dictionary(
            uniqueKeysWithValues: rows.map { (try $0.decode(String.self, "relname"), try $0.decode(Int.self, "n")) })
    }

    /// `count` activity tokens the apps reported (retired ones, all for instance `p1` on device `p-d1` of
    /// `seedDeliveries`, so that no uniqueness rule of active tokens applies).
    static func registerTokens(_ connection: PostgresConnection, tenant: UUID, count: Int) throws {
        try connection.execute(
            """
            INSERT INTO activity_tokens (tenant_id, instance_id, device_token, token, status, retired_reason, retired_at)
            SELECT \(tenant), 'p1', 'p-d1', md5(i::text), 'retired', 'rotated', now()
            FROM generate_series(1, \(count)) i
            """)
    }
}

import Foundation
import PostgresClient
import Testing

/// Migration 0066: instances → tenants, instances → campaigns and campaign_members → campaigns are checked once per
/// statement by triggers instead of foreign keys. Each rule a foreign key kept is pinned here: the missing parent,
/// the statement that fails whole, the parent's delete (cascade or refusal), the keys that may not change, and the
/// lock that makes a concurrent delete of a campaign wait for its writer.
@Suite("Reference checks per statement")
struct ReferenceChecksTests {
    /// A tenant with activity type `a` and a scheduled campaign `c`.
    static func seed(_ pool: PostgresPool, tenant: UUID) async throws {
        _ = try await pool.execute(
            "INSERT INTO tenants (id, name, sealed_delivery_secret) VALUES (\(tenant), 'refs', '\\x00')")
        _ = try await pool.execute(
            "INSERT INTO activity_types (tenant_id, identifier, attributes_type) VALUES (\(tenant), 'a', 'A')")
        _ = try await pool.execute(
            """
            INSERT INTO campaigns (tenant_id, id, name, activity_type, audience, attributes, content_state, state,
                                   start_at)
            VALUES (\(tenant), 'c', 'c', 'a', '{"all": true}', '{}', '{}', 'scheduled', now())
            """)
    }

    /// `count` instances `<prefix>1…` of `campaign` (the one numbered `odd`, if any, names `odd_campaign` instead).
    static func insertInstances(
        tenant: UUID, prefix: String, count: Int, campaign: String?, odd: Int = 0, oddCampaign: String? = nil
    ) -> PostgresQuery {
        """
        INSERT INTO instances (tenant_id, id, activity_type, state, attributes, content_state, content_timestamp,
                               expires_at, campaign_id)
        SELECT \(tenant), \(prefix) || i, 'a', 'pending', '{}', '{}', 1, now() + interval '1 hour',
               CASE WHEN i = \(odd) THEN \(oddCampaign)::text ELSE \(campaign)::text END
        FROM generate_series(1, \(count)) i
        """
    }

    /// `count` members `p1…` (instances `i1…`) of `campaign`, like `insertInstances`.
    static func insertMembers(
        tenant: UUID, count: Int, campaign: String, odd: Int = 0, oddCampaign: String? = nil
    ) -> PostgresQuery {
        """
        INSERT INTO campaign_members (tenant_id, campaign_id, person_id, instance_id)
        SELECT \(tenant), CASE WHEN i = \(odd) THEN \(oddCampaign)::text ELSE \(campaign)::text END, 'p' || i, 'i' || i
        FROM generate_series(1, \(count)) i
        """
    }

    static func count(_ pool: PostgresPool, _ table: String, tenant: UUID) async throws -> Int {
        try await pool.query("SELECT count(*)::int AS n FROM \(unsafeRaw: table) WHERE tenant_id = \(tenant)")[0]
            .decode(Int.self, "n")
    }

    static func violation(_ body: () async throws -> Void) async -> PostgresError? {
        do {
            try await body()
            return nil
        } catch let error as PostgresError {
            return error
        } catch {
            return nil
        }
    }

    @Test("a row whose tenant or campaign is missing fails its whole statement, as a foreign key would")
    func missingParents() async throws {
        let (_, pool) = try await QueueStatisticsTests.migratedDatabase()
        defer { pool.close() }
        let tenant = UUID()
        try await Self.seed(pool, tenant: tenant)

        let campaign = await Self.violation {
            _ = try await pool.execute(
                Self.insertInstances(
                    tenant: tenant, prefix: "i", count: 500, campaign: "c", odd: 317, oddCampaign: "gone"))
        }
        #expect(campaign?.code == .foreignKeyViolation)
        #expect(campaign?.constraint == "instances_tenant_id_campaign_id_fkey")
        #expect(campaign?.detail?.contains("gone") == true, "\(String(describing: campaign))")

        let other = UUID()
        let tenantMissing = await Self.violation {
            _ = try await pool.execute(Self.insertInstances(tenant: other, prefix: "i", count: 3, campaign: nil))
        }
        #expect(tenantMissing?.code == .foreignKeyViolation)
        #expect(tenantMissing?.constraint == "instances_tenant_id_fkey")

        let member = await Self.violation {
            _ = try await pool.execute(
                Self.insertMembers(tenant: tenant, count: 100, campaign: "c", odd: 50, oddCampaign: "gone"))
        }
        #expect(member?.code == .foreignKeyViolation)
        #expect(member?.constraint == "campaign_members_tenant_id_campaign_id_fkey")

        #expect(try await Self.count(pool, "instances", tenant: tenant) == 0, "nothing of a failed statement stays")
        #expect(try await Self.count(pool, "campaign_members", tenant: tenant) == 0)

        // The same statements with every parent there; an instance without a campaign needs none.
        _ = try await pool.execute(Self.insertInstances(tenant: tenant, prefix: "i", count: 500, campaign: "c"))
        _ = try await pool.execute(Self.insertInstances(tenant: tenant, prefix: "solo", count: 2, campaign: nil))
        _ = try await pool.execute(Self.insertMembers(tenant: tenant, count: 100, campaign: "c"))
        #expect(try await Self.count(pool, "instances", tenant: tenant) == 502)
        #expect(try await Self.count(pool, "campaign_members", tenant: tenant) == 100)
    }

    @Test("a campaign with instances cannot be deleted; its delete takes its members; a tenant's, its instances")
    func parentsDeleted() async throws {
        let (_, pool) = try await QueueStatisticsTests.migratedDatabase()
        defer { pool.close() }
        let tenant = UUID()
        try await Self.seed(pool, tenant: tenant)
        _ = try await pool.execute(Self.insertInstances(tenant: tenant, prefix: "i", count: 3, campaign: "c"))
        _ = try await pool.execute(Self.insertMembers(tenant: tenant, count: 3, campaign: "c"))
        _ = try await pool.execute(
            """
            INSERT INTO delivery_queue (tenant_id, id, instance_id, device_token, provider, token_kind, token,
                                        operation, instance_version)
            VALUES (\(tenant), gen_random_uuid(), 'i1', 'd', 'apns', 'push_to_start', 't', 'start', 1)
            """)

        let refused = await Self.violation {
            _ = try await pool.execute("DELETE FROM campaigns WHERE tenant_id = \(tenant) AND id = 'c'")
        }
        #expect(refused?.code == .foreignKeyViolation)
        #expect(refused?.constraint == "instances_tenant_id_campaign_id_fkey")
        #expect(try await Self.count(pool, "campaign_members", tenant: tenant) == 3)

        _ = try await pool.execute("DELETE FROM instances WHERE tenant_id = \(tenant)")
        #expect(try await Self.count(pool, "delivery_queue", tenant: tenant) == 0, "the queue's foreign key stays")
        #expect(try await pool.execute("DELETE FROM campaigns WHERE tenant_id = \(tenant) AND id = 'c'") == 1)
        #expect(try await Self.count(pool, "campaign_members", tenant: tenant) == 0)

        // A tenant's delete: its instances first, then its campaigns and their members by their own cascades.
        let second = UUID()
        try await Self.seed(pool, tenant: second)
        _ = try await pool.execute(Self.insertInstances(tenant: second, prefix: "i", count: 3, campaign: "c"))
        _ = try await pool.execute(Self.insertMembers(tenant: second, count: 1, campaign: "c"))
        #expect(try await pool.execute("DELETE FROM tenants WHERE id = \(second)") == 1)
        for table in ["instances", "campaigns", "campaign_members"] {
            #expect(try await Self.count(pool, table, tenant: second) == 0, "\(table)")
        }
    }

    @Test("the keys of the references cannot change")
    func keysFixed() async throws {
        let (_, pool) = try await QueueStatisticsTests.migratedDatabase()
        defer { pool.close() }
        let tenant = UUID()
        try await Self.seed(pool, tenant: tenant)
        _ = try await pool.execute(Self.insertInstances(tenant: tenant, prefix: "i", count: 1, campaign: "c"))
        _ = try await pool.execute(Self.insertMembers(tenant: tenant, count: 1, campaign: "c"))
        let updates: [PostgresQuery] = [
            "UPDATE instances SET campaign_id = NULL WHERE tenant_id = \(tenant)",
            "UPDATE campaign_members SET campaign_id = 'other' WHERE tenant_id = \(tenant)",
            "UPDATE campaigns SET id = 'other' WHERE tenant_id = \(tenant)",
            "UPDATE tenants SET id = \(UUID()) WHERE id = \(tenant)",
        ]
        for update in updates {
            let refused = await Self.violation { _ = try await pool.execute(update) }
            #expect(refused?.code == .foreignKeyViolation, "\(update.sql)")
        }
        // Naming a key column with its own value changes nothing and is allowed.
        #expect(try await pool.execute("UPDATE instances SET campaign_id = 'c' WHERE tenant_id = \(tenant)") == 1)
    }

    @Test("a campaign's delete waits for a writer of its instances, and a writer fails on a campaign deleted meanwhile")
    func concurrentDelete() async throws {
        let (url, pool) = try await QueueStatisticsTests.migratedDatabase()
        defer { pool.close() }
        let tenant = UUID()
        try await Self.seed(pool, tenant: tenant)
        let configuration = try PostgresConfiguration(url: url)

        // Each side holds its transaction through a pool session (its statements run on the connection's thread).
        let writers = PostgresPool(configuration, options: .init(maxConnections: 1))
        let deleters = PostgresPool(configuration, options: .init(maxConnections: 1))
        defer {
            writers.close()
            deleters.close()
        }

        // The writer first: its statement's check holds the campaign KEY SHARE until it commits, so the delete waits
        // and then sees the instance.
        let refused = try await writers.withSession { writer in
            try await writer.execute("BEGIN")
            try await writer.execute(Self.insertInstances(tenant: tenant, prefix: "w", count: 10, campaign: "c"))
            let writerPID = try await writer.query("SELECT pg_backend_pid() AS pid")[0].decode(Int.self, "pid")
            let delete = Task {
                await Self.violation {
                    _ = try await deleters.execute("DELETE FROM campaigns WHERE tenant_id = \(tenant) AND id = 'c'")
                }
            }
            #expect(try await Self.blocked(pool, by: writerPID), "the delete waits for the writer")
            try await writer.execute("COMMIT")
            return await delete.value
        }
        #expect(refused?.constraint == "instances_tenant_id_campaign_id_fkey")
        #expect(try await Self.count(pool, "campaigns", tenant: tenant) == 1)

        // The delete first: the writer's check waits for it, then finds the campaign gone.
        _ = try await pool.execute("DELETE FROM instances WHERE tenant_id = \(tenant)")
        let failed = try await deleters.withSession { deleter in
            try await deleter.execute("BEGIN")
            #expect(try await deleter.execute("DELETE FROM campaigns WHERE tenant_id = \(tenant) AND id = 'c'") == 1)
            let deleterPID = try await deleter.query("SELECT pg_backend_pid() AS pid")[0].decode(Int.self, "pid")
            let insert = Task {
                await Self.violation {
                    _ = try await writers.execute(
                        Self.insertInstances(tenant: tenant, prefix: "late", count: 10, campaign: "c"))
                }
            }
            #expect(try await Self.blocked(pool, by: deleterPID), "the writer's check waits for the delete")
            try await deleter.execute("COMMIT")
            return await insert.value
        }
        #expect(failed?.constraint == "instances_tenant_id_campaign_id_fkey")
        #expect(try await Self.count(pool, "instances", tenant: tenant) == 0, "no instance names a deleted campaign")
    }

    /// Whether a backend comes to wait for `holder` within 30 s.
    static func blocked(_ pool: PostgresPool, by holder: Int) async throws -> Bool {
        let deadline = ContinuousClock.now + .seconds(30)
        while ContinuousClock.now < deadline {
            let n = try await pool.query(
                "SELECT count(*)::int AS n FROM pg_stat_activity WHERE \(holder)::int = ANY(pg_blocking_pids(pid))"
            )[0].decode(Int.self, "n")
            if n > 0 { return true }
            try await Task.sleep(for: .milliseconds(20))
        }
        return false
    }

    @Test("the checks plan index lookups whatever the transaction set (a start's steps turn nested loops off)")
    func checksPlanLookups() async throws {
        let (_, pool) = try await QueueStatisticsTests.migratedDatabase()
        defer { pool.close() }
        let config = try await pool.query(
            "SELECT array_to_string(proconfig, ',') AS c FROM pg_proc WHERE proname = 'marquee_check_parents'"
        )[0].decode(String?.self, "c")
        #expect(config == "enable_nestloop=on,enable_seqscan=off")
    }
}

import Foundation
import PostgresClient
import Testing

/// Migration 0066: instances → tenants, instances → campaigns and campaign_members → campaigns are checked once per
/// statement by triggers instead of foreign keys; migration 0069: delivery_queue → instances too, with the parking of
/// deliveries for a broken credential. Each rule a foreign key kept is pinned here: the missing parent, the statement
/// that fails whole, the parent's delete (cascade or refusal), the keys that may not change, and the lock that makes
/// a concurrent delete of a parent wait for its writer.
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

    /// A migrated database (its URL, and the owner's pool for the caller to close) with `seed`'s tenant.
    static func seeded() async throws -> (url: String, pool: PostgresPool, tenant: UUID) {
        let (url, pool) = try await QueueStatisticsTests.migratedDatabase()
        let tenant = UUID()
        try await seed(pool, tenant: tenant)
        return (url, pool, tenant)
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

    /// One queued start per element of `instances` (an instance named twice gets two rows), for `provider`.
    static func insertQueued(tenant: UUID, instances: [String], provider: String = "apns") -> PostgresQuery {
        """
        INSERT INTO delivery_queue (tenant_id, id, instance_id, device_token, provider, token_kind, token, operation,
                                    instance_version)
        SELECT \(tenant), gen_random_uuid(), i, 'd', \(provider),
               CASE WHEN \(provider) = 'apns' THEN 'push_to_start' ELSE 'fcm' END, 't' || i, 'start', 1
        FROM unnest(\(instances)::text[]) i
        """
    }

    /// The tenant's APNs credential, broken (its deliveries are parked when queued).
    static func brokenAPNsKey(tenant: UUID) -> PostgresQuery {
        """
        INSERT INTO apns_credentials (tenant_id, team_id, key_id, bundle_id, environment, sealed_private_key, status)
        VALUES (\(tenant), 't', 'k', 'b', 'sandbox', '\\x00', 'broken')
        """
    }

    /// The text of an INSERT of one queued start for `instance` (values written out: it goes inside a CTE).
    static func queuedRow(tenant: UUID, instance: String) -> String {
        """
        INSERT INTO delivery_queue (tenant_id, id, instance_id, device_token, provider, token_kind, token, operation,
                                    instance_version)
        VALUES ('\(tenant.uuidString)', gen_random_uuid(), '\(instance)', 'd', 'apns', 'push_to_start', 't', 'start', 1)
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
        let (_, pool, tenant) = try await Self.seeded()
        defer { pool.close() }

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
        let (_, pool, tenant) = try await Self.seeded()
        defer { pool.close() }
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
        #expect(try await Self.count(pool, "delivery_queue", tenant: tenant) == 0, "the queue's rows go with them")
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
        let (_, pool, tenant) = try await Self.seeded()
        defer { pool.close() }
        _ = try await pool.execute(Self.insertInstances(tenant: tenant, prefix: "i", count: 1, campaign: "c"))
        _ = try await pool.execute(Self.insertMembers(tenant: tenant, count: 1, campaign: "c"))
        _ = try await pool.execute(Self.insertQueued(tenant: tenant, instances: ["i1"]))
        let updates: [PostgresQuery] = [
            "UPDATE instances SET campaign_id = NULL WHERE tenant_id = \(tenant)",
            "UPDATE instances SET id = 'other' WHERE tenant_id = \(tenant)",
            "UPDATE delivery_queue SET instance_id = 'other' WHERE tenant_id = \(tenant)",
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
        let (url, pool, tenant) = try await Self.seeded()
        defer { pool.close() }
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
        let refused = try await Self.waits(
            "the delete waits for the writer", on: writers, watched: pool,
            holding: {
                try await $0.execute(Self.insertInstances(tenant: tenant, prefix: "w", count: 10, campaign: "c"))
            },
            then: {
                await Self.violation {
                    _ = try await deleters.execute("DELETE FROM campaigns WHERE tenant_id = \(tenant) AND id = 'c'")
                }
            })
        #expect(refused?.constraint == "instances_tenant_id_campaign_id_fkey")
        #expect(try await Self.count(pool, "campaigns", tenant: tenant) == 1)

        // The delete first: the writer's check waits for it, then finds the campaign gone.
        _ = try await pool.execute("DELETE FROM instances WHERE tenant_id = \(tenant)")
        let failed = try await Self.waits(
            "the writer's check waits for the delete", on: deleters, watched: pool,
            holding: {
                let deleted = try await $0.execute("DELETE FROM campaigns WHERE tenant_id = \(tenant) AND id = 'c'")
                #expect(deleted == 1)
            },
            then: {
                await Self.violation {
                    _ = try await writers.execute(
                        Self.insertInstances(tenant: tenant, prefix: "late", count: 10, campaign: "c"))
                }
            })
        #expect(failed?.constraint == "instances_tenant_id_campaign_id_fkey")
        #expect(try await Self.count(pool, "instances", tenant: tenant) == 0, "no instance names a deleted campaign")
    }

    @Test("a queued delivery whose instance is missing fails its whole statement; an instance's delete takes its rows")
    func queueParent() async throws {
        let (_, pool, tenant) = try await Self.seeded()
        defer { pool.close() }
        _ = try await pool.execute(Self.insertInstances(tenant: tenant, prefix: "i", count: 3, campaign: nil))

        let missing = await Self.violation {
            _ = try await pool.execute(Self.insertQueued(tenant: tenant, instances: ["i1", "i2", "gone", "i3"]))
        }
        #expect(missing?.code == .foreignKeyViolation)
        #expect(missing?.constraint == "deliveries_tenant_id_instance_id_fkey")
        #expect(missing?.detail?.contains("gone") == true, "\(String(describing: missing))")
        #expect(
            try await Self.count(pool, "delivery_queue", tenant: tenant) == 0, "nothing of a failed statement stays")

        // One statement inserting into the queue twice (as a campaign-wide change queues its broadcast and its pushes):
        // the rows of both are checked, whichever names the missing instance.
        let twice = await Self.violation {
            _ = try await pool.execute(
                """
                WITH first AS (\(unsafeRaw: Self.queuedRow(tenant: tenant, instance: "i1")) RETURNING 1),
                     second AS (\(unsafeRaw: Self.queuedRow(tenant: tenant, instance: "gone")) RETURNING 1)
                SELECT (SELECT count(*) FROM first) + (SELECT count(*) FROM second) AS n
                """)
        }
        #expect(twice?.constraint == "deliveries_tenant_id_instance_id_fkey")
        #expect(try await Self.count(pool, "delivery_queue", tenant: tenant) == 0)

        // Another tenant's instance of the same name is not this tenant's parent.
        let other = UUID()
        try await Self.seed(pool, tenant: other)
        _ = try await pool.execute(Self.insertInstances(tenant: other, prefix: "x", count: 1, campaign: nil))
        let foreign = await Self.violation {
            _ = try await pool.execute(Self.insertQueued(tenant: tenant, instances: ["x1"]))
        }
        #expect(foreign?.constraint == "deliveries_tenant_id_instance_id_fkey")

        _ = try await pool.execute(Self.insertQueued(tenant: tenant, instances: ["i1", "i1", "i2", "i3"]))
        #expect(try await Self.count(pool, "delivery_queue", tenant: tenant) == 4)
        #expect(try await pool.execute("DELETE FROM instances WHERE tenant_id = \(tenant) AND id = 'i1'") == 1)
        let left = try await pool.query(
            "SELECT instance_id FROM delivery_queue WHERE tenant_id = \(tenant) ORDER BY instance_id"
        ).map { try $0.decode(String.self, "instance_id") }
        #expect(left == ["i2", "i3"])
    }

    @Test("deliveries queued for a broken credential are parked; the statement's other provider stays queued")
    func parkedWhenQueued() async throws {
        let (_, pool, tenant) = try await Self.seeded()
        defer { pool.close() }
        _ = try await pool.execute(Self.insertInstances(tenant: tenant, prefix: "i", count: 4, campaign: nil))
        _ = try await pool.execute(Self.brokenAPNsKey(tenant: tenant))
        _ = try await pool.execute(
            """
            INSERT INTO fcm_credentials (tenant_id, project_id, client_email, token_uri, sealed_service_account)
            VALUES (\(tenant), 'p', 'e', 'u', '\\x00')
            """)
        _ = try await pool.execute(
            """
            INSERT INTO delivery_queue (tenant_id, id, instance_id, device_token, provider, token_kind, token,
                                        operation, instance_version)
            SELECT \(tenant), gen_random_uuid(), v.i, 'd', v.p, CASE v.p WHEN 'apns' THEN 'push_to_start' ELSE 'fcm' END,
                   't' || v.i, 'start', 1
            FROM (VALUES ('i1', 'apns'), ('i2', 'apns'), ('i3', 'fcm'), ('i4', 'fcm')) AS v(i, p)
            """)
        let statuses = try await pool.query(
            "SELECT provider, status FROM delivery_queue WHERE tenant_id = \(tenant) ORDER BY instance_id"
        ).map { "\(try $0.decode(String.self, "provider")):\(try $0.decode(String.self, "status"))" }
        #expect(statuses == ["apns:parked", "apns:parked", "fcm:queued", "fcm:queued"])
    }

    @Test("a statement's queued rows ask whether a credential is broken once per tenant and provider, not per row")
    func credentialAskedOnce() async throws {
        let (url, pool, tenant) = try await Self.seeded()
        defer { pool.close() }
        _ = try await pool.execute(Self.insertInstances(tenant: tenant, prefix: "i", count: 200, campaign: nil))
        _ = try await pool.execute(Self.brokenAPNsKey(tenant: tenant))
        let connection = try PostgresConnection(connecting: try PostgresConfiguration(url: url))
        defer { _ = try? connection.execute("ROLLBACK") }
        try connection.execute("SET track_functions = 'pl'")
        try connection.execute("BEGIN")
        // 100 rows for each provider in one statement; the APNs credential is broken.
        _ = try connection.execute(
            Self.insertQueued(tenant: tenant, instances: (1...100).map { "i\($0)" }, provider: "apns"))
        let calls = {
            try connection.query(
                """
                SELECT COALESCE(sum(calls), 0)::int AS n FROM pg_stat_xact_user_functions
                WHERE funcname = 'marquee_credential_broken'
                """)[0].decode(Int.self, "n")
        }
        // Asked once by the check, once more by the park of its rows.
        #expect(try calls() == 2)
        _ = try connection.execute(
            Self.insertQueued(tenant: tenant, instances: (101...200).map { "i\($0)" }, provider: "fcm"))
        #expect(try calls() == 3, "the FCM rows: asked once, nothing to park")
        let statuses = try connection.query(
            """
            SELECT provider || ':' || status AS s, count(*)::int AS n FROM delivery_queue WHERE tenant_id = \(tenant)
            GROUP BY 1 ORDER BY 1
            """
        ).map { "\(try $0.decode(String.self, "s"))=\(try $0.decode(Int.self, "n"))" }
        #expect(statuses == ["apns:parked=100", "fcm:queued=100"])
    }

    @Test("an instance's delete waits for a writer queueing for it, and takes the writer's rows; a late writer fails")
    func queueConcurrentDelete() async throws {
        let (url, pool, tenant) = try await Self.seeded()
        defer { pool.close() }
        _ = try await pool.execute(Self.insertInstances(tenant: tenant, prefix: "i", count: 3, campaign: nil))
        let configuration = try PostgresConfiguration(url: url)
        let writers = PostgresPool(configuration, options: .init(maxConnections: 1))
        let deleters = PostgresPool(configuration, options: .init(maxConnections: 1))
        defer {
            writers.close()
            deleters.close()
        }
        // i1: the writer only queues (its check locks the instance KEY SHARE); i2: the writer also updates the
        // instance, as Marquee's writes do (the check leaves it to the update's lock). Either way the delete waits,
        // then deletes the rows the writer committed.
        for (instance, writes) in [("i1", false), ("i2", true)] {
            let deleted = try await Self.waits(
                "the delete of \(instance) waits for the writer", on: writers, watched: pool,
                holding: { writer in
                    if writes {
                        try await writer.execute(
                            "UPDATE instances SET version = version + 1 WHERE tenant_id = \(tenant) AND id = \(instance)"
                        )
                    }
                    try await writer.execute(Self.insertQueued(tenant: tenant, instances: [instance, instance]))
                },
                then: {
                    try await deleters.execute("DELETE FROM instances WHERE tenant_id = \(tenant) AND id = \(instance)")
                })
            #expect(deleted == 1)
            let left = try await pool.query(
                "SELECT count(*)::int AS n FROM delivery_queue WHERE tenant_id = \(tenant) AND instance_id = \(instance)"
            )[0].decode(Int.self, "n")
            #expect(left == 0, "no queued row outlives \(instance)")
        }

        // The delete first: the writer's check waits for it, then finds the instance gone.
        let failed = try await Self.waits(
            "the writer's check waits for the delete", on: deleters, watched: pool,
            holding: {
                let deleted = try await $0.execute("DELETE FROM instances WHERE tenant_id = \(tenant) AND id = 'i3'")
                #expect(deleted == 1)
            },
            then: {
                await Self.violation {
                    _ = try await writers.execute(Self.insertQueued(tenant: tenant, instances: ["i3"]))
                }
            })
        #expect(failed?.constraint == "deliveries_tenant_id_instance_id_fkey")
        #expect(try await Self.count(pool, "delivery_queue", tenant: tenant) == 0)
    }

    /// Runs `hold` in a transaction of `holder` (a one-connection pool), then `other` beside it; expects `other` to come
    /// to wait for that transaction (`what`), commits it, and returns what `other` returned.
    static func waits<T: Sendable>(
        _ what: String, on holder: PostgresPool, watched pool: PostgresPool,
        holding hold: (PostgresSession) async throws -> Void, then other: @escaping @Sendable () async throws -> T
    ) async throws -> T {
        try await holder.withSession { session in
            try await session.execute("BEGIN")
            try await hold(session)
            let pid = try await session.query("SELECT pg_backend_pid() AS pid")[0].decode(Int.self, "pid")
            let waiting = Task { try await other() }
            #expect(try await blocked(pool, by: pid), "\(what)")
            try await session.execute("COMMIT")
            return try await waiting.value
        }
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
        for function in ["marquee_check_parents", "marquee_queue_rows_added", "marquee_instances_deleted"] {
            let config = try await pool.query(
                "SELECT array_to_string(proconfig, ',') AS c FROM pg_proc WHERE proname = \(function)"
            )[0].decode(String?.self, "c")
            #expect(config == "enable_nestloop=on,enable_seqscan=off", "\(function)")
        }
    }
}

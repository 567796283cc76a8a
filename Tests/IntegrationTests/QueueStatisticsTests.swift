import Foundation
import MarqueeCore
import PostgresClient
import Synchronization
import Testing

@testable import MarqueeStore

/// The queue's statistics refresh (migration 0047): after a burst of queued deliveries the workers analyse the table,
/// so the claim is not planned for the empty table autovacuum last saw.
@Suite("Queue statistics refresh")
struct QueueStatisticsTests {
    /// A new database migrated by `marquee migrate`, and a one-connection pool on it as its owner.
    static func migratedDatabase() async throws -> (url: String, owner: PostgresPool) {
        let url = try await TestEnvironment.makeDatabase()
        let migrate = try await runCommand(
            TestEnvironment.marqueeBinary, ["migrate"],
            environment: ["DATABASE_URL": url, "MARQUEE_MIGRATIONS_DIR": TestEnvironment.migrationsDirectory])
        guard migrate.status == 0 else { throw TestFailure("marquee migrate: \(migrate.output)") }
        return (url, PostgresPool(try PostgresConfiguration(url: url), options: .init(maxConnections: 1)))
    }

    /// A tenant named `name` with activity type `a` and one active instance `i`, to queue deliveries on.
    static func seedInstance(_ connection: PostgresConnection, tenant: UUID, name: String) throws {
        try connection.execute(
            "INSERT INTO tenants (id, name, sealed_delivery_secret) VALUES (\(tenant), \(name), '\\x00')")
        try connection.execute(
            "INSERT INTO activity_types (tenant_id, identifier, attributes_type) VALUES (\(tenant), 'a', 'A')")
        try connection.execute(
            """
            INSERT INTO instances (tenant_id, id, activity_type, state, attributes, content_state,
                                   content_timestamp, expires_at)
            VALUES (\(tenant), 'i', 'a', 'active', '{}', '{}', 1, now() + interval '1 hour')
            """)
    }

    /// `count` instances of `tenant` (`<prefix>1`…, of the seeded activity type), each with one queued update to a
    /// device of the instance's person (`<prefix>1`…, device `<prefix>-d1`…): a retry of a push to a device that is
    /// not its person's is not kept (migration 0083).
    static func seedDeliveries(_ connection: PostgresConnection, tenant: UUID, prefix: String, count: Int) throws {
        try connection.execute(
            "INSERT INTO people (tenant_id, id) SELECT \(tenant), \(prefix) || i FROM generate_series(1, \(count)) i")
        try connection.execute(
            """
            INSERT INTO devices (tenant_id, token, person_id, platform)
            SELECT \(tenant), \(prefix) || '-d' || i, \(prefix) || i, 'ios' FROM generate_series(1, \(count)) i
            """)
        try connection.execute(
            """
            INSERT INTO instances (tenant_id, id, activity_type, person_id, state, attributes, content_state,
                                   content_timestamp, expires_at)
            SELECT \(tenant), \(prefix) || i, 'a', \(prefix) || i, 'active', '{}', '{}', 1, now() + interval '1 hour'
            FROM generate_series(1, \(count)) i
            """)
        try connection.execute(
            """
            INSERT INTO delivery_queue (tenant_id, id, instance_id, device_token, provider, token_kind, token,
                                    operation, instance_version)
            SELECT \(tenant), marquee_new_ulid(), \(prefix) || i, \(prefix) || '-d' || i, 'apns', 'activity',
                   md5(i::text), 'update', 1
            FROM generate_series(1, \(count)) i
            """)
    }

    /// A pool as a worker's: marquee_app in the marquee_system role (every tenant's rows).
    static func workerPool(_ url: String, connections: Int = 2) throws -> PostgresPool {
        var configuration = try PostgresConfiguration(
            url: url.replacingOccurrences(of: "postgres@", with: "marquee_app@"))
        configuration.startupSettings["role"] = "marquee_system"
        return PostgresPool(configuration, options: .init(maxConnections: connections))
    }

    /// A migrated database whose queue autovacuum leaves alone (its statistics are the test's to set), with one
    /// instance `name` of a new tenant. The caller closes `owner`.
    static func queueWithoutAutovacuum(instance name: String) async throws
        -> (url: String, owner: PostgresPool, tenant: UUID)
    {
        let (url, owner) = try await migratedDatabase()
        try await owner.execute("ALTER TABLE delivery_queue SET (autovacuum_enabled = false)")
        let tenant = UUID()
        try await owner.withConnection { try seedInstance($0, tenant: tenant, name: name) }
        return (url, owner, tenant)
    }

    @Test(
        "the queue gauges leave out a tenant sending at its own send rate limit, and count it once it is not sent for")
    func rateLimitedApart() async throws {
        let (url, owner) = try await Self.migratedDatabase()
        defer { owner.close() }
        let limited = UUID()
        let other = UUID()
        try await owner.withConnection { connection in
            try Self.seedInstance(connection, tenant: limited, name: "limited")
            try Self.seedInstance(connection, tenant: other, name: "other")
            for (tenant, count, age) in [(limited, 200, 600), (other, 3, 2)] {
                try connection.execute(
                    """
                    INSERT INTO delivery_queue (tenant_id, id, instance_id, device_token, provider, token_kind, token,
                                                operation, instance_version, next_attempt_at)
                    SELECT \(tenant), gen_random_uuid(), 'i', 'd' || i, 'apns', 'activity', md5(i::text), 'update', 1,
                           now() - make_interval(secs => \(age))
                    FROM generate_series(1, \(count)) i
                    """)
            }
            // One push a second, and the claims have just spent it.
            try connection.execute(
                """
                INSERT INTO send_limits (tenant_id, rate_per_second, tokens, refilled_at)
                VALUES (\(limited), 1, 0, clock_timestamp() + interval '1 hour')
                """)
        }
        let workerPool = try Self.workerPool(url)
        defer { workerPool.close() }
        let queue = DeliveryQueue(pool: workerPool)
        let held = try #require(try await queue.statistics()[.apns])
        #expect(held.due == 3 && held.rateLimited == 200, "\(held)")
        #expect(held.oldestDueAge < 60, "the limited tenant's ten-minute-old rows are not the queue's age: \(held)")

        // Nobody spends its bucket any more (the workers are gone, or busy elsewhere): it is behind like any other.
        try await owner.execute(
            "UPDATE send_limits SET tokens = 1, refilled_at = now() - interval '1 hour' WHERE tenant_id = \(limited)")
        let behind = try #require(try await queue.statistics()[.apns])
        #expect(behind.due == 203 && behind.rateLimited == 0, "\(behind)")
        #expect(behind.oldestDueAge >= 600, "\(behind)")
    }

    @Test("a burst of 5,000 queued deliveries is analysed once, as the worker's role; a quiet table is left alone")
    func refreshAfterBurst() async throws {
        let (url, owner) = try await Self.migratedDatabase()
        defer { owner.close() }
        // Autovacuum must not analyse behind the test's back.
        try await owner.execute("ALTER TABLE delivery_queue SET (autovacuum_enabled = false)")
        let workerPool = try Self.workerPool(url)
        defer { workerPool.close() }
        let queue = DeliveryQueue(pool: workerPool)
        #expect(try await queue.refreshStatistics() == false, "nothing changed yet")

        let tenant = UUID()
        try await owner.withConnection { try Self.seedInstance($0, tenant: tenant, name: "stats") }
        // Writes the queue; the counters the function reads are published by the writing session.
        func write(_ sql: PostgresQuery) async throws {
            try await owner.withConnection { connection in
                try connection.execute(sql)
                _ = try connection.query("SELECT pg_stat_force_next_flush()")
            }
        }
        try await write(
            """
            INSERT INTO delivery_queue (tenant_id, id, instance_id, device_token, provider, token_kind, token,
                                        operation, instance_version, attributes, content_state, options)
            SELECT \(tenant), gen_random_uuid(), 'i', 'd' || i, 'apns', 'activity', md5(i::text), 'update', 1,
                   jsonb_build_object('n', i), jsonb_build_object('score', i % 7), '{"priority": 10}'
            FROM generate_series(1, 5000) i
            """)
        #expect(try await queue.refreshStatistics() == true, "5,000 new rows: analysed")
        let analysed = try await owner.query(
            "SELECT last_analyze IS NOT NULL AS done FROM pg_stat_user_tables WHERE relid = 'delivery_queue'::regclass")
        #expect(try analysed[0].decode(Bool.self, "done"))
        // The columns plans read have statistics; the JSON a row carries for its send has none (migration 0092: half
        // of an analysis's work, for no plan).
        let columns = try await owner.query(
            "SELECT attname::text AS name FROM pg_stats WHERE schemaname = 'public' AND tablename = 'delivery_queue'"
        ).map { try $0.decode(String.self, "name") }
        #expect(
            Set(["tenant_id", "instance_id", "token", "status", "next_attempt_at"]).isSubset(of: columns), "\(columns)")
        #expect(Set(columns).isDisjoint(with: ["attributes", "content_state", "options"]), "\(columns)")
        #expect(try await queue.refreshStatistics() == false, "just analysed: nothing to do")

        // A queue draining (outcomes delete their rows, migration 0057) is not analysed again and again (0058); a
        // second burst that doubles it is.
        try await write("DELETE FROM delivery_queue WHERE id IN (SELECT id FROM delivery_queue LIMIT 4000)")
        #expect(try await queue.refreshStatistics() == false, "4,000 of 5,000 sent: the plans need no new statistics")
        try await write(
            """
            INSERT INTO delivery_queue (tenant_id, id, instance_id, device_token, provider, token_kind, token,
                                        operation, instance_version)
            SELECT \(tenant), gen_random_uuid(), 'i', 'e' || i, 'apns', 'activity', md5('e' || i), 'update', 1
            FROM generate_series(1, 10000) i
            """)
        #expect(try await queue.refreshStatistics() == true, "11,000 queued where the plans expect 5,000: analysed")
    }
    @Test("a claim planned on statistics from before a burst of 50,000 on one instance does not scan the burst per row")
    func claimAfterBurst() async throws {
        let (url, owner, tenant) = try await Self.queueWithoutAutovacuum(instance: "burst")
        defer { owner.close() }
        try await owner.withConnection { connection in
            // Statistics of an empty queue, then the burst: one instance, 50,000 tokens.
            try connection.execute("ANALYZE delivery_queue")
            try connection.execute(
                """
                INSERT INTO delivery_queue (tenant_id, id, instance_id, device_token, provider, token_kind, token,
                                        operation, instance_version)
                SELECT \(tenant), gen_random_uuid(), 'i', 'd' || i, 'apns', 'activity', md5(i::text), 'update', 1
                FROM generate_series(1, 50000) i
                """)
        }
        let workerPool = try Self.workerPool(url)
        defer { workerPool.close() }
        // With sequential scans for the version check (one per claimed row, each reading the burst) the claim ran into
        // its 2 s statement timeout and threw; it records 256 here, as a claim on fresh statistics does.
        let claimed = try await DeliveryQueue(pool: workerPool).claim(limit: 256, hold: .seconds(60)) { batch in
            ClaimResults(
                results: batch.map {
                    DeliveryResult(tenantID: $0.tenantID, id: $0.id, instanceID: $0.instanceID, status: .sent)
                })
        }
        #expect(claimed == 256)
    }

    @Test("the claim's tenant skip scan, its plan cached while the queue was empty, does not read a burst")
    func skipScanAfterBurst() async throws {
        let (url, owner, tenant) = try await Self.queueWithoutAutovacuum(instance: "skip")
        defer { owner.close() }
        // What autovacuum leaves after a queue drained: no pages, statistics of an empty table.
        try await owner.execute("VACUUM ANALYZE delivery_queue")
        let worker = try Self.workerPool(url, connections: 1)
        defer { worker.close() }
        // A worker polling an empty queue: its connection plans the skip scan again and again, then keeps one generic
        // plan — made for a table of no pages, where a sequential scan and sort cost nothing.
        for _ in 0..<8 {
            let found = try await worker.withConnection {
                try DeliveryQueue.dueTenants($0, limit: 32, providers: ["apns", "fcm"], only: nil).tenants
            }
            #expect(found.isEmpty)
        }
        try await owner.execute(
            """
            INSERT INTO delivery_queue (tenant_id, id, instance_id, device_token, provider, token_kind, token,
                                    operation, instance_version)
            SELECT \(tenant), gen_random_uuid(), 'i', 'd' || i, 'apns', 'activity', md5(i::text), 'update', 1
            FROM generate_series(1, 20000) i
            """)
        func rowsReadBySequentialScans() async throws -> Int {
            try await owner.query(
                "SELECT seq_tup_read::int AS n FROM pg_stat_user_tables WHERE relid = 'delivery_queue'::regclass"
            )[0].decode(Int.self, "n")
        }
        let before = try await rowsReadBySequentialScans()
        let found = try await worker.withConnection { connection in
            let tenants = try DeliveryQueue.dueTenants(connection, limit: 32, providers: ["apns", "fcm"], only: nil)
            _ = try connection.query("SELECT pg_stat_force_next_flush()")  // its counters, published now
            return tenants.tenants
        }
        #expect(found == [tenant])
        // With that plan the skip scan read the whole burst three times a call (in bench/campaign: 128–333 ms a call).
        #expect(try await rowsReadBySequentialScans() - before == 0)
    }

    @Test("a record finds each of its rows by key, whichever of the queue's indexes the planner serves it from")
    func recordLooksRowsUp() async throws {
        let (url, owner) = try await Self.migratedDatabase()
        defer { owner.close() }
        let tenant = UUID()
        try await owner.withConnection { try Self.seedInstance($0, tenant: tenant, name: "record") }
        try await owner.withConnection { connection in
            try Self.seedDeliveries(connection, tenant: tenant, prefix: "r", count: 20_000)
            // In bench/campaign, on statistics that did not know the tenant, the planner served the record's
            // (tenant_id, id) lookups from deliveries_instance (tenant_id, instance_id, token, id), reading every entry
            // of the tenant per row. Here that index is the only one that can serve them.
            try connection.execute("ALTER TABLE delivery_queue DROP CONSTRAINT delivery_queue_pkey")
            // This backend's counts, published before it answers (the inserts' pages are not the record's).
            _ = try connection.query("SELECT pg_stat_force_next_flush()")
        }
        let worker = try Self.workerPool(url)
        defer { worker.close() }
        func indexBlocks() async throws -> Int {
            try await owner.query(
                """
                SELECT (idx_blks_hit + idx_blks_read)::int AS n FROM pg_statio_user_indexes
                WHERE indexrelid = 'deliveries_instance'::regclass
                """
            )[0].decode(Int.self, "n")
        }
        let rows = try await owner.query(
            "SELECT tenant_id, id, instance_id FROM delivery_queue ORDER BY id LIMIT 256")
        let results = try rows.map {
            DeliveryResult(
                tenantID: try $0.decode(UUID.self, "tenant_id"), id: try $0.decode(UUID.self, "id"),
                instanceID: try $0.decode(String.self, "instance_id"), status: .sent, providerID: "p")
        }
        let before = try await indexBlocks()
        try await worker.transaction { connection in
            try connection.execute("SET LOCAL enable_seqscan = off")  // as in the claim
            _ = try DeliveryQueue.record(connection, results)
            _ = try connection.query("SELECT pg_stat_force_next_flush()")
        }
        #expect(
            try await owner.count("SELECT count(*)::int AS n FROM delivery_history WHERE tenant_id = \(tenant)") == 256)
        // A few pages a row (without the instance in the lookups: ~200,000 for these 256 rows).
        let read = try await indexBlocks() - before
        #expect(read < 256 * 20, "\(read) index pages read")
    }

    @Test("a record planned on statistics of an almost empty queue writes its rows without walking a burst")
    func recordAfterEmptyStatistics() async throws {
        let (url, owner, tenant) = try await Self.queueWithoutAutovacuum(instance: "empty")
        defer { owner.close() }
        try await owner.withConnection { try Self.seedDeliveries($0, tenant: tenant, prefix: "e", count: 10_000) }
        // Statistics that say the queue holds one row (in bench/campaign: analysed while a campaign's first step
        // was being sent, before the next 10,000 were queued).
        try await owner.execute(
            """
            UPDATE pg_class SET reltuples = 1, relpages = pg_relation_size('delivery_queue') / 8192
            WHERE oid = 'delivery_queue'::regclass
            """)
        let worker = try Self.workerPool(url)
        defer { worker.close() }
        let rows = try await owner.query("SELECT tenant_id, id, instance_id FROM delivery_queue ORDER BY id LIMIT 256")
        // Half sent (they leave the queue), half retried (they stay, due later).
        let results = try rows.enumerated().map { index, row in
            DeliveryResult(
                tenantID: try row.decode(UUID.self, "tenant_id"), id: try row.decode(UUID.self, "id"),
                instanceID: try row.decode(String.self, "instance_id"), status: index % 2 == 0 ? .sent : .queued,
                reason: index % 2 == 0 ? nil : "retry", retryDelay: .seconds(60))
        }
        // Rows the transaction read from the queue by index and by sequential scan, counted by this backend
        // (pg_stat_xact_user_tables: nothing waits for statistics to be flushed).
        @Sendable func rowsRead(_ connection: PostgresConnection) throws -> Int {
            try connection.query(
                """
                SELECT (COALESCE(idx_tup_fetch, 0) + seq_tup_read)::int AS n FROM pg_stat_xact_user_tables
                WHERE relid = 'delivery_queue'::regclass
                """
            )[0].decode(Int.self, "n")
        }
        let read = try await worker.transaction { connection in
            // As a claim's transaction: generic plans, no sequential scans.
            try connection.execute(GroupCommitter.genericPlans)
            try connection.execute("SET LOCAL enable_seqscan = off")
            let before = try rowsRead(connection)
            _ = try DeliveryQueue.record(connection, results)
            return try rowsRead(connection) - before
        }
        // Its own rows, each looked up once (as joins: the whole queue read for each statement).
        #expect(read <= 256 * 2, "\(read) rows of the queue read")
        #expect(try await owner.count("SELECT count(*)::int AS n FROM delivery_queue") == 10_000 - 128)
        #expect(
            try await owner.count(
                "SELECT count(*)::int AS n FROM delivery_queue WHERE reason = 'retry' AND attempts = 1") == 128)
    }
    @Test(
        "a claim's discovery that cannot finish (its skip scan waiting on a lock, a tenant's bucket held) is stopped by the claim's statement timeout, and the next claim goes on"
    )
    func discoveryTimesOut() async throws {
        let (url, owner) = try await Self.migratedDatabase()
        defer { owner.close() }
        let tenant = UUID()
        try await owner.withConnection { connection in
            try Self.seedInstance(connection, tenant: tenant, name: "discovery")
            try Self.seedDeliveries(connection, tenant: tenant, prefix: "q", count: 3)
            try connection.execute(
                "INSERT INTO send_limits (tenant_id, rate_per_second, tokens) VALUES (\(tenant), 1000, 1000)")
        }
        let worker = try Self.workerPool(url, connections: 1)
        defer { worker.close() }
        let queue = DeliveryQueue(pool: worker)
        @Sendable func claimOne() async throws -> Int {
            try await queue.claim(limit: 1, hold: .seconds(60), tenants: [tenant]) { batch in
                ClaimResults(
                    results: batch.map {
                        DeliveryResult(tenantID: $0.tenantID, id: $0.id, instanceID: $0.instanceID, status: .sent)
                    })
            }
        }
        // A worker's connection has claimed before: its statements are prepared (as they are once per connection).
        #expect(try await claimOne() == 1)
        // Discovery meets `lock`: a claim ends within seconds (the statement timeout is 2 s), stopped.
        func claimStopped(by lock: HeldTransaction, _ what: String) async throws {
            let ended = Mutex(false)
            let claim = Task {
                defer { ended.withLock { $0 = true } }
                return try await claimOne()
            }
            let endedInTime =
                (try? await eventually("the claim to end", timeout: .seconds(10)) { ended.withLock { $0 } }) != nil
            try await lock.commit()  // a claim still waiting goes on
            let outcome = await claim.result
            #expect(endedInTime, "\(what): the claim waited for the lock")
            #expect(throws: PostgresError.self, "\(what)") { try outcome.get() }
            if case .failure(let error as PostgresError) = outcome { #expect(error.code == .queryCanceled, "\(what)") }
        }
        // The skip scan: the queue locked whole (planned badly, it is a long scan instead).
        try await claimStopped(
            by: try await HeldTransaction.open(url) {
                try $0.execute("LOCK TABLE delivery_queue IN ACCESS EXCLUSIVE MODE")
            },
            "the queue locked")
        // The rate limit: the tenant's bucket row held by another transaction.
        try await claimStopped(
            by: try await HeldTransaction.open(url) {
                _ = try $0.query("SELECT tenant_id FROM send_limits WHERE tenant_id = \(tenant) FOR UPDATE")
            }, "the bucket held")
        // Each failure ended its implicit transaction: the same connection claims again.
        #expect(try await claimOne() == 1)
    }
}

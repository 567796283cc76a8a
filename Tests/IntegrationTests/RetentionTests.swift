import Foundation
import MarqueeDelivery
import MarqueeStore
import Observability
import PostgresClient
import Synchronization
import Testing

/// Retention (migrations 0020, 0080) on a database of its own: a pass with the clock moved forward drops whole day
/// partitions and purges finished instances, and would do the same to every other suite's rows on a shared database.
@Suite("Retention")
struct RetentionTests {
    /// A fresh, migrated database; `owner` connects as its owner, `system` as the worker does (marquee_app with the
    /// marquee_system role).
    struct Database {
        /// The owner's URL.
        let url: String
        let owner: PostgresPool
        let system: PostgresPool
        let tenant = UUID()

        static func make() async throws -> Database {
            let url = try await TestEnvironment.makeDatabase()
            let owner = PostgresPool(try PostgresConfiguration(url: url), options: .init(maxConnections: 2))
            try await Migrator(
                pool: owner, migrations: try MigrationFiles.load(directory: TestEnvironment.migrationsDirectory)
            ).migrate()
            var configuration = try PostgresConfiguration(url: TestEnvironment.appURL(url))
            configuration.startupSettings["role"] = "marquee_system"
            let database = Database(
                url: url, owner: owner, system: PostgresPool(configuration, options: .init(maxConnections: 8)))
            try await database.system.execute(
                "INSERT INTO tenants (id, name, sealed_delivery_secret) VALUES (\(database.tenant), 'r', '\\x00')")
            return database
        }

        func close() {
            owner.close()
            system.close()
        }

        func count(_ table: String) async throws -> Int {
            try await system.query(PostgresQuery(unsafeSQL: "SELECT count(*)::int AS n FROM \(table)"))[0]
                .decode(Int.self, "n")
        }

        func exists(_ relation: String) async throws -> Bool {
            try await owner.query("SELECT to_regclass(\(relation)) IS NOT NULL AS e")[0].decode(Bool.self, "e")
        }

        /// An instance that ended (or expires) at `at`.
        func instance(_ id: String, expiresAt: Date, endedAt: Date?) async throws {
            try await system.execute(
                """
                INSERT INTO instances (tenant_id, id, activity_type, state, attributes, content_state,
                                       content_timestamp, expires_at, ended_at)
                VALUES (\(tenant), \(id), 'Order', \(endedAt == nil ? "active" : "ended"), '{}', '{}', 1,
                        \(expiresAt), \(endedAt))
                """)
        }
    }

    static func day(_ date: Date) -> String {
        let formatter = DateFormatter()
        formatter.timeZone = TimeZone(identifier: "UTC")
        formatter.locale = Locale(identifier: "en_US_POSIX")
        formatter.dateFormat = "yyyyMMdd"
        return formatter.string(from: date)
    }

    @Test("a pass 40 days on drops old day partitions, the DEFAULT partition's old rows and finished instances")
    func clockMovedForward() async throws {
        let db = try await Database.make()
        defer { db.close() }
        let now = Date()
        let day: TimeInterval = 86_400
        // Rows of today (today's partition) and of 5 days ago (no partition that old: the DEFAULT partition).
        for receivedAt in [now, now - 5 * day] {
            try await db.system.execute(
                """
                INSERT INTO activity_events (tenant_id, id, instance_id, device_token, event, at, received_at)
                VALUES (\(db.tenant), \(UUID()), 'i', 'd', 'started', \(receivedAt), \(receivedAt))
                """)
            try await db.system.execute(
                """
                INSERT INTO delivery_metrics (tenant_id, id, delivery_id, metric, at, recorded_at)
                VALUES (\(db.tenant), \(UUID()), 'x', 'opened', \(receivedAt), \(receivedAt))
                """)
            try await db.system.execute(
                """
                INSERT INTO delivery_history (tenant_id, id, instance_id, device_token, provider, token_kind, token,
                                              operation, instance_version, status, attempts, created_at, recorded_at)
                VALUES (\(db.tenant), \(UUID()), 'i', 'd', 'apns', 'activity', 't', 'update', 1, 'sent', 1,
                        \(receivedAt), \(receivedAt))
                """)
        }
        #expect(try await db.count("activity_events_default") == 1)
        #expect(try await db.count("activity_events_\(Self.day(now))") == 1)
        try await db.instance("ended-long-ago", expiresAt: now + 8 * 3600, endedAt: now)
        try await db.instance("expired-long-ago", expiresAt: now + 8 * 3600, endedAt: nil)
        try await db.instance("still-live-then", expiresAt: now + 45 * day, endedAt: nil)

        let store = RetentionStore(pool: db.system)
        // Today, keeping 30 days: nothing is old enough.
        let first = try #require(try await store.apply(now: now, keepDays: 30))
        #expect(first.partitionsDropped == 0 && first.instancesPurged == 0 && first.defaultRowsDeleted == 0)
        #expect(try await db.count("activity_events") == 2)
        // Once a day: a second pass the same day does nothing.
        #expect(try await store.apply(now: now, keepDays: 30) == nil)

        // 40 days on: the cutoff is 10 days after today.
        let later = now + 40 * day
        let report = try #require(try await store.apply(now: later, keepDays: 30))
        #expect(report.cutoff.replacingOccurrences(of: "-", with: "") == Self.day(now + 10 * day))
        // Yesterday to today+7 were made by the migration (9 days per table) and today's pass; all are before the
        // cutoff except none: every one of them is dropped.
        #expect(report.partitionsDropped >= 3 * 9)
        #expect(report.defaultRowsDeleted == 3)
        #expect(report.instancesPurged == 2)
        #expect(try await db.count("activity_events") == 0)
        #expect(try await db.count("delivery_metrics") == 0)
        #expect(try await db.count("delivery_history") == 0)
        #expect(try await !db.exists("delivery_history_\(Self.day(now))"))
        #expect(try await !db.exists("activity_events_\(Self.day(now))"))
        #expect(try await !db.exists("delivery_metrics_\(Self.day(now))"))
        // Partitions ahead of the new day exist and are protected like their parent.
        let ahead = "activity_events_\(Self.day(later + 3 * day))"
        #expect(try await db.exists(ahead))
        let protected = try await db.owner.query(
            "SELECT relrowsecurity AND relforcerowsecurity AS p FROM pg_class WHERE relname = \(ahead)")
        #expect(try protected[0].decode(Bool.self, "p"))
        let left = try await db.system.query("SELECT id FROM instances ORDER BY id")
        #expect(try left.map { try $0.decode(String.self, "id") } == ["still-live-then"])
    }

    @Test(
        "a long reader of delivery_history stalls neither its writers nor the pass; its partitions wait for a later pass"
    )
    func longReaderOfDeliveryHistory() async throws {
        let db = try await Database.make()
        defer { db.close() }
        let now = Date()
        let day: TimeInterval = 86_400
        @Sendable func recordDelivery(at recordedAt: Date) async throws {
            try await db.system.execute(
                """
                INSERT INTO delivery_history (tenant_id, id, instance_id, device_token, provider, token_kind, token,
                                              operation, instance_version, status, attempts, created_at, recorded_at)
                VALUES (\(db.tenant), \(UUID()), 'i', 'd', 'apns', 'activity', 't', 'update', 1, 'sent', 1,
                        \(recordedAt), \(recordedAt))
                """)
        }
        try await recordDelivery(at: now)
        try await db.instance("ended-long-ago", expiresAt: now + 8 * 3600, endedAt: now)
        let summary: PostgresQuery = "SELECT summary::text AS s FROM maintenance_runs WHERE job = 'retention'"

        // An analyst's query, open all along: ACCESS SHARE on delivery_history and each of its partitions.
        let reader = try await HeldTransaction.open(db.url) { c in
            try c.query("SELECT 1 FROM delivery_history LIMIT 1")
        }
        // 40 days on: every partition of delivery_history is past the retention and must be dropped.
        let store = RetentionStore(pool: db.system)
        let passed = Flag()
        let pass = Task {
            defer { passed.set() }
            return try await store.apply(now: now + 40 * day, keepDays: 30)
        }
        let failure: (any Error)?
        let recorded = Flag()
        var record: Task<Void, any Error>?
        do {
            try await reader.waitedOn(by: 1, via: db.owner, "the pass waits for the reader's lock")
            // A worker records a delivery meanwhile: it must not queue behind the pass (which queues behind the
            // reader). Before the fix it waited for as long as the reader read.
            record = Task {
                try await recordDelivery(at: Date())
                recorded.set()
            }
            try await eventually("the delivery recorded while the reader reads", timeout: .seconds(10)) {
                recorded.isSet
            }
            // The pass gives up on the table after its lock timeouts and finishes the rest, reader or not.
            try await eventually("the pass finished while the reader reads", timeout: .seconds(90)) {
                passed.isSet
            }
            failure = nil
        } catch {
            failure = error
        }
        try await reader.commit()
        try await record?.value
        let report = try await pass.value
        if let failure { throw failure }

        let first = try #require(report)
        #expect(first.instancesPurged == 1, "the purge did not wait for the reader")
        #expect(try await !db.exists("activity_events_\(Self.day(now))"), "other tables' partitions were dropped")
        #expect(try await db.exists("delivery_history_\(Self.day(now))"), "the reader's table was left alone")
        let ran = try await db.owner.query(summary)[0].decode(String.self, "s")
        #expect(ran.contains(#""partitions_skipped": 18"#), "9 drops and 9 creations left for later: \(ran)")
        #expect(ran.contains(#""skipped_tables": ["delivery_history"]"#), "\(ran)")

        // The reader is gone: the next pass, the same day, does what was left; then the day is done.
        let second = try #require(try await store.apply(now: now + 40 * day, keepDays: 30))
        #expect(second.partitionsDropped >= 9 && second.partitionsCreated == 9)
        #expect(try await !db.exists("delivery_history_\(Self.day(now))"))
        #expect(try await db.exists("delivery_history_\(Self.day(now + 43 * day))"))
        #expect(try await db.count("delivery_history") == 0)
        let done = try await db.owner.query(summary)[0].decode(String.self, "s")
        #expect(done.contains(#""partitions_skipped": 0"#), "\(done)")
        #expect(try await store.apply(now: now + 40 * day, keepDays: 30) == nil)
    }

    @Test("push-to-start tokens retired before the cutoff are purged; active and recently retired ones stay")
    func retiredTokensPurged() async throws {
        let db = try await Database.make()
        defer { db.close() }
        let now = Date()
        let day: TimeInterval = 86_400
        try await db.system.execute("INSERT INTO people (tenant_id, id) VALUES (\(db.tenant), 'p')")
        try await db.system.execute(
            "INSERT INTO devices (tenant_id, token, person_id, platform) VALUES (\(db.tenant), 'd', 'p', 'ios')")
        // Rotated 40 and 5 days ago (each rotation keeps the old row), the token active since 100 days ago, and one
        // APNs refused 40 days ago for a wrong environment: the tenant's credential (configured 60 days ago) is
        // still the one in place, and correcting it brings that token back (migration 0077), so it stays.
        try await db.system.execute(
            """
            INSERT INTO apns_credentials (tenant_id, team_id, key_id, bundle_id, environment, sealed_private_key, configured_at)
            SELECT \(db.tenant), 'TEAM123456', 'KEY1234567', 'com.example.app', 'sandbox', '\\x00'::bytea,
                   \(now - 60 * day)
            """)
        for (token, status, retiredAt, reason) in [
            ("rotated-long-ago", "retired", now - 40 * day, "rotated"),
            ("rotated-lately", "retired", now - 5 * day, "rotated"), ("current", "active", nil, nil),
            ("refused-long-ago", "retired", now - 40 * day, "BadDeviceToken"),
        ] as [(String, String, Date?, String?)] {
            try await db.system.execute(
                """
                INSERT INTO push_to_start_tokens (tenant_id, device_token, activity_type, token, status, retired_at,
                                                  retired_reason, created_at, updated_at)
                VALUES (\(db.tenant), 'd', 'Order', \(token), \(status), \(retiredAt), \(reason), \(now - 100 * day),
                        \(now - 100 * day))
                """)
        }
        let report = try #require(try await RetentionStore(pool: db.system).apply(now: now, keepDays: 30))
        #expect(report.retiredTokensPurged == 1)
        let left = try await db.system.query("SELECT token FROM push_to_start_tokens ORDER BY token")
        #expect(
            try left.map { try $0.decode(String.self, "token") } == ["current", "refused-long-ago", "rotated-lately"])
    }

    @Test("the partition functions (run as the owner) refuse a table retention does not keep")
    func partitionFunctionsOnlyForTheirTables() async throws {
        let db = try await Database.make()
        defer { db.close() }
        // A partitioned table of the owner's that is not kept by day partitions, with a day partition of its own.
        try await db.owner.execute(
            "CREATE TABLE scratch (tenant_id uuid NOT NULL, at timestamptz NOT NULL) PARTITION BY RANGE (at)")
        try await db.owner.execute(
            "CREATE TABLE scratch_20200101 PARTITION OF scratch FOR VALUES FROM ('2020-01-01') TO ('2020-01-02')")
        for call in [
            "SELECT marquee_drop_day_partitions_before('scratch', current_date)::text AS r",
            "SELECT marquee_ensure_day_partition('scratch', current_date)::text AS r",
        ] {
            await #expect(throws: PostgresError.self, "\(call)") {
                try await db.system.query(PostgresQuery(unsafeSQL: call))
            }
        }
        #expect(try await db.exists("scratch_20200101"), "the owner's partition is still there")
        #expect(try await !db.exists("scratch_\(Self.day(Date()))"), "nor was one made")
        // Their own tables still work.
        _ = try await db.system.query("SELECT marquee_ensure_day_partition('delivery_history', current_date + 30)")
    }

    @Test("keeping 0 days keeps everything; partitions are still made ahead")
    func keepEverything() async throws {
        let db = try await Database.make()
        defer { db.close() }
        let now = Date() + 100 * 86_400
        try await db.instance("old", expiresAt: Date(), endedAt: Date())
        let report = try #require(try await RetentionStore(pool: db.system).apply(now: now, keepDays: 0))
        #expect(report.partitionsDropped == 0 && report.instancesPurged == 0)
        #expect(report.partitionsCreated == 3 * 9, "events, metrics and delivery history, 9 days each")
        #expect(try await db.count("instances") == 1)
        #expect(try await db.exists("delivery_metrics_\(Self.day(now))"))
    }

    /// Day partitions hold UTC days and the cutoffs are UTC midnights, whatever the session's TimeZone (migration
    /// 0099). Run by hand from a psql session in New York, the pass made [05:00 UTC, 05:00 UTC) partitions, and the
    /// workers' next pass (UTC) could not attach the day after the last of them ("would overlap", 42P17): every pass
    /// failed from then on. Its cutoffs were New York's midnight too, and purged instances 5 hours early.
    @Test("a pass run from a session in another time zone keeps UTC days, and the workers' passes go on")
    func daysAreUTCInAnyTimeZone() async throws {
        let db = try await Database.make()
        defer { db.close() }
        let day: TimeInterval = 86_400
        var calendar = Calendar(identifier: .gregorian)
        calendar.timeZone = TimeZone(identifier: "UTC")!
        let today = calendar.startOfDay(for: Date())
        // 40 days on, keeping 30: the cutoff is today + 10, at its midnight UTC.
        let cutoff = today + 10 * day
        try await db.instance("ended-before-the-cutoff", expiresAt: cutoff + 8 * 3600, endedAt: cutoff - 3600)
        try await db.instance("ended-after-the-cutoff", expiresAt: cutoff + 8 * 3600, endedAt: cutoff + 2 * 3600)

        // An operator, as the owner in psql, in New York: drops every partition made so far and makes today + 39 to
        // today + 47.
        let byHand = try await db.owner.withConnection { c in
            try c.execute("SET TimeZone = 'America/New_York'")
            defer { _ = try? c.execute("RESET TimeZone") }
            return try c.query("CALL marquee_retention_pass(\(today + 40 * day + 3600), 30, NULL)")[0]
                .decode(String?.self, "p_summary")
        }
        #expect(byHand != nil, "the pass ran")
        let left = try await db.system.query("SELECT id FROM instances ORDER BY id")
        #expect(try left.map { try $0.decode(String.self, "id") } == ["ended-after-the-cutoff"])

        // Every day partition holds its UTC day.
        let formatter = DateFormatter()
        formatter.timeZone = TimeZone(identifier: "UTC")
        formatter.locale = Locale(identifier: "en_US_POSIX")
        let bounds = try await db.owner.query(
            """
            SELECT c.relname::text AS name, pg_get_expr(c.relpartbound, c.oid) AS bound
            FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid
            WHERE i.inhparent = ANY (marquee_day_partitioned_tables()) AND c.relname ~ '_[0-9]{8}$'
            """)
        #expect(bounds.count == 3 * 9)
        for row in bounds {
            let name = try row.decode(String.self, "name")
            formatter.dateFormat = "yyyyMMdd"
            let start = try #require(formatter.date(from: String(name.suffix(8))))
            formatter.dateFormat = "yyyy-MM-dd"
            let expected =
                "FOR VALUES FROM ('\(formatter.string(from: start)) 00:00:00+00') TO ('\(formatter.string(from: start + day)) 00:00:00+00')"
            #expect(try row.decode(String.self, "bound") == expected, "\(name)")
        }

        // The next day, a worker's pass (UTC) makes today + 48 beside them.
        let next = try await RetentionStore(pool: db.system).apply(now: today + 41 * day + 3600, keepDays: 30)
        #expect(next?.partitionsCreated == 3)
        #expect(try await db.exists("delivery_history_\(Self.day(today + 48 * day))"))
    }

    /// The pass's time is the database's (migration 0099): a worker whose clock ran ahead passed it as the pass's
    /// `now`, and dropped partitions and purged rows early. Seen here by when the pass's time was taken: the pass waits
    /// for its pool's one connection, and its recorded time must be after the wait, as the database's clock is (the
    /// worker's was read before it).
    @Test("a worker's pass takes its time from the database")
    func passTimeIsTheDatabases() async throws {
        let db = try await Database.make()
        defer { db.close() }
        var configuration = try PostgresConfiguration(url: TestEnvironment.appURL(db.url))
        configuration.startupSettings["role"] = "marquee_system"
        let pool = PostgresPool(configuration, options: .init(maxConnections: 1))
        defer { pool.close() }
        let lock = PostgresPool(try PostgresConfiguration(url: db.url), options: .init(maxConnections: 1))
        defer { lock.close() }
        // The pool's connection, busy until the test lets it go.
        try await lock.execute("SELECT pg_advisory_lock(99001)")
        let holder = Task {
            try await pool.withConnection { c in
                _ = try c.query("SELECT pg_advisory_lock(99001)")
                _ = try c.query("SELECT pg_advisory_unlock(99001)")
            }
        }
        try await eventually("the pool's connection is held", timeout: .seconds(10)) {
            pool.statistics.open == 1 && pool.statistics.idle == 0
        }
        let service = RetentionService(
            store: RetentionStore(pool: pool), configuration: .init(keepDays: 30), metrics: MetricsRegistry(),
            logger: Logger(label: "test", level: .critical))
        let pass = Task { await service.runOnce() }
        try await eventually("the pass waits for the connection", timeout: .seconds(10)) {
            pool.statistics.waiting == 1
        }
        let released = try await db.owner.query("SELECT now() AS t")[0].decode(Date.self, "t")
        try await lock.execute("SELECT pg_advisory_unlock(99001)")
        try await holder.value
        #expect(await pass.value != nil, "the pass ran")
        let ranAt = try await db.owner.query("SELECT ran_at FROM maintenance_runs WHERE job = 'retention'")[0]
            .decode(Date.self, "ran_at")
        #expect(
            ranAt > released,
            "the pass's time is \(released.timeIntervalSince(ranAt)) s before it had its connection: not the database's"
        )
    }

    @Test("`delivered` is recorded once per delivery and recipient, even when reports race")
    func deliveredOnceUnderRace() async throws {
        let db = try await Database.make()
        defer { db.close() }
        // A delivery recorded (a report is kept only for a delivery that is there: migration 0101).
        let delivery = UUID()
        try await db.system.execute(
            """
            INSERT INTO delivery_history (tenant_id, id, instance_id, device_token, provider, token_kind, token,
                                          operation, instance_version, status, attempts, created_at)
            VALUES (\(db.tenant), \(delivery), 'i', 'd', 'apns', 'activity', 't', 'update', 1, 'sent', 1, now())
            """)
        let results = try await withThrowingTaskGroup(of: Bool.self) { group in
            for _ in 0..<8 {
                group.addTask {
                    try await db.system.transaction { connection in
                        try connection.query(
                            """
                            SELECT marquee_record_delivery_metric(\(db.tenant), 'dlv', 'delivered', 'phone', NULL,
                                                                  \(delivery)) AS recorded
                            """)[0].decode(Bool.self, "recorded")
                    }
                }
            }
            return try await group.reduce(into: [Bool]()) { $0.append($1) }
        }
        #expect(results.filter { $0 }.count == 1)
        // `opened` counts every time; another recipient is another `delivered`.
        for (metric, recipient) in [("opened", "phone"), ("opened", "phone"), ("delivered", "watch")] {
            let recorded = try await db.system.query(
                """
                SELECT marquee_record_delivery_metric(\(db.tenant), 'dlv', \(metric), \(recipient), NULL, \(delivery))
                    AS r
                """)
            #expect(try recorded[0].decode(Bool.self, "r"))
        }
        // A delivery that is not there (or none named) keeps nothing: NULL.
        for other in [UUID(), nil] as [UUID?] {
            let unknown = try await db.system.query(
                "SELECT marquee_record_delivery_metric(\(db.tenant), 'dlv', 'opened', 'phone', NULL, \(other)) AS r")
            #expect(try unknown[0].decode(Bool?.self, "r") == nil)
        }
        #expect(try await db.count("delivery_metrics") == 4)
    }

    @Test("history is never updated, by a partition's name either: its default and day partitions take no UPDATE")
    func historyPartitionsNotUpdated() async throws {
        let db = try await Database.make()
        defer { db.close() }
        // Made by the migrations, and one made now as the worker's retention pass does (0096).
        let made = try await db.system.query(
            "SELECT marquee_ensure_day_partition('delivery_history', current_date + 30) AS made")
        #expect(try made[0].decode(Bool.self, "made"))
        let rows = try await db.owner.query(
            """
            SELECT c.relname::text AS name, r.role,
                   has_table_privilege(r.role, c.oid, 'UPDATE') AS may_update,
                   has_table_privilege(r.role, c.oid, 'INSERT') AND has_table_privilege(r.role, c.oid, 'SELECT')
                       AND has_table_privilege(r.role, c.oid, 'DELETE') AS may_rest
            FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid
            CROSS JOIN (VALUES ('marquee_api'), ('marquee_system')) AS r (role)
            WHERE i.inhparent IN ('delivery_history'::regclass, 'delivery_metrics'::regclass)
            """)
        var partitions: Set<String> = []
        for row in rows {
            let name = try row.decode(String.self, "name")
            let role = try row.decode(String.self, "role")
            partitions.insert(name)
            // Delivery metrics' partitions are updated (their parent grants it); history's are not.
            #expect(try row.decode(Bool.self, "may_update") == name.hasPrefix("delivery_metrics"), "\(name) \(role)")
            #expect(try row.decode(Bool.self, "may_rest"), "\(name) \(role)")
        }
        #expect(partitions.contains("delivery_history_default"))
        #expect(partitions.contains("delivery_history_\(Self.day(Date() + 30 * 86_400))"))
        #expect(partitions.filter { $0.hasPrefix("delivery_history_") }.count >= 10)
        // As the worker's role, an update by the partition's name is refused.
        await #expect(throws: PostgresError.self) {
            try await db.system.execute("UPDATE delivery_history_default SET status = status WHERE false")
        }
    }
}

/// Set once, read from anywhere: whether something concurrent has happened yet.
private final class Flag: Sendable {
    private let state = Mutex(false)
    func set() { state.withLock { $0 = true } }
    var isSet: Bool { state.withLock { $0 } }
}
